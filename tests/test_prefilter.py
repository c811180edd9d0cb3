"""The literal prefilter (kb.facts.prefilter) only ever skips a pattern that could not have matched.

Soundness is checked on every pattern that reads user input (the same set tests/test_linear_patterns.py walks,
plus every incident's signatures) against real lines: incident documents, the case base, the seed articles, and
the same lines upper-cased and with the letters re.IGNORECASE treats specially swapped in."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
from test_linear_patterns import patterns  # tests/ is on sys.path (pytest's default import mode)

from kb.facts.masking import mask_line
from kb.facts.prefilter import Haystack, fold, requirement, satisfied

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def _lines() -> list[str]:
    files = sorted(REPO.glob("incidents/*/incident.md")) + sorted(REPO.glob("cases/*.yaml"))
    files += sorted((SHARED / "seeds").glob("*")) if (SHARED / "seeds").is_dir() else []
    out: dict[str, None] = {}
    for f in files:
        out.update(dict.fromkeys(ln[:400] for ln in f.read_text(encoding="utf-8", errors="replace").splitlines()
                                 if ln.strip()))
    lines = list(out)
    return lines[:: max(1, len(lines) // 1500)]  # a spread of ~1,500 distinct lines keeps the test under a minute


LINES = _lines()
VARIANTS = [lambda s: s, str.upper, mask_line,
            lambda s: s.replace("i", "\u0131").replace("s", "\u017f").replace("I", "\u0130").replace("k", "\u212a")]


def _all_patterns() -> list[tuple[str, re.Pattern[str]]]:
    from kb.diagnose.signatures import compiled
    from kb.documents import load_incidents

    found = patterns()
    incidents, _ = load_incidents(REPO / "incidents")
    for inc in incidents:
        for sig in inc.symptoms.signatures:
            rx, _ = compiled(sig.pattern)
            if rx is not None:
                found.append((f"{inc.id}: {sig.pattern}", rx))
    return found


def test_fold_table_covers_every_special_case_of_ignorecase() -> None:
    """Every character re.IGNORECASE matches to an ASCII letter folds to that letter (the table is complete)."""
    cased = [chr(u) for u in range(0x110000) if not 0xD800 <= u < 0xE000 and chr(u).lower() != chr(u).upper()]
    for c in string.ascii_lowercase:
        rx = re.compile(c, re.IGNORECASE)
        for ch in cased:
            if rx.fullmatch(ch):
                assert c in fold(ch), (c, hex(ord(ch)))


@pytest.mark.parametrize(("pattern", "flags", "expected"), [
    (r"loss['\"]?\s*[:=]\s*nan", re.IGNORECASE, (("loss",), ("nan",))),
    (r"(ZeRO|zero)[-_ ]?(stage)?[-_ ]?2\b|stage2", re.IGNORECASE, (("zero", "stage2"),)),
    (r"OVERFLOW!.{0,40}Skipping step|Attempted loss scale", re.IGNORECASE,
     (("skipping step", "attempted loss scale"),)),
    (r"(?:fp16)?x", 0, None),                      # an optional group proves nothing
    (r"a|bcd", 0, None),                           # one branch without a literal of 3+ proves nothing
    (r"\bsdpa\b", 0, (("sdpa",),)),                # zero-width assertions do not break a run
    (r"(?:ab){2,}cd", 0, None),
    (r"学习率.{0,20}太大", 0, (("学习率",),)),
])
def test_requirements_of_known_shapes(pattern: str, flags: int, expected) -> None:
    assert requirement(pattern, flags) == expected


def test_prefilter_never_skips_a_pattern_that_matches() -> None:
    assert len(LINES) > 1000
    checked = skipped_lines = 0
    for name, rx in _all_patterns():
        need = requirement(rx.pattern, rx.flags)
        if need is None:
            continue
        for line in LINES:
            for variant in VARIANTS:
                s = variant(line)
                folded = fold(s)
                if rx.search(s):
                    checked += 1
                    assert satisfied(need, folded), f"{name} matches {s[:120]!r} but its prefilter {need} says no"
                elif not satisfied(need, folded):
                    skipped_lines += 1
    assert checked > 1000 and skipped_lines > 100_000  # the check saw real matches, and the filter does work


def test_haystack_gate_stands_in_for_a_pattern_that_cannot_match() -> None:
    rx = re.compile(r"loss\s*[:=]\s*nan", re.IGNORECASE)
    hay = Haystack("step 3 | LOSS = 0.7 | grad_norm = 1.2")
    gated = hay.gate(rx)
    assert gated is not rx and gated.search("loss: nan") is None and list(gated.finditer("loss=nan")) == []
    assert Haystack("Loss = NaN").gate(rx) is rx


def test_truncated_json_closers_in_one_pass_match_the_per_cut_definition() -> None:
    """kb.facts.configs reads a cut-off JSON paste; the brackets owed at every cut point come from one pass."""
    import random

    from kb.facts.configs import _closers_at

    def owed(body: str) -> str:  # the definition: scan the prefix
        stack: list[str] = []
        in_str = esc = False
        for ch in body:
            if in_str:
                esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
                continue
            if ch == '"':
                in_str = True
            elif ch in "{[":
                stack.append("}" if ch == "{" else "]")
            elif ch in "}]" and stack:
                stack.pop()
        return "" if in_str else "".join(reversed(stack))

    rnd = random.Random(0)
    for _ in range(2000):
        t = "".join(rnd.choice('{}[]"\\a,: ') for _ in range(rnd.randint(0, 50)))
        cuts = sorted({rnd.randint(0, len(t)) for _ in range(6)})
        got = _closers_at(t, cuts)
        assert all(got[c] == owed(t[:c]) for c in cuts), t


def test_signature_search_finds_the_same_first_line_as_a_line_by_line_scan() -> None:
    """MaskedLines searches the joined paste (one regex scan, not one per line); the answer must be the line a
    plain scan of each raw and masked line finds first, for every signature and error template."""
    from kb.diagnose.signatures import MaskedLines, _error_template, compiled
    from kb.documents import load_incidents

    incidents, _ = load_incidents(REPO / "incidents")
    rxs = [compiled(sig.pattern) for inc in incidents for sig in inc.symptoms.signatures]
    rxs += [(_error_template(e)[0], None, False) for inc in incidents for e in inc.symptoms.errors if len(e) >= 12]
    pastes = [p.read_text(encoding="utf-8") for p in sorted(REPO.glob("incidents/*/incident.md"))[::3]]
    pastes += [p.read_text(encoding="utf-8") for p in sorted(REPO.glob("cases/*.yaml"))[::10]]
    pastes.append("loss: 0.5\n\n  \nloss\n: nan\nLOSS = NAN\nstep 1 loss: nan\n")  # matches that span lines
    compared = found = 0
    for text in pastes:
        lines = [("log", n, s) for n, s in enumerate(text.splitlines(), 1)]
        ml = MaskedLines(lines)
        for item in rxs:
            rx, need = item[0], item[1]
            if rx is None:
                continue
            masked_too = len(item) == 2
            want = next((i for i, (_, _, s) in enumerate(lines)
                         if rx.search(s) or (masked_too and rx.search(ml.masked[i]))), None)
            assert ml.search(rx, masked_too=masked_too, need=need) == want, (rx.pattern, text[:80])
            compared += 1
            found += want is not None
    assert compared > 1000 and found > 50
