"""Run an ASGI app under uvicorn on a free 127.0.0.1 port in a background thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn

from api.server import HeaderTimeoutH11Protocol, uvicorn_options


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackServer:
    """`with LoopbackServer(app) as base_url: httpx.get(base_url + "/healthz")` — a real uvicorn server."""

    def __init__(self, app, port: int | None = None, log_level: str = "warning", startup_timeout: float = 60.0,
                 header_timeout_s: float | None = None, limit_concurrency: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        options = uvicorn_options(limit_concurrency=limit_concurrency)
        # The same protocol `kb serve` runs; a per-server subclass carries this server's header deadline.
        settings = getattr(getattr(app, "state", None), "settings", None)
        timeout = header_timeout_s or getattr(settings, "header_timeout_s", None)
        options["http"] = type("LoopbackProtocol", (HeaderTimeoutH11Protocol,), {"header_timeout": timeout})
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level=log_level,
                                                     lifespan="on", access_log=False, **options))
        self._thread = threading.Thread(target=self._server.run, name="kb-loopback", daemon=True)
        self._startup_timeout = startup_timeout

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
