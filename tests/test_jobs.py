"""Repro jobs under attack: bounded settings, limited check processes, no survivors after a stop, stale-job recovery."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from api.app import create_app
from api.jobs import Job, ReproParams, process_token
from api.loopback import LoopbackServer, free_port
from api.settings import Settings
from kb.errors import InputError
from kb.repro import runner

KEY = "jobs-test-key-0123456789"


def _check_with(param: str, repo_root: Path) -> str:
    for incident_id in runner.list_checks(repo_root / "incidents"):
        if param in runner.declared_parameters(incident_id, repo_root / "incidents"):
            return incident_id
    pytest.skip(f"no repro check declares {param!r}")


# A stand-in for a long repro run: it starts a child of its own, records both pids, and sleeps.
LONG_CHECK = '''"""Test stub: a repro check that never finishes (it starts a child and sleeps)."""
import subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
Path(__file__).with_name("pids").write_text(f"{__import__('os').getpid()} {child.pid}")
time.sleep(600)
'''

# A stub that reports the limits it runs under as a harness verdict.
LIMITS_CHECK = '''"""Test stub: prints its resource limits as a verdict, then tries to allocate `alloc_mb`."""
import json, resource, sys
args = sys.argv
settings = json.loads(args[args.index("--settings") + 1]) if "--settings" in args else {}
ev = {"as": resource.getrlimit(resource.RLIMIT_AS)[0], "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0]}
mb = int(settings.get("micro_batch_size") or 0)  # read as settings.get("micro_batch_size"): declared
if mb:
    block = bytearray(mb * 1024 * 1024)
    ev["allocated"] = len(block)
print(json.dumps({"incident_id": "x", "reproduced": False, "evidence": {"run": ev}}))
'''


def _stub_incidents(tmp_path: Path, repo_root: Path, source: str) -> tuple[Path, str]:
    """A one-incident folder: a real curated record whose repro.py is replaced by `source`."""
    incident_id = runner.list_checks(repo_root / "incidents")[0]
    root = tmp_path / "incidents"
    shutil.copytree(repo_root / "incidents" / incident_id, root / incident_id)
    (root / incident_id / "repro.py").write_text(source, encoding="utf-8")
    return root, incident_id


# ---------------------------------------------------------------- settings are validated before anything runs
def test_runner_refuses_out_of_bound_and_undeclared_settings(repo_root):
    incident_id = _check_with("num_generations", repo_root)
    with pytest.raises(InputError, match=r"num_generations: 4000000 is outside"):
        runner.run_check(incident_id, repo_root / "incidents", settings_override={"num_generations": 4_000_000})
    for bad in ({"num_generations": float("nan")}, {"num_generations": float("inf")}, {"no_such_knob": 1},
                {"num_generations": [1] * 10}, {"num_generations": {"a": 1}}, {"model": "x" * 10_000},
                {f"k{i}": 1 for i in range(100)}):
        with pytest.raises(InputError):
            runner.validate_settings(incident_id, bad, repo_root / "incidents")
    assert runner.validate_settings(incident_id, {"num_generations": 8}, repo_root / "incidents") == {
        "num_generations": 8}


def test_every_bound_names_a_setting_some_check_declares(repo_root):
    declared = set()
    for incident_id in runner.list_checks(repo_root / "incidents"):
        declared |= runner.declared_parameters(incident_id, repo_root / "incidents")
    assert set(runner.PARAM_BOUNDS) - {"gradient_accumulation_steps"} <= declared


@pytest.fixture()
def jobs_app(tmp_path, repo_root):
    settings = Settings(data_dir=str(tmp_path / "data"), incidents_dir=str(repo_root / "incidents"),
                        api_keys=KEY, warm_on_start=False)
    app = create_app(settings)
    with LoopbackServer(app) as url:
        yield url, app


def test_a_four_million_generation_job_is_refused_before_it_runs(jobs_app, repo_root):
    url, app = jobs_app
    incident_id = _check_with("num_generations", repo_root)
    headers = {"Authorization": f"Bearer {KEY}"}
    resp = httpx.post(f"{url}/v1/incidents/{incident_id}/repro", headers=headers, timeout=30,
                      json={"settings_override": {"num_generations": 4_000_000}})
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "invalid_input" and "num_generations" in resp.json()["error"]["message"]
    unknown = httpx.post(f"{url}/v1/incidents/{incident_id}/repro", headers=headers, timeout=30,
                         json={"settings_override": {"rm -rf": 1}})
    assert unknown.status_code == 422 and "accepts" in unknown.json()["error"]["message"]
    # Nothing was queued: no job record exists and nothing is active.
    assert not list((Path(app.state.kb.data_dir) / "jobs").glob("*.json"))
    assert app.state.jobs.counts() == {"queued": 0, "running": 0}


# ---------------------------------------------------------------- the check process is limited
def test_checks_run_with_memory_and_cpu_limits(tmp_path, repo_root):
    root, incident_id = _stub_incidents(tmp_path, repo_root, LIMITS_CHECK)
    ok = runner.run_check(incident_id, root, device="cpu", timeout=60, memory_mb=512)
    assert ok.error is None, ok.error
    assert ok.evidence["run"]["as"] == 512 * 1024 * 1024
    assert 0 < ok.evidence["run"]["cpu"] <= 60 * 2 + 10
    # Over the cap the check cannot allocate: it fails instead of taking the host's memory.
    over = runner.run_check(incident_id, root, device="cpu", timeout=60, memory_mb=128,
                            settings_override={"micro_batch_size": 200})
    assert over.error is not None and "allocated" not in over.evidence.get("run", {})


# ---------------------------------------------------------------- stale jobs
def test_jobs_orphaned_by_a_dead_server_are_failed_at_start_up(tmp_path, repo_root):
    data = tmp_path / "data"
    (data / "jobs").mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        records = {
            "a" * 32: Job(id="a" * 32, incident_id="x", status="running", created_at=time.time(),
                          started_at=time.time(), params=ReproParams(), owner=f"{dead.pid}:1"),
            "b" * 32: Job(id="b" * 32, incident_id="x", status="queued", created_at=time.time(),
                          params=ReproParams(), owner=None),
            # Another live worker's job on the same host: not this server's to fail.
            "c" * 32: Job(id="c" * 32, incident_id="x", status="running", created_at=time.time(),
                          started_at=time.time(), params=ReproParams(), owner=process_token(sleeper.pid)),
        }
        for job in records.values():
            (data / "jobs" / f"{job.id}.json").write_text(job.model_dump_json(), encoding="utf-8")
        app = create_app(Settings(data_dir=str(data), incidents_dir=str(repo_root / "incidents"),
                                  warm_on_start=False))
        with LoopbackServer(app) as url:
            got = {i: httpx.get(f"{url}/v1/jobs/{i}", timeout=30).json() for i in records}
    finally:
        sleeper.kill()
        sleeper.wait()
    assert got["a" * 32]["status"] == "failed" and got["a" * 32]["error"]["code"] == "server_restarted"
    assert "running" in got["a" * 32]["error"]["message"]
    assert got["b" * 32]["status"] == "failed" and "queued" in got["b" * 32]["error"]["message"]
    assert got["c" * 32]["status"] == "running"


# ---------------------------------------------------------------- stopping the server kills its checks
def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigterm_to_the_server_leaves_no_check_running(tmp_path, repo_root):
    root, incident_id = _stub_incidents(tmp_path, repo_root, LONG_CHECK)
    port = free_port()
    env = {**os.environ, "KB_DATA_DIR": str(tmp_path / "data"), "KB_INCIDENTS_DIR": str(root), "KB_API_KEYS": KEY,
           "KB_WARM_ON_START": "false", "PYTHONPATH": str(repo_root)}
    server = subprocess.Popen([sys.executable, "-m", "kb.cli", "serve", "--port", str(port), "--log-level",
                               "warning"], env=env, cwd=str(repo_root))
    pids: list[int] = []
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return server.poll() is not None and pytest.fail("kb serve exited early")

        _wait(up, 120, "kb serve to start")
        resp = httpx.post(f"{url}/v1/incidents/{incident_id}/repro", headers={"X-API-Key": KEY},
                          json={"device": "cpu"}, timeout=30)
        assert resp.status_code == 202, resp.text
        pid_file = root / incident_id / "pids"
        _wait(pid_file.exists, 60, "the check to start")
        time.sleep(0.2)
        pids = [int(x) for x in pid_file.read_text().split()]
        assert all(_alive(p) for p in pids)
        server.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal: exit status -SIGTERM, not a crash.
        assert server.wait(timeout=60) in (0, -signal.SIGTERM)
        _wait(lambda: not any(_alive(p) for p in pids), 30, f"check processes {pids} to die")
        job = json.loads(next((tmp_path / "data" / "jobs").glob("*.json")).read_text())
        assert job["status"] == "failed" and job["error"]["code"] == "server_stopped"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
