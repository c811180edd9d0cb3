"""The FastAPI application factory: `create_app()` wires settings, the knowledge base, routers and handlers."""

from __future__ import annotations

import logging
import sys
import threading
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from api import errors
from api.admission import Admission
from api.chatops import routers as chatops_routers
from api.chatops.feishu import _TenantToken
from api.chatops.replay import ReplayCache
from api.chatops.threads import ThreadMemory
from api.jobs import JobManager, Runner
from api.limits import BodyLimitMiddleware
from api.metrics import Metrics, MetricsMiddleware
from api.routers import ask, diagnose, dify, health, incidents, jobs, web
from api.settings import Settings

log = logging.getLogger("kb.api")

DESCRIPTION = """Diagnose NaN / inf / collapsing losses in LLM fine-tuning and RLHF.

Ask a question, paste a log / config / command line, read incident records, add documents and run repro
checks. Errors are `{"error": {"code", "message"}}`. Write endpoints need `Authorization: Bearer KEY` or
`X-API-Key: KEY` (keys from `KB_API_KEYS`)."""


def _open_kb(settings: Settings):
    from kb.kb import KnowledgeBase

    return KnowledgeBase.open(data_dir=settings.data_dir, incidents_dir=settings.incidents_dir,
                              model=settings.embed_model)


def _warm(app: FastAPI) -> None:
    """Load the records, build or load the index and the embedder, so the first request is fast."""
    try:
        kb = app.state.kb
        kb.build_index()
        kb.embedder.encode(["warm up"], query=True)
        # One small diagnosis loads the rest a first request would wait for: jieba, the case index, the ranker.
        kb.diagnose(log="{'loss': nan, 'grad_norm': nan}", question="DPO 损失 nan", k=1)
        log.info("knowledge base ready: %d records", len(kb.records))
    except Exception as e:
        log.exception("warm-up failed")
        app.state.warm_error = f"{type(e).__name__}: {e}"
    finally:
        app.state.ready.set()


def create_app(settings: Settings | None = None, kb=None, repro_runner: Runner | None = None) -> FastAPI:
    """Build the app. `kb` defaults to `KnowledgeBase.open(...)` from the settings; `repro_runner` to
    `kb.repro.runner.run_check`. With no arguments everything comes from the environment (uvicorn --factory)."""
    settings = settings or Settings()
    kb = kb if kb is not None else _open_kb(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sys.setswitchinterval(settings.gil_switch_ms / 1000)
        app.state.http = httpx.AsyncClient(timeout=settings.chatops_timeout_s, follow_redirects=False)
        recovered = app.state.jobs.recover()
        if recovered:
            log.warning("marked %d orphaned repro job(s) failed (the server stopped while they ran)", recovered)
        if settings.warm_on_start:
            threading.Thread(target=_warm, args=(app,), name="kb-warm", daemon=True).start()
        else:
            app.state.ready.set()
        try:
            yield
        finally:
            app.state.jobs.shutdown()  # first: running checks die even if closing the HTTP client fails
            await app.state.http.aclose()

    # docs_url=None: web.install serves /docs from self-hosted assets (FastAPI's default loads a CDN).
    app = FastAPI(title="kb: why did my loss go NaN?", version="0.1.0", description=DESCRIPTION,
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.kb = kb
    app.state.metrics = Metrics()
    app.state.ingest_lock = threading.Lock()
    app.state.ready = threading.Event()
    app.state.warm_error = ""
    app.state.replay = ReplayCache(Path(kb.data_dir) / "chatops-replay.sqlite3", settings.replay_cache_rows)
    app.state.threads = ThreadMemory(Path(kb.data_dir) / "chatops-threads.sqlite3")
    app.state.admission = Admission(settings.max_inflight, settings.max_queued, settings.queue_wait_s,
                                    settings.retry_after_s)
    app.state.ask_admission = Admission(settings.ask_max_inflight, settings.ask_max_queued,
                                        settings.ask_queue_wait_s, settings.retry_after_s, what="answers")
    app.state.feishu_token = _TenantToken()
    app.state.jobs = JobManager(Path(kb.data_dir) / "jobs", Path(kb.incidents_dir), settings.repro_concurrency,
                                settings.repro_max_pending, settings.repro_timeout_s, runner=repro_runner,
                                memory_mb=settings.repro_memory_mb)

    errors.install(app)
    for module in (health, ask, diagnose, incidents, jobs, dify):
        app.include_router(module.router)
    web.install(app)
    for router in chatops_routers():
        app.include_router(router)
    # Added last = outermost: metrics see every answer, including the body limiter's 413s.
    app.add_middleware(BodyLimitMiddleware, settings=settings)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
