"""Property-based fuzzing of `KnowledgeBase.diagnose` and `kb.ingest.parse_document`, and the regression corpus
(tests/data/fuzz/library.jsonl) of inputs that crashed or hung the library: only kb.errors.KBError may escape.

Entries marked `known_bug` still crash the library: they are strict xfails, so the day the library handles one
the test turns red and the marker comes off. The property tests leave out the same known classes (KNOWN_BUGS)
so that they keep finding new ones; scripts/fuzz.py runs the longer campaign without any exclusion.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_api import prebuilt_data_dir  # tests/ is on sys.path (pytest's default import mode)

from kb.errors import KBError

CORPUS = Path(__file__).parent / "data" / "fuzz" / "library.jsonl"
# Examples per property: a CI-sized default; KB_FUZZ_EXAMPLES=500 for a deeper local run (scripts/fuzz.py goes further).
EXAMPLES = int(os.environ.get("KB_FUZZ_EXAMPLES", "40"))

FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------------------ strategies
CONFIG_KEYS = ["max_length", "cutoff_len", "micro_batch_size", "per_device_train_batch_size", "zero_stage",
               "learning_rate", "lr", "fp16", "bf16", "torch_dtype", "num_generations", "beta", "stage",
               "sequence_parallel_size", "gradient_accumulation_steps", "rpo_alpha", "loss_type", "deepspeed",
               "model_name_or_path", "num_gpus", "warmup_ratio", "max_grad_norm"]
NONFINITE = ["nan", "NaN", "inf", "-inf", "Infinity", ".nan", ".inf", "1e309", "-1e309"]
ODD_VALUES = ["0", "-0", "99999999999999999999999999", "0x7fffffff", "1_000", "１２", "true", "null", "~", "[]",
              "{}", "''", '"', "\\", "bf16", "fp16", "auto", "\u00a0", "1e-400"]
values = st.one_of(st.sampled_from(NONFINITE + ODD_VALUES), st.integers(-10**30, 10**30).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=12))
config_line = st.builds(lambda k, v, f: f.format(k=k, v=v), st.sampled_from(CONFIG_KEYS), values,
                        st.sampled_from(["{k}: {v}", "--{k} {v}", "--{k}={v}", '"{k}": {v},', "{k}={v}",
                                         "  {k}:\n    {v}"]))
log_line = st.builds(lambda t, v, w: t.format(v=v, w=w), st.sampled_from([
    "{{'loss': {v}, 'grad_norm': {v}, 'epoch': 0.1}}", "step 3: loss={v} grad_norm={w}", "loss: {v}",
    '{{"loss": {v}, "nll_loss": {w}}}', "RuntimeError: {w}", "Traceback (most recent call last):",
    "UserWarning: std(): degrees of freedom is <= 0", "[rank0]: {w}"]), values, st.text(max_size=30))
nesting = st.builds(lambda d, kind: ["[" * d + "]" * d, '{"a":' * d + "1" + "}" * d, "a: " + "[" * d + "]" * d,
                                     "".join(f"{'  ' * i}k{i}:\n" for i in range(d)) + "  " * d + "x"][kind],
                    st.integers(1, 2000), st.integers(0, 3))
pieces = st.one_of(st.text(max_size=300), config_line, log_line, nesting,
                   st.builds(lambda n, m: "a: " + " " * n + "x" + " " * m + "y", st.integers(0, 200),
                             st.integers(0, 200)))
paste = st.lists(pieces, min_size=1, max_size=8).flatmap(
    lambda ps: st.sampled_from(["\n", "\r\n", " ", ""]).map(lambda sep: sep.join(ps)))
diagnose_inputs = st.dictionaries(st.sampled_from(["log", "config", "question", "text"]), paste, min_size=1,
                                  max_size=3)
ingest_inputs = st.tuples(st.one_of(paste, st.builds(lambda fm, body: f"---\nid: fuzz-x\n{fm}\n---\n{body}",
                                                     paste, paste)),
                          st.sampled_from(["a.md", "a.txt", "a.html", "a", "incident.md"]))

# ------------------------------------------------------------------------------------------ known library bugs
# Each pattern matches one crash class pinned in the corpus as a strict xfail. Delete a line when the library
# fix lands (its corpus entries then pass, and the property tests cover the class again).
_INT_KEYS = (r"max_length|cutoff_len|micro_batch_size|per_device_train_batch_size|zero_stage|num_generations|stage"
             r"|sequence_parallel_size|gradient_accumulation_steps|num_gpus|deepspeed")
KNOWN_BUGS: dict[str, re.Pattern[str]] = {}  # every class found so far is fixed in the library


def _too_deep(text: str) -> bool:
    depth = best = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    indents = [len(m.group(1)) // 2 for m in re.finditer(r"(?m)^( +)\S", text)]
    return best >= 400 or max(indents, default=0) >= 400


def known_bug(*texts: str) -> str | None:
    for text in texts:
        for name, pattern in KNOWN_BUGS.items():
            if name.startswith("nesting"):
                if _too_deep(text):
                    return name
            elif pattern.search(text):
                return name
    return None


# ------------------------------------------------------------------------------------------ properties
@pytest.fixture(scope="module")
def kb(tmp_path_factory, repo_root):
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=prebuilt_data_dir(tmp_path_factory, repo_root),
                            incidents_dir=repo_root / "incidents")
    kb.build_index()
    return kb


@FUZZ
@given(inputs=diagnose_inputs)
def test_diagnose_raises_only_library_errors(kb, inputs):
    assume(known_bug(*inputs.values()) is None)
    try:
        kb.diagnose(**inputs, k=3)
    except KBError:
        pass


@FUZZ
@given(doc=ingest_inputs)
def test_parse_document_raises_only_library_errors(doc):
    from kb.ingest.parse import parse_document

    text, name = doc
    assume(known_bug(text) is None)
    try:
        parse_document(text, name=name)
    except KBError:
        pass


def test_no_crash_class_is_excluded_any_more():
    """Every class the fuzzers found is fixed in the library, so the properties cover all of them again."""
    assert KNOWN_BUGS == {}
    for text in ("max_length: nan", "--max_length inf", "[" * 500, "x \ud800", "<![\\"):
        assert known_bug(text) is None


# ------------------------------------------------------------------------------------------ regression corpus
def _corpus() -> list:
    out = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        marks = [pytest.mark.xfail(strict=True, reason=f"library bug: {entry['known_bug']}")] \
            if entry.get("known_bug") else []
        out.append(pytest.param(entry, id=entry["id"], marks=marks))
    return out


# Runs one corpus entry in a child process, so a hang is cut off by the parent instead of stalling the suite.
_RUN_ONE = """
import json, sys
from kb.errors import KBError
entry = json.loads(sys.stdin.read())
try:
    if entry["target"] == "diagnose":
        from kb.kb import KnowledgeBase
        KnowledgeBase.open(data_dir=sys.argv[1], incidents_dir=sys.argv[2]).diagnose(**entry["input"], k=3)
    else:
        from kb.ingest.parse import parse_document
        parse_document(entry["input"]["text"], name=entry["input"].get("name", ""))
except KBError:
    pass
print("done")
"""
HANG_GUARD_S = 45  # a guard against a hang, not a speed target: the inputs take well under a second when fixed


@pytest.fixture(scope="module")
def hang_runs(kb, repo_root):
    """The corpus's hang cases, started together in child processes; each test collects its own."""
    import time

    runs = {}
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry.get("hang"):
            proc = subprocess.Popen([sys.executable, "-c", _RUN_ONE, str(kb.data_dir), str(repo_root / "incidents")],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=str(repo_root))
            proc.stdin.write(json.dumps(entry))
            proc.stdin.close()
            proc.stdin = None  # already closed: communicate() must not flush it again
            runs[entry["id"]] = (proc, time.monotonic())
    yield runs
    for proc, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _start_hang_runs_early(request):
    # Started before the property tests, so the guard's wait overlaps with them instead of adding to the suite.
    if any(item.name.startswith("test_regression_corpus[") and item.module is request.module
           for item in request.session.items):
        request.getfixturevalue("hang_runs")


@pytest.mark.parametrize("entry", _corpus())
def test_regression_corpus(entry, kb, hang_runs):
    if entry.get("hang"):
        import time

        proc, started = hang_runs[entry["id"]]
        try:
            out, err = proc.communicate(timeout=max(1.0, HANG_GUARD_S - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{entry['id']}: no answer within {HANG_GUARD_S} s (hang)")
        assert proc.returncode == 0 and "done" in out, err[-2000:]
        return
    if entry["target"] == "diagnose":
        try:
            kb.diagnose(**entry["input"], k=3)
        except KBError:
            pass
    else:
        from kb.ingest.parse import parse_document

        try:
            parse_document(entry["input"]["text"], name=entry["input"].get("name", ""))
        except KBError:
            pass
