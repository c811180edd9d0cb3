"""Admission control: at most N requests of one kind in flight per worker process, a bounded queue, then 503."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.requests import Request

from api.errors import APIError


class Overloaded(APIError):
    def __init__(self, retry_after_s: int, why: str) -> None:
        super().__init__(503, "overloaded", f"the server is busy ({why}); retry in {retry_after_s} s",
                         headers={"Retry-After": str(retry_after_s)})


class ClientGone(APIError):
    """The client hung up before its work started: nothing is run (nginx's 499; nobody reads it)."""

    def __init__(self) -> None:
        super().__init__(499, "client_closed_request", "the client disconnected before the work started")


class Admission:
    """A per-process cap on expensive requests. Memory then grows with the cap, not with the number of clients:
    beyond `max_inflight` running and `max_queued` waiting, a request is answered 503 + Retry-After at once,
    and a waiting one gets 503 after `wait_s`."""

    def __init__(self, max_inflight: int, max_queued: int, wait_s: float, retry_after_s: int,
                 what: str = "diagnoses") -> None:
        self.max_inflight, self.max_queued, self.what = max_inflight, max_queued, what
        self.wait_s, self.retry_after_s = wait_s, retry_after_s
        self.inflight = 0
        self.waiting = 0
        self.rejected = 0
        self._sem: asyncio.Semaphore | None = None

    def saturated(self) -> bool:
        return self.inflight >= self.max_inflight and self.waiting >= self.max_queued

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._sem is None:  # created on first use, inside the server's event loop
            self._sem = asyncio.Semaphore(self.max_inflight)
        if self.saturated():
            self.rejected += 1
            raise Overloaded(self.retry_after_s, f"{self.inflight} {self.what} running and {self.waiting} waiting")
        self.waiting += 1
        try:
            await asyncio.wait_for(self._sem.acquire(), self.wait_s)
        except asyncio.TimeoutError:
            self.rejected += 1
            raise Overloaded(self.retry_after_s, f"no slot within {self.wait_s:g} s") from None
        finally:
            self.waiting -= 1
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1
            self._sem.release()


async def ensure_connected(request: Request) -> None:
    """Raise ClientGone when the client has hung up. Call it after the body is read (it reads one message)."""
    if await request.is_disconnected():
        raise ClientGone()
