"""Feishu / Lark: event subscription (url_verification, im.message.receive_v1), token + signature checks,
AES-encrypted payloads, event_id dedup, and an interactive-card reply through the Open API."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import time
from typing import Annotated

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from fastapi import APIRouter, BackgroundTasks, Depends, Request

from api.admission import Admission, Overloaded
from api.bodies import parse_json, parse_object
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
from api.chatops.formatting import busy_message, feishu_reply_body
from api.chatops.threads import ThreadMemory
from api.deps import AdmissionDep, HttpDep, KBDep, MetricsDep, ReplayDep, SettingsDep, ThreadsDep
from api.errors import APIError
from api.metrics import Metrics
from api.settings import Settings

router = APIRouter(prefix="/chatops/feishu", tags=["chatops"])
_MENTION = re.compile(r"@_user_\d+")


# ---------------------------------------------------------------- crypto (pure)
def _key(encrypt_key: str) -> bytes:
    return hashlib.sha256(encrypt_key.encode("utf-8")).digest()


def decrypt(encrypt_key: str, encrypted: str) -> str:
    """AES-256-CBC, key = SHA-256(encrypt key), IV = first 16 bytes of the base64-decoded payload, PKCS#7."""
    try:
        raw = base64.b64decode(encrypted, validate=True)
        if len(raw) < 32 or len(raw) % 16:
            raise ValueError("bad length")
        decryptor = Cipher(algorithms.AES(_key(encrypt_key)), modes.CBC(raw[:16])).decryptor()
        padded = decryptor.update(raw[16:]) + decryptor.finalize()
        unpadder = padding.PKCS7(128).unpadder()
        return (unpadder.update(padded) + unpadder.finalize()).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        # A payload that does not decrypt was not made with our key.
        raise Unauthenticated("encrypted payload does not decrypt with the configured encrypt key") from None


def encrypt(encrypt_key: str, plaintext: str, iv: bytes | None = None) -> str:
    """The inverse of `decrypt` (what Feishu does); used by tests and for local trials."""
    iv = iv or os.urandom(16)
    padder = padding.PKCS7(128).padder()
    data = padder.update(plaintext.encode("utf-8")) + padder.finalize()
    encryptor = Cipher(algorithms.AES(_key(encrypt_key)), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + encryptor.update(data) + encryptor.finalize()).decode()


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """X-Lark-Signature = hex(SHA-256(timestamp + nonce + encrypt_key + raw body))."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode("utf-8") + body).hexdigest()


def verify_signature(encrypt_key: str, timestamp: str | None, nonce: str | None, sig: str | None, body: bytes,
                     max_skew: int, now: float | None = None) -> None:
    if not (timestamp and nonce and sig):
        raise Unauthenticated("missing X-Lark-Request-Timestamp, X-Lark-Request-Nonce or X-Lark-Signature")
    try:
        ts = int(timestamp)
    except ValueError:
        raise Unauthenticated("X-Lark-Request-Timestamp is not a number") from None
    check_window(ts, max_skew, now)
    if not hmac.compare_digest(signature(timestamp, nonce, encrypt_key, body).encode(), sig.encode()):
        raise Unauthenticated("bad Feishu signature")


def _token_ok(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def message_text(event: dict) -> str:
    """The text of an im.message.receive_v1 event without the @bot mention placeholders."""
    message = event.get("message")
    if not isinstance(message, dict) or message.get("message_type") != "text":
        return ""
    try:
        content = json.loads(str(message.get("content") or "{}"))
    except (ValueError, RecursionError):
        return ""
    if not isinstance(content, dict):
        return ""
    return _MENTION.sub("", str(content.get("text", ""))).strip()


# ---------------------------------------------------------------- transport
class _TenantToken:
    """tenant_access_token cache (valid ~2 h; refreshed 5 minutes early)."""

    value: str = ""
    expires: float = 0.0


async def _tenant_token(http, settings: Settings, cache: _TenantToken) -> str | None:
    if cache.value and time.time() < cache.expires:
        return cache.value
    res = await post_json(http, settings.feishu_api_base.rstrip("/")
                          + "/open-apis/auth/v3/tenant_access_token/internal",
                          {"app_id": settings.feishu_app_id, "app_secret": settings.feishu_app_secret})
    if not res or res.get("code") != 0 or not res.get("tenant_access_token"):
        log.warning("Feishu tenant_access_token request failed: %s", res)
        return None
    cache.value = res["tenant_access_token"]
    cache.expires = time.time() + max(60, int(res.get("expire", 7200)) - 300)
    return cache.value


async def _reply(kb, http, admission: Admission, metrics: Metrics, settings: Settings, cache: _TenantToken,
                 message_id: str, text: str, memory: ThreadMemory | None = None, thread: str | None = None) -> None:
    try:
        msg = await answer_limited(admission, kb, text, settings.chatops_max_results, memory, thread)
    except Overloaded:
        metrics.chatops.labels("feishu", "overloaded").inc()
        msg = busy_message(settings.retry_after_s)
    token = await _tenant_token(http, settings, cache)
    ok = False
    if token:
        url = f"{settings.feishu_api_base.rstrip('/')}/open-apis/im/v1/messages/{message_id}/reply"
        res = await post_json(http, url, feishu_reply_body(msg), {"Authorization": f"Bearer {token}"})
        ok = bool(res is not None and res.get("code", 0) == 0)
    metrics.chatops.labels("feishu", "answered" if ok else "delivery_failed").inc()


def _token_cache(request: Request) -> _TenantToken:
    return request.app.state.feishu_token


# An unsigned request can only be a URL-verification challenge, which is small; nothing bigger is parsed unsigned.
UNSIGNED_MAX_BYTES = 16 * 1024


@router.post("/events", summary="Feishu / Lark event subscription")
async def events(request: Request, background: BackgroundTasks, s: SettingsDep, kb: KBDep, replay: ReplayDep,
                 metrics: MetricsDep, admission: AdmissionDep, http: HttpDep, threads: ThreadsDep,
                 token_cache: Annotated[_TenantToken, Depends(_token_cache)]) -> dict:
    if not (s.feishu_verification_token or s.feishu_encrypt_key):
        raise NotConfigured("Feishu", "KB_FEISHU_VERIFICATION_TOKEN and/or KB_FEISHU_ENCRYPT_KEY")
    body = await request.body()
    signed = "x-lark-signature" in request.headers
    rejected = metrics.chatops.labels("feishu", "rejected")
    if s.feishu_encrypt_key and signed:
        # The signature covers timestamp, nonce and the raw body: checked before a byte of it is parsed.
        sig = request.headers.get("x-lark-signature")
        timestamp = request.headers.get("x-lark-request-timestamp")
        try:
            verify_signature(s.feishu_encrypt_key, timestamp, request.headers.get("x-lark-request-nonce"), sig,
                             body, s.feishu_max_skew_s)
            await first_use(replay, f"feishu-sig:{sig}", int(timestamp or 0) + s.feishu_max_skew_s)
        except Unauthenticated:
            rejected.inc()
            raise
    elif s.feishu_encrypt_key and len(body) > UNSIGNED_MAX_BYTES:
        rejected.inc()
        raise Unauthenticated("unsigned event (encryption is configured; Feishu signs every event)")
    outer = parse_object(body)
    if "encrypt" in outer:
        if not s.feishu_encrypt_key:
            raise APIError(422, "invalid_input", "encrypted event but KB_FEISHU_ENCRYPT_KEY is not set")
        try:
            payload = parse_json(decrypt(s.feishu_encrypt_key, str(outer["encrypt"])).encode("utf-8"), "event")
        except APIError:
            raise Unauthenticated("decrypted payload is not JSON") from None
    else:
        payload = outer
    if not isinstance(payload, dict):
        raise APIError(422, "invalid_input", "event is not a JSON object")
    header = payload.get("header") if isinstance(payload.get("header"), dict) else {}
    token = header.get("token") if payload.get("schema") == "2.0" else payload.get("token")

    if payload.get("type") == "url_verification":
        # Feishu sends the challenge unsigned; the token (inside the encrypted payload when encryption is on)
        # is what proves it is ours.
        if s.feishu_verification_token and not _token_ok(s.feishu_verification_token, token):
            rejected.inc()
            raise Unauthenticated("bad verification token")
        if not s.feishu_verification_token and "encrypt" not in outer:
            raise Unauthenticated("unencrypted challenge without a configured verification token")
        return {"challenge": str(payload.get("challenge", ""))}

    try:
        if s.feishu_encrypt_key and not signed:
            raise Unauthenticated("unsigned event (encryption is configured; Feishu signs every event)")
        if s.feishu_verification_token and not _token_ok(s.feishu_verification_token, token):
            raise Unauthenticated("bad verification token")
    except Unauthenticated:
        rejected.inc()
        raise

    event_id = str(header.get("event_id") or payload.get("uuid") or "")
    if not event_id or not await first_delivery(replay, f"feishu-event:{event_id}"):
        metrics.chatops.labels("feishu", "duplicate").inc()
        return {}
    event = payload.get("event") if isinstance(payload.get("event"), dict) else {}
    if header.get("event_type") != "im.message.receive_v1":
        return {}
    text = message_text(event)
    message = event.get("message") if isinstance(event.get("message"), dict) else {}
    sender = event.get("sender") if isinstance(event.get("sender"), dict) else {}
    message_id = str(message.get("message_id") or "")
    if not message_id or sender.get("sender_type") == "app":
        return {}
    if not (s.feishu_app_id and s.feishu_app_secret):
        log.warning("Feishu message received but KB_FEISHU_APP_ID / KB_FEISHU_APP_SECRET are not set")
        return {}
    if admission.saturated():
        raise Overloaded(s.retry_after_s, "too many answers in progress")
    # The reply goes to the message, which starts a thread (a reply in it has the message as its root_id): a later
    # message there with answers only re-ranks the first paste.
    thread = f"feishu:{message.get('chat_id', '')}:{message.get('root_id') or message_id}"
    background.add_task(_reply, kb, http, admission, metrics, s, token_cache,
                        message_id, text, threads, thread)
    return {}
