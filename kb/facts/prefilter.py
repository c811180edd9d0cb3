"""Literal prefilters for regexes: the strings a match must contain, so a pattern is skipped with a substring test.

As RE2's FilteredRE2 does, but only for what is cheap to prove from the parsed pattern: runs of literals
(zero-width assertions do not break a run), groups, repeats of at least one, and alternations whose every branch
has a requirement. The test is on case-folded text, so it is a superset of what the regex (with or without
IGNORECASE) can match: a skipped pattern never had a match; a kept one still runs.
"""

from __future__ import annotations

import functools
import re
from re import _constants as sre_c  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

# The only characters that re.IGNORECASE matches to an ASCII letter but str.lower() does not map to it alone
# (U+0130 lowers to "i" plus a combining dot); tests/test_prefilter.py re-checks the table.
_FOLD_EXTRA = (("\u0130", "i"), ("\u0131", "i"), ("\u017f", "s"))
_MIN_LITERAL = 3
_REPEATS = (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", sre_c.MAX_REPEAT))

Requirement = tuple[tuple[str, ...], ...]  # every tuple must have one of its strings in the text


def fold(text: str) -> str:
    """Case-fold the way the prefilter compares."""
    for ch, ascii_ in _FOLD_EXTRA:
        if ch in text:
            text = text.replace(ch, ascii_)
    return text.lower()


# For texts that many patterns are asked about in turn (an article against every category cue).
fold_cached = functools.lru_cache(maxsize=8)(fold)


def _best(conj: list[tuple[str, ...]]) -> tuple[str, ...]:
    # The most selective: the longest shortest alternative, then the fewest alternatives.
    return max(conj, key=lambda o: (min(len(s) for s in o), -len(o)))


def _required(items: Any) -> list[tuple[str, ...]]:
    conj: list[tuple[str, ...]] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) >= _MIN_LITERAL:
            conj.append(("".join(run),))
        run.clear()

    for op, av in items:
        if op is sre_c.LITERAL:
            ch = chr(av)
            if ch.isascii() or ch.lower() == ch.upper():  # cased non-ASCII letters have other IGNORECASE rules
                run.append(fold(ch))
                continue
        elif op is sre_c.AT:
            continue
        flush()
        if op is sre_c.SUBPATTERN:
            conj.extend(_required(av[-1]))
        elif op in _REPEATS and av[0] >= 1:
            conj.extend(_required(av[2]))
        elif op is sre_c.BRANCH:
            branches = [_required(b) for b in av[1]]
            if all(branches):
                conj.append(tuple(dict.fromkeys(s for b in branches for s in _best(b))))
    flush()
    return conj


@functools.lru_cache(maxsize=8192)
def requirement(pattern: str, flags: int = 0) -> Requirement | None:
    """What every match of `pattern` contains (case-folded), or None when nothing can be proved."""
    try:
        conj = _required(sre_parse.parse(pattern, flags & ~re.DEBUG))
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    # Keep the three most selective: more rarely rejects anything the first three do not.
    conj = sorted(dict.fromkeys(conj), key=lambda o: (-min(len(s) for s in o), len(o)))[:3]
    return tuple(conj) or None


def satisfied(need: Requirement | None, folded: str) -> bool:
    return need is None or all(any(s in folded for s in opt) for opt in need)


class _Never:
    """Stands in for a pattern that cannot match the text at hand."""

    pattern = ""

    def search(self, *_: Any, **__: Any) -> None:
        return None

    match = fullmatch = search

    def finditer(self, *_: Any, **__: Any):
        return iter(())

    def findall(self, *_: Any, **__: Any) -> list:
        return []


NEVER = _Never()


class Haystack:
    """A text, case-folded once, asked which patterns could match anywhere in it."""

    def __init__(self, text: str, folded: str | None = None):
        self.folded = fold(text) if folded is None else folded

    def may(self, rx: re.Pattern[str]) -> bool:
        return satisfied(requirement(rx.pattern, rx.flags), self.folded)

    def gate(self, rx: re.Pattern[str]) -> Any:
        """`rx` itself, or a stand-in that never matches when `rx` cannot match anywhere in the text."""
        return rx if self.may(rx) else NEVER
