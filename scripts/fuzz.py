"""A longer fuzz campaign against `KnowledgeBase.diagnose`, ingest (`kb.ingest.parse_document`) and the HTTP API.

    python scripts/fuzz.py --n 20000                          # all three targets, 20,000 inputs each
    python scripts/fuzz.py --targets diagnose --n 5000 --save-crashes /tmp/fuzz-crashes
    python scripts/fuzz.py --targets api --n 2000 --json-out bench-results/fuzz.json

Inputs are generated from a seeded RNG: random Unicode, pieces of real incident records and logs, config lines
with hostile values (nan, inf, 1e309, huge integers), deep JSON / YAML nesting, long whitespace runs, lone
surrogates, NUL bytes and mixed encodings, each at most --max-bytes. Library targets run in a worker process that
is killed and restarted when one input takes longer than --hang-s (a hang); the API target runs `kb serve` in its
own process on 127.0.0.1, sends the inputs from 4 client threads and polls /healthz every 100 ms meanwhile.
Three more targets measure the server rather than fuzz it: `slowloris` holds --slowloris connections that never
finish their headers, `overload` sends --overload clients' diagnoses at once and samples the server's memory, and
`worst` keeps --worst-clients clients posting the hardest pastes found (worst_inputs) while timing /healthz.
`--retime REPORT` runs again, alone, the library inputs that an earlier report lists as over 1 s.

Prints one JSON report: per target the inputs run, crashes (exceptions other than kb.errors.KBError) and their
distinct causes (type and kb/ source line), hangs, inputs over 1 s, max latency, and for the API the status
classes, 5xx count and the slowest /healthz answer. --save-crashes writes each distinct crashing input as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# ---------------------------------------------------------------------------------------------------- inputs
CONFIG_KEYS = ["max_length", "cutoff_len", "max_seq_length", "micro_batch_size", "per_device_train_batch_size",
               "zero_stage", "learning_rate", "lr", "fp16", "bf16", "torch_dtype", "num_generations", "beta",
               "sequence_parallel_size", "gradient_accumulation_steps", "rpo_alpha", "loss_type", "deepspeed",
               "model_name_or_path", "num_gpus", "nproc_per_node", "warmup_ratio", "max_grad_norm", "stage"]
HOSTILE_VALUES = ["nan", "NaN", "inf", "-inf", "Infinity", ".nan", ".inf", "1e309", "-1e309", "1e-400", "0",
                  "-0", "99999999999999999999999999", "0x7fffffff", "1_000", "１２", "true", "null", "~", "[]",
                  "{}", "''", '"', "\\", "bf16", "fp16", "auto", "𝟙𝟚", "\u00a0", "\ud800"]
LOG_TEMPLATES = ["{{'loss': {v}, 'grad_norm': {v}, 'learning_rate': {v}, 'epoch': {v}}}",
                 "step {i}: loss={v} grad_norm={v}", "[rank{i}]: RuntimeError: {t}", "loss: {v}",
                 "{{\"loss\": {v}, \"nll_loss\": {v}}}", "Traceback (most recent call last):",
                 "  File \"{t}.py\", line {i}, in {t}", "torch.cuda.OutOfMemoryError: {t}",
                 "UserWarning: std(): degrees of freedom is <= 0", "{t}={v}", "--{k} {v}", "{k}: {v}"]


def _seed_texts() -> list[str]:
    texts = []
    for p in sorted((REPO / "incidents").glob("*/incident.md"))[:60]:
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except OSError:
            pass
    return texts or ["loss: nan\n"]


def _rand_text(rng: random.Random, n: int) -> str:
    pools = [(0x20, 0x7e), (0x4e00, 0x4fff), (0x00, 0x1f), (0x80, 0x2ff), (0x1f600, 0x1f64f), (0xfff0, 0xffff)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(pools)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _nest(rng: random.Random, depth: int) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return "[" * depth + "]" * depth
    if kind == 1:
        return '{"a":' * depth + "1" + "}" * depth
    if kind == 2:
        return "a: " + "[" * depth + "]" * depth
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + "  " * depth + "x"


def _piece(rng: random.Random, seeds: list[str], budget: int) -> str:
    r = rng.random()
    if r < 0.2:
        return _rand_text(rng, rng.randint(0, min(budget, 400)))
    if r < 0.4:
        s = rng.choice(seeds)
        a = rng.randrange(len(s))
        return s[a:a + rng.randint(1, min(budget, 4000))]
    if r < 0.6:
        k, v = rng.choice(CONFIG_KEYS), rng.choice(HOSTILE_VALUES + [str(rng.uniform(-1e6, 1e6))])
        return rng.choice(["{k}: {v}", "--{k} {v}", "--{k}={v}", '"{k}": {v},', "{k}={v}"]).format(k=k, v=v)
    if r < 0.8:
        return "\n".join(rng.choice(LOG_TEMPLATES).format(v=rng.choice(HOSTILE_VALUES + ["0.69", "nan"]),
                                                          i=rng.randint(0, 10**6), t=_rand_text(rng, 8),
                                                          k=rng.choice(CONFIG_KEYS))
                         for _ in range(rng.randint(1, 30)))
    if r < 0.97:
        return _nest(rng, rng.choice([5, 50, 200, 600, 1000, 1500, 3000]))
    width = rng.choice([100, 1000, 3000, 10000])
    return "a: " + " " * width + "x" + " " * width + rng.choice(["y", "", "=", ":"])


def gen_text(rng: random.Random, max_bytes: int) -> str:
    parts, size = [], 0
    for _ in range(rng.randint(1, 6)):
        p = _piece(rng, SEEDS, max_bytes - size)
        parts.append(p)
        size += len(p.encode("utf-8", "surrogatepass"))
        if size >= max_bytes:
            break
    text = rng.choice(["\n", "\r\n", " ", ""]).join(parts)
    raw = text.encode("utf-8", "surrogatepass")[:max_bytes]
    for cut in range(4):  # the cut may split a character: drop its partial bytes
        try:
            return raw[:len(raw) - cut].decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", "ignore")


def gen_diagnose(rng: random.Random, max_bytes: int) -> dict[str, Any]:
    fields = rng.sample(["log", "config", "question", "text"], rng.randint(1, 3))
    return {f: gen_text(rng, max_bytes // len(fields)) for f in fields}


def gen_ingest(rng: random.Random, max_bytes: int) -> dict[str, Any]:
    text = gen_text(rng, max_bytes)
    if rng.random() < 0.4:  # a curated-looking document with hostile front matter
        text = "---\nid: fuzz-x\nroot_cause: " + gen_text(rng, 2000) + "\n---\n" + text
    return {"text": text, "name": rng.choice(["a.md", "a.txt", "a.html", "a", "incident.md"])}


SEEDS: list[str] = []

# ---------------------------------------------------------------------------------------------------- library
def _worker(conn, data_dir: str, incidents_dir: str) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from kb.errors import KBError
    from kb.ingest.parse import parse_document
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=data_dir, incidents_dir=incidents_dir)
    kb.build_index()
    # Load the embedding model, jieba and the case index now: a first input would otherwise pay seconds of start-up.
    kb.diagnose(log="{'loss': nan}", question="loss nan 损失", config="bf16: true", k=1)
    parse_document("# DPO loss nan\n\nThe DPO loss is nan from step 1 with fp16 on a V100.\n", name="warm.md")
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        target, payload = msg
        t0 = time.perf_counter()
        outcome: tuple[str, str, str] = ("ok", "", "")
        try:
            if target == "diagnose":
                kb.diagnose(**payload, k=3)
            else:
                parse_document(payload["text"], name=payload["name"])
        except KBError as e:
            outcome = ("kberror", type(e).__name__, "")
        except BaseException as e:  # noqa: BLE001 - every other exception is what we are looking for
            frames = [f for f in traceback.extract_tb(e.__traceback__) if "/kb/" in f.filename]
            where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
            outcome = ("crash", type(e).__name__, where)
        conn.send((outcome, time.perf_counter() - t0))


class Worker:
    def __init__(self, data_dir: str, incidents_dir: str) -> None:
        self.args = (data_dir, incidents_dir)
        self.start()

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()  # so a worker that dies reads as EOF here instead of a silent wait
        if not self.conn.poll(600) or self.conn.recv() != "ready":
            raise RuntimeError("fuzz worker did not start")

    def run(self, target: str, payload: dict, hang_s: float):
        self.conn.send((target, payload))
        if self.conn.poll(hang_s):
            return self.conn.recv()
        self.proc.kill()
        self.proc.join()
        self.start()
        return ("hang", "", ""), hang_s

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def run_all(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def fuzz_library(target: str, n: int, rng: random.Random, args, save: Path | None,
                 only: set[int] | None = None) -> dict[str, Any]:
    """`n` inputs from `rng`, spread over --jobs worker processes (the inputs do not depend on the job count).
    `only`: run just these input numbers (the same inputs, regenerated from the seed) and skip the rest."""
    gen = gen_diagnose if target == "diagnose" else gen_ingest
    counts: Counter[str] = Counter()
    causes: Counter[str] = Counter()
    sizes: list[int] = []
    slow_at: list[int] = []
    state = {"slow": 0, "max": 0.0, "worst": None, "done": 0}
    lock = threading.Lock()
    feed = ((i, p) for i, p in ((i, gen(rng, args.max_bytes)) for i in range(n)) if only is None or i in only)

    def record(i: int, payload: dict, kind: str, exc: str, where: str, latency: float) -> None:
        counts[kind] += 1
        sizes.append(sum(len(v.encode("utf-8", "surrogatepass")) for v in payload.values()))
        if latency > 1.0:
            state["slow"] += 1
            slow_at.append(i)
            if save is not None and state["slow"] <= 50:
                save.mkdir(parents=True, exist_ok=True)
                (save / f"{target}-slow-{state['slow']:03d}.json").write_text(json.dumps(
                    {"target": target, "latency_s": round(latency, 3), "input": payload}, ensure_ascii=True),
                    encoding="utf-8")
        if latency > state["max"]:
            state["max"], state["worst"] = latency, payload
        if kind in ("crash", "hang"):
            cause = f"{exc} at {where}" if kind == "crash" else "hang"
            if save is not None and causes[cause] == 0:
                save.mkdir(parents=True, exist_ok=True)
                (save / f"{target}-{len(causes):03d}.json").write_text(json.dumps(
                    {"target": target, "cause": cause, "input": payload}, ensure_ascii=True), encoding="utf-8")
            causes[cause] += 1
        state["done"] += 1
        if args.progress and state["done"] % 1000 == 0:
            print(f"{target}: {state['done']}/{n} {dict(counts)} over 1 s: {state['slow']}", file=sys.stderr,
                  flush=True)

    def drive() -> None:
        worker = Worker(args.data_dir, args.incidents_dir)
        try:
            while True:
                with lock:
                    item = next(feed, None)  # generation stays in one thread: the inputs depend on the seed only
                if item is None:
                    return
                i, payload = item
                (kind, exc, where), latency = worker.run(target, payload, args.hang_s)
                with lock:
                    record(i, payload, kind, exc, where, latency)
        finally:
            worker.close()

    run_all([threading.Thread(target=drive) for _ in range(max(1, args.jobs))])
    sizes.sort()
    worst = state["worst"]
    return {"inputs": n if only is None else len(only), "ok": counts["ok"], "kb_errors": counts["kberror"],
            "crashes": counts["crash"], "hangs": counts["hang"], "distinct_causes": dict(causes),
            "over_1s": state["slow"], "over_1s_inputs": sorted(slow_at),
            "max_latency_s": round(state["max"], 3),
            "input_bytes": {"median": sizes[len(sizes) // 2] if sizes else 0, "max": sizes[-1] if sizes else 0},
            "slowest_input": None if worst is None else {k: v[:200] for k, v in worst.items()}}


# ---------------------------------------------------------------------------------------------------- API
KEY = "fuzz-key-0123456789"


def gen_request(rng: random.Random, max_bytes: int) -> dict[str, Any]:
    r = rng.random()
    text = gen_text(rng, max_bytes)
    if r < 0.35:
        body = json.dumps(gen_diagnose(rng, max_bytes), ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
        return {"method": "POST", "path": "/v1/diagnose", "ctype": "application/json", "body": body}
    if r < 0.5:
        enc = rng.choice(["utf-8", "gb18030", "utf-16", "latin-1"])
        return {"method": "POST", "path": "/v1/diagnose", "ctype": rng.choice(["text/plain", "", "text/x-log"]),
                "body": text.encode(enc, "ignore")}
    if r < 0.6:
        body = json.dumps({"question": gen_text(rng, 3000), "k": rng.randint(-5, 60)}).encode("utf-8", "surrogatepass")
        return {"method": "POST", "path": "/v1/ask", "ctype": "application/json", "body": body}
    if r < 0.7:
        return {"method": "GET", "path": rng.choice(["/v1/incidents/", "/v1/jobs/", "/v1/incidents?category=",
                                                     "/v1/incidents?limit="]) + quote(_rand_text(rng, 20)),
                "ctype": "", "body": b""}
    if r < 0.8:
        override = {rng.choice(CONFIG_KEYS + ["num_generations"]): rng.choice(
            [10**rng.randint(0, 9), rng.random(), "x" * rng.randint(0, 500), None, [1], {"a": 1}])}
        return {"method": "POST", "path": f"/v1/incidents/{rng.choice(REPRO_IDS)}/repro",
                "ctype": "application/json", "body": json.dumps({"settings_override": override}).encode(),
                "key": True}
    if r < 0.9:
        path = rng.choice(["/chatops/slack/commands", "/chatops/slack/events", "/chatops/feishu/events",
                           "/chatops/dingtalk/robot"])
        body = text.encode("utf-8", "surrogatepass") if rng.random() < 0.5 else _nest(rng, 1500).encode()
        ctype = rng.choice(["application/json", "application/x-www-form-urlencoded"])
        return {"method": "POST", "path": path, "ctype": ctype, "body": body,
                "headers": {"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0=00",
                            "timestamp": str(int(time.time() * 1000)), "sign": "AAAA",
                            "X-Lark-Signature": "00", "X-Lark-Request-Timestamp": "1", "X-Lark-Request-Nonce": "n"}
                if rng.random() < 0.5 else {}}
    return {"method": "POST", "path": "/v1/incidents", "ctype": rng.choice(["application/json", "text/markdown"]),
            "body": text.encode("utf-8", "surrogatepass")[:4000], "key": rng.random() < 0.1}


REPRO_IDS: list[str] = ["none"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, log, extra: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """`kb serve` in its own process on a free loopback port, with every chat platform configured."""
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "KB_DATA_DIR": args.data_dir, "KB_INCIDENTS_DIR": args.incidents_dir, "KB_API_KEYS": KEY,
           "KB_SLACK_SIGNING_SECRET": "s", "KB_FEISHU_ENCRYPT_KEY": "k", "KB_FEISHU_VERIFICATION_TOKEN": "t",
           "KB_DINGTALK_APP_SECRET": "d", "KB_REPRO_MAX_PENDING": "2", "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, "-m", "kb.cli", "serve", "--port", str(port), "--log-level",
                               "warning", *(extra or [])], env=env, stdout=log, stderr=subprocess.STDOUT,
                              cwd=str(REPO))
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError("kb serve did not become ready")
        time.sleep(0.5)


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def probe_health(url: str, stop: threading.Event, health: list[float], every_s: float) -> None:
    """GET /healthz every `every_s` until `stop`, appending each answer's latency (30 s for no answer)."""
    import httpx

    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                c.get(url + "/healthz")
                health.append(time.perf_counter() - t0)
            except httpx.HTTPError:
                health.append(30.0)
            time.sleep(every_s)


def fuzz_api(n: int, rng: random.Random, args) -> dict[str, Any]:
    import httpx

    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - read after the server ends
    statuses: Counter[str] = Counter()
    lat: list[float] = []
    slow: list[dict[str, Any]] = []
    health: list[float] = []
    stop = threading.Event()
    lock = threading.Lock()
    server, url = start_server(args, log)
    try:
        requests = [gen_request(rng, args.max_bytes) for _ in range(n)]
        it = iter(requests)

        def client() -> None:
            with httpx.Client(base_url=url, timeout=args.hang_s) as c:
                while True:
                    with lock:
                        req = next(it, None)
                    if req is None:
                        return
                    headers = {"content-type": req["ctype"], **req.get("headers", {})}
                    if req.get("key"):
                        headers["X-API-Key"] = KEY
                    t0 = time.perf_counter()
                    try:
                        resp = c.request(req["method"], req["path"], content=req["body"], headers=headers)
                        key = f"{resp.status_code // 100}xx" if resp.status_code != 503 else "503"
                    except httpx.TimeoutException:
                        key = "timeout"
                    except (httpx.HTTPError, httpx.InvalidURL) as e:
                        key = f"transport:{type(e).__name__}"
                    took = time.perf_counter() - t0
                    with lock:
                        statuses[key] += 1
                        lat.append(took)
                        if took > 1.0:
                            slow.append({"path": req["path"], "bytes": len(req["body"]), "status": key,
                                         "latency_s": round(took, 3)})

        prober = threading.Thread(target=probe_health, args=(url, stop, health, 0.1), daemon=True)
        prober.start()
        run_all([threading.Thread(target=client) for _ in range(max(1, args.clients))])
    finally:
        stop.set()
        stop_server(server)
    log.seek(0)
    server_log = log.read()
    os.unlink(log.name)
    # The exception line that ends each server-side traceback, with its last kb/ frame: the causes of the 5xx.
    errors: Counter[str] = Counter()
    for block in server_log.split("Traceback (most recent call last):")[1:]:
        lines = [ln for ln in block.splitlines() if ln.strip()]
        frames = [ln.strip() for ln in lines if ln.strip().startswith("File ") and "/kb/" in ln]
        last = next((ln for ln in reversed(lines) if not ln.startswith(" ") and ":" in ln), "?")
        where = frames[-1].split("/kb/")[-1].split('",')[0] + ":" + frames[-1].split("line ")[-1].split(",")[0] \
            if frames else "?"
        errors[f"{last.split(':')[0]} at {where}"] += 1
    lat.sort()
    return {"inputs": n, "statuses": dict(statuses), "5xx": statuses["5xx"], "timeouts": statuses["timeout"],
            "over_1s": sum(1 for x in lat if x > 1.0), "max_latency_s": round(lat[-1], 3) if lat else 0.0,
            "p99_latency_s": round(lat[int(len(lat) * 0.99)], 3) if lat else 0.0,
            "healthz_max_ms": round(max(health, default=0.0) * 1000, 1),
            "healthz_p99_ms": round(sorted(health)[int(len(health) * 0.99)] * 1000, 1) if health else 0.0,
            "server_tracebacks": server_log.count("Traceback"), "server_errors": dict(errors),
            "slow_requests": sorted(slow, key=lambda r: -r["latency_s"])[:20]}


def slowloris(n: int, args) -> dict[str, Any]:
    """`n` connections that send one header line every 0.5 s and never finish: how many does the server close,
    and does /healthz still answer meanwhile?"""
    import httpx

    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - removed below
    server, url = start_server(args, log)
    port = int(url.rsplit(":", 1)[1])
    socks, closed_at = [], {}
    t0 = time.monotonic()
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            s.setblocking(False)
            socks.append(s)
        health = []
        while len(closed_at) < n and time.monotonic() - t0 < 120:
            for i, s in enumerate(socks):
                if i in closed_at:
                    continue
                try:
                    s.send(b"X-Drip: 1\r\n")
                    if s.recv(64) == b"":
                        closed_at[i] = time.monotonic() - t0
                except BlockingIOError:
                    pass
                except OSError:
                    closed_at[i] = time.monotonic() - t0
            h0 = time.perf_counter()
            httpx.get(url + "/healthz", timeout=30)
            health.append(time.perf_counter() - h0)
            time.sleep(0.5)
    finally:
        for s in socks:
            s.close()
        stop_server(server)
        os.unlink(log.name)
    times = sorted(closed_at.values())
    return {"connections": n, "closed_by_server": len(times), "still_open_after_s": round(time.monotonic() - t0, 1)
            if len(times) < n else None, "last_closed_after_s": round(times[-1], 1) if times else None,
            "healthz_max_ms": round(max(health, default=0) * 1000, 1)}


def overload(clients: list[int], args) -> dict[str, Any]:
    """`c` clients at once posting a real diagnosis each: statuses (503 + Retry-After past the admission cap) and
    the server's peak RSS, for each c; memory should follow the cap, not c."""
    import httpx
    import psutil

    body = json.dumps({"log": "\n".join(["{'loss': 0.69, 'grad_norm': 3.2, 'epoch': 0.01}"] * 50
                                         + ["{'loss': nan, 'grad_norm': nan, 'epoch': 0.03}"] * 5),
                       "config": "rlhf_type: dpo\nsequence_parallel_size: 4\nbf16: true"}).encode()
    out: dict[str, Any] = {}
    for c in clients:
        log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - removed below
        server, url = start_server(args, log)
        proc = psutil.Process(server.pid)
        peak = [proc.memory_info().rss]
        stop = threading.Event()

        def sample(proc=proc, peak=peak, stop=stop) -> None:
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], proc.memory_info().rss)
                except psutil.Error:
                    return
                time.sleep(0.05)

        statuses: Counter[str] = Counter()
        retry_after: set[str] = set()
        lock = threading.Lock()

        def one(url=url, statuses=statuses, retry_after=retry_after, lock=lock) -> None:
            try:
                r = httpx.post(url + "/v1/diagnose", content=body, headers={"content-type": "application/json"},
                               timeout=120)
                with lock:
                    statuses[str(r.status_code)] += 1
                    if r.status_code == 503:
                        retry_after.add(r.headers.get("retry-after", "missing"))
            except httpx.HTTPError as e:
                with lock:
                    statuses[type(e).__name__] += 1

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        idle = proc.memory_info().rss
        t0 = time.perf_counter()
        threads = [threading.Thread(target=one) for _ in range(c)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        out[str(c)] = {"statuses": dict(statuses), "retry_after": sorted(retry_after),
                       "seconds": round(time.perf_counter() - t0, 1), "rss_idle_mb": round(idle / 2**20),
                       "rss_peak_mb": round(peak[0] / 2**20)}
        stop_server(server)
        os.unlink(log.name)
    return out


def worst_inputs(max_bytes: int = 100_000) -> dict[str, str]:
    """Hand-built pastes just under --max-bytes that made the library work hardest (kept from the search for them):
    lines where every pattern finds its literals, thousands of metric records, old backtracking shapes."""
    rnd = random.Random(0)
    words = ["fp16", "bf16", "deepspeed", "zero3", "loss", "nan", "grad_norm", "inf", "lora", "dpo", "kto", "grpo",
             "sequence_parallel", "flash_attn", "sdpa", "学习率", "损失", "梯度", "溢出", "V100", "A100", "8", "GPUs",
             "torch==2.1.0", "transformers==4.40.0"]
    keys = ["fp16", "bf16", "learning_rate", "zero_stage", "max_length", "beta"]
    out = {
        "keyword lines": "\n".join(" ".join(rnd.choice(words) for _ in range(8)) for _ in range(2500)),
        "metric records": "\n".join(f"{{'loss': {'nan' if i % 7 == 0 else 0.69}, 'grad_norm': nan, 'learning_rate': "
                                     f"5e-06, 'rewards/chosen': nan, 'epoch': {i / 100}}}" for i in range(1200)),
        "config lines": "\n".join(f"{rnd.choice(keys)}: {rnd.choice(['true', 'nan', '1e-5', '3', '2048'])}"
                                   for _ in range(9000)),
        "tracebacks": ("Traceback (most recent call last):\n  File \"/a/b.py\", line 3, in f\nRuntimeError: "
                       "probability tensor contains either `inf`, `nan` or element < 0\n") * 800,
        "backtracking": ("a: " + " " * 3000 + "x" + " " * 3000 + "y\n") * 17,
    }
    return {k: v.encode()[:max_bytes - 200].decode("utf-8", "ignore") for k, v in out.items()}


def worst(clients: int, args) -> dict[str, Any]:
    """`clients` clients post the worst pastes (worst_inputs) to /v1/diagnose for --worst-seconds while /healthz is
    polled every 50 ms: how long a health check waits while the server works as hard as it can be made to."""
    import httpx

    bodies = [json.dumps({"log": v}).encode() for v in worst_inputs(args.max_bytes).values()]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 - removed below
    server, url = start_server(args, log)
    health: list[float] = []
    lat: list[float] = []
    statuses: Counter[str] = Counter()
    stop = threading.Event()
    lock = threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(timeout=120) as c:
            i = k
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = c.post(url + "/v1/diagnose", content=bodies[i % len(bodies)],
                               headers={"content-type": "application/json"})
                    key = str(r.status_code)
                except httpx.HTTPError as e:
                    key = type(e).__name__
                with lock:
                    statuses[key] += 1
                    if key == "200":
                        lat.append(time.perf_counter() - t0)
                i += 1

    try:
        threads = [threading.Thread(target=probe_health, args=(url, stop, health, 0.05), daemon=True)] + [
            threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
        for t in threads:
            t.start()
        time.sleep(args.worst_seconds)
        stop.set()
        for t in threads:
            t.join(130)
    finally:
        stop_server(server)
        os.unlink(log.name)
    health.sort()
    lat.sort()
    return {"clients": clients, "inputs": {k: len(v.encode()) for k, v in worst_inputs(args.max_bytes).items()},
            "statuses": dict(statuses), "diagnose_p50_s": round(lat[len(lat) // 2], 3) if lat else None,
            "diagnose_max_s": round(lat[-1], 3) if lat else None, "healthz_checks": len(health),
            "healthz_p50_ms": round(health[len(health) // 2] * 1000, 1) if health else None,
            "healthz_p99_ms": round(health[int(len(health) * 0.99)] * 1000, 1) if health else None,
            "healthz_max_ms": round(health[-1] * 1000, 1) if health else None}


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000, help="inputs per target (default 1000)")
    p.add_argument("--targets", default="diagnose,ingest,api",
                   help="comma-separated: diagnose, ingest, api, slowloris, overload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-bytes", type=int, default=100_000, help="largest input (default 100,000 bytes)")
    p.add_argument("--hang-s", type=float, default=10.0, help="an input taking longer than this is a hang")
    p.add_argument("--data-dir", help="a data dir with a built index (default: a temporary one, built first)")
    p.add_argument("--incidents-dir", default=str(REPO / "incidents"))
    p.add_argument("--save-crashes", type=Path, help="write each distinct crashing / hanging input, and up to 50 inputs over 1 s, here")
    p.add_argument("--json-out", type=Path, help="also write the report here")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--retime", type=Path, help="library targets: a report of an earlier run with the same --seed and "
                   "--n; run again, alone, only its inputs that took over 1 s (were they slow, or the machine busy?)")
    p.add_argument("--worst-clients", type=int, default=8, help="target worst: clients posting at once (default 8)")
    p.add_argument("--worst-seconds", type=float, default=30.0, help="target worst: how long (default 30 s)")
    p.add_argument("--clients", type=int, default=4, help="target api: concurrent client threads (default 4)")
    p.add_argument("--jobs", type=int, default=1, help="library targets: worker processes run at once (default 1)")
    p.add_argument("--slowloris", type=int, default=600, help="target slowloris: connections to hold (600)")
    p.add_argument("--overload", default="8,64", help="target overload: concurrent clients per round (8,64)")
    args = p.parse_args(argv)
    if args.n < 1 or args.max_bytes < 1 or args.hang_s <= 0:
        p.error("--n, --max-bytes and --hang-s must be positive")
    SEEDS.extend(_seed_texts())
    REPRO_IDS[:] = sorted(x.parent.name for x in Path(args.incidents_dir).glob("*/repro.py")) or ["none"]
    tmp = None
    if not args.data_dir:
        tmp = tempfile.TemporaryDirectory(prefix="kb-fuzz-")
        args.data_dir = tmp.name
        from kb.kb import KnowledgeBase

        KnowledgeBase.open(data_dir=args.data_dir, incidents_dir=args.incidents_dir).build_index()
    report: dict[str, Any] = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
                              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                        time.gmtime()),
                              "seed": args.seed, "max_bytes": args.max_bytes, "hang_s": args.hang_s}
    t0 = time.time()
    for target in [t.strip() for t in args.targets.split(",") if t.strip()]:
        rng = random.Random(f"{args.seed}-{target}")
        started = time.time()
        if target in ("diagnose", "ingest"):
            only = None
            if args.retime:
                only = set(json.loads(args.retime.read_text(encoding="utf-8"))[target]["over_1s_inputs"])
            report[target] = fuzz_library(target, args.n, rng, args, args.save_crashes, only)
        elif target == "api":
            report[target] = fuzz_api(args.n, rng, args)
        elif target == "slowloris":
            report[target] = slowloris(args.slowloris, args)
        elif target == "worst":
            report[target] = worst(args.worst_clients, args)
        elif target == "overload":
            report[target] = overload([int(x) for x in args.overload.split(",")], args)
        else:
            p.error(f"unknown target {target!r}")
        report[target]["seconds"] = round(time.time() - started, 1)
        print(json.dumps({target: report[target]}, ensure_ascii=False), file=sys.stderr, flush=True)
    report["seconds"] = round(time.time() - t0, 1)
    text = json.dumps(report, ensure_ascii=False, indent=2)
    print(text)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(text + "\n", encoding="utf-8")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
