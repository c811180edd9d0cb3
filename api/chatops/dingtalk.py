"""DingTalk outgoing robot: `timestamp` / `sign` header check, answer as a markdown message in the response.

DingTalk's sign is HMAC-SHA256(app secret, "{timestamp}\\n{app secret}"): it proves the sender knows the secret
and when it signed, but it does not cover the body. So a (timestamp, sign) pair is accepted once (a SQLite
replay cache shared by the workers) within a short window (KB_DINGTALK_MAX_SKEW_S, 300 s by default), and the
answer only ever goes back in the HTTP response: a captured pair buys at most one read-only answer, and only
if it arrives before the original. docs/API.md says this in full."""

from __future__ import annotations

import base64
import hashlib
import hmac

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from api.admission import ensure_connected
from api.bodies import parse_object
from api.chatops.common import NotConfigured, Unauthenticated, answer, check_window, first_use
from api.chatops.formatting import to_dingtalk
from api.deps import AdmissionDep, KBDep, MetricsDep, ReplayDep, SettingsDep, ThreadsDep

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
async def robot(request: Request, s: SettingsDep, kb: KBDep, replay: ReplayDep, metrics: MetricsDep,
                admission: AdmissionDep, threads: ThreadsDep) -> dict:
    if not s.dingtalk_app_secret:
        raise NotConfigured("DingTalk", "KB_DINGTALK_APP_SECRET")
    timestamp, signature = request.headers.get("timestamp"), request.headers.get("sign")
    try:
        verify(s.dingtalk_app_secret, timestamp, signature, s.dingtalk_max_skew_s)
        await first_use(replay, f"dingtalk:{timestamp}:{signature}", int(timestamp or 0) / 1000 + s.dingtalk_max_skew_s)
    except Unauthenticated:
        metrics.chatops.labels("dingtalk", "rejected").inc()
        raise
    payload = parse_object(await request.body())
    text_field = payload.get("text")
    text = str(text_field.get("content", "")) if isinstance(text_field, dict) else ""
    sender = payload.get("senderStaffId")
    # DingTalk's group chats have no threads: a sender's answers ("precision=bf16") re-rank their own last paste in
    # the same conversation.
    who = sender if isinstance(sender, str) and sender else payload.get("senderId")
    conversation = payload.get("conversationId")
    thread = f"dingtalk:{conversation}:{who}" if isinstance(conversation, str) and conversation and who else None
    async with admission.slot():
        await ensure_connected(request)
        msg = await run_in_threadpool(answer, kb, text, s.chatops_max_results, threads, thread)
    metrics.chatops.labels("dingtalk", "answered").inc()
    reply = to_dingtalk(msg)
    if isinstance(sender, str) and sender:
        reply["at"] = {"atUserIds": [sender], "isAtAll": False}
    return reply
