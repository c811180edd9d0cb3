"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import JobsDep, KBDep, MetricsDep
from api.errors import error_response

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict:
    """The process is up (no dependency is touched; runs on the event loop, never waits for a worker thread)."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "still loading the index, or it failed to load"}})
def readyz(request: Request) -> JSONResponse:
    """Ready when the records are loaded and the index is built (the first question will be fast)."""
    state = request.app.state
    if state.warm_error:
        return error_response(503, "not_ready", f"index failed to load: {state.warm_error}")
    if not state.ready.is_set():
        return error_response(503, "not_ready", "loading the knowledge base")
    return JSONResponse({"status": "ready", "records": len(state.kb.records)})


@router.get("/metrics", response_class=Response)
def metrics(request: Request, jobs: JobsDep, kb: KBDep, registry: MetricsDep) -> Response:
    """Prometheus text format (per process; with several workers use PROMETHEUS_MULTIPROC_DIR)."""
    for status, n in jobs.counts().items():
        registry.jobs.labels(status).set(n)
    if request.app.state.ready.is_set():  # records are loaded by the warm-up; counting them earlier would block
        registry.records.set(len(kb.records))
    return Response(generate_latest(registry.registry), media_type=CONTENT_TYPE_LATEST)
