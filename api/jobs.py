"""Background repro jobs: a bounded thread pool, job records as JSON files so every worker can read them."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.errors import APIError, ErrorBody
from kb.errors import KBError

try:  # the runner's own Verdict model documents the job answer; any JSON object when it is absent
    from kb.repro.harness import Verdict
except ImportError:  # pragma: no cover - the repro harness is an optional part of the library
    Verdict = dict[str, Any]  # type: ignore[misc]

JobStatus = Literal["queued", "running", "succeeded", "failed"]
_JOB_ID = re.compile(r"[0-9a-f]{32}")
# Finished job records kept on disk; older ones are pruned so the folder stays small.
KEEP_JOBS = 500


class ReproParams(BaseModel):
    """Optional settings of a repro run (all optional; defaults: auto device, the incident's own settings)."""

    model_config = ConfigDict(extra="forbid")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    settings_override: dict[str, Any] = Field(default_factory=dict)
    timeout: int | None = Field(default=None, ge=1, le=3600, description="seconds; capped by KB_REPRO_TIMEOUT_S")


class Job(BaseModel):
    id: str
    kind: Literal["repro"] = "repro"
    incident_id: str
    status: JobStatus
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    params: ReproParams
    # The repro check's verdict: reproduced (faulty run fails), fixed (the fix stays finite), evidence.
    verdict: Verdict | None = None
    error: ErrorBody | None = None


Runner = Callable[..., Any]


def default_runner() -> Runner:
    try:
        from kb.repro.runner import run_check
    except ImportError as e:  # the repro harness is an optional part of the library
        raise APIError(503, "repro_unavailable", f"the repro runner is not available: {e}") from None
    return run_check


class JobManager:
    def __init__(self, jobs_dir: Path, incidents_dir: Path, concurrency: int, max_pending: int,
                 max_timeout: int, runner: Runner | None = None) -> None:
        self.dir = jobs_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.incidents_dir = incidents_dir
        self.max_pending = max_pending
        self.max_timeout = max_timeout
        self._runner = runner
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kb-repro")
        self._lock = threading.Lock()
        self.active: dict[str, JobStatus] = {}  # this process's unfinished jobs

    # ------------------------------------------------------------ storage
    def _path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.json"

    def _write(self, job: Job) -> None:
        tmp = self.dir / f".{job.id}.{os.getpid()}.tmp"
        tmp.write_text(job.model_dump_json(), encoding="utf-8")
        os.replace(tmp, self._path(job.id))  # readers see the old or the new record, never half of one

    def get(self, job_id: str) -> Job:
        if not _JOB_ID.fullmatch(job_id):
            raise APIError(404, "not_found", f"no job with id {job_id!r}")
        try:
            return Job.model_validate(json.loads(self._path(job_id).read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise APIError(404, "not_found", f"no job with id {job_id!r}") from None

    def _prune(self) -> None:
        files = sorted(self.dir.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for p in files[:-KEEP_JOBS]:
            if p.stem not in self.active:
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------ running
    def submit(self, incident_id: str, params: ReproParams) -> Job:
        runner = self._runner or default_runner()
        with self._lock:
            if len(self.active) >= self.max_pending:
                raise APIError(429, "too_many_requests",
                               f"{len(self.active)} repro jobs are already queued or running "
                               "(KB_REPRO_MAX_PENDING); try again later", headers={"Retry-After": "30"})
            job = Job(id=uuid.uuid4().hex, incident_id=incident_id, status="queued", created_at=time.time(),
                      params=params)
            self.active[job.id] = "queued"
            self._write(job)
        self._prune()
        self._pool.submit(self._run, job, runner)
        return job

    def _run(self, job: Job, runner: Runner) -> None:
        job.status, job.started_at = "running", time.time()
        self.active[job.id] = "running"
        self._write(job)
        timeout = min(job.params.timeout or self.max_timeout, self.max_timeout)
        try:
            verdict = runner(job.incident_id, incidents_dir=self.incidents_dir, device=job.params.device,
                             settings_override=job.params.settings_override or None, timeout=timeout)
            job.verdict = verdict
            error = getattr(verdict, "error", None)
            # A check that could not run (timeout, crash, bad settings) is a failed job that keeps its verdict.
            job.status = "failed" if error else "succeeded"
            if error:
                job.error = ErrorBody(code="repro_error", message=str(error))
        except KBError as e:
            job.status, job.error = "failed", ErrorBody(code=e.code, message=str(e))
        except Exception as e:  # noqa: BLE001 - a crashing check is a failed job, not a dead worker
            job.status, job.error = "failed", ErrorBody(code="repro_crashed", message=f"{type(e).__name__}: {e}")
        job.finished_at = time.time()
        self._write(job)
        with self._lock:
            self.active.pop(job.id, None)

    def counts(self) -> dict[str, int]:
        statuses = list(self.active.values())
        return {"queued": statuses.count("queued"), "running": statuses.count("running")}

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
