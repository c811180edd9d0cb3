"""Request dependencies: the settings, the opened knowledge base, and API-key checks."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from api.errors import APIError
from api.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_kb(request: Request):
    """The app's KnowledgeBase (opened once per process)."""
    return request.app.state.kb


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def key_is_valid(presented: str | None, keys: list[str]) -> bool:
    """Constant-time membership: every configured key is compared, whatever matches first."""
    if not presented or not keys:
        return False
    given = presented.encode("utf-8", "surrogateescape")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key.encode("utf-8"))
    return ok


def _require(request: Request, settings: Settings) -> None:
    if not settings.api_key_list:
        raise APIError(401, "unauthorized", "no API keys are configured on this server (set KB_API_KEYS)",
                       headers={"WWW-Authenticate": "Bearer"})
    if not key_is_valid(presented_key(request), settings.api_key_list):
        raise APIError(401, "unauthorized", "missing or invalid API key (Authorization: Bearer KEY or X-API-Key)",
                       headers={"WWW-Authenticate": "Bearer"})


def require_write_key(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> None:
    _require(request, settings)


def require_read_key(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> None:
    if settings.require_key_for_reads:
        _require(request, settings)


SettingsDep = Annotated[Settings, Depends(get_settings)]
