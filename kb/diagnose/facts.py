"""Facts about a paste: canonical key -> value with the evidence (kind, line, matched text) that gave it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from kb.errors import InputError, InputTooLarge

# Which kind of evidence wins when two disagree: an explicit setting beats a prose mention.
_RANK = {"config": 3, "env": 3, "log": 2, "text": 1}
LIST_FACTS = frozenset({"nan_metrics", "zero_metrics", "huge_metrics", "spike_metrics", "errors", "symptom",
                        "fix_changes"})

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_LINES = 200_000
MAX_LINE_CHARS = 8_000  # regexes over one minified 5 MB JSON line would dominate the run time


class Fact(BaseModel):
    value: Any
    kind: str  # config | log | text | env
    line: int | None = None  # 1-based line in the input named by `source`
    detail: str = ""
    source: str = "text"


@dataclass
class Facts:
    """Canonical facts with evidence. Scalars keep the strongest / first evidence; list facts accumulate."""

    items: dict[str, Fact] = field(default_factory=dict)
    # Evidence for each element of a list fact (element -> Fact), so every metric / error names its line.
    elements: dict[str, dict[str, Fact]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, kind: str, line: int | None, detail: str, source: str = "text") -> None:
        if value is None:
            return
        if key in LIST_FACTS:
            self.add(key, value, kind, line, detail, source)
            return
        old = self.items.get(key)
        if old is not None and _RANK.get(old.kind, 0) >= _RANK.get(kind, 0):
            return
        self.items[key] = Fact(value=value, kind=kind, line=line, detail=detail.strip()[:300], source=source)

    def add(self, key: str, element: Any, kind: str, line: int | None, detail: str, source: str = "text") -> None:
        """Append `element` to list fact `key` (once)."""
        els = self.elements.setdefault(key, {})
        if str(element) in els:
            return
        f = Fact(value=element, kind=kind, line=line, detail=detail.strip()[:300], source=source)
        els[str(element)] = f
        cur = self.items.get(key)
        if cur is None:
            self.items[key] = Fact(value=[element], kind=kind, line=line, detail=f.detail, source=source)
        else:
            cur.value.append(element)

    def get(self, key: str) -> Fact | None:
        return self.items.get(key)

    def value(self, key: str, default: Any = None) -> Any:
        f = self.items.get(key)
        return default if f is None else f.value

    def evidence_for(self, key: str, element: Any = None) -> Fact | None:
        if element is not None and key in self.elements:
            for name, f in self.elements[key].items():
                if name.lower() == str(element).lower() or name.lower().endswith("/" + str(element).lower()):
                    return f
        return self.items.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def merge(self, other: Facts) -> None:
        for key, f in other.items.items():
            if key in LIST_FACTS:
                for ef in other.elements.get(key, {}).values():
                    self.add(key, ef.value, ef.kind, ef.line, ef.detail, ef.source)
            else:
                self.set(key, f.value, f.kind, f.line, f.detail, f.source)
        self.warnings.extend(other.warnings)

    def to_dict(self) -> dict[str, Any]:
        return {k: v.model_dump() for k, v in sorted(self.items.items())}

    def values(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.items.items()}


def _limits() -> tuple[int, int]:
    def env_int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return env_int("KB_DIAGNOSE_MAX_BYTES", DEFAULT_MAX_BYTES), env_int("KB_DIAGNOSE_MAX_LINES", DEFAULT_MAX_LINES)


def check_text(text: str | bytes, name: str = "input") -> str:
    """Decode and sanity-check a paste: binary junk is an InputError, absurd sizes an InputTooLarge."""
    max_bytes, _ = _limits()
    if isinstance(text, bytes):
        if len(text) > 10 * max_bytes:
            raise InputTooLarge(f"{name} is {len(text) / 1e6:.0f} MB; the limit is {10 * max_bytes / 1e6:.0f} MB "
                                "(set KB_DIAGNOSE_MAX_BYTES); paste the head and tail of the log")
        if b"\x00" in text[:65536]:
            raise InputError(f"{name} looks binary (NUL bytes); paste a text log, config or command line")
        text = text.decode("utf-8", errors="replace")
    if len(text) > 10 * max_bytes:
        raise InputTooLarge(f"{name} is {len(text) / 1e6:.0f} MB; the limit is {10 * max_bytes / 1e6:.0f} MB "
                            "(set KB_DIAGNOSE_MAX_BYTES); paste the head and tail of the log")
    sample = text[:65536]
    if "\x00" in sample:
        raise InputError(f"{name} looks binary (NUL bytes); paste a text log, config or command line")
    if sample:
        bad = sum(1 for c in sample if (ord(c) < 32 and c not in "\t\n\r\x1b\x0c") or c == "\ufffd")
        if bad / len(sample) > 0.1:
            raise InputError(f"{name} looks binary ({bad} control/undecodable characters in the first "
                             f"{len(sample)}); paste a text log, config or command line")
    return text


def numbered_lines(text: str, name: str = "input") -> tuple[list[tuple[int, str]], list[str]]:
    """(line number, line) pairs within the work caps: the head and tail of a huge log are kept, with a warning."""
    max_bytes, max_lines = _limits()
    warnings: list[str] = []
    if len(text) > max_bytes:
        head = text[: max_bytes // 4]
        tail = text[-(max_bytes - len(head)):]
        skipped_lines = text.count("\n", len(head), len(text) - len(tail))
        head_lines = head.split("\n")
        tail_lines = tail.split("\n")
        n_head = len(head_lines)
        start_tail = n_head + skipped_lines
        lines = [(i + 1, s) for i, s in enumerate(head_lines)]
        lines += [(start_tail + i, s) for i, s in enumerate(tail_lines)]
        warnings.append(f"{name} is {len(text) / 1e6:.1f} MB; read its first {len(head) // 1024} KB and last "
                        f"{len(tail) // 1024} KB (limit KB_DIAGNOSE_MAX_BYTES={max_bytes})")
    else:
        lines = [(i + 1, s) for i, s in enumerate(text.split("\n"))]
    if len(lines) > max_lines:
        keep_head = max_lines // 4
        lines = lines[:keep_head] + lines[-(max_lines - keep_head):]
        warnings.append(f"{name} has more than {max_lines} lines; read the first {keep_head} and the last "
                        f"{max_lines - keep_head} (limit KB_DIAGNOSE_MAX_LINES)")
    long_lines = 0
    out = []
    for n, s in lines:
        s = s.rstrip("\r")
        if len(s) > MAX_LINE_CHARS:
            long_lines += 1
            s = s[:MAX_LINE_CHARS // 2] + " … " + s[-MAX_LINE_CHARS // 2:]
        out.append((n, s))
    if long_lines:
        warnings.append(f"{long_lines} line(s) in {name} longer than {MAX_LINE_CHARS} characters were shortened")
    return out, warnings


def extract_facts(text: str, source: str = "text") -> Facts:
    """All facts in one paste (logs, tracebacks, env dumps, configs, command lines, prose), with evidence.

    Pure function: string in, facts out. Raises InputError for binary junk, InputTooLarge past 10x the caps.
    """
    from kb.diagnose import configs, logs, prose

    text = check_text(text, source)
    lines, warnings = numbered_lines(text, source)
    facts = Facts(warnings=warnings)
    configs.extract(lines, facts, source)
    logs.extract(lines, facts, source)
    prose.extract(lines, facts, source)
    prose.derive(facts, source)
    return facts
