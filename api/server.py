"""uvicorn wiring shared by `kb serve` and the loopback test server: a header-read timeout and the server options."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT_S = 10.0


def header_timeout_s() -> float:
    try:
        value = float(os.environ.get("KB_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S))
    except ValueError:
        return DEFAULT_HEADER_TIMEOUT_S
    return value if value > 0 else DEFAULT_HEADER_TIMEOUT_S


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for a request's headers (uvicorn has none: a client that sends one
    header byte a minute holds its connection forever). The clock starts when the connection opens, or when the
    first byte of the next request on a kept-alive connection arrives; the connection is closed if the request
    line and headers are not complete by then. Body reads have their own deadline (api.limits)."""

    header_timeout: float | None = None  # None: KB_HEADER_TIMEOUT_S, else 10 s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._kb_timer: asyncio.TimerHandle | None = None
        self._kb_cycle = None
        super().connection_made(transport)
        self._kb_arm()

    def _kb_arm(self) -> None:
        self._kb_cycle = self.cycle
        timeout = self.header_timeout if self.header_timeout is not None else header_timeout_s()
        self._kb_timer = self.loop.call_later(timeout, self._kb_expire)

    def _kb_cancel(self) -> None:
        if self._kb_timer is not None:
            self._kb_timer.cancel()
            self._kb_timer = None

    def _kb_expire(self) -> None:
        self._kb_timer = None
        # No new request began since the clock started: its headers are still incomplete.
        if self.cycle is self._kb_cycle and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._kb_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._kb_arm()
        super().data_received(data)
        if self._kb_timer is not None and self.cycle is not self._kb_cycle:
            self._kb_cancel()  # the headers of a new request are in

    def connection_lost(self, exc: Exception | None) -> None:
        self._kb_cancel()
        super().connection_lost(exc)


def uvicorn_options(header_timeout_s: float | None = None, keep_alive_s: int = 5,
                    limit_concurrency: int | None = None, graceful_s: int = 10) -> dict[str, Any]:
    """Keyword arguments for uvicorn.run / uvicorn.Config that bound slow and idle clients."""
    if header_timeout_s is not None:
        os.environ["KB_HEADER_TIMEOUT_S"] = str(header_timeout_s)  # worker processes read it from here
    return {"http": "api.server:HeaderTimeoutH11Protocol", "timeout_keep_alive": keep_alive_s,
            "limit_concurrency": limit_concurrency, "timeout_graceful_shutdown": graceful_s,
            "h11_max_incomplete_event_size": 64 * 1024}
