"""DingTalk outgoing robot: `timestamp` / `sign` header check, answer as a markdown message in the response."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from api.chatops.common import NotConfigured, Unauthenticated, answer, check_window
from api.chatops.formatting import to_dingtalk
from api.errors import APIError

router = APIRouter(prefix="/chatops/dingtalk", tags=["chatops"])


def sign(timestamp: str, secret: str) -> str:
    """base64(HMAC-SHA256(key=secret, "{timestamp}\\n{secret}")), timestamp in milliseconds."""
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def verify(secret: str, timestamp: str | None, signature: str | None, max_skew: int,
           now: float | None = None) -> None:
    if not timestamp or not signature:
        raise Unauthenticated("missing timestamp or sign header")
    try:
        ts_ms = int(timestamp)
    except ValueError:
        raise Unauthenticated("timestamp is not a number") from None
    check_window(ts_ms / 1000.0, max_skew, now)
    if not hmac.compare_digest(sign(timestamp, secret).encode(), signature.encode()):
        raise Unauthenticated("bad DingTalk sign")


@router.post("/robot", summary="DingTalk outgoing robot")
async def robot(request: Request) -> dict:
    s = request.app.state.settings
    if not s.dingtalk_app_secret:
        raise NotConfigured("DingTalk", "KB_DINGTALK_APP_SECRET")
    metrics = request.app.state.metrics.chatops
    try:
        verify(s.dingtalk_app_secret, request.headers.get("timestamp"), request.headers.get("sign"),
               s.dingtalk_max_skew_s)
    except Unauthenticated:
        metrics.labels("dingtalk", "rejected").inc()
        raise
    try:
        payload = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(422, "invalid_input", "body is not JSON") from None
    if not isinstance(payload, dict):
        raise APIError(422, "invalid_input", "body is not a JSON object")
    text = str((payload.get("text") or {}).get("content", "")) if isinstance(payload.get("text"), dict) else ""
    msg = await run_in_threadpool(answer, request.app.state.kb, text, s.chatops_max_results)
    metrics.labels("dingtalk", "answered").inc()
    reply = to_dingtalk(msg)
    sender = payload.get("senderStaffId")
    if sender:
        reply["at"] = {"atUserIds": [sender], "isAtAll": False}
    return reply
