"""Helpers for tests that start `kb serve` as a real process.

Imported as `from server_support import ...` (tests/ is on sys.path in pytest's default import mode)."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Poll /readyz until 200; fail with the server's stderr if it exits first. The timeout guards against a hang
    and is not a speed target."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError((err.decode(errors="replace") if isinstance(err, bytes) else err)[-3000:])
        try:
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "kb serve did not become ready"
        time.sleep(0.3)
