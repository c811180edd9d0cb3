"""What every chat platform shares: turning a chat text into a Message, replay dedup, outgoing HTTP."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from api.chatops.formatting import Message, from_ask, from_diagnosis, help_message
from api.errors import APIError
from kb.errors import KBError

log = logging.getLogger("kb.api.chatops")


class Unauthenticated(APIError):
    """A forged, replayed or unsigned chat request: 401 and no work done."""

    def __init__(self, message: str) -> None:
        super().__init__(401, "unauthorized", message)


class NotConfigured(APIError):
    def __init__(self, platform: str, env: str) -> None:
        super().__init__(404, "not_configured", f"{platform} is not configured on this server (set {env})")


def _lang(text: str) -> str:
    try:
        from kb.tokenize import detect_lang

        return detect_lang(text)
    except Exception:  # noqa: BLE001 - language only picks the labels
        return "en"


def answer(kb, text: str, max_results: int = 3) -> Message:
    """A chat text (question or paste) → the best message: a diagnosis when the paste matches known
    incidents, else the retrieval answer (which says when nothing fits)."""
    text = (text or "").strip()
    lang = _lang(text)
    if not text or text.lower() in {"help", "?", "帮助"}:
        return help_message(lang)
    try:
        try:
            msg = from_diagnosis(kb.diagnose(text=text, k=max_results), lang=lang, max_items=max_results)
            if not msg.abstained:
                return msg
        except KBError:
            raise
        except Exception:
            log.exception("diagnose failed; answering with retrieval only")
        return from_ask(kb.ask(text[:4000], k=max_results), max_items=max_results)
    except KBError as e:
        return Message(heading=help_message(lang).heading, lang=lang, notes=[str(e)], abstained=True)


class Dedup:
    """Event ids seen in the last `ttl` seconds (platforms redeliver on timeouts); bounded, thread-safe."""

    def __init__(self, ttl: float = 3600.0, max_size: int = 10_000) -> None:
        self.ttl, self.max_size = ttl, max_size
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, key: str) -> bool:
        now = time.monotonic()
        with self._lock:
            while self._seen and (len(self._seen) > self.max_size or next(iter(self._seen.values())) < now - self.ttl):
                self._seen.popitem(last=False)
            if key in self._seen:
                return False
            self._seen[key] = now
            return True


def check_window(timestamp_s: float, max_skew: float, now: float | None = None) -> None:
    now = time.time() if now is None else now
    if abs(now - timestamp_s) > max_skew:
        raise Unauthenticated(f"request timestamp is outside the {int(max_skew)} s window (replay?)")


async def post_json(app, url: str, payload: dict, headers: dict[str, str] | None = None) -> dict | None:
    """POST and return the JSON answer; failures are logged (the chat request was already acknowledged)."""
    try:
        resp = await app.state.http.post(url, json=payload, headers=headers or {})
        if resp.status_code >= 400:
            log.warning("POST %s -> %s %s", url, resp.status_code, resp.text[:200])
            return None
        try:
            return resp.json()
        except ValueError:
            return {}
    except Exception as e:  # noqa: BLE001 - network trouble must not kill the background task silently
        log.warning("POST %s failed: %s", url, e)
        return None
