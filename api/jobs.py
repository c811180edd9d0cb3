"""Background repro jobs: a bounded thread pool, job records as JSON files so every worker can read them.

Each check runs in its own process group with memory and CPU limits (kb.repro.runner); settings are validated
before a job is accepted; stopping the server kills running checks; a restart fails the jobs it orphaned."""

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
from kb.repro.harness import Verdict

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
    # The worker process that owns an unfinished job ("pid:start-ticks"); a restart fails jobs whose owner is gone.
    owner: str | None = None


Runner = Callable[..., Any]


def default_runner() -> Runner:
    from kb.repro.runner import run_check

    return run_check


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc), so a reused pid is not mistaken for it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def process_token(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_ticks(pid)}"


def owner_alive(owner: str | None) -> bool:
    if not owner or ":" not in owner:
        return False
    pid_s, ticks = owner.split(":", 1)
    try:
        pid = int(pid_s)
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # alive, owned by someone else
        pass
    return ticks == "?" or _start_ticks(pid) == ticks


class JobManager:
    def __init__(self, jobs_dir: Path, incidents_dir: Path, concurrency: int, max_pending: int,
                 max_timeout: int, runner: Runner | None = None, memory_mb: int = 4096) -> None:
        self.dir = jobs_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.incidents_dir = incidents_dir
        self.max_pending = max_pending
        self.max_timeout = max_timeout
        self._runner = runner
        self.memory_mb = memory_mb
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kb-repro")
        self._lock = threading.Lock()
        self._stopping = False
        self.owner = process_token()
        self.active: dict[str, JobStatus] = {}  # this process's unfinished jobs
        self._jobs: dict[str, Job] = {}

    # ------------------------------------------------------------ storage
    def _path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.json"

    def _write(self, job: Job) -> None:
        tmp = self.dir / f".{job.id}.{os.getpid()}.{threading.get_ident()}.tmp"
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

    def recover(self) -> int:
        """Fail the queued / running jobs whose worker process is gone (a crash or restart left them behind)."""
        n = 0
        for path in self.dir.glob("*.json"):
            try:
                job = Job.model_validate(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
            if job.status in ("queued", "running") and not owner_alive(job.owner):
                job.status, job.finished_at = "failed", time.time()
                job.error = ErrorBody(code="server_restarted", message=f"the server stopped while the job was "
                                      f"{'running' if job.started_at else 'queued'}; start it again")
                self._write(job)
                n += 1
        return n

    # ------------------------------------------------------------ running
    def submit(self, incident_id: str, params: ReproParams) -> Job:
        from kb.repro.runner import validate_settings

        runner = self._runner or default_runner()
        # Refused here, before a record exists or anything runs (InputError -> 422).
        params.settings_override = validate_settings(incident_id, params.settings_override, self.incidents_dir)
        with self._lock:
            if self._stopping:
                raise APIError(503, "unavailable", "the server is stopping", headers={"Retry-After": "10"})
            if len(self.active) >= self.max_pending:
                raise APIError(429, "too_many_requests",
                               f"{len(self.active)} repro jobs are already queued or running "
                               "(KB_REPRO_MAX_PENDING); try again later", headers={"Retry-After": "30"})
            job = Job(id=uuid.uuid4().hex, incident_id=incident_id, status="queued", created_at=time.time(),
                      params=params, owner=self.owner)
            self.active[job.id] = "queued"
            self._jobs[job.id] = job
            self._write(job)
        self._prune()
        self._pool.submit(self._run, job, runner)
        return job

    def _run(self, job: Job, runner: Runner) -> None:
        if self._stopping:
            return
        job.status, job.started_at = "running", time.time()
        self.active[job.id] = "running"
        self._write(job)
        timeout = min(job.params.timeout or self.max_timeout, self.max_timeout)
        try:
            kwargs: dict[str, Any] = {"memory_mb": self.memory_mb} if self._runner is None else {}
            verdict = runner(job.incident_id, incidents_dir=self.incidents_dir, device=job.params.device,
                             settings_override=job.params.settings_override or None, timeout=timeout, **kwargs)
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
        if self._stopping and job.status == "failed":
            job.error = ErrorBody(code="server_stopped", message="the server stopped while the job was running")
        job.finished_at = time.time()
        job.owner = None
        self._write(job)
        with self._lock:
            self.active.pop(job.id, None)
            self._jobs.pop(job.id, None)

    def counts(self) -> dict[str, int]:
        statuses = list(self.active.values())
        return {"queued": statuses.count("queued"), "running": statuses.count("running")}

    def shutdown(self) -> None:
        """Stop: queued jobs never start, running checks are killed (their whole process group), and every
        unfinished record says why."""
        with self._lock:
            self._stopping = True
            unfinished = [j for j in self._jobs.values() if j.status in ("queued", "running")]
        self._pool.shutdown(wait=False, cancel_futures=True)
        from kb.repro.runner import kill_all

        kill_all()
        # Written here, not left to the worker threads: the process may exit before they wake up.
        for job in unfinished:
            when = "while the job was running" if job.status == "running" else "before the job started"
            job.status, job.finished_at, job.owner = "failed", time.time(), None
            job.error = ErrorBody(code="server_stopped", message=f"the server stopped {when}")
            self._write(job)
