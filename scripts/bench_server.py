"""`kb serve` under a real HTTP load generator (wrk): POST /v1/ask and POST /v1/diagnose (3 KB log).

    python scripts/bench_server.py                       # workers 1 and 2, 1 and 32 clients, 15 s each
    python scripts/bench_server.py --workers 2 --duration 10 --json-out /tmp/server.json

Starts `python -m kb.cli serve` on a free 127.0.0.1 port with its own data dir, waits for /readyz, runs
`wrk --latency` (apt-get install wrk) for each (endpoint, clients) cell, reads p50/p99 and req/s from wrk,
and the server's memory (RSS and PSS summed over the uvicorn parent and its workers, from
/proc/PID/smaps_rollup: PSS counts pages shared between workers once). Stops the server at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def log_3kb() -> str:
    """A realistic ~3 KB paste: a launch command, 45 metric lines, a DeepSpeed overflow line, the NaN."""
    lines = [("deepspeed --num_gpus 8 src/train.py --stage dpo --model_name_or_path Qwen/Qwen2-7B-Instruct "
             "--deepspeed ds_z3_config.json --fp16 --learning_rate 5e-6 --pref_beta 0.1")]
    lines += [f"{{'loss': {0.6931 - i * 0.004:.4f}, 'grad_norm': {3.1 + i * 0.07:.3f}, "
              f"'learning_rate': 5e-06, 'epoch': {i / 100:.2f}}}" for i in range(45)]
    tail = ["[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
            "{'loss': nan, 'grad_norm': nan, 'learning_rate': 5e-06, 'epoch': 0.46}"]
    # Metric lines are dropped (not the end cut off) to fit 3 KB: the overflow line and the NaN stay.
    while len("\n".join(lines + tail)) > 3072:
        lines.pop(1)
    return "\n".join(lines + tail)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(pid: int) -> list[int]:
    out = [pid]
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    for k in kids:
        out += tree(int(k))
    return out


def memory_mb(pid: int) -> dict:
    rss = pss = 0
    pids = tree(pid)
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return {"processes": len(pids), "rss_mb": round(rss / 1024), "pss_mb": round(pss / 1024)}


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("server not ready in time")


# Each request's body made distinct (a run id in the paste, a number in the question), so no cache inside kb
# (the query-vector cache, the tokenizer memo) answers a repeat: every request pays the full work.
DISTINCT_LUA = """
local n = 0
function init(args)
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "1", 16) % 100000)
  prefix = tostring(math.random(1, 1000000000))
end
request = function()
  n = n + 1
  local body = string.gsub(wrk.body, "@@ID@@", prefix .. "-" .. n)
  return wrk.format(nil, nil, nil, body)
end
"""


def wrk(url: str, path: str, body: str, ctype: str, clients: int, duration: int, tmp: Path,
        distinct: bool = True) -> dict:
    script = tmp / "post.lua"
    script.write_text(f"wrk.method = 'POST'\nwrk.headers['Content-Type'] = '{ctype}'\n"
                      f"wrk.body = {json.dumps(body)}\n" + (DISTINCT_LUA if distinct and "@@ID@@" in body else ""),
                      encoding="utf-8")
    cmd = ["wrk", f"-t{min(clients, 2)}", f"-c{clients}", f"-d{duration}s", "--timeout", "30s", "--latency",
           "-s", str(script), url + path]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float | None:
        m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
        if not m:
            return None
        v, unit = float(m.group(1)), m.group(2)
        return round(v / 1000 if unit == "us" else v * 1000 if unit == "s" else v, 2)

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {"clients": clients, "p50_ms": ms("50"), "p90_ms": ms("90"), "p99_ms": ms("99"),
            "req_s": float(rps.group(1)) if rps else None, "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": errors.group(0) if errors else ""}


def run_one(workers: int, duration: int, clients: list[int], data_dir: str | None, distinct: bool = True) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="kb-bench-server-"))
    data = data_dir or str(tmp / "data")
    env = {**os.environ, "KB_DATA_DIR": data, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "KB_DAEMON": "off"}
    # Build the index (and the embedder cache) once, outside the measured server.
    subprocess.run([sys.executable, "-m", "kb.cli", "-q", "index"], env=env, check=True, cwd=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "kb.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", str(workers), "--log-level", "warning"], env=env, cwd=REPO,
                            start_new_session=True)
    result: dict = {"workers": workers, "cells": []}
    try:
        wait_ready(url, proc)
        result["memory_idle"] = memory_mb(proc.pid)
        log = log_3kb()
        cases = [("/v1/ask", json.dumps({"question": "DPO NLL loss nan in run @@ID@@"}), "application/json"),
                 ("/v1/diagnose", "run @@ID@@\n" + log, "text/plain")]
        for path, body, ctype in cases:
            wrk(url, path, body, ctype, 2, 2, tmp, distinct)  # warm-up: first requests pay lazy loads
            for c in clients:
                cell = wrk(url, path, body, ctype, c, duration, tmp, distinct)
                cell["endpoint"] = path
                cell["distinct_bodies"] = distinct
                cell["memory"] = memory_mb(proc.pid)
                result["cells"].append(cell)
                print(json.dumps(cell), flush=True)
        result["log_bytes"] = len(log.encode())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--duration", type=int, default=15, help="seconds per cell")
    ap.add_argument("--data-dir", help="reuse a data dir with a built index (default: a fresh temp one)")
    ap.add_argument("--json-out")
    ap.add_argument("--repeat-bodies", action="store_true",
                    help="send one identical body per endpoint (caches answer repeats) instead of distinct ones")
    a = ap.parse_args()
    if not shutil.which("wrk"):
        print("wrk not found: apt-get install -y wrk", file=sys.stderr)
        return 2
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"), "cpus": os.cpu_count(),
           "load_avg_before": os.getloadavg(), "runs": []}
    for w in a.workers:
        out["runs"].append(run_one(w, a.duration, a.clients, a.data_dir, distinct=not a.repeat_bodies))
    out["load_avg_after"] = os.getloadavg()
    print("\n| workers | endpoint | clients | p50 ms | p99 ms | req/s | non-2xx | RSS MB | PSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out["runs"]:
        for c in r["cells"]:
            print(f"| {r['workers']} | {c['endpoint']} | {c['clients']} | {c['p50_ms']} | {c['p99_ms']} | "
                  f"{c['req_s']} | {c['non_2xx']} | {c['memory']['rss_mb']} | {c['memory']['pss_mb']} |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
