"""Runs repro checks in subprocesses with a timeout and collects their verdicts (`kb repro`)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from kb.errors import InputError, NotFound
from kb.repro.harness import Verdict

DEFAULT_TIMEOUT = 180.0
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{1,80}")
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _incidents_dir(incidents_dir: str | os.PathLike | None) -> Path:
    try:
        from kb.paths import incidents_dir as locate
    except ImportError:
        env = os.environ.get("KB_INCIDENTS_DIR")
        return Path(incidents_dir or env or _REPO_ROOT / "incidents").expanduser().resolve()
    return locate(incidents_dir)


def check_path(incident_id: str, incidents_dir: str | os.PathLike | None = None) -> Path:
    """incidents/<id>/repro.py, or NotFound with a clear message."""
    if not _ID.fullmatch(incident_id or ""):
        raise NotFound(f"not an incident id: {incident_id!r}")
    folder = _incidents_dir(incidents_dir) / incident_id
    if not folder.is_dir():
        raise NotFound(f"unknown incident {incident_id!r} (no folder {folder})")
    path = folder / "repro.py"
    if not path.is_file():
        raise NotFound(f"incident {incident_id!r} has no repro check ({path} is missing)")
    return path


def list_checks(incidents_dir: str | os.PathLike | None = None) -> list[str]:
    root = _incidents_dir(incidents_dir)
    return sorted(p.parent.name for p in root.glob("*/repro.py")) if root.is_dir() else []


def _parse(incident_id: str, stdout: str, stderr: str, rc: int) -> Verdict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "reproduced" not in data:
                return Verdict(incident_id=incident_id, error="printed JSON that is not a harness verdict: write the "
                                                              "check on kb.repro.harness (docs/REPRO.md)")
            return Verdict.model_validate(data)
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return Verdict(incident_id=incident_id, error=f"no verdict (exit {rc}): {tail[:500]}")


def run_check(incident_id: str, incidents_dir: str | os.PathLike | None = None, device: str = "auto",
              settings_override: dict[str, Any] | None = None, timeout: float = DEFAULT_TIMEOUT,
              facts: dict[str, Any] | None = None, framework: bool = True) -> Verdict:
    """Run incidents/<id>/repro.py in a subprocess and return its verdict. A timeout or a crash becomes
    `Verdict.error` (exit code 2); an unknown id raises NotFound."""
    path = check_path(incident_id, incidents_dir)
    cmd = [sys.executable, str(path), "--json", "--device", device]
    try:
        if settings_override:
            cmd += ["--settings", json.dumps(settings_override)]
        if facts:
            cmd += ["--facts", json.dumps(facts)]
    except (TypeError, ValueError) as e:
        raise InputError(f"settings must be JSON-serialisable: {e}") from None
    if not framework:
        cmd.append("--no-framework")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env["HF_HUB_OFFLINE"] = "1"  # checks build models from configs; nothing may download
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(_REPO_ROOT), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the check's own process group only
        proc.communicate()
        return Verdict(incident_id=incident_id, device=device, seconds=float(timeout),
                       error=f"timed out after {timeout:g}s")
    return _parse(incident_id, out, err, proc.returncode)


def run_all(incidents_dir: str | os.PathLike | None = None, device: str = "auto", timeout: float = DEFAULT_TIMEOUT,
            framework: bool = True, ids: list[str] | None = None) -> list[Verdict]:
    """Every check under the incidents folder (or `ids`), one subprocess each, in id order."""
    out: list[Verdict] = []
    for i in ids or list_checks(incidents_dir):
        try:
            out.append(run_check(i, incidents_dir, device, timeout=timeout, framework=framework))
        except NotFound as e:  # a folder renamed while the run was going on: report it, run the rest
            out.append(Verdict(incident_id=i, device=device, error=str(e)))
    return out
