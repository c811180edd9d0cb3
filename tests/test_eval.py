"""`kb eval`: accuracy / MRR / abstention report on a labelled JSONL set, per language, kind and mode."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from kb.diagnose.evaluate import evaluate, fit_logistic, format_report, load_eval_set
from kb.errors import InputError
from kb.kb import KnowledgeBase


@pytest.fixture(scope="module")
def real_kb(repo_root, tmp_path_factory) -> KnowledgeBase:
    # Embedding every curated incident takes tens of seconds on 2 cores: reuse KB_DATA_DIR's index when given.
    data = os.environ.get("KB_DATA_DIR") or tmp_path_factory.mktemp("data")
    kb = KnowledgeBase.open(data_dir=data, incidents_dir=repo_root / "incidents")
    if not kb.records:
        pytest.skip("no curated incidents in ./incidents yet")
    return kb


@pytest.mark.slow
def test_eval_on_dev_set(real_kb, shared_dir):
    rows = load_eval_set(shared_dir / "eval" / "dev.jsonl")
    rep = evaluate(real_kb, rows, mode="full")
    o = rep["overall"]
    assert o["n"] == len(rows) and 0.0 <= o["top1"] <= o["top3"] <= 1.0 and 0.0 <= o["mrr"] <= 1.0
    assert set(rep["by_lang"]) == {"en", "zh"} and set(rep["by_kind"]) == {"known-issue", "same-cause"}
    assert "top1=" in format_report(rep)


@pytest.mark.slow
def test_eval_abstention_set(real_kb, repo_root):
    rep = evaluate(real_kb, load_eval_set(repo_root / "tests/data/abstain.jsonl"))
    assert rep["overall"]["abstain_recall"] == 1.0 and rep["overall"]["abstain_precision"] == 1.0


@pytest.mark.slow
def test_cli_eval_json(real_kb, repo_root, capsys):
    from kb.cli import main

    code = main(["--data-dir", str(real_kb.data_dir), "--incidents-dir", str(real_kb.incidents_dir), "eval",
                 str(repo_root / "tests/data/abstain.jsonl"), "--mode", "bm25", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["mode"] == "bm25"


def test_bad_eval_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"query": "x"}\n')
    with pytest.raises(InputError):
        load_eval_set(p)


def test_logistic_fit_separates_a_clear_feature():
    X = np.array([[1.0], [0.9], [0.1], [0.0]] * 10)
    y = np.array([1.0, 1.0, 0.0, 0.0] * 10)
    w = fit_logistic(X, y)
    assert w[0] > 0 and (1 / (1 + np.exp(-(w[0] * 1.0 + w[1])))) > 0.5 > (1 / (1 + np.exp(-w[1])))
