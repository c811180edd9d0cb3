"""Request dependencies: settings, knowledge base, jobs, metrics, admission, replay cache, API-key checks.

Routes take these as typed parameters (`kb: KBDep`) instead of reading `request.app.state` themselves."""

from __future__ import annotations

import hmac
import threading
from typing import Annotated

import httpx
from fastapi import Depends, Request

from api.admission import Admission
from api.chatops.replay import ReplayCache
from api.chatops.threads import ThreadMemory
from api.errors import APIError
from api.jobs import JobManager
from api.metrics import Metrics
from api.settings import Settings
from kb.kb import KnowledgeBase


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_kb(request: Request) -> KnowledgeBase:
    """The app's KnowledgeBase (opened once per process)."""
    return request.app.state.kb


def get_jobs(request: Request) -> JobManager:
    return request.app.state.jobs


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def get_admission(request: Request) -> Admission:
    return request.app.state.admission


def get_ask_admission(request: Request) -> Admission:
    return request.app.state.ask_admission


def get_replay(request: Request) -> ReplayCache:
    return request.app.state.replay


def get_threads(request: Request) -> ThreadMemory:
    return request.app.state.threads


def get_http(request: Request) -> httpx.AsyncClient:
    """The app's outgoing HTTP client (chat replies), opened in the lifespan."""
    return request.app.state.http


def get_ingest_lock(request: Request) -> threading.Lock:
    return request.app.state.ingest_lock


SettingsDep = Annotated[Settings, Depends(get_settings)]
KBDep = Annotated[KnowledgeBase, Depends(get_kb)]
JobsDep = Annotated[JobManager, Depends(get_jobs)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
AdmissionDep = Annotated[Admission, Depends(get_admission)]
AskAdmissionDep = Annotated[Admission, Depends(get_ask_admission)]
ReplayDep = Annotated[ReplayCache, Depends(get_replay)]
ThreadsDep = Annotated[ThreadMemory, Depends(get_threads)]
HttpDep = Annotated[httpx.AsyncClient, Depends(get_http)]
IngestLockDep = Annotated[threading.Lock, Depends(get_ingest_lock)]


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


def require_write_key(request: Request, settings: SettingsDep) -> None:
    _require(request, settings)


def require_read_key(request: Request, settings: SettingsDep) -> None:
    if settings.require_key_for_reads:
        _require(request, settings)
