"""Drain-style masking: replace the variable parts of a log line (numbers, paths, ids, ranks, times) by tokens."""

from __future__ import annotations

import re

# Order matters: specific shapes before the generic number rule (why: a timestamp is also numbers).
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\[rank\s*\d+\]:?", re.IGNORECASE), "[rank<*>]:"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"), "<TS>"),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<TS>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<HEX>"),
    (re.compile(r"\b[0-9a-f]{12,}\b"), "<HEX>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:~|\.{1,2})?(?:/[\w.@+\-]+){2,}/?"), "<PATH>"),
    (re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])"), "<NUM>"),
    (re.compile(r"\s+"), " "),
)


def mask_line(line: str) -> str:
    """`[rank6]: step 12 loss 1.2e+34 at /a/b.py:88` -> `[rank<*>]: step <NUM> loss <NUM> at <PATH>:<NUM>`."""
    out = line.strip()
    for pat, repl in _MASKS:
        out = pat.sub(repl, out)
    return out


def template_regex(text: str) -> re.Pattern[str]:
    """A case-insensitive regex matching `text` with its variable parts masked (for symptoms.errors strings)."""
    masked = mask_line(text)
    parts = re.split(r"(<NUM>|<PATH>|<HEX>|<TS>|\[rank<\*>\]:)", masked)
    wild = {"<NUM>": r"\S+", "<PATH>": r"\S+", "<HEX>": r"\S+", "<TS>": r"\S+(?: \S+)?", "[rank<*>]:": r"(?:\[rank\s*\d+\]:?)?"}
    rx = "".join(wild.get(p, re.escape(p).replace(r"\ ", r"\s+")) for p in parts)
    return re.compile(rx, re.IGNORECASE)


def distinct_lines(text: str, limit: int = 4000) -> str:
    """The text with each masked line shape kept once (its first line), in order, cut at `limit` characters.

    What the embedding model needs of a paste: 45 metric lines of the same shape say what one of them says, and
    mean-pooling over them drowns the command line and the error. Lines whose shape differs (a `nan` where there
    were numbers) stay."""
    seen: set[str] = set()
    out: list[str] = []
    size = 0
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        shape = mask_line(s[:500])
        if shape in seen:
            continue
        seen.add(shape)
        out.append(s)
        size += len(s) + 1
        if size >= limit:
            break
    return "\n".join(out)[:limit]
