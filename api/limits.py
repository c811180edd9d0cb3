"""Input limits: the request-body cap enforced while bytes stream in, and the per-field log/config checks."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import APIError
from api.settings import Settings


class BodyTooLarge(APIError):
    def __init__(self, limit_name: str, limit: int) -> None:
        super().__init__(413, "too_large", f"request body is over {limit} bytes (limit {limit_name})")


class BodyTimeout(APIError):
    def __init__(self, limit: float) -> None:
        super().__init__(408, "request_timeout", f"the request body did not arrive within {limit:g} s "
                                                 "(KB_BODY_TIMEOUT_S)", headers={"Connection": "close"})


class BodyLimitMiddleware:
    """Refuses a body over the limit from its Content-Length, or as soon as a streamed body passes it, and a
    body that does not finish arriving within `body_timeout_s` of the app's first read (slow-loris bodies).

    Nothing buffers the whole body first: a 50 MB upload is cut off after the first chunk past the limit.
    """

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def _limit(self, path: str, method: str) -> tuple[str, int]:
        if method == "POST" and path.rstrip("/") == "/v1/incidents":
            return "KB_MAX_INGEST_BYTES", self.settings.max_ingest_bytes
        return "KB_MAX_BODY_BYTES", self.settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        name, limit = self._limit(scope.get("path", ""), scope.get("method", ""))
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_error(send, 400, "bad_request", "Content-Length is not a number")
                    return
                if declared > limit:
                    err = BodyTooLarge(name, limit)
                    await _send_error(send, 413, err.code, err.detail)
                    return
        seen = 0
        started = False
        body_done = False
        deadline: float | None = None
        timeout = self.settings.body_timeout_s

        async def counting_receive() -> Message:
            nonlocal seen, body_done, deadline
            if body_done:  # later reads only wait for a disconnect; no deadline applies to them
                return await receive()
            if deadline is None:
                deadline = time.monotonic() + timeout
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise BodyTimeout(timeout) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(name, limit)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except (BodyTooLarge, BodyTimeout) as err:
            # Raised where no handler saw it (e.g. inside a form parser); answer unless a response began.
            if started:
                raise
            await _send_error(send, err.status_code, err.code, err.detail)


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def decode_text(data: bytes, what: str) -> str:
    """Bytes of a paste or upload as text: UTF-8 (with or without BOM), else GB18030 (Chinese logs)."""
    if b"\x00" in data[:65536]:
        raise APIError(422, "invalid_input", f"{what} looks binary (contains NUL bytes); send text")
    for enc in ("utf-8-sig", "gb18030"):
        try:
            return data.decode(enc)
        except UnicodeDecodeError:
            continue
    raise APIError(422, "invalid_input", f"{what} is not UTF-8 or GB18030 text")


def _utf8_size(text: str) -> int:
    # surrogatepass: a lone surrogate counts as its 3 bytes here; whether it is acceptable text is not a size
    # question (api.bodies refuses it in JSON, decode_text never produces it).
    return len(text.encode("utf-8", "surrogatepass"))


def check_log(text: str | None, settings: Settings, what: str = "log") -> None:
    if not text:
        return
    size = _utf8_size(text)
    if size > settings.max_log_bytes:
        raise APIError(413, "too_large", f"{what} is {size} bytes; the limit is {settings.max_log_bytes} "
                                         "(KB_MAX_LOG_BYTES)")
    lines = text.count("\n") + 1
    if lines > settings.max_log_lines:
        raise APIError(413, "too_large", f"{what} has {lines} lines; the limit is {settings.max_log_lines} "
                                         "(KB_MAX_LOG_LINES)")


def check_config(text: str | None, settings: Settings) -> None:
    if not text:
        return
    size = _utf8_size(text)
    if size > settings.max_config_bytes:
        raise APIError(413, "too_large", f"config is {size} bytes; the limit is {settings.max_config_bytes} "
                                         "(KB_MAX_CONFIG_BYTES)")


def check_question(text: str | None, settings: Settings) -> None:
    if text and len(text) > settings.max_question_chars:
        raise APIError(413, "too_large", f"question is {len(text)} characters; the limit is "
                                         f"{settings.max_question_chars} (KB_MAX_QUESTION_CHARS)")
