"""Symptom signatures: incident regexes and error templates matched against the paste's raw and masked lines."""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass
from re import _constants as sre_c  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

from kb.facts.masking import mask_line, template_regex
from kb.facts.prefilter import Requirement, fold, requirement, satisfied
from kb.records import Incident, Signature


@dataclass
class SignatureHit:
    signature: Signature
    line: int
    text: str
    source: str


@functools.lru_cache(maxsize=4096)
def compiled(pattern: str) -> tuple[re.Pattern[str] | None, Requirement | None]:
    """The signature's regex (case-insensitive, multi-line) and the literals any match contains."""
    try:
        rx = re.compile(pattern, re.IGNORECASE | re.MULTILINE)
    except (re.error, RecursionError, OverflowError):
        return None, None
    return rx, requirement(rx.pattern, rx.flags)


@functools.lru_cache(maxsize=1024)
def _error_template(err: str) -> tuple[re.Pattern[str], Requirement | None]:
    rx = template_regex(err)
    return rx, requirement(rx.pattern, rx.flags)


class MaskedLines:
    """The paste's lines, raw and masked, each masked and case-folded once, shared by every incident's signatures.

    A signature's result is computed once per paste (incidents share patterns), and a signature whose required
    literal occurs nowhere in the paste is rejected with one substring search instead of a regex per line.
    """

    def __init__(self, lines: list[tuple[str, int, str]]):
        self.lines = lines
        self.raw = [s for _, _, s in lines]
        self.masked = [mask_line(s) for s in self.raw]
        self._everything: str | None = None
        self._joined: tuple[str, list[int], str, list[int]] | None = None
        self._memo: dict[tuple[str, bool], int | None] = {}

    def joined(self) -> tuple[str, list[int], str, list[int]]:
        """The raw lines joined by newlines with each line's start, and the same for the masked lines."""
        if self._joined is None:
            self._joined = (*_join(self.raw), *_join(self.masked))
        return self._joined

    def everything(self) -> str:
        """Raw and masked lines together, case-folded once, for the prefilters."""
        if self._everything is None:
            raw, _, masked, _ = self.joined()
            self._everything = fold(raw + "\n" + masked)
        return self._everything

    def search(self, rx: re.Pattern[str], masked_too: bool = True, need: Requirement | None = None) -> int | None:
        """Index of the first line where `rx` matches (raw or masked); `need`: literals one of which a match holds."""
        key = (rx.pattern, masked_too)
        if key not in self._memo:
            self._memo[key] = self._search(rx, masked_too, need)
        return self._memo[key]

    def _search(self, rx: re.Pattern[str], masked_too: bool, need: Requirement | None) -> int | None:
        if need is not None and not satisfied(need, self.everything()):
            return None
        if _joined_search_exact(rx.pattern, rx.flags):
            raw, raw_starts, masked, masked_starts = self.joined()
            first = _first_line(rx, raw, raw_starts, self.raw)
            if masked_too:
                m = _first_line(rx, masked, masked_starts, self.masked, stop=first)
                first = m if first is None or (m is not None and m < first) else first
            return first
        for i, s in enumerate(self.raw):
            if rx.search(s) or (masked_too and rx.search(self.masked[i])):
                return i
        return None


def _join(lines: list[str]) -> tuple[str, list[int]]:
    starts, pos = [], 0
    for s in lines:
        starts.append(pos)
        pos += len(s) + 1
    return "\n".join(lines), starts


def _first_line(rx: re.Pattern[str], joined: str, starts: list[int], lines: list[str],
                stop: int | None = None) -> int | None:
    """The first line (before `stop`) that `rx` matches on its own, found by searching the joined text.

    A match in the joined text that spans lines is checked against its first line alone; if that line does not
    match by itself, the search goes on from the next line."""
    pos = 0
    while pos <= len(joined):
        m = rx.search(joined, pos)
        if m is None:
            return None
        i = bisect.bisect_right(starts, m.start()) - 1
        if stop is not None and i >= stop:
            return None
        if rx.search(lines[i]):
            return i
        if i + 1 >= len(starts):
            return None
        pos = starts[i + 1]
    return None


@functools.lru_cache(maxsize=4096)
def _joined_search_exact(pattern: str, flags: int) -> bool:
    """Whether every line that matches `pattern` on its own also yields a match in the joined text at or before it.

    True unless the pattern has a negative lookaround (it may see the next line in the joined text) or an anchor
    that means the string's start or end (`\\A`, `\\Z`, or `^`/`$` without MULTILINE). Matches that the joined
    text adds across lines are checked line by line, so they cost time, never correctness."""
    try:
        tree = sre_parse.parse(pattern, flags)
    except (re.error, RecursionError, OverflowError):
        return False
    multiline = bool(flags & re.MULTILINE)
    string_anchors = {sre_c.AT_BEGINNING_STRING, sre_c.AT_END_STRING}
    if not multiline:
        string_anchors |= {sre_c.AT_BEGINNING, sre_c.AT_END}

    def ok(items) -> bool:
        for op, av in items:
            if op is sre_c.ASSERT_NOT or (op is sre_c.AT and av in string_anchors):
                return False
            if op is sre_c.SUBPATTERN and not ok(av[-1]):
                return False
            if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)) \
                    and not ok(av[2]):
                return False
            if op is sre_c.BRANCH and not all(ok(b) for b in av[1]):
                return False
            if op is sre_c.ASSERT and not ok(av[1]):
                return False
            if op is getattr(sre_c, "ATOMIC_GROUP", None) and not ok(av):
                return False
            if op is sre_c.GROUPREF_EXISTS:
                return False
        return True

    return ok(tree)


def match_signatures(inc: Incident, lines: list[tuple[str, int, str]] | MaskedLines) -> list[SignatureHit]:
    """Signatures are matched against each raw line and its masked template; symptoms.errors as templates."""
    ml = lines if isinstance(lines, MaskedLines) else MaskedLines(lines)
    hits: list[SignatureHit] = []
    for sig in inc.symptoms.signatures:
        rx, need = compiled(sig.pattern)
        if rx is None:
            continue
        i = ml.search(rx, need=need)
        if i is not None:
            source, n, s = ml.lines[i]
            hits.append(SignatureHit(sig, n, s.strip(), source))
    for err in inc.symptoms.errors:
        if len(err.strip()) < 12:
            continue  # "nan" alone would match every paste
        rx, need = _error_template(err)
        i = ml.search(rx, masked_too=False, need=need)
        if i is not None:
            source, n, s = ml.lines[i]
            hits.append(SignatureHit(Signature(pattern=err, kind="error", weight=1.0), n, s.strip(), source))
    return hits
