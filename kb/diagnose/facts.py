"""Facts about a paste: canonical key -> value with the evidence (kind, line, matched text) that gave it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from kb.errors import InputError, InputTooLarge

# Which kind of evidence wins when two disagree: an explicit setting beats a prose mention.
_RANK = {"config": 3, "env": 3, "log": 2, "text": 1}
LIST_FACTS = frozenset({"nan_metrics", "zero_metrics", "huge_metrics", "spike_metrics", "errors", "symptom",
                        "fix_changes"})

DEFAULT_MAX_BYTES = 20 * 1024 * 1024
# Each line goes through a few dozen regexes: 20k lines is a few seconds on a busy CPU core.
DEFAULT_MAX_LINES = 20_000
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


def _decode(data: bytes, name: str) -> str:
    """UTF-8 (BOM or not) or UTF-16 with a BOM (Windows editors, PowerShell redirects); NUL bytes otherwise = binary."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise InputError(f"{name} starts with a UTF-16 mark but does not decode; save it as UTF-8") from None
    if b"\x00" in data[:65536]:
        raise InputError(f"{name} looks binary (NUL bytes); paste a text log, config or command line")
    return data.decode("utf-8-sig", errors="replace")


def check_text(text: str | bytes, name: str = "input") -> str:
    """Decode and sanity-check a paste: binary junk is an InputError, absurd sizes an InputTooLarge."""
    max_bytes, _ = _limits()
    if isinstance(text, bytes):
        if len(text) > 10 * max_bytes:
            raise InputTooLarge(f"{name} is {len(text) / 1e6:.0f} MB; the limit is {10 * max_bytes / 1e6:.0f} MB "
                                "(set KB_DIAGNOSE_MAX_BYTES); paste the head and tail of the log")
        text = _decode(text, name)
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


# Lines worth keeping from the skipped middle of a huge log: bad values, errors, warnings, overflow messages.
_SALIENT = re.compile(r"(?<![A-Za-z])(?:nan|inf)(?![A-Za-z])|error|exception|traceback|overflow|warn|skipping step|"
                      r"loss scale|untrained|-100|溢出|报错", re.IGNORECASE)


def numbered_lines(text: str, name: str = "input") -> tuple[list[tuple[int, str]], list[str]]:
    """(line number, line) pairs within the work caps, line numbers preserved.

    Past KB_DIAGNOSE_MAX_LINES lines or KB_DIAGNOSE_MAX_BYTES bytes, a quarter of the budget goes to the head
    (command, config, environment), a quarter to middle lines that mention nan / inf / errors / overflow (the
    first and the last of them), and half to the tail; a warning says so.
    """
    max_bytes, max_lines = _limits()
    warnings: list[str] = []
    raw = text.split("\n")
    budget = max_lines
    if len(text) > max_bytes:
        # Keep the line budget proportional to the byte cap for long-lined logs.
        avg = max(1.0, len(text) / max(1, len(raw)))
        budget = max(100, min(max_lines, int(max_bytes / avg)))
    if len(raw) <= budget:
        lines = [(i + 1, s) for i, s in enumerate(raw)]
    else:
        n_head, n_mid = budget // 4, budget // 4
        n_tail = budget - n_head - n_mid
        mid_lo, mid_hi = n_head, len(raw) - n_tail
        salient = [i for i in range(mid_lo, mid_hi) if _SALIENT.search(raw[i])]
        if len(salient) > n_mid:
            salient = salient[: n_mid // 2] + salient[-(n_mid - n_mid // 2):]
        keep = list(range(n_head)) + salient + list(range(mid_hi, len(raw)))
        lines = [(i + 1, raw[i]) for i in keep]
        warnings.append(f"{name} has {len(raw)} lines ({len(text) / 1e6:.1f} MB); read the first {n_head}, the last "
                        f"{n_tail} and {len(salient)} lines in between that mention nan / inf / errors "
                        f"(limits KB_DIAGNOSE_MAX_LINES={max_lines}, KB_DIAGNOSE_MAX_BYTES={max_bytes})")
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
    return extract_with_lines(text, source)[0]


def extract_with_lines(text: str | bytes, source: str = "text") -> tuple[Facts, list[tuple[int, str]]]:
    """`extract_facts` plus the numbered lines it read (the engine matches signatures on the same lines)."""
    from kb.diagnose import configs, logs, prose

    text = check_text(text, source)
    lines, warnings = numbered_lines(text, source)
    facts = Facts(warnings=warnings)
    configs.extract(lines, facts, source)
    logs.extract(lines, facts, source)
    prose.extract(lines, facts, source)
    prose.derive(facts, source)
    return facts, lines
