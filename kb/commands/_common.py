"""Helpers shared by CLI commands: opening the knowledge base from global flags, tables, JSON output."""

from __future__ import annotations

import json
import sys
import unicodedata
from typing import Any


def open_kb(args, progress: bool | None = None):
    from kb.kb import KnowledgeBase

    quiet = getattr(args, "quiet", False) or getattr(args, "json", False)
    show = (not quiet and sys.stderr.isatty()) if progress is None else progress
    return KnowledgeBase.open(data_dir=args.data_dir, incidents_dir=args.incidents_dir, model=args.model,
                              progress=show)


def add_filters(p) -> None:
    p.add_argument("--framework", help="only incidents of this framework (e.g. trl, ms-swift)")
    p.add_argument("--algorithm", help="only this algorithm (e.g. DPO, KTO, SFT)")
    p.add_argument("--category", help="only this root-cause category key")


def filters_of(args) -> dict[str, str]:
    return {k: v for k in ("framework", "algorithm", "category") if (v := getattr(args, k, None))}


def print_json(obj: Any) -> None:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    print(json.dumps(obj, ensure_ascii=False, indent=2))


def width(s: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def clip(s: str, n: int) -> str:
    out, w = "", 0
    for c in s:
        cw = 2 if unicodedata.east_asian_width(c) in "WF" else 1
        if w + cw > n - 1 and w + cw > n:
            return out + "…"
        out, w = out + c, w + cw
    return out


def table(headers: list[str], rows: list[list[str]], max_col: int = 60) -> str:
    rows = [[clip(str(c), max_col) for c in r] for r in rows]
    widths = [max([width(h)] + [width(r[i]) for r in rows]) for i, h in enumerate(headers)]
    pad = lambda s, w: s + " " * (w - width(s))
    lines = ["  ".join(pad(h, w) for h, w in zip(headers, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(pad(c, w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
