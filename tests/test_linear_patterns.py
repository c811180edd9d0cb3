"""Every pattern that reads user input runs in linear time: each one is fed adversarial strings of two sizes and
the work must grow like the input (a backtracking pattern grows with its square or cube).

Work is measured as process CPU time of the pattern alone, best of three, and only the *ratio* between the two
sizes is asserted (4x the input may take at most ~10x the time; quadratic takes 16x, cubic 64x), so a busy machine
does not make it flaky."""

from __future__ import annotations

import importlib
import pkgutil
import re
import time

import pytest

MODULES = ["kb.canonical", "kb.conditions", "kb.cues", "kb.tokenize"] + [
    f"{pkg}.{m.name}" for pkg in ("kb.facts", "kb.diagnose", "kb.ingest")
    for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__)]


def patterns() -> list[tuple[str, re.Pattern[str]]]:
    found: dict[int, tuple[str, re.Pattern[str]]] = {}

    def visit(name: str, obj, depth: int = 0) -> None:
        if isinstance(obj, re.Pattern):
            found.setdefault(id(obj), (name, obj))
        elif depth < 3 and isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                visit(f"{name}[{i}]", x, depth + 1)
        elif depth < 3 and isinstance(obj, dict):
            for k, x in list(obj.items())[:200]:
                visit(f"{name}[{k!r}]", x, depth + 1)

    for mod in MODULES:
        m = importlib.import_module(mod)
        for attr, obj in vars(m).items():
            visit(f"{mod}.{attr}", obj)
    return sorted(found.values(), key=lambda t: t[0])


def data_patterns() -> list[tuple[str, re.Pattern[str]]]:
    """Patterns that are data, compiled as the library compiles them: the category cues (read on whole articles
    and on pastes), and the curated incidents' signatures and trigger conditions (read on pastes)."""
    from pathlib import Path

    from kb.cues import cues
    from kb.documents import load_incidents

    out: dict[str, re.Pattern[str]] = {}
    for cue in cues():
        for i, cond in enumerate((*cue.trigger.all, *cue.trigger.any, *cue.trigger.none)):
            if cond.op == "regex":
                out[f"cue {cue.category}: {cue.name} {i}"] = re.compile(str(cond.value), re.IGNORECASE)
    records, _ = load_incidents(Path(__file__).resolve().parent.parent / "incidents")
    for rec in records:
        for i, sig in enumerate(rec.symptoms.signatures):
            out[f"{rec.id} signature {i}"] = re.compile(sig.pattern, re.IGNORECASE | re.MULTILINE)
        for trig in rec.triggers:
            for i, cond in enumerate((*trig.all, *trig.any, *trig.none)):
                if cond.op == "regex":
                    out[f"{rec.id} trigger {trig.id} {i}"] = re.compile(str(cond.value), re.IGNORECASE)
    return sorted(out.items())


# Shapes that make backtracking patterns blow up: long runs of one class, and separators that almost match.
ADVERSARIAL = {
    "spaces": lambda n: "a: " + " " * n + "x" + " " * n + "y",
    "word": lambda n: "a" * n + "!",
    "digits": lambda n: "1" * n + "x",
    "dotted": lambda n: "a." * n + "=",
    "underscore": lambda n: "a_" * n + " ",
    "dashes": lambda n: "--" + "a-" * n,
    "quotes": lambda n: "'" * n + "x",
    "braces": lambda n: "{" * n,
    "colons": lambda n: "a:" * n,
    "loss words": lambda n: "loss " * (n // 5) + "x",
    "cjk": lambda n: "损失" * (n // 2) + "为",
    "mixed": lambda n: ("x1_." * (n // 4)) + "=",
    "tabs": lambda n: "k" + "\t" * n + "v",
    "exclaim": lambda n: "!" * n + "a",
    "heading spaces": lambda n: "# a" + " " * n + "b" + " " * n + "c",  # found by scripts/fuzz.py (ingest)
    "list spaces": lambda n: "- a" + " " * n + "b" + " " * n + "c",
}


# Patterns the library only ever anchors at one position (`.match(text, pos)` right after a label), never scans.
MATCH_ONLY = {"kb.facts.statements._VALUE", "kb.facts.prose._SETTING_AFTER", "kb.facts.prose._NAME_THEN_VALUE",
              "kb.facts.prose._METRIC_VALUE_AFTER"}


def _work(rx: re.Pattern[str], text: str, scan: bool = True) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        if scan:
            for _m in rx.finditer(text):
                pass
        rx.match(text)
        best = min(best, time.process_time() - t0)
    return best


ALL = patterns() + data_patterns()


def test_the_scan_sees_the_patterns_that_read_input():
    names = {n for n, _ in ALL}
    assert len(ALL) > 80
    assert "kb.facts.configs._KV_LINE" in names and "kb.facts.logs._PAIR" in names
    assert any(n.startswith("cue all-labels-masked") for n in names)
    assert any(" signature " in n for n in names) and any(" trigger " in n for n in names)


def test_the_ratio_check_catches_a_quadratic_pattern():
    bad = re.compile(r"(?:a+)+b|\s+#")  # the textbook catastrophic shape, bounded to be merely quadratic here
    # 8x the input: a quadratic pattern takes ~64x the time, well clear of the 8x asserted on a loaded machine
    small, big = " " * 500 + "x", " " * 4000 + "x"
    assert _work(bad, big) / max(_work(bad, small), 1e-6) > 8


@pytest.mark.parametrize("name, rx", ALL, ids=[n for n, _ in ALL])
def test_pattern_work_grows_linearly_with_the_input(name, rx):
    # Lines reach patterns capped at KB_MAX_LINE_CHARS (8,000 by default): that is the size that matters.
    for shape, make in ADVERSARIAL.items():
        small, big = make(1000), make(4000)
        t_small = _work(rx, small, name not in MATCH_ONLY)
        t_big = _work(rx, big, name not in MATCH_ONLY)
        if t_big < 0.02:
            continue  # too fast to matter at the largest line a pattern ever sees
        ratio = t_big / max(t_small, 1e-4)
        assert ratio < 10, f"{name} on {shape}: 4x the input took {ratio:.0f}x the time ({t_big:.3f}s)"
