"""`kb serve`: run the HTTP API (REST + chat-ops) under uvicorn."""

from __future__ import annotations

import math
import os
import sys

from kb.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the HTTP API (FastAPI under uvicorn)")
    p.add_argument("--host", default=os.environ.get("KB_HOST", "127.0.0.1"),
                   help="bind address (default 127.0.0.1; env KB_HOST; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=int(os.environ.get("KB_PORT", "8000")),
                   help="port (default 8000; env KB_PORT)")
    p.add_argument("--workers", type=int, default=int(os.environ.get("KB_WORKERS", "1")),
                   help="worker processes (default 1; 0 = one per CPU core; env KB_WORKERS). Workers map "
                        "the same read-only index and model weights, so memory grows little per worker")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--header-timeout", type=float, default=os.environ.get("KB_HEADER_TIMEOUT_S", "10"),
                   help="seconds a client has to send a request's headers (default 10; env KB_HEADER_TIMEOUT_S)")
    p.add_argument("--body-timeout", type=float, default=os.environ.get("KB_BODY_TIMEOUT_S", "30"),
                   help="seconds a client has to send a request's body, else 408 (default 30; env KB_BODY_TIMEOUT_S)")
    p.add_argument("--keep-alive", type=int, default=5, help="seconds an idle kept-alive connection stays open (5)")
    p.add_argument("--max-inflight", type=int, default=None,
                   help="diagnoses running at once per worker; beyond it and a short queue, 503 with Retry-After "
                        "(default 2; env KB_MAX_INFLIGHT)")
    p.add_argument("--limit-concurrency", type=int, default=None,
                   help="connections + tasks per worker before uvicorn answers 503 (default: no limit)")
    p.set_defaults(func=run)


def run(args) -> int:
    # Imported here so the library (and every other command) never imports the HTTP layer.
    import uvicorn

    for name, value in (("header_timeout", args.header_timeout), ("body_timeout", args.body_timeout),
                        ("max_inflight", args.max_inflight)):
        if name == "max_inflight" and value is None:
            continue  # the server's own default
        if value is None or not math.isfinite(value) or value <= 0:
            raise InputError(f"--{name.replace('_', '-')} must be a positive number, got {value}")

    # Workers are separate processes that build the app from the environment (uvicorn --factory),
    # so the global flags travel as environment variables.
    for flag, env in (("data_dir", "KB_DATA_DIR"), ("incidents_dir", "KB_INCIDENTS_DIR"),
                      ("model", "KB_EMBED_MODEL")):
        value = getattr(args, flag, None)
        if value:
            os.environ[env] = str(value)
    if args.workers <= 0:
        args.workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.workers > 1:
        _bind_tcp_sockets_as_tcp()
        # Build the index once, before the workers start, so they do not race to build it. In a child process:
        # a large build runs OpenMP threads (HNSW), and this process forks the workers next.
        _build_index_in_child(args)
        _preload_shared(args.model)
    os.environ["KB_BODY_TIMEOUT_S"] = str(args.body_timeout)
    if args.max_inflight is not None:
        os.environ["KB_MAX_INFLIGHT"] = str(args.max_inflight)
    from api.server import uvicorn_options

    # SIGTERM / Ctrl-C: uvicorn stops accepting, waits up to the graceful timeout, then runs the app's shutdown,
    # which kills running repro checks (api.jobs).
    uvicorn.run("api.app:create_app", factory=True, host=args.host, port=args.port,
                workers=max(1, args.workers), log_level=args.log_level, proxy_headers=True,
                **uvicorn_options(header_timeout_s=args.header_timeout, keep_alive_s=args.keep_alive,
                                  limit_concurrency=args.limit_concurrency))
    return 0


def _build_index(data_dir: str | None, incidents_dir: str | None, model: str | None) -> None:
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=data_dir, incidents_dir=incidents_dir, model=model, progress=False)
    kb.build_index()
    # Also the case base's first-use work (its vectors, token cuts and the fitted text classifiers are cached in
    # the data dir): done once here, the workers only read those caches instead of each computing them.
    kb.case_model()


def _build_index_in_child(args) -> None:
    """Run the build in a fresh process and re-raise its error here (the CLI prints it as usual)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_build_index, args.data_dir, args.incidents_dir, args.model).result()


def _preload_shared(model: str | None) -> None:
    """Load once, here, what every worker only reads: the code, the embedding model (its tokenizer is ~400k
    small objects; its weights are mapped) and jieba's dictionary. Then freeze those objects out of the cyclic
    GC, whose passes would otherwise write to every page holding them, and fork the workers from this
    process (uvicorn spawns fresh interpreters by default), so they share these pages instead of each
    loading its own copy. Measured in README "Speed and memory"."""
    import gc
    import multiprocessing

    import uvicorn._subprocess as sub

    import api.app  # noqa: F401 - the app's modules, imported once for every worker
    from kb.embed import PACKAGED, get_embedder, model_name_from_env
    from kb.tokenize import load_segmenter

    # Only where fork is the platform's own way (Linux), only for the packaged numpy models (a torch model would
    # bring thread pools a fork can break), and only with the uvicorn layout this was written against; else the
    # workers start fresh, as uvicorn does by default.
    name = model_name_from_env(model)
    if (not sys.platform.startswith("linux") or not getattr(PACKAGED.get(name), "process_parallel", False)
            or not hasattr(sub, "spawn")):
        return
    get_embedder(name)
    load_segmenter()
    _cap_malloc_arenas()
    gc.collect()
    gc.freeze()
    sub.spawn = multiprocessing.get_context("fork")


def _cap_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own arena (up to 8 per core) and keeps their freed memory:
    the threads that run requests then grow a worker by tens of MB. Two arenas, as MALLOC_ARENA_MAX=2 would,
    unless the operator set that variable; forked workers inherit the setting. Not glibc: nothing to do."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def _bind_tcp_sockets_as_tcp() -> None:
    """uvicorn's multi-worker mode binds `socket.socket(family)`, i.e. proto 0; the workers' accepted
    connections inherit it and asyncio only sets TCP_NODELAY when proto is IPPROTO_TCP, so each keep-alive
    response waited for a delayed ACK (measured on loopback: p50 52 ms with 2 workers vs 6 ms on a new
    connection). Re-wrap the bound socket with the protocol spelled out."""
    import socket

    from uvicorn.config import Config

    original = Config.bind_socket
    if getattr(original, "_kb_tcp", False):
        return

    def bind_socket(self: Config) -> socket.socket:
        sock = original(self)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.proto == 0:
            sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
        return sock

    bind_socket._kb_tcp = True  # type: ignore[attr-defined]
    Config.bind_socket = bind_socket
