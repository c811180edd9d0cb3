"""Slack: `/kb` slash command and Events API `app_mention`, signed with the app's signing secret."""

from __future__ import annotations

import hashlib
import hmac
import re

from fastapi import APIRouter, BackgroundTasks, Request

from api.admission import Admission, Overloaded
from api.bodies import parse_form, parse_object
from api.chatops.common import (
    NotConfigured,
    Unauthenticated,
    answer_limited,
    check_window,
    first_delivery,
    first_use,
    log,
    post_json,
)
from api.chatops.formatting import busy_message, to_slack
from api.chatops.replay import ReplayCache
from api.chatops.threads import ThreadMemory
from api.deps import AdmissionDep, HttpDep, KBDep, MetricsDep, ReplayDep, SettingsDep, ThreadsDep
from api.errors import APIError
from api.metrics import Metrics
from api.settings import Settings

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


async def _verified_body(request: Request, settings: Settings, replay: ReplayCache, metrics: Metrics) -> bytes:
    """The raw body once its signature, timestamp window and first use are proven; nothing is parsed before."""
    if not settings.slack_signing_secret:
        raise NotConfigured("Slack", "KB_SLACK_SIGNING_SECRET")
    body = await request.body()
    timestamp, sig = request.headers.get("x-slack-request-timestamp"), request.headers.get("x-slack-signature")
    try:
        verify(settings.slack_signing_secret, timestamp, sig, body, settings.slack_max_skew_s)
        # The signature covers timestamp and body: one use per signature, remembered for the whole window.
        await first_use(replay, f"slack-sig:{sig}", int(timestamp or 0) + settings.slack_max_skew_s)
    except Unauthenticated:
        metrics.chatops.labels("slack", "rejected").inc()
        raise
    return body


async def _answer_to(kb, http, admission: Admission, metrics: Metrics, settings: Settings, text: str, url: str,
                     extra: dict, headers: dict[str, str] | None = None, memory: ThreadMemory | None = None,
                     thread: str | None = None) -> None:
    try:
        msg = await answer_limited(admission, kb, text, settings.chatops_max_results, memory, thread)
    except Overloaded:
        metrics.chatops.labels("slack", "overloaded").inc()
        msg = busy_message(settings.retry_after_s)
    result = await post_json(http, url, {**to_slack(msg), **extra}, headers)
    metrics.chatops.labels("slack", "answered" if result is not None else "delivery_failed").inc()


@router.post("/commands", summary="Slack slash command (/kb ...)")
async def slash_command(request: Request, background: BackgroundTasks, settings: SettingsDep, kb: KBDep,
                        replay: ReplayDep, metrics: MetricsDep, admission: AdmissionDep, http: HttpDep) -> dict:
    """Acknowledges at once; the full answer goes to the command's response_url."""
    body = await _verified_body(request, settings, replay, metrics)
    form = parse_form(body)
    # The normalised URL is both the one checked and the one posted to.
    response_url = settings.allowed_response_url(form.get("response_url", ""))
    if response_url is None:
        raise APIError(422, "invalid_input", "response_url is not an allowed target (KB_SLACK_RESPONSE_URL_ALLOW)")
    if admission.saturated():
        raise Overloaded(settings.retry_after_s, "too many answers in progress")
    text = form.get("text", "")
    background.add_task(_answer_to, kb, http, admission, metrics, settings, text, response_url,
                        {"response_type": "in_channel", "replace_original": False})
    return {"response_type": "ephemeral", "text": "Looking through the known NaN incidents…"}


@router.post("/events", summary="Slack Events API (url_verification, app_mention)")
async def events(request: Request, background: BackgroundTasks, settings: SettingsDep, kb: KBDep,
                 replay: ReplayDep, metrics: MetricsDep, admission: AdmissionDep, http: HttpDep,
                 threads: ThreadsDep) -> dict:
    body = await _verified_body(request, settings, replay, metrics)
    payload = parse_object(body)
    if payload.get("type") == "url_verification":
        return {"challenge": str(payload.get("challenge", ""))}
    event = payload.get("event") or {}
    if not isinstance(event, dict):
        raise APIError(422, "invalid_input", "event is not a JSON object")
    if payload.get("type") != "event_callback" or event.get("type") != "app_mention" or event.get("bot_id"):
        return {"ok": True}
    # Slack redelivers when we are slow; answer each event once.
    event_key = str(payload.get("event_id") or event.get("client_msg_id") or event.get("ts"))
    if not await first_delivery(replay, f"slack-event:{event_key}"):
        return {"ok": True}
    if not settings.slack_bot_token:
        log.warning("app_mention received but KB_SLACK_BOT_TOKEN is not set; cannot reply")
        return {"ok": True}
    text = _MENTION.sub("", str(event.get("text", ""))).strip()
    root = event.get("thread_ts") or event.get("ts")
    # The answer goes into the mention's thread; a later mention there with answers only re-ranks its first paste.
    thread = f"slack:{payload.get('team_id', '')}:{event.get('channel', '')}:{root}" if root else None
    background.add_task(_answer_to, kb, http, admission, metrics, settings, text,
                        settings.slack_api_base.rstrip("/") + "/chat.postMessage",
                        {"channel": event.get("channel"), "thread_ts": root},
                        {"Authorization": f"Bearer {settings.slack_bot_token}"}, threads, thread)
    return {"ok": True}
