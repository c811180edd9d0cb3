"""The text classifiers behind the learned ranker's `text` / `oos_text` features: what they learn, that the
scores a training case gets are truly left out, and that the shipped model loads and is what diagnosis uses."""

from __future__ import annotations

import numpy as np
import pytest

from kb.diagnose import learned
from kb.diagnose.learned import OUT_OF_SCOPE, TextModel, _ridge, text_counts

MASKED = ["loss is 0.0 from the first step, tokenization mismatch warning in the log",
          "training loss stays exactly 0, WARNING: tokenization mismatch: 312 vs. 318",
          "loss 一直是 0，日志里 tokenization mismatch 警告",
          "train loss 0.0000 every epoch with tokenization mismatch after changing the template"]
OVERFLOW = ["fp16 loss scale keeps halving, Gradient overflow. Skipping step, loss scale 1",
            "Current loss scale already at minimum, fp16 overflow, loss nan",
            "使用 fp16 训练 loss scale 降到最小后 loss 变成 nan, Gradient overflow",
            "attempted loss scale 0.5 below minimum; fp16 overflow every step"]
OOM = ["torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
       "CUDA out of memory when loading the 13b model on a 24GB card",
       "显存不足 CUDA out of memory, batch size 已经是 1",
       "RuntimeError: CUDA out of memory during evaluation"]


def _fit(texts: list[str], labels: list[str], train: list[int]):
    return TextModel.fit([text_counts(t) for t in texts], labels, train)


def test_text_model_separates_scope_and_categories_on_unseen_text():
    texts = MASKED + OVERFLOW + OOM
    labels = ["all-labels-masked"] * 4 + ["fp16-overflow"] * 4 + [OUT_OF_SCOPE] * 4
    model, _ = _fit(texts, labels, list(range(len(texts))))
    assert model.categories == ["all-labels-masked", "fp16-overflow"]
    scope, cats = model.scores("my loss is 0 and the log says tokenization mismatch")
    assert cats["all-labels-masked"] > cats["fp16-overflow"] and scope < 0
    scope, cats = model.scores("Gradient overflow, loss scale at minimum with fp16")
    assert cats["fp16-overflow"] > cats["all-labels-masked"] and scope < 0
    scope, _ = model.scores("CUDA out of memory, tried to allocate 4 GiB")
    assert scope > 0


def test_leave_one_out_scores_equal_a_refit_without_the_row():
    """The closed form that gives training cases their scores must be exactly a refit that never saw the case
    (otherwise the ranker would learn to trust scores that are better than an unseen report gets)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(9, 30))
    Y = np.eye(3)[rng.integers(0, 3, size=9)]
    _, loo = _ridge(X, Y, 0.3)
    for i in range(9):
        keep = [j for j in range(9) if j != i]
        w, _ = _ridge(X[keep], Y[keep], 0.3)
        np.testing.assert_allclose(loo[i], X[i] @ w, atol=1e-8)


def test_fold_scores_of_training_rows_are_out_of_sample_and_test_rows_use_the_fit():
    texts = MASKED + OVERFLOW + OOM
    labels = ["all-labels-masked"] * 4 + ["fp16-overflow"] * 4 + [OUT_OF_SCOPE] * 4
    train = [0, 1, 2, 4, 5, 6, 8, 9, 10]
    model, scores = _fit(texts, labels, train)
    for j in (3, 7, 11):  # held out: exactly what the fitted model says
        scope, cats = model.scores(texts[j])
        assert scores[j][0] == pytest.approx(scope, abs=1e-5)
        assert all(scores[j][1][c] == pytest.approx(v, abs=1e-5) for c, v in cats.items())
    for j in train:  # in the fit: not what the fitted model says (it saw the row)
        assert scores[j][0] != pytest.approx(model.scores(texts[j])[0], abs=1e-4)
        if labels[j] != OUT_OF_SCOPE:  # out-of-scope rows are not in the category fit: their scores are its own
            assert scores[j][1] != pytest.approx(model.scores(texts[j])[1], abs=1e-4)


def test_saved_text_model_round_trips_and_a_foreign_file_is_refused(tmp_path):
    texts = MASKED + OVERFLOW + OOM
    labels = ["all-labels-masked"] * 4 + ["fp16-overflow"] * 4 + [OUT_OF_SCOPE] * 4
    model, _ = _fit(texts, labels, list(range(len(texts))))
    path = tmp_path / "text.npz"
    model.save(path)
    back = TextModel.load(path)
    assert back is not None and back.categories == model.categories
    q = "loss 0 with tokenization mismatch"
    a, b = model.scores(q), back.scores(q)
    assert a[0] == pytest.approx(b[0], abs=2e-3)
    assert all(a[1][c] == pytest.approx(b[1][c], abs=2e-3) for c in a[1])
    np.savez(tmp_path / "other.npz", dim=np.array(learned.TEXT_DIM * 2))
    assert TextModel.load(tmp_path / "other.npz") is None
    assert TextModel.load(tmp_path / "missing.npz") is None


def test_the_text_classifiers_read_a_report_without_the_tools_it_names(repo_root, tmp_path):
    from kb.cases import load_cases

    cases, _ = load_cases(repo_root / "cases")
    names = learned.tool_names(cases)
    # the training frameworks and the case base's projects; not a kernel, a model family or a short common word
    assert {"llama-factory", "ms-swift", "verl", "trl", "medicalgpt", "minimind"} <= set(names)
    assert not {"flash-attention", "liger-kernel", "qwen2.5-vl", "moe-llava", "roll", "apex", "peft", "adopt"} & set(names)
    assert list(names) == sorted(names, key=lambda n: (-len(n), n))  # longest first: "llama-factory" before "llama"
    texts = MASKED + OVERFLOW + OOM
    labels = ["all-labels-masked"] * 4 + ["fp16-overflow"] * 4 + [OUT_OF_SCOPE] * 4
    model, _ = TextModel.fit([text_counts(t, names) for t in texts], labels, range(len(texts)), names)
    assert model.names == names
    # Two reports that differ only in the tool they ran score alike; a word that is no tool's name still counts.
    a = model.scores("LLaMA-Factory: loss 0 with tokenization mismatch")
    b = model.scores("ms-swift: loss 0 with tokenization mismatch")
    assert a[0] == pytest.approx(b[0], abs=1e-6) and a[1] == pytest.approx(b[1], abs=1e-6)
    assert text_counts("llamafactory-cli train, loss nan", names) == text_counts("verl train, loss nan", names) != \
        text_counts("llamafactory-cli train, loss nan")
    # the names travel with a saved model; a model saved before they did is refitted
    model.save(tmp_path / "t.npz")
    assert TextModel.load(tmp_path / "t.npz").names == names
    with np.load(tmp_path / "t.npz") as z:
        np.savez(tmp_path / "old.npz", **{k: z[k] for k in z.files if k != "names"})
    assert TextModel.load(tmp_path / "old.npz") is None


def test_the_shipped_ranker_and_the_text_classifiers_fitted_from_the_case_base(repo_root, tmp_path):
    from kb.cases import load_cases

    ranker = learned.Ranker.load()
    assert ranker is not None, "refit with `kb eval --cv --fit`"
    assert len(ranker.weights) == len(learned.FEATURES)
    cases, _ = load_cases(repo_root / "cases")
    cache = tmp_path / "cases-text.npz"
    text = TextModel.for_cases(cases, cache)
    assert text is not None and cache.is_file()
    assert set(text.categories) <= set(ranker.labels) and OUT_OF_SCOPE not in text.categories
    oom = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    scope, _ = text.scores(oom)
    assert scope > 0
    again = TextModel.for_cases(cases, cache)  # from the cache: the same model
    assert again is not None and again.scores(oom)[0] == pytest.approx(scope, abs=1e-5)
    assert TextModel.for_cases(cases[:-1], cache).scores(oom)[0] != pytest.approx(scope, abs=1e-7)  # refit
    w = dict(zip(learned.FEATURES, ranker.weights))
    assert w["text"] > 0 and w["oos_text"] > 0  # fitted, not hand-set: both features point the way they mean


@pytest.mark.slow
def test_cv_on_a_small_case_base_reports_out_of_fold_numbers_and_the_fit_writes_the_ranker(repo_root, tmp_path,
                                                                                            tmp_path_factory):
    """`kb eval --cv --fit` end to end on a subset of the real case base (so it runs in seconds)."""
    import os
    import shutil

    from kb import KnowledgeBase
    from kb.cases import load_cases
    from kb.diagnose.evaluate import (
        TEXTS_ROW,
        TEXTS_ROW_AS_WRITTEN,
        VARIANTS,
        cross_validate,
        fit_case_ranker,
        format_cv,
        learning_curve,
    )
    from kb.errors import InputError, NotFound

    data = os.environ.get("KB_DATA_DIR") or tmp_path_factory.mktemp("data")
    kb = KnowledgeBase.open(data_dir=data, incidents_dir=repo_root / "incidents")
    every, _ = load_cases(kb.cases_dir, kb.records.keys())
    want = {"framework-bug": 8, "fp16-overflow": 6, "out-of-scope": 10}
    chosen = []
    for c in sorted(every, key=lambda c: c.id):
        if want.get(c.category, 0) > 0:
            want[c.category] -= 1
            chosen.append(c)
    assert not any(want.values()), "the shipped case base should hold these labels"
    sub = tmp_path / "cases"
    sub.mkdir()
    for c in chosen:
        shutil.copy(kb.cases_dir / f"{c.id}.yaml", sub / f"{c.id}.yaml")
    kb.cases_dir = sub

    # --texts: five reports answered a second time from another text. Given their own text as written, the
    # answers are the grouped scheme's answers (same folds, same rankers); given the title, they are scored apart.
    same = {c.id: c.query() for c in chosen[::5]}
    report = cross_validate(kb, folds=3, draws=4, texts=same)
    assert report["predictions"]["the given texts"] == {k: report["predictions"]["grouped by thread"][k] for k in same}
    assert report[TEXTS_ROW] == report[TEXTS_ROW_AS_WRITTEN]
    assert report[TEXTS_ROW]["n_in"] + report[TEXTS_ROW]["n_out"] == len(same) == 5
    with pytest.raises(NotFound):
        cross_validate(kb, folds=3, draws=1, texts={"no-such-case": "loss nan"})
    report = cross_validate(kb, folds=3, draws=4)
    assert TEXTS_ROW not in report and "the given texts" not in report["predictions"]
    assert report["cases"] == len(chosen) == report["threads"]
    mean = report["learned, grouped by thread, mean of 4 fold draws"]  # the grouped scheme over 4 assignments
    assert mean["draws"] == 4 and mean["n_in"] == 14 and mean["n_out"] == 10
    assert mean["top1_min"] <= mean["top1"] <= mean["top1_max"] and mean["top1_sd"] >= 0.0
    assert mean["top1_min"] <= report["learned, grouped by thread"]["top1"] <= mean["top1_max"]
    for name in ("learned, grouped by thread", "learned, leave one framework out", "rules only (no case learning)",
                 "plain hybrid retrieval", *VARIANTS):
        r = report[name]
        assert r["n_in"] == 14 and r["n_out"] == 10 and 0.0 <= r["top1"] <= 1.0
    preds = report["predictions"]["grouped by thread"]  # every case's own out-of-fold answer, by id
    assert set(preds) == {c.id for c in chosen}
    assert set(report["predictions"]["leave one framework out"]) == set(preds)
    for lab, t in report["confusion"].items():  # the per-case answers are the ones the table counts
        assert t["right"] == sum(1 for c in chosen if learned.label_of(c) == lab == preds[c.id])
    conf = report["confusion"]
    assert sum(t["n"] for t in conf.values()) == len(chosen)
    assert all(t["right"] + sum(t["went_to"].values()) == t["n"] for t in conf.values())
    assert "where the misses went" in format_cv(report) and "over 4 fold assignments" in format_cv(report)
    # The shown confidence's reliability counts every report once, and its right answers are the table's.
    check = report["confidence"]
    assert sum(b["n"] for b in check["bins"]) == len(chosen)
    assert round(sum(b["n"] * b["correct"] for b in check["bins"] if b["n"])) == sum(
        t["right"] for t in conf.values())
    assert 0.0 <= check["ece"] <= 1.0
    answered = [x["answered"] for x in check["in_scope_by_confidence"]]
    assert answered == sorted(answered, reverse=True) and answered[0] <= 1.0
    assert "expected calibration error" in format_cv(report)
    by_lang = [report[f"  of which reports in {lang}"] for lang in ("zh", "en")]
    assert sum(r["n_in"] for r in by_lang) == 14 and sum(r["n_out"] for r in by_lang) == 10

    # The learning curve's whole-case-base point is the same measurement as the mean of fold draws above; a smaller
    # share fits on fewer cases and answers the same reports.
    curve = learning_curve(kb, (0.5, 1.0), folds=3, draws=4)
    half, whole = curve["points"]
    assert (whole["top1"], whole["in_abstained"], whole["out_abstained"]) == (
        mean["top1"], mean["in_abstained"], mean["out_abstained"])
    assert half["share"] == 0.5 and 0 < half["train_cases"] < whole["train_cases"] == len(chosen) * 2 / 3
    assert 0.0 <= half["top1"] <= 1.0
    with pytest.raises(InputError):
        learning_curve(kb, (0.0, 1.0), folds=3, draws=1)

    out = tmp_path / "learned.json"
    assert fit_case_ranker(kb, out=out)["track_record"] is False  # no report: weights only
    assert learned.Ranker.load(out).track_record is None
    assert fit_case_ranker(kb, out=out, report=report)["track_record"] is True
    ranker = learned.Ranker.load(out)
    assert ranker is not None and len(ranker.weights) == len(learned.FEATURES)
    assert ranker.track_record["bins"] == report["confidence"]["bins"] and ranker.track_record["reports"] == 24
    text = TextModel.for_cases(chosen)
    assert text is not None and text.categories == ["fp16-overflow", "framework-bug"]


def test_case_texts_folder_for_eval_cv(tmp_path):
    """`kb eval --cv --texts DIR`: <case id>.txt files, a source line and a #PARTIAL marker on top left out;
    binary junk, a missing or empty folder are clear errors."""
    from kb.diagnose.evaluate import load_case_texts
    from kb.errors import InputError

    (tmp_path / "gh-a-b-1.txt").write_text("# https://github.com/a/b/issues/1\n#PARTIAL\nLoss NaN\n# Logs\nx\n")
    (tmp_path / "gh-a-b-2.txt").write_text("\n\n训练 loss 为 0\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("# https://example.org/t/1\n")
    (tmp_path / "notes.md").write_text("not a case text")
    assert load_case_texts(tmp_path) == {"gh-a-b-1": "Loss NaN\n# Logs\nx", "gh-a-b-2": "训练 loss 为 0"}
    (tmp_path / "junk.txt").write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(InputError):
        load_case_texts(tmp_path)
    with pytest.raises(InputError):
        load_case_texts(tmp_path / "missing")
    (tmp_path / "none").mkdir()
    with pytest.raises(InputError):
        load_case_texts(tmp_path / "none")


def test_case_index_caches_its_tokens_so_a_fresh_process_needs_no_jieba(repo_root, tmp_path):
    """The cases' Chinese text is not in the index's saved segmentations; with the cut cached beside the
    vectors a cold diagnosis opens the case index without loading jieba's dictionary, and gets the same BM25."""
    import os
    import subprocess
    import sys

    script = f"""
import sys
from pathlib import Path
from kb.cases import load_cases
from kb.diagnose.learned import CaseIndex
from kb.embed import get_embedder
cases, _ = load_cases(Path({str(repo_root / "cases")!r}))
idx = CaseIndex.build(cases, get_embedder(), Path({str(tmp_path / "cases-index.npz")!r}))
print(int("jieba" in sys.modules), len(idx.bm25.vocab), round(float(idx.bm25.scores(["loss", "nan", "溢出"]).sum()), 4))
"""
    env = {**os.environ, "KB_DATA_DIR": str(tmp_path / "data")}  # model and jieba caches stay in the test's dir
    runs = [subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                           timeout=300, env=env)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    first, second = (r.stdout.split() for r in runs)
    assert first[0] == "1" and second[0] == "0"  # the first run cut the Chinese text, the second read the cut
    assert first[1:] == second[1:]


def test_a_case_from_an_incidents_own_thread_is_answered_without_that_incident(repo_root, tmp_path_factory):
    """Cross-validation meets a report the curated incidents were written from as a new user's report: the
    incidents citing its thread are left out of the rules' candidates and of the retrieval baseline."""
    import os

    from kb import KnowledgeBase
    from kb.diagnose.evaluate import _case_views

    data = os.environ.get("KB_DATA_DIR") or tmp_path_factory.mktemp("data")
    kb = KnowledgeBase.open(data_dir=data, incidents_dir=repo_root / "incidents")
    by_id = {c.id: c for c in kb.cases}
    cited, other = by_id["gh-hiyouga-llamafactory-950"], by_id["gh-axolotl-ai-cloud-axolotl-1381"]
    index = learned.CaseIndex.build([cited, other], kb.embedder)
    rows = _case_views(kb, [cited, other], index)
    assert rows[0]["excluded"] == ["llamafactory-baichuan2-fp16-zero-loss"]
    assert "llamafactory-baichuan2-fp16-zero-loss" not in rows[0]["rules_incidents"]
    assert rows[0]["rules_incidents"]  # the other incidents still answer it
    assert rows[1]["excluded"] == []


@pytest.mark.parametrize(("rules", "probs", "first"), [
    # A confident rule leads over a less confident ranker...
    (0.64, [0.50, 0.30, 0.20], "rule-cause"),
    # ...but never pushes down a cause the ranker is more confident of (the list stays ordered by confidence).
    (0.64, [0.71, 0.09, 0.20], "ranker-cause"),
    # Against a confident out of scope it still leads: a configuration pasted alone is a question about it.
    (0.64, [0.10, 0.05, 0.85], "rule-cause"),
    # An unsure ranker defers to rules that would not abstain themselves, when they are the surer of the two.
    (0.28, [0.20, 0.26, 0.10], "rule-cause"),
    (0.28, [0.33, 0.27, 0.10], "ranker-cause"),
])
def test_the_rules_lead_only_when_they_are_the_more_confident(rules, probs, first):
    from kb.facts import Facts

    labels = ["ranker-cause", "rule-cause", OUT_OF_SCOPE]
    view = learned.QueryView(facts=Facts(), category_scores={"rule-cause": rules}, fired={"rule-cause"},
                             engine_top="rule-cause", sims=np.zeros(0))
    # "nan" keeps the report in scope for the scope rules (a symptom), so only the ordering is under test.
    view.facts.set("nan_metrics", ["loss"], "text", None, "loss nan")
    assert labels[learned.ranked(view, np.array(probs), labels, "loss nan")[0]] == first


def test_the_confidence_shown_is_the_rankers_unless_the_rules_put_the_same_label_first_and_are_surer():
    from kb.facts import Facts

    labels = ["ranker-cause", "rule-cause", OUT_OF_SCOPE]
    view = learned.QueryView(facts=Facts(), category_scores={"rule-cause": 0.64}, fired={"rule-cause"},
                             engine_top="rule-cause", sims=np.zeros(0))
    shown = learned.shown_probabilities(view, np.array([0.2, 0.5, 0.3]), labels, [1, 2, 0])
    assert list(shown) == ["rule-cause", OUT_OF_SCOPE, "ranker-cause"]  # best first
    # The others share what is left (0.36) in their own proportions (0.3 : 0.2): the shown probabilities add up.
    assert shown == pytest.approx({"rule-cause": 0.64, OUT_OF_SCOPE: 0.216, "ranker-cause": 0.144})
    assert sum(shown.values()) == pytest.approx(1.0)
    # The rules' score lifts only their own first label, and never lowers the ranker's.
    shown = learned.shown_probabilities(view, np.array([0.7, 0.1, 0.2]), labels, [0, 2, 1])
    assert shown == {"ranker-cause": 0.7, OUT_OF_SCOPE: 0.2, "rule-cause": 0.1}
    shown = learned.shown_probabilities(view, np.array([0.1, 0.8, 0.1]), labels, [1, 0, 2])
    assert shown["rule-cause"] == 0.8


def test_the_track_record_quotes_the_band_of_a_confidence_and_keeps_quiet_on_thin_bands(tmp_path):
    bins = [{"bin": "0.00-0.50", "n": 5, "correct": 0.2, "mean_confidence": 0.3},
            {"bin": "0.50-0.90", "n": 40, "correct": 0.7, "mean_confidence": 0.7},
            {"bin": "0.90-1.00", "n": 60, "correct": 0.95, "mean_confidence": 0.97}]
    ranker = learned.Ranker(track_record={"reports": 105, "bins": bins})
    assert ranker.record_for(0.6) == {"band": "0.50-0.90", "reports": 40, "right": 0.7, "of": 105, "percent": 70}
    # The percent every display quotes comes from the count right, half up: 347 of 375 (stored 0.925) is 93 %,
    # 37 of 40 (0.925 exactly) too, where round(92.5) would say 92.
    for n, correct, pct in ((375, 0.925, 93), (40, 0.925, 93), (40, 0.7, 70), (60, 0.95, 95), (21, 0.0, 0)):
        r = learned.Ranker(track_record={"reports": n, "bins": [{"bin": "0.00-1.00", "n": n, "correct": correct}]})
        assert r.record_for(0.5)["percent"] == pct, (n, correct)
    assert ranker.record_for(0.9)["band"] == ranker.record_for(1.0)["band"] == "0.90-1.00"
    assert ranker.record_for(0.3) is None  # 5 reports say too little
    assert learned.Ranker().record_for(0.6) is None  # never measured
    # A saved record comes back; a damaged one is dropped, the weights still load.
    path = tmp_path / "learned.json"
    ranker.save(path, {"track_record": ranker.track_record})
    assert learned.Ranker.load(path).record_for(0.6)["right"] == 0.7
    for damaged in ([{"n": 3}], [{"bin": "x", "n": 3}], [{"bin": "0.9-0.5", "n": 3}], [{"bin": "0-1"}], [{"bin": "0-1", "n": 30, "correct": "most"}], "bins"):
        ranker.save(path, {"track_record": {"bins": damaged}})
        loaded = learned.Ranker.load(path)
        assert loaded is not None and loaded.track_record is None and loaded.record_for(0.6) is None


def test_a_mechanism_the_reports_algorithm_rules_out_neither_leads_nor_scores():
    from kb.facts import Facts

    facts = Facts()
    facts.set("algorithm", "ORPO", "text", 1, "TRL ORPO training blows up")
    facts.set("nan_metrics", ["loss"], "text", 1, "one logged loss was NaN")
    assert learned.algorithm_mismatch("kto-unbalanced-batch", facts)
    assert not learned.algorithm_mismatch("log-odds-cancellation", facts)
    assert not learned.algorithm_mismatch("framework-bug", facts)  # no algorithm of its own
    assert not learned.algorithm_mismatch("kto-unbalanced-batch", Facts())  # an unknown algorithm rules nothing out
    # A confident rule for KTO's mechanism does not lead an ORPO report; the ranker's order stands.
    labels = ["framework-bug", "kto-unbalanced-batch", "log-odds-cancellation", OUT_OF_SCOPE]
    view = learned.QueryView(facts=facts, category_scores={"kto-unbalanced-batch": 0.7}, fired=set(),
                             engine_top="kto-unbalanced-batch", sims=np.zeros(0))
    probs = np.array([0.40, 0.05, 0.35, 0.20])
    assert labels[learned.ranked(view, probs, labels, "ORPO loss nan")[0]] == "framework-bug"
    # The feature the ranker weighs marks the impossible label only.
    nbrs: list[int] = []
    on = {lab: learned.features(view, lab, nbrs, [], {}, "ORPO loss nan")[learned.FEATURES.index("algo_mismatch")]
          for lab in labels}
    assert on == {"framework-bug": 0.0, "kto-unbalanced-batch": 1.0, "log-odds-cancellation": 0.0, OUT_OF_SCOPE: 0.0}


@pytest.mark.parametrize(("text", "release"), [
    ("loss nan after upgrading transformers to 4.46", True),
    ("loading the older revision refs/pr/23 of the model repo made training work again", True),
    ("rolled back to deepspeed 0.12.6 and the grad_norm is finite", True),
    ("升级 peft 之后 loss 变成 0", True),
    ("loss nan at step 300 with lr 2e-5", False),
    ("the previous step had a finite loss", False),
])
def test_a_release_said_to_matter_counts_for_the_framework_defect_route(text, release):
    from kb.facts import Facts

    view = learned.QueryView(facts=Facts(), category_scores={}, fired=set(), engine_top=None, sims=np.zeros(0))
    row = learned.features(view, learned.FRAMEWORK_BUG, [], [], {}, text)
    assert row[learned.FEATURES.index("fw_release_words")] == (1.0 if release else 0.0)


@pytest.mark.parametrize(("text", "inference"), [
    ("Qwen2-7B with float16 generate() outputs only exclamation marks", True),
    ("vLLM 部署后调用，返回结果是一串感叹号", True),
    # an RL run generates too, inside training: its rollouts are not inference
    ('verl agentic RL: rollouts degenerate to "!!!!" repeated until max_response_length', False),
    ("强化学习时 rollout 生成的回答全是乱码", False),
])
def test_generation_inside_an_rl_run_is_training(text, inference):
    assert learned.inference_only(text) is inference


def test_a_training_loss_read_as_nan_keeps_the_best_in_scope_cause_first():
    """The ranker's "out of scope" does not overrule a training loss or gradient norm the paste shows going NaN
    (a Chinese pretraining report with a script's argparse block was sent out of scope in the ninth round); an
    evaluation loss, or an out-of-scope error beside it, leaves the ranker's order as it is."""
    from kb.diagnose import learned
    from kb.facts import extract_facts

    labels = [learned.OUT_OF_SCOPE, "framework-bug", "lr-too-high"]
    probs = np.array([0.57, 0.19, 0.10])

    def first(text: str) -> str:
        view = learned.QueryView(facts=extract_facts(text), category_scores={}, fired=set(), engine_top=None,
                                 sims=np.zeros(0))
        return labels[learned.ranked(view, probs, labels)[0]]

    assert first("pretraining loss becomes nan in epoch 6") == "framework-bug"
    assert first("{'loss': 2.1, 'grad_norm': nan, 'epoch': 6.0}") == "framework-bug"
    assert first("eval_loss: nan") == learned.OUT_OF_SCOPE
    assert first("loss nan\ntorch.cuda.OutOfMemoryError: CUDA out of memory.") == learned.OUT_OF_SCOPE
