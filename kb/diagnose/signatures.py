"""Symptom signatures: incident regexes and error templates matched against the paste's raw and masked lines."""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

from kb.facts.masking import mask_line, template_regex
from kb.facts.prefilter import Requirement, fold, requirement, satisfied
from kb.records import Incident, Signature


@dataclass
class SignatureHit:
    signature: Signature
    line: int
    text: str
    source: str


# Past this many lines a signature is searched once over the joined text instead of line by line.
_JOINED_ABOVE = 2000


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
        self.masked = [mask_line(s) for _, _, s in lines]
        self._folded: tuple[list[str], list[str], str] | None = None
        self._joined: tuple[str, str, list[int]] | None = None
        self._memo: dict[tuple[str, bool], int | None] = {}

    def folded(self) -> tuple[list[str], list[str], str]:
        if self._folded is None:
            raw = [fold(s) for _, _, s in self.lines]
            masked = [fold(s) for s in self.masked]
            self._folded = (raw, masked, "\n".join(raw) + "\n" + "\n".join(masked))
        return self._folded

    def joined(self) -> tuple[str, str, list[int]]:
        if self._joined is None:
            raw = "\n".join(s for _, _, s in self.lines)
            starts, pos = [], 0
            for _, _, s in self.lines:
                starts.append(pos)
                pos += len(s) + 1
            self._joined = (raw, "\n".join(self.masked), starts)
        return self._joined

    def search(self, rx: re.Pattern[str], masked_too: bool = True, need: Requirement | None = None) -> int | None:
        """Index of the first line where `rx` matches (raw or masked); `need`: literals one of which a match holds."""
        key = (rx.pattern, masked_too)
        if key not in self._memo:
            self._memo[key] = self._search(rx, masked_too, need)
        return self._memo[key]

    def _search(self, rx: re.Pattern[str], masked_too: bool, need: Requirement | None) -> int | None:
        if need is not None:
            raw_f, masked_f, everything = self.folded()
            if not satisfied(need, everything):
                return None
        if len(self.lines) <= _JOINED_ABOVE:
            for i, (_, _, s) in enumerate(self.lines):
                if need is not None and not (satisfied(need, raw_f[i]) or (masked_too and satisfied(need, masked_f[i]))):
                    continue
                if rx.search(s) or (masked_too and rx.search(self.masked[i])):
                    return i
            return None
        raw, masked, starts = self.joined()
        best = None
        m = rx.search(raw)
        if m:
            best = bisect.bisect_right(starts, m.start()) - 1
        if masked_too:
            m = rx.search(masked)
            if m:
                # Masked lines have other lengths: find the line by counting newlines before the match.
                i = masked.count("\n", 0, m.start())
                best = i if best is None else min(best, i)
        return best


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
