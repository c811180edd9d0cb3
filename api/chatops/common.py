"""What every chat platform shares: turning a chat text into a Message, replay checks, outgoing HTTP."""

from __future__ import annotations

import logging
import re
import sqlite3
import time

import httpx
from starlette.concurrency import run_in_threadpool

from api.admission import Admission
from api.chatops.formatting import Message, from_diagnosis, help_message
from api.chatops.replay import ReplayCache
from api.chatops.threads import ThreadMemory
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


# A line that answers a question: `key=value` or `key: value`, the key one the questions ask about.
_ANSWER_LINE = re.compile(r"^\s*([A-Za-z_]+)\s*[=:：]\s*(\S.{0,199}?)\s*$")


def parse_answers(text: str) -> dict[str, str] | None:
    """A message made only of answers to the questions (one `key=value` per line, keys from kb's questions) →
    {key: value}; None for anything else (a paste, a question)."""
    from kb.canonical import QUESTIONS

    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        m = _ANSWER_LINE.match(line)
        if m is None or m.group(1).lower() not in QUESTIONS:
            return None
        out[m.group(1).lower()] = m.group(2)
    return out or None


def answer(kb, text: str, max_results: int = 3, memory: ThreadMemory | None = None,
           thread: str | None = None) -> Message:
    """A chat text (question or paste) → the diagnosis as a message: its candidates, evidence and fix, the
    questions that would separate the candidates, or why it abstained. One engine call: the diagnosis already
    carries the retrieval. With a thread (`memory`, `thread`): a paste is remembered as the thread's, and a
    message of answers only ("precision=bf16") re-ranks the thread's paste with every answer given in it so far."""
    text = (text or "").strip()
    lang = _lang(text)
    if not text or text.lower() in {"help", "?", "帮助"}:
        return help_message(lang)
    try:
        said = parse_answers(text) if memory is not None and thread else None
        kept = _remembered(memory.recall, thread) if said is not None else None
        if kept is not None:
            paste, before = kept
            answers = {**before, **said}
            d = kb.diagnose(text=paste, k=max_results, answers=answers)
            _remembered(memory.answered, thread, answers)
            return from_diagnosis(d, lang=_lang(paste), max_items=max_results)
        d = kb.diagnose(text=text, k=max_results)
        if memory is not None and thread:
            _remembered(memory.remember, thread, text)
        return from_diagnosis(d, lang=lang, max_items=max_results)
    except KBError as e:
        return Message(heading=help_message(lang).heading, lang=lang, notes=[str(e)], abstained=True)


def _remembered(op, *args):
    """A thread-memory call; a store that cannot be read or written (full disk, a lock held past the timeout) costs
    the thread its memory, not the answer."""
    try:
        return op(*args)
    except sqlite3.Error as e:
        log.warning("chat thread memory unavailable: %s", e)
        return None


async def answer_limited(admission: Admission, kb, text: str, max_results: int, memory: ThreadMemory | None = None,
                         thread: str | None = None) -> Message:
    """`answer` under the process's admission cap (chat answers cost what a diagnosis costs)."""
    async with admission.slot():
        return await run_in_threadpool(answer, kb, text, max_results, memory, thread)


async def first_use(replay: ReplayCache, key: str, expires_at: float) -> None:
    """Raise Unauthenticated when this signed request (or delivery) was seen before, in any worker on this host."""
    if not await run_in_threadpool(replay.first_time, key, expires_at):
        raise Unauthenticated("replayed request: this signature was already used")


async def first_delivery(replay: ReplayCache, key: str, ttl_s: float = 3600.0) -> bool:
    """True the first time an event id is delivered (platforms redeliver when the answer is slow)."""
    return await run_in_threadpool(replay.first_time, key, time.time() + ttl_s)


def check_window(timestamp_s: float, max_skew: float, now: float | None = None) -> None:
    now = time.time() if now is None else now
    if abs(now - timestamp_s) > max_skew:
        raise Unauthenticated(f"request timestamp is outside the {int(max_skew)} s window (replay?)")


async def post_json(http: httpx.AsyncClient, url: str, payload: dict,
                    headers: dict[str, str] | None = None) -> dict | None:
    """POST and return the JSON answer; failures are logged (the chat request was already acknowledged)."""
    try:
        resp = await http.post(url, json=payload, headers=headers or {})
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
