"""Slack: `/kb` slash command and Events API `app_mention`, signed with the app's signing secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from urllib.parse import parse_qs

from fastapi import APIRouter, BackgroundTasks, Request
from starlette.concurrency import run_in_threadpool

from api.chatops.common import NotConfigured, Unauthenticated, answer, check_window, log, post_json
from api.chatops.formatting import to_slack
from api.errors import APIError

router = APIRouter(prefix="/chatops/slack", tags=["chatops"])
_MENTION = re.compile(r"<@[A-Z0-9]+(?:\|[^>]*)?>")


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(secret: str, timestamp: str | None, signature: str | None, body: bytes, max_skew: int,
           now: float | None = None) -> None:
    """X-Slack-Signature = v0=hex(HMAC-SHA256(secret, "v0:{ts}:{body}")), ts within the window."""
    if not timestamp or not signature:
        raise Unauthenticated("missing X-Slack-Request-Timestamp or X-Slack-Signature")
    try:
        ts = int(timestamp)
    except ValueError:
        raise Unauthenticated("X-Slack-Request-Timestamp is not a number") from None
    check_window(ts, max_skew, now)
    if not hmac.compare_digest(slack_signature(secret, timestamp, body).encode(), signature.encode()):
        raise Unauthenticated("bad Slack signature")


async def _verified_body(request: Request) -> bytes:
    settings = request.app.state.settings
    if not settings.slack_signing_secret:
        raise NotConfigured("Slack", "KB_SLACK_SIGNING_SECRET")
    body = await request.body()
    try:
        verify(settings.slack_signing_secret, request.headers.get("x-slack-request-timestamp"),
               request.headers.get("x-slack-signature"), body, settings.slack_max_skew_s)
    except Unauthenticated:
        request.app.state.metrics.chatops.labels("slack", "rejected").inc()
        raise
    return body


async def _answer_to(app, text: str, url: str, extra: dict, headers: dict[str, str] | None = None) -> None:
    settings = app.state.settings
    msg = await run_in_threadpool(answer, app.state.kb, text, settings.chatops_max_results)
    result = await post_json(app, url, {**to_slack(msg), **extra}, headers)
    app.state.metrics.chatops.labels("slack", "answered" if result is not None else "delivery_failed").inc()


@router.post("/commands", summary="Slack slash command (/kb ...)")
async def slash_command(request: Request, background: BackgroundTasks) -> dict:
    """Acknowledges at once; the full answer goes to the command's response_url."""
    body = await _verified_body(request)
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    settings = request.app.state.settings
    response_url = form.get("response_url", "")
    if not settings.response_url_allowed(response_url):
        raise APIError(422, "invalid_input", "response_url is not an allowed target (KB_SLACK_RESPONSE_URL_ALLOW)")
    text = form.get("text", "")
    background.add_task(_answer_to, request.app, text, response_url,
                        {"response_type": "in_channel", "replace_original": False})
    return {"response_type": "ephemeral", "text": "Looking through the known NaN incidents…"}


@router.post("/events", summary="Slack Events API (url_verification, app_mention)")
async def events(request: Request, background: BackgroundTasks) -> dict:
    body = await _verified_body(request)
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(422, "invalid_input", "body is not JSON") from None
    if not isinstance(payload, dict):
        raise APIError(422, "invalid_input", "body is not a JSON object")
    if payload.get("type") == "url_verification":
        return {"challenge": str(payload.get("challenge", ""))}
    event = payload.get("event") or {}
    if payload.get("type") != "event_callback" or event.get("type") != "app_mention" or event.get("bot_id"):
        return {"ok": True}
    # Slack redelivers when we are slow; answer each event once.
    event_key = str(payload.get("event_id") or event.get("client_msg_id") or event.get("ts"))
    if not request.app.state.dedup["slack"].first_time(event_key):
        return {"ok": True}
    settings = request.app.state.settings
    if not settings.slack_bot_token:
        log.warning("app_mention received but KB_SLACK_BOT_TOKEN is not set; cannot reply")
        return {"ok": True}
    text = _MENTION.sub("", str(event.get("text", ""))).strip()
    background.add_task(_answer_to, request.app, text, settings.slack_api_base.rstrip("/") + "/chat.postMessage",
                        {"channel": event.get("channel"), "thread_ts": event.get("thread_ts") or event.get("ts")},
                        {"Authorization": f"Bearer {settings.slack_bot_token}"})
    return {"ok": True}
