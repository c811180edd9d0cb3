"""Incidents: list and read records, ingest a document (write key), start a repro check (write key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.bodies import parse_model
from api.deps import (
    IngestLockDep,
    JobsDep,
    KBDep,
    MetricsDep,
    SettingsDep,
    require_read_key,
    require_write_key,
)
from api.errors import ERROR_RESPONSES, APIError, ErrorResponse
from api.jobs import Job, ReproParams
from api.limits import decode_text
from kb.kb import IngestOutcome
from kb.records import Incident

router = APIRouter(prefix="/v1", tags=["incidents"])

ID_PATH = r"^[a-z0-9][a-z0-9._-]{1,80}$"


class IncidentPage(BaseModel):
    total: int
    limit: int
    offset: int
    items: list[Incident]


class IngestRequest(BaseModel):
    """A curated incident.md (YAML front matter) or a raw article (markdown, text, HTML)."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)
    name: str = Field(default="upload.md", min_length=1, max_length=200, description="file name; its suffix "
                      "hints the format")
    fmt: str | None = Field(default=None, max_length=20, description="md | txt | html (default: from name)")
    allow_duplicate: bool = False


INGEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": IngestRequest.model_json_schema()},
            "text/markdown": {"schema": {"type": "string"}},
            "text/plain": {"schema": {"type": "string"}},
            "text/html": {"schema": {"type": "string"}},
        },
    }
}


@router.get("/incidents", response_model=IncidentPage, responses=ERROR_RESPONSES,
            dependencies=[Depends(require_read_key)])
def list_incidents(
    kb: KBDep,
    settings: SettingsDep,
    framework: Annotated[str | None, Query(max_length=100)] = None,
    algorithm: Annotated[str | None, Query(max_length=100)] = None,
    category: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> IncidentPage:
    """Incidents matching the filters (case-insensitive), sorted by id, one page at a time."""
    records = kb.list(framework=framework, algorithm=algorithm, category=category)
    limit = min(limit, settings.max_page_size)
    return IncidentPage(total=len(records), limit=limit, offset=offset, items=records[offset:offset + limit])


@router.get("/incidents/{incident_id}", response_model=Incident, responses=ERROR_RESPONSES,
            dependencies=[Depends(require_read_key)])
def get_incident(incident_id: str, kb: KBDep) -> Incident:
    """The whole record, both languages."""
    return kb.get(incident_id)


@router.get("/stats", dependencies=[Depends(require_read_key)], responses=ERROR_RESPONSES)
def stats(kb: KBDep) -> dict:
    """Counts by framework, category, language, algorithm; index metadata."""
    return kb.stats()


@router.post("/incidents", response_model=IngestOutcome, openapi_extra=INGEST_BODY,
             dependencies=[Depends(require_write_key)],
             responses={**ERROR_RESPONSES, 201: {"model": IngestOutcome, "description": "created"},
                        409: {"model": ErrorResponse, "description": "near-duplicate of an existing record"}})
async def ingest(request: Request, response: Response, metrics: MetricsDep, kb: KBDep, lock: IngestLockDep,
                 name: Annotated[str, Query(min_length=1, max_length=200)] = "upload.md",
                 fmt: Annotated[str | None, Query(max_length=20)] = None,
                 allow_duplicate: bool = False) -> IngestOutcome:
    """Add or update a record from a document; the index is rebuilt before the answer (readers keep working)."""
    ctype = request.headers.get("content-type", "text/plain").split(";")[0].strip().lower()
    raw = await request.body()
    if ctype == "application/json":
        body = parse_model(IngestRequest, raw)
    elif ctype.startswith("text/"):
        body = IngestRequest(text=decode_text(raw, "document") or " ", name=name, fmt=fmt,
                             allow_duplicate=allow_duplicate)
    else:
        raise APIError(415, "unsupported_media_type",
                       f"unsupported Content-Type {ctype!r}: send application/json, text/markdown or text/plain")
    if not body.text.strip():
        raise APIError(422, "invalid_input", "the document is empty")
    outcome = await run_in_threadpool(_ingest_locked, kb, lock, body)
    metrics.ingests.labels(outcome.status).inc()
    if outcome.status == "duplicate":
        raise APIError(409, "duplicate", "; ".join(outcome.warnings) or
                       f"near-duplicate of {', '.join(outcome.near_duplicates)}")
    if outcome.status == "error":
        raise APIError(422, "invalid_input", outcome.error or "the document could not be ingested")
    response.status_code = 201 if outcome.status == "created" else 200
    return outcome


def _ingest_locked(kb, lock, body: IngestRequest) -> IngestOutcome:
    # One writer at a time; readers keep using the old index and case model until the library swaps in the new
    # ones, which the writer builds here so that no reader waits for them.
    with lock:
        outcome = kb.ingest_text(body.text, name=body.name, fmt=body.fmt, allow_duplicate=body.allow_duplicate)
        if outcome.status in ("created", "updated"):
            kb.build_index()
            kb.case_model()
        return outcome


@router.post("/incidents/{incident_id}/repro", response_model=Job, status_code=202,
             dependencies=[Depends(require_write_key)],
             responses={**ERROR_RESPONSES, 409: {"model": ErrorResponse, "description": "no repro check"},
                        429: {"model": ErrorResponse, "description": "too many jobs pending"}})
def start_repro(response: Response, incident_id: str, kb: KBDep, jobs: JobsDep,
                params: ReproParams | None = None) -> Job:
    """Run the incident's repro check in the background; poll `GET /v1/jobs/{id}` for the verdict."""
    inc = kb.get(incident_id)
    if not inc.repro.path:
        raise APIError(409, "no_repro", f"incident {incident_id!r} has no repro check")
    # Unknown settings or values out of bounds are refused here with 422, before a job exists.
    job = jobs.submit(incident_id, params or ReproParams())
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return job
