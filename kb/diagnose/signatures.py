"""Symptom signatures: incident regexes and error templates matched against the paste's raw and masked lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kb.facts.masking import mask_line, template_regex
from kb.records import Incident, Signature


@dataclass
class SignatureHit:
    signature: Signature
    line: int
    text: str
    source: str


# Past this many lines a signature is searched once over the joined text instead of line by line.
_JOINED_ABOVE = 2000


class MaskedLines:
    """The paste's lines, raw and masked (each line masked once, shared by every incident's signatures)."""

    def __init__(self, lines: list[tuple[str, int, str]]):
        self.lines = lines
        self.masked = [mask_line(s) for _, _, s in lines]
        self._joined: tuple[str, str, list[int]] | None = None

    def joined(self) -> tuple[str, str, list[int]]:
        if self._joined is None:
            raw = "\n".join(s for _, _, s in self.lines)
            starts, pos = [], 0
            for _, _, s in self.lines:
                starts.append(pos)
                pos += len(s) + 1
            self._joined = (raw, "\n".join(self.masked), starts)
        return self._joined

    def search(self, rx: re.Pattern[str], masked_too: bool = True) -> int | None:
        """Index of the first line where `rx` matches (raw or masked)."""
        if len(self.lines) <= _JOINED_ABOVE:
            for i, (_, _, s) in enumerate(self.lines):
                if rx.search(s) or (masked_too and rx.search(self.masked[i])):
                    return i
            return None
        import bisect

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
        try:
            rx = re.compile(sig.pattern, re.IGNORECASE | re.MULTILINE)
        except re.error:
            continue
        i = ml.search(rx)
        if i is not None:
            source, n, s = ml.lines[i]
            hits.append(SignatureHit(sig, n, s.strip(), source))
    for err in inc.symptoms.errors:
        if len(err.strip()) < 12:
            continue  # "nan" alone would match every paste
        i = ml.search(template_regex(err), masked_too=False)
        if i is not None:
            source, n, s = ml.lines[i]
            hits.append(SignatureHit(Signature(pattern=err, kind="error", weight=1.0), n, s.strip(), source))
    return hits
