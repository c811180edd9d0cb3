"""CLI side of the answer daemon (kb/daemon.py): ask the warm daemon first, answer in-process when none runs.

KB_DAEMON=auto (default): use a running daemon; after an in-process answer in an interactive terminal,
start one for the next call. KB_DAEMON=on: also start one from scripts. KB_DAEMON=off: never use one.
"""

from __future__ import annotations

import base64
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path

from kb import daemon

# Files bigger than this are not shipped to the daemon; the in-process path reports the size error.
_MAX_SEND = 64 * 1024 * 1024


class Result(dict):
    """A JSON answer with attribute access, so the same printing code serves daemon and library results."""

    def __getattr__(self, name: str) -> object:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def wrap(cls, x: object) -> object:
        if isinstance(x, dict):
            return cls({k: cls.wrap(v) for k, v in x.items()})
        if isinstance(x, list):
            return [cls.wrap(v) for v in x]
        return x


def _mode() -> str:
    m = os.environ.get("KB_DAEMON", "auto").strip().lower()
    return {"0": "off", "false": "off", "no": "off", "1": "on", "true": "on", "yes": "on"}.get(m, m)


def answer(args, op: str, params: Callable[[], dict | None], local: Callable[[], object]) -> object:
    """The daemon's answer to `op` when one runs (params() None: this request cannot go through it), else
    `local()`; after a local answer, maybe start a daemon for the next call."""
    mode = _mode()
    if mode == "off":
        return local()
    t = daemon.target(args.data_dir, args.incidents_dir, args.model)
    if t.socket_path.exists() and (p := params()) is not None:
        try:
            return Result.wrap(daemon.request(t, op, p))
        except daemon.DaemonUnavailable:
            pass
    res = local()
    if mode == "on" or (mode == "auto" and (sys.stdout.isatty() or sys.stderr.isatty())):
        try:
            daemon.start(t)
        except OSError as e:
            print(f"kb: note: could not start the answer daemon: {e}", file=sys.stderr)
    return res


def diagnose_params(args) -> dict | None:
    """Raw inputs of `kb diagnose` for the daemon (it decodes and checks them); None when anything is
    unusual (missing file, directory, no input, ablation mode), so the in-process path reports it."""
    if getattr(args, "mode", "full") != "full" or getattr(args, "run_dir", None) or getattr(args, "answer", None):
        return None  # ablations, run folders and answered questions are answered in-process

    def raw(path: str) -> list[str] | None:
        if path == "-":
            data = sys.stdin.buffer.read(_MAX_SEND + 1)
        else:
            p = Path(path)
            if not p.is_file() or p.stat().st_size > _MAX_SEND:
                return None
            data = p.read_bytes()
        if len(data) > _MAX_SEND:
            return None
        return [path, base64.b64encode(data).decode("ascii")]

    files = list(args.files)
    if not files and not (args.log or args.config or args.question) and not sys.stdin.isatty():
        files = ["-"]
    try:
        items = [raw(f) for f in files]
        log = raw(args.log) if args.log else None
        config = raw(args.config) if args.config else None
    except OSError:
        return None
    if any(x is None for x in items) or (args.log and log is None) or (args.config and config is None):
        return None
    if not (items or log or config or args.question):
        return None
    if "-" in files:
        # Stdin is consumed now: put the same bytes back for the in-process fallback.
        data = base64.b64decode(items[files.index("-")][1])
        sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace")
    return {"files": items, "log": log, "config": config, "question": args.question, "k": max(1, min(args.k, 20))}
