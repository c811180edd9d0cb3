"""GET /v1/jobs/{id}: the status of a background job and, when finished, its verdict."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.deps import JobsDep, require_read_key
from api.errors import ERROR_RESPONSES
from api.jobs import Job

router = APIRouter(prefix="/v1", tags=["jobs"], dependencies=[Depends(require_read_key)])


@router.get("/jobs/{job_id}", response_model=Job, responses=ERROR_RESPONSES)
def get_job(job_id: str, jobs: JobsDep) -> Job:
    """queued → running → succeeded (with `verdict`) or failed (with `error`)."""
    return jobs.get(job_id)
