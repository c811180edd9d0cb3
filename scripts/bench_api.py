"""Latency and throughput of POST /v1/diagnose and POST /v1/ask at 1, 8 and 32 concurrent clients.

    python scripts/bench_api.py                        # starts `kb serve` on a free loopback port
    python scripts/bench_api.py --url http://127.0.0.1:8000 --requests 500
    python scripts/bench_api.py --json-out bench-results/api.json

The server runs in its own process (`python -m kb.cli serve`), so the client does not share its GIL. Each
(endpoint, concurrency) cell sends a bounded number of requests after a short warm-up and stops by itself.
Prints a markdown table, then the same numbers as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent

# Representative inputs, cycled: short questions (en/zh) and pasted logs/configs of a few dozen lines.
QUESTIONS = [
    "DPO NLL loss nan",
    "ORPO log_odds_chosen nan with bf16 deepspeed",
    "GRPO advantages explode when group std is zero",
    "序列并行 DPO nll_loss 为 nan",
    "fp16 全参微调 loss 变成 nan",
    "grad_norm nan at step 0 with sdpa and deepspeed",
]
_LOG_LINES = [f"{{'loss': {0.69 - i * 0.001:.4f}, 'grad_norm': {3.1 - i * 0.01:.3f}, 'learning_rate': 1e-06, "
              f"'epoch': {i / 100:.2f}}}" for i in range(30)]
DIAGNOSE_BODIES = [
    {"log": "\n".join(_LOG_LINES + ["{'loss': nan, 'grad_norm': nan, 'nll_loss': nan, 'epoch': 0.31}"]),
     "config": "rlhf_type: dpo\nsequence_parallel_size: 4\nrpo_alpha: 1.0\nbf16: true\n"},
    {"log": "\n".join(_LOG_LINES + ["{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.31}"] * 3),
     "config": "fp16: true\nmodel_name_or_path: THUDM/chatglm-6b\nfinetuning_type: full\n"},
    {"question": "GRPO training reward std is 0 and advantages are nan", "config": "num_generations: 1\n"},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(stack: ExitStack, data_dir: str | None, workers: int) -> str:
    port = free_port()
    data = data_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="kb-bench-"))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "kb.cli", "--data-dir", data, "--incidents-dir", str(REPO / "incidents"), "serve",
           "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO)
    stack.callback(lambda: (proc.terminate(), proc.wait(timeout=30)))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kb serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("kb serve did not become ready within 600 s")


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


async def run_cell(url: str, endpoint: str, concurrency: int, n_requests: int) -> dict:
    bodies = [{"question": q, "k": 5} for q in QUESTIONS] if endpoint == "ask" else DIAGNOSE_BODIES
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies: list[float] = []
    errors = 0
    counter = iter(range(n_requests))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        for body in bodies:  # warm-up: one of each input, not measured
            await client.post(f"/v1/{endpoint}", json=body)

        async def worker() -> None:
            nonlocal errors
            for i in counter:
                t0 = time.perf_counter()
                resp = await client.post(f"/v1/{endpoint}", json=bodies[i % len(bodies)])
                latencies.append(time.perf_counter() - t0)
                if resp.status_code != 200:
                    errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    latencies.sort()
    return {"endpoint": f"POST /v1/{endpoint}", "concurrency": concurrency, "requests": len(latencies),
            "errors": errors, "p50_ms": round(percentile(latencies, 0.50) * 1000, 1),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
            "throughput_rps": round(len(latencies) / wall, 1), "wall_s": round(wall, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="an already running server (default: start `kb serve` here)")
    p.add_argument("--data-dir", help="data dir for the server started here (default: a temp dir)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of the server started here")
    p.add_argument("--requests", type=int, default=200, help="requests per (endpoint, concurrency) cell")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--json-out", help="also write the JSON here")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    with ExitStack() as stack:
        url = args.url or start_server(stack, args.data_dir, args.workers)
        cells = [asyncio.run(run_cell(url, ep, c, max(args.requests, c))) for ep in ("diagnose", "ask")
                 for c in levels]
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "processor": platform.processor() or platform.machine(), "server_workers": args.workers}
    print(f"\nMachine: {machine['cpus']} CPUs, {machine['platform']}, Python {machine['python']}, "
          f"server workers {args.workers}\n")
    print("| endpoint | clients | requests | errors | p50 ms | p99 ms | req/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        print(f"| {c['endpoint']} | {c['concurrency']} | {c['requests']} | {c['errors']} | {c['p50_ms']} | "
              f"{c['p99_ms']} | {c['throughput_rps']} |")
    result = {"machine": machine, "results": cells}
    print("\n" + json.dumps(result, indent=2))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 1 if any(c["errors"] for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
