"""Runs repro checks in subprocesses with a timeout and collects their verdicts (`kb repro`)."""

from __future__ import annotations

import ast
import atexit
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kb.errors import InputError, NotFound
from kb.repro.harness import Verdict

DEFAULT_TIMEOUT = 180.0
# Address-space cap of a check (RLIMIT_AS). A CPU check of a toy model stays well under 2 GB; the cap turns a
# runaway setting into a MemoryError inside the check instead of an OOM-killed host.
DEFAULT_MEMORY_MB = 4096

# Bounds of the settings a check may be given (canonical fact name -> (min, max), inclusive). Every numeric
# setting not listed here gets GENERIC_BOUND. Sizes that allocate memory in a check (lengths, batch sizes,
# group sizes) are kept to what a toy model on a CPU can hold; rates and coefficients only need to be finite.
GENERIC_BOUND: tuple[float, float] = (-1e6, 1e6)
PARAM_BOUNDS: dict[str, tuple[float, float]] = {
    "num_generations": (1, 64),
    "rollout_n": (1, 64),
    "micro_batch_size": (1, 1024),
    "ppo_mini_batch_size": (1, 65536),
    "gradient_accumulation_steps": (1, 4096),
    # Real configs reach 128k-token contexts; a check given one still runs under the memory cap.
    "max_length": (1, 1_048_576),
    "max_prompt_length": (0, 1_048_576),
    "sequence_parallel_size": (1, 1024),
    "num_gpus": (1, 4096),
    "num_nodes": (1, 1024),
    "zero_stage": (0, 3),
    "zero_hpz_partition_size": (1, 1024),
    "learning_rate": (0.0, 1e4),
    "vision_learning_rate": (0.0, 1e4),
    "beta": (-1e4, 1e4),
    "kl_coef": (-1e4, 1e4),
    "rpo_alpha": (-1e4, 1e4),
}
MAX_SETTINGS = 32
MAX_SETTING_CHARS = 200
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{1,80}")
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _incidents_dir(incidents_dir: str | os.PathLike | None) -> Path:
    from kb.paths import incidents_dir as locate

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


def _record_keys(folder: Path) -> set[str]:
    """The settings the incident record names: `config:`, `repro.settings:` and every fact its triggers test."""
    from kb.errors import KBError
    from kb.repro.harness import load_record

    try:
        rec = load_record(folder / "repro.py")
    except (KBError, OSError, UnicodeDecodeError):
        return set()
    if rec is None:
        return set()
    facts = {c.fact for t in rec.triggers for c in (*t.all, *t.any, *t.none)}
    return set(rec.config) | set(rec.repro.settings) | facts


def _source_keys(path: Path) -> set[str]:
    """Setting names a check's source reads: every string constant used as `settings["x"]` /
    `settings.get("x")`. Read with `ast`, never imported (importing runs torch)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return set()
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "settings":
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "settings" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            keys.add(node.args[0].value)
    return keys


def declared_parameters(incident_id: str, incidents_dir: str | os.PathLike | None = None) -> set[str]:
    """The settings a check accepts: what its incident record names and what its source reads."""
    path = check_path(incident_id, incidents_dir)
    return _record_keys(path.parent) | _source_keys(path)


def _check_value(key: str, value: Any, where: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if len(value) > MAX_SETTING_CHARS:
            raise InputError(f"{where}{key}: a string of {len(value)} characters (at most {MAX_SETTING_CHARS})")
        return value
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise InputError(f"{where}{key}: {value} is not a finite number")
        lo, hi = PARAM_BOUNDS.get(key, GENERIC_BOUND)
        if not lo <= value <= hi:
            raise InputError(f"{where}{key}: {value} is outside [{lo:g}, {hi:g}]")
        return value
    raise InputError(f"{where}{key}: expected a number, a string, true/false or null, got {type(value).__name__}")


def validate_settings(incident_id: str, settings: dict[str, Any] | None,
                      incidents_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Check a settings override before anything runs: every key is a parameter the check declares, every
    value a scalar within its bound (PARAM_BOUNDS, else GENERIC_BOUND). Raises InputError (HTTP 422)."""
    if not settings:
        return {}
    if not isinstance(settings, dict):
        raise InputError("settings must be a JSON object: setting name -> value")
    if len(settings) > MAX_SETTINGS:
        raise InputError(f"{len(settings)} settings given; at most {MAX_SETTINGS}")
    declared = declared_parameters(incident_id, incidents_dir)
    unknown = sorted(str(k) for k in settings if k not in declared)
    if unknown:
        raise InputError(f"{incident_id} has no setting {', '.join(map(repr, unknown[:5]))}; it accepts: "
                         f"{', '.join(sorted(declared)) or 'none'}")
    return {k: _check_value(k, v, "settings.") for k, v in settings.items()}


def bound_facts(facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """A user's facts (from a config) keep every key; numeric values must still be finite and in bounds."""
    if not facts:
        return facts
    out: dict[str, Any] = {}
    for k, v in facts.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            _check_value(str(k), v, "facts.")
        out[str(k)] = v
    return out


# Process groups of checks running now, so a stopping server can kill them all (kill_all).
_LIVE: set[int] = set()
_LIVE_LOCK = threading.Lock()

# Runs in the child between fork and the check: limits first, then the check replaces this interpreter.
_LAUNCH = """import os, resource, sys
mem, cpu = int(sys.argv[1]), int(sys.argv[2])
if mem > 0:
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
if cpu > 0:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG = SIGKILL: die with the server even on kill -9
except Exception:
    pass
os.execv(sys.argv[3], sys.argv[3:])
"""


def _gpu_visible() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists()


def kill_all() -> int:
    """SIGKILL every running check's process group (the check and anything it started). Returns how many."""
    with _LIVE_LOCK:
        groups = list(_LIVE)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(groups)


atexit.register(kill_all)


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
              facts: dict[str, Any] | None = None, framework: bool = True,
              memory_mb: int | None = DEFAULT_MEMORY_MB) -> Verdict:
    """Run incidents/<id>/repro.py in a subprocess and return its verdict. A timeout or a crash becomes
    `Verdict.error` (exit code 2); an unknown id raises NotFound; bad settings raise InputError before anything
    runs. The check runs in its own process group with an address-space cap (`memory_mb`; not applied when a
    CUDA device may be used, since CUDA reserves far more address space than it uses) and a CPU-time cap."""
    path = check_path(incident_id, incidents_dir)
    settings_override = validate_settings(incident_id, settings_override, incidents_dir)
    facts = bound_facts(facts)
    mem = 0 if not memory_mb or (device != "cpu" and _gpu_visible()) else int(memory_mb) * 1024 * 1024
    cpu = max(1, math.ceil(timeout)) * 2 + 10 if timeout and math.isfinite(timeout) else 0
    cmd = [sys.executable, "-c", _LAUNCH, str(mem), str(cpu), sys.executable, str(path), "--json",
           "--device", device]
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
    with _LIVE_LOCK:  # registered under the lock so kill_all never misses a check that has just started
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=str(_REPO_ROOT), start_new_session=True)
        _LIVE.add(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid)  # the check's own process group only
        proc.communicate()
        return Verdict(incident_id=incident_id, device=device, seconds=float(timeout),
                       error=f"timed out after {timeout:g}s")
    finally:
        _killpg(proc.pid)  # whatever the check left behind in its group goes with it
        with _LIVE_LOCK:
            _LIVE.discard(proc.pid)
    if proc.returncode < 0:
        sig = -proc.returncode
        why = {signal.SIGKILL: "killed (server stopping, or out of memory)",
               signal.SIGXCPU: "CPU-time limit reached"}.get(sig, f"killed by signal {sig}")
        return Verdict(incident_id=incident_id, device=device, error=f"the check was {why}")
    return _parse(incident_id, out, err, proc.returncode)


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_all(incidents_dir: str | os.PathLike | None = None, device: str = "auto", timeout: float = DEFAULT_TIMEOUT,
            framework: bool = True, ids: list[str] | None = None, jobs: int = 1,
            on_done: Callable[[Verdict], None] | None = None) -> list[Verdict]:
    """Every check under the incidents folder (or `ids`), one subprocess each, verdicts in id order. `jobs` checks
    run at once (each is its own process, so they share nothing but the machine; most of a check's time is its
    process importing torch and starting CUDA). `on_done` is called with each verdict as it arrives."""
    if jobs < 1:
        raise InputError(f"jobs must be 1 or more, not {jobs}")
    ids = list(ids or list_checks(incidents_dir))

    def one(i: str) -> Verdict:
        try:
            v = run_check(i, incidents_dir, device, timeout=timeout, framework=framework)
        except NotFound as e:  # a folder renamed while the run was going on: report it, run the rest
            v = Verdict(incident_id=i, device=device, error=str(e))
        if on_done is not None:
            on_done(v)
        return v

    if jobs == 1 or len(ids) < 2:
        return [one(i) for i in ids]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(jobs, len(ids))) as pool:
        return list(pool.map(one, ids))  # map keeps the id order whatever order they finish in
