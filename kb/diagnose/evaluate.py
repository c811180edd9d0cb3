"""Evaluation of diagnosis on a labelled JSONL set (top-1/top-3 category accuracy, MRR, abstention), per
language and kind, for each ranking mode; and refitting the confidence calibration (logistic regression)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from kb.diagnose.engine import (
    ABSTAIN_BELOW,
    CALIBRATION_FILE,
    FEATURE_SIGNS,
    FEATURES,
    Diagnoser,
    collect_facts,
    rank,
    retrieval_query,
    search_without,
)
from kb.errors import InputError, NotFound
from kb.facts.template import narrative


def load_eval_set(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise NotFound(f"no such eval file: {path}")
    rows = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise InputError(f"{path}:{i}: not JSON ({e})") from None
        if isinstance(row, dict) and "query" not in row and "reporter_excerpt" in row and "category" in row:
            # A corpus line (../shared/corpus/sources.jsonl): the reporter's own words, labelled by its category.
            row = {"id": f"{p.stem}-{i}", "query": row["reporter_excerpt"], "expected_category": row["category"],
                   "source_url": row.get("url"), "lang": row.get("lang", "?"), "kind": "excerpt"}
        if not isinstance(row, dict) or "query" not in row or "expected_category" not in row:
            raise InputError(f"{path}:{i}: each line needs 'query' and 'expected_category' (null = abstain)")
        rows.append(row)
    return rows


def pooled_rows(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Several labelled files as one set (ids prefixed by file name where they would collide)."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for path in paths:
        for row in load_eval_set(path):
            rid = str(row.get("id", ""))
            if not rid or rid in seen:
                row = {**row, "id": f"{Path(path).stem}:{rid or len(rows)}"}
            seen.add(str(row["id"]))
            rows.append(row)
    return rows


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    pos = [r for r in results if r["expected"] is not None]
    neg = [r for r in results if r["expected"] is None]
    out: dict[str, Any] = {"n": len(results), "n_answerable": len(pos), "n_abstain": len(neg)}
    if pos:
        out["top1"] = round(sum(r["rank"] == 1 for r in pos) / len(pos), 3)
        out["top3"] = round(sum(r["rank"] is not None and r["rank"] <= 3 for r in pos) / len(pos), 3)
        out["mrr"] = round(sum(1.0 / r["rank"] for r in pos if r["rank"]) / len(pos), 3)
        # Answered and right: top-1 correct and not abstained.
        out["answered_top1"] = round(sum(r["rank"] == 1 and not r["abstained"] for r in pos) / len(pos), 3)
    abst = [r for r in results if r["abstained"]]
    out["abstain_precision"] = round(sum(r["expected"] is None for r in abst) / len(abst), 3) if abst else None
    out["abstain_recall"] = round(sum(r["abstained"] for r in neg) / len(neg), 3) if neg else None
    return out


def _norm_url(url: str) -> str:
    return url.strip().lower().rstrip("/").removeprefix("http://").removeprefix("https://").removeprefix("www.")


def citing_incidents(kb: Diagnoser, url: str) -> set[str]:
    """Ids of the incidents that cite the thread `url` in their sources."""
    want = _norm_url(url)
    return {inc.id for inc in kb.records.values() if any(s.url and _norm_url(s.url) == want for s in inc.sources)}


def holdout_exclusions(kb: Diagnoser, row: dict[str, Any]) -> frozenset[str]:
    """Incidents that cite the query's own thread (`source_url`), and the case of that thread: left out in
    held-out mode, unless the query is a `known-issue` (asking about a thread the KB is meant to contain)."""
    url = row.get("source_url")
    if not url or row.get("kind") == "known-issue":
        return frozenset()
    want = _norm_url(str(url))
    cited = citing_incidents(kb, str(url))
    # A case of the same thread is named too (`case:<id>`): any exclusion answers without the case model, which
    # cannot forget one case without a refit.
    cases = {f"case:{c.id}" for c in getattr(kb, "cases", []) if _norm_url(c.url) == want}
    return frozenset(cited | cases)


def reliability(results: list[dict[str, Any]], edges: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)) -> list[dict]:
    """For bins of top-1 confidence: how many queries fell in the bin and the share whose top-1 was right
    (a query that should abstain counts as wrong whatever it ranked first)."""
    out = []
    for lo, hi in pairwise(edges):
        inb = [r for r in results if lo <= r["confidence"] < hi or (hi == edges[-1] and r["confidence"] == hi)]
        right = sum(r["rank"] == 1 for r in inb)
        out.append({"bin": f"{lo:.2f}-{hi:.2f}", "n": len(inb),
                    "correct": round(right / len(inb), 3) if inb else None,
                    "mean_confidence": round(sum(r["confidence"] for r in inb) / len(inb), 3) if inb else None})
    return out


def evaluate(kb: Diagnoser, rows: list[dict[str, Any]], mode: str = "full", holdout: bool = False) -> dict[str, Any]:
    """Run every query; report overall and per-language / per-kind numbers plus each query's outcome.

    `holdout`: each query with a `source_url` is answered without the incidents that cite that URL (unless its
    kind is `known-issue`), so a same-cause report must be matched by other incidents of its category."""
    results = []
    case_threads = {_norm_url(c.url) for c in getattr(kb, "cases", [])}
    for row in rows:
        excl = holdout_exclusions(kb, row) if holdout else frozenset()
        d = kb.diagnose(text=row["query"], k=10, mode=mode, exclude=excl)
        cats = [x.category for x in d.diagnoses]
        exp = row["expected_category"]
        rank = cats.index(exp) + 1 if exp in cats else None
        reachable = exp is None or any(i.root_cause.category == exp for i in kb.records.values() if i.id not in excl)
        results.append({"id": row.get("id", ""), "lang": row.get("lang", "?"), "kind": row.get("kind", "?"),
                        "expected": exp, "predicted": cats[:3], "rank": rank, "abstained": d.abstained,
                        "confidence": d.diagnoses[0].confidence if d.diagnoses else 0.0,
                        "excluded": sorted(excl), "reachable": reachable,
                        "case_thread": _norm_url(str(row.get("source_url") or "")) in case_threads})
    by_lang: dict[str, list] = defaultdict(list)
    by_kind: dict[str, list] = defaultdict(list)
    for r in results:
        by_lang[r["lang"]].append(r)
        by_kind[r["kind"]].append(r)
    return {"mode": mode, "holdout": holdout, "overall": _summary(results),
            "from_case_threads": sum(r["case_thread"] for r in results),
            "by_lang": {k: _summary(v) for k, v in sorted(by_lang.items())},
            "by_kind": {k: _summary(v) for k, v in sorted(by_kind.items())},
            "reliability": reliability(results),
            "queries": results}


def calibration_rows(kb: Diagnoser, rows: list[dict[str, Any]], holdout: bool = True
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(features, label) for each (query, incident) pair: label 1 when the incident's category is expected.

    Rows that should abstain (expected_category null) give only negatives. With `holdout` (default) a query's own
    thread is left out as in `kb eval --holdout`, so the fitted confidence reflects reports the KB has not seen."""
    X, y = [], []
    for row in rows:
        inputs = [("text", row["query"])]
        facts, lines = collect_facts(inputs)
        excl = holdout_exclusions(kb, row) if holdout else frozenset()
        for c in rank(kb, facts, lines, retrieval_query(inputs, facts), exclude=excl):
            X.append([c.features[f] for f in FEATURES])
            y.append(1.0 if c.incident.root_cause.category == row["expected_category"] else 0.0)
    return np.asarray(X, dtype=float), np.asarray(y, dtype=float)


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 5000, lr: float = 0.5,
                 signs: list[int] | None = None) -> np.ndarray:
    """L2-regularised logistic regression by projected gradient descent (bias last); no sklearn needed.

    No class re-weighting, so the output stays a probability. `signs` (+1 / -1 / 0 per feature) keeps each weight
    on the side its meaning requires (a fired trigger never lowers confidence), so a small set cannot flip them.
    """
    Xb = np.hstack([X, np.ones((len(X), 1))])
    w = np.zeros(Xb.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-Xb @ w))
        grad = Xb.T @ (p - y) / len(y) + l2 * np.r_[w[:-1], 0.0] / len(y)
        w -= lr * grad
        if signs is not None:
            for i, sgn in enumerate(signs):
                if sgn > 0:
                    w[i] = max(w[i], 0.0)
                elif sgn < 0:
                    w[i] = min(w[i], 0.0)
    return w


def calibrate(kb: Diagnoser, rows: list[dict[str, Any]], out: Path | None = None, holdout: bool = True,
              sources: list[str] | None = None) -> dict[str, Any]:
    """Refit the logistic weights on `rows` (answerable and abstain rows) and write kb/diagnose/calibration.json."""

    X, y = calibration_rows(kb, rows, holdout=holdout)
    if not len(y) or y.sum() == 0:
        raise InputError("no labelled pairs to calibrate on")
    w = fit_logistic(X, y, signs=[FEATURE_SIGNS[f] for f in FEATURES])
    n_pos = sum(1 for r in rows if r.get("expected_category"))
    data = {"weights": {**{f: round(float(v), 4) for f, v in zip(FEATURES, w[:-1])}, "bias": round(float(w[-1]), 4)},
            "abstain_below": ABSTAIN_BELOW,
            "fitted_on": {"files": sources or [], "queries": len(rows), "answerable": n_pos,
                          "abstain": len(rows) - n_pos, "pairs": len(y), "holdout": holdout}}
    p = 1.0 / (1.0 + np.exp(-(np.hstack([X, np.ones((len(X), 1))]) @ w)))
    data["fitted_on"]["log_loss"] = round(float(-np.mean(y * np.log(p + 1e-9) + (1 - y) * np.log(1 - p + 1e-9))), 4)
    target = out or CALIBRATION_FILE
    target.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return data


def format_report(rep: dict[str, Any]) -> str:
    def line(name: str, s: dict[str, Any]) -> str:
        f = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
        return (f"{name:<14} n={s['n']:<3} top1={f(s.get('top1'))} top3={f(s.get('top3'))} mrr={f(s.get('mrr'))} "
                f"abstain P={f(s['abstain_precision'])} R={f(s['abstain_recall'])}")

    out = [f"mode: {rep['mode']}{' (held out: a query never sees the incidents citing its own thread)' if rep.get('holdout') else ''}",
           line("overall", rep["overall"])]
    out += [line(f"lang={k}", v) for k, v in rep["by_lang"].items()]
    out += [line(f"kind={k}", v) for k, v in rep["by_kind"].items()]
    if rep.get("reliability"):
        out.append("reliability (top-1 confidence bin: n, share whose top-1 is right): " + "; ".join(
            f"{b['bin']}: n={b['n']}" + (f" right={b['correct']:.2f}" if b["correct"] is not None else "")
            for b in rep["reliability"]))
    seen = rep.get("from_case_threads", 0)
    if seen and rep["mode"] == "full" and not rep.get("holdout"):
        out.append(f"note: {seen} of {rep['overall']['n']} queries come from threads that are cases (cases/): the "
                   "case model has seen them, so these numbers are not held out (--holdout answers without it)")
    unreachable = [q["id"] for q in rep["queries"] if not q.get("reachable", True)]
    if unreachable:
        out.append(f"unreachable once held out (no other incident of the category): {', '.join(unreachable)}")
    misses = [q for q in rep["queries"] if q["rank"] != 1 and q["expected"] is not None
              or (q["expected"] is None and not q["abstained"])]
    if misses:
        out.append("misses:")
        out += [f"  {q['id'] or '?'}: expected {q['expected']}, got {q['predicted'][:3]}"
                f"{' (abstained)' if q['abstained'] else ''}" for q in misses]
    return "\n".join(out)


__all__ = ["calibrate", "evaluate", "fit_logistic", "format_report", "holdout_exclusions", "load_eval_set",
           "pooled_rows", "reliability"]


# ------------------------------------------------------------------------------------------------ case base
# What a GitHub issue form adds to every report, whatever went wrong: a checkbox, section headings and an
# environment dump (versions, GPU). `kb eval --cv` also answers every case as if filed through it, with the ranker
# fitted on the cases as written, so the table shows how far such scaffolding moves the answers.
ISSUE_FORM = """### Reminder
- [x] I have read the documentation and searched the existing issues.

### System Info
- `llamafactory` version: 0.9.1
- Platform: Linux-5.15.0-105-generic-x86_64-with-glibc2.35
- Python version: 3.10.14
- PyTorch version: 2.4.0+cu121 (GPU)
- Transformers version: 4.46.1
- Accelerate version: 1.0.1
- PEFT version: 0.12.0
- TRL version: 0.9.6
- DeepSpeed version: 0.15.4
- GPU type: NVIDIA A100-SXM4-80GB

### Reproduction
"""

# Two more things real reports carry that say nothing about the cause: a traceback's frames (where the program
# was) and the training script the reporter ran (its imports and calls). Neither sets anything.
PASTED_TRACEBACK = """Traceback (most recent call last):
  File "/home/user/train.py", line 212, in <module>
    trainer.train()
  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", line 2123, in train
    return inner_training_loop(
  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", line 3579, in training_step
    loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1553, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
"""
PASTED_SCRIPT = """```python
from datasets import load_dataset
from transformers import AutoTokenizer, AutoModelForCausalLM, Trainer
tokenizer = AutoTokenizer.from_pretrained(model_path)
model = AutoModelForCausalLM.from_pretrained(model_path)
dataset = load_dataset("json", data_files=data_path)["train"]
trainer = Trainer(model=model, args=training_args, train_dataset=dataset, tokenizer=tokenizer)
trainer.train()
```
"""


def _case_views(kb: Diagnoser, cases: list, index, text_of: Callable[[Any], str] | None = None,
                only: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Rules, retrieval, similarity and hashed text counts for every case's query (or the cases at `only`, in that
    order), computed once (nothing here is fitted); `text_of` gives what the reporter brings (default:
    `Case.query`, title, observation and paste)."""
    from kb.diagnose import learned
    from kb.diagnose.engine import query_view

    rows = []
    names = learned.tool_names(cases)  # read out of the text the classifiers see, as the shipped ones read it
    for c in (cases if only is None else [cases[j] for j in only]):
        text = text_of(c) if text_of is not None else c.query()
        inputs = [("text", text)]
        facts, lines = collect_facts(inputs)
        query = retrieval_query(inputs, facts)
        # A case from a thread a curated incident was written from is answered without that incident (as
        # `kb eval --holdout` does), so the rules meet it as they would meet a new user's report.
        excl = frozenset(citing_incidents(kb, c.url))
        cands = rank(kb, facts, lines, query, exclude=excl)
        hits = kb.search(query, k=len(kb.records) if excl else 1, mode="hybrid")
        if excl:
            hits = search_without(hits, excl, "hybrid")
        own = narrative(text)  # what the learned layer reads (kb.facts.template), as in engine._learned_diagnosis
        rows.append({"case": c, "text": own, "view": query_view(kb, facts, cands, query, index, text),
                     "counts": learned.text_counts(own, names), "excluded": sorted(excl),
                     "hybrid_top": hits[0].incident.root_cause.category if hits else None,
                     "rules_top": cands[0].incident.root_cause.category if cands else None,
                     "rules_incidents": [x.incident.id for x in cands[:5]],
                     "rules_abstain": not cands or not _in_scope_or_fired(facts, cands)})
    return rows


def _in_scope_or_fired(facts, cands) -> bool:
    from kb.diagnose.engine import in_scope

    return in_scope(facts) or bool(cands and cands[0].fired)


def _hash_order(keys: Iterable[str], salt: str = "") -> list[str]:
    """The distinct keys in an order drawn by a hash of `salt` and the key: deterministic, another salt another
    order."""
    import hashlib

    return sorted(set(keys), key=lambda k: hashlib.sha256((salt + k).encode()).hexdigest())


def _folds(keys: list[str], n: int, salt: str = "") -> list[int]:
    """Fold of each row: rows with the same key (thread, framework) always share a fold (deterministic; another
    `salt` draws another assignment)."""
    fold_of = {k: i % n for i, k in enumerate(_hash_order(keys, salt))}
    return [fold_of[k] for k in keys]


def _fit_predict(rows: list[dict[str, Any]], train: list[int], test: list[int], labels: list[str]):
    from kb.diagnose import learned

    case_labels = [learned.label_of(r["case"]) for r in rows]
    n = len(rows)
    train_mask = np.zeros(n, dtype=bool)
    train_mask[train] = True
    prior = learned.priors([case_labels[i] for i in train], labels)
    # The text classifiers are fitted on the training rows only; a training row's scores are its leave-one-out
    # scores (each thread is one case), so the ranker learns how far to trust them on unseen text.
    text_model, text_scores = learned.TextModel.fit([r["counts"] for r in rows], case_labels, train)
    groups, targets = [], []
    for j in train:
        usable = train_mask.copy()
        usable[j] = False  # a training query never sees its own label among its neighbours
        phi, _ = learned.label_matrix(rows[j]["view"], labels, case_labels, usable, prior, rows[j]["text"],
                                      text_scores[j])
        groups.append(phi)
        targets.append(labels.index(case_labels[j]))
    ranker = learned.Ranker.fit(groups, targets, labels)
    ranker.text = text_model
    ranker.not_training_right = learned.not_training_precision(
        [rows[j]["view"] for j in train], [rows[j]["text"] for j in train], [rows[j]["case"].scope == "out" for j in train])
    preds = {}
    for j in test:
        phi, _ = learned.label_matrix(rows[j]["view"], labels, case_labels, train_mask, prior, rows[j]["text"],
                                      text_scores[j])
        p = ranker.probabilities(phi, labels)
        order = learned.ranked(rows[j]["view"], p, labels, rows[j]["text"])
        shown = learned.shown_probabilities(rows[j]["view"], p, labels, order, rows[j]["text"],
                                            ranker.not_training_right)  # what kb diagnose would show
        preds[j] = (labels[order[0]], shown[labels[order[0]]], [labels[i] for i in order[:3]])
    return ranker, preds


def _score(rows: list[dict[str, Any]], pred: dict[int, tuple[str, bool]]) -> dict[str, Any]:
    """top-1 over in-scope reports (an abstention is a miss), in-scope abstained, out-of-scope abstained."""
    from kb.diagnose import learned

    ins = [j for j in pred if rows[j]["case"].scope == "in"]
    outs = [j for j in pred if rows[j]["case"].scope == "out"]
    right = sum(1 for j in ins if not pred[j][1] and pred[j][0] == rows[j]["case"].category)
    abst_in = sum(1 for j in ins if pred[j][1])
    abst_out = sum(1 for j in outs if pred[j][1] or pred[j][0] == learned.OUT_OF_SCOPE)
    return {"n_in": len(ins), "n_out": len(outs),
            "top1": round(right / len(ins), 3) if ins else None,
            "in_abstained": round(abst_in / len(ins), 3) if ins else None,
            "out_abstained": round(abst_out / len(outs), 3) if outs else None}


def _confusion(rows: list[dict[str, Any]], pred: dict[int, tuple[str, bool]]) -> dict[str, Any]:
    """Per true label: how many reports, how many answered right, and where the others went (most first)."""
    from kb.diagnose import learned

    table: dict[str, dict[str, Any]] = {}
    for j, (lab, *_) in pred.items():
        true = learned.label_of(rows[j]["case"])
        t = table.setdefault(true, {"n": 0, "right": 0, "went_to": {}})
        t["n"] += 1
        if lab == true:
            t["right"] += 1
        else:
            t["went_to"][lab] = t["went_to"].get(lab, 0) + 1
    for t in table.values():
        t["went_to"] = dict(sorted(t["went_to"].items(), key=lambda kv: (-kv[1], kv[0])))
    return dict(sorted(table.items(), key=lambda kv: (-kv[1]["n"], kv[0])))


CONFIDENCE_BINS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
COMMIT_AT = (0.5, 0.6, 0.7, 0.8, 0.9)


def _confidence_check(rows: list[dict[str, Any]], pred: dict[int, tuple[str, bool, float]]) -> dict[str, Any]:
    """Is the confidence `kb diagnose` shows a probability? Every report's out-of-fold answer (out of scope
    included: an out-of-scope report answered "out of scope" is right) binned by the confidence shown for it, the
    expected calibration error (the bins' |mean confidence - share right|, weighted by size), and, for the in-scope
    reports, how many are answered with a category at each confidence or more and how often that category is right
    (what trusting only confident answers buys)."""
    from kb.diagnose import learned

    truth = {j: learned.label_of(rows[j]["case"]) for j in pred}
    results = [{"confidence": a[2], "rank": 1 if a[0] == truth[j] else 0} for j, a in pred.items()]
    bins = reliability(results, CONFIDENCE_BINS)
    ece = sum(b["n"] * abs(b["mean_confidence"] - b["correct"]) for b in bins if b["n"]) / max(1, len(results))
    ins = [j for j in pred if rows[j]["case"].scope == "in"]
    commit = []
    for t in COMMIT_AT:
        said = [j for j in ins if pred[j][0] != learned.OUT_OF_SCOPE and pred[j][2] >= t]
        commit.append({"at_least": t, "answered": round(len(said) / len(ins), 3) if ins else None,
                       "right": round(sum(pred[j][0] == truth[j] for j in said) / len(said), 3) if said else None})
    return {"bins": bins, "ece": round(ece, 3), "in_scope_by_confidence": commit}


def _case_base(kb: Diagnoser, min_cases: int = 0) -> tuple[list, Any, list[dict[str, Any]], list[str]]:
    """The cases, their index, the engine's view of each (`_case_views`) and every label a ranker chooses among
    (the cases' and the curated incidents' categories, and out of scope)."""
    from kb.diagnose import learned

    cases = kb.cases
    if len(cases) < min_cases:
        raise InputError(f"the case base has {len(cases)} cases; cross-validation needs at least {min_cases}")
    index = learned.CaseIndex.build(cases, kb.embedder, kb.data_dir / "cases-index.npz")
    labels = sorted({learned.label_of(c) for c in cases} | {i.root_cause.category for i in kb.records.values()})
    return cases, index, _case_views(kb, cases, index), labels


def cross_validate(kb: Diagnoser, folds: int = 5, draws: int = 10, texts: dict[str, str] | None = None
                   ) -> dict[str, Any]:
    """Out-of-fold numbers on the case base: the learned ranker grouped by thread and leave-one-framework-out,
    beside the rules-only engine and a plain hybrid-retrieval baseline, which are not fitted on cases at all.

    Which threads share a fold moves top-1 by a few points on its own (adding a handful of cases reshuffles every
    fold), so the grouped scheme is also run over `draws` fold assignments and reported as their mean and spread;
    the other rows, the per-case predictions and the confusion table use the first assignment.

    `texts` (case id -> text, `load_case_texts`) answers those cases a second time from another text of the same
    report, typically its thread's opening post as the reporter wrote it, out of fold by the rankers fitted on the
    reports as written; the same cases as written are scored beside it."""
    from kb.canonical import canonical_framework

    if texts:  # before the case views are computed (a minute on the whole case base)
        unknown = sorted(set(texts) - {c.id for c in kb.cases})
        if unknown:
            raise NotFound(f"no case with id {', '.join(unknown[:5])}" + (" ..." if len(unknown) > 5 else ""))
    cases, index, rows, labels = _case_base(kb, min_cases=2 * folds)
    out: dict[str, Any] = {"cases": len(cases), "threads": len({c.thread for c in cases}), "folds": folds}
    schemes = {
        "grouped by thread": _folds([c.thread for c in cases], folds),
        "leave one framework out": _folds([(canonical_framework(c.framework.name) or c.framework.name).lower()
                                           for c in cases], len({c.framework.name.lower() for c in cases})),
    }
    threads = [c.thread for c in cases]
    for name, fold_of in schemes.items():
        preds = _out_of_fold(rows, fold_of, labels, threads)
        out[f"learned, {name}"] = _score(rows, preds)
        if name == "grouped by thread" and draws > 1:
            out[f"learned, grouped by thread, mean of {draws} fold draws"] = _draws(
                rows, labels, threads, folds, draws, out[f"learned, {name}"])
        if name == "grouped by thread":
            for label, text_of in VARIANTS.items():
                out[label] = _variant_score(kb, cases, index, rows, fold_of, labels, text_of)[0]
            if texts:
                only = [j for j, c in enumerate(cases) if c.id in texts]
                out[TEXTS_ROW], given = _variant_score(kb, cases, index, rows, fold_of, labels,
                                                       lambda c: texts[c.id], only)
                out[TEXTS_ROW_AS_WRITTEN] = _score(rows, {j: preds[j] for j in only})
                out.setdefault("predictions", {})["the given texts"] = {cases[j].id: a[0]
                                                                         for j, a in sorted(given.items())}
        # Every case's out-of-fold answer (an abstention is "out-of-scope"), for comparisons on a subset (e.g.
        # scripts/blind_reader.py, which sets a reader's labels beside the engine's on the same reports).
        out.setdefault("predictions", {})[name] = {cases[j].id: a[0] for j, a in sorted(preds.items())}
        if name == "grouped by thread":
            out["confusion"] = _confusion(rows, preds)
            out["confidence"] = _confidence_check(rows, preds)
            for lang in ("zh", "en"):  # the reporter's language: a third of the reports are Chinese
                out[f"  of which reports in {lang}"] = _score(rows, {j: a for j, a in preds.items()
                                                                     if cases[j].lang == lang})
            # The curated incidents (and their triggers) were written from some of these threads: even answered
            # without the incident of their own thread, those reports are the rules' home ground, so they are
            # also reported apart.
            cited = {j: p for j, p in preds.items() if rows[j]["excluded"]}
            if cited:
                out["  of which threads an incident cites"] = _score(rows, cited)
                out["  of which other threads"] = _score(rows, {j: p for j, p in preds.items() if j not in cited})
    every = {j: (r["rules_top"], r["rules_abstain"]) for j, r in enumerate(rows)}
    out["rules only (no case learning)"] = _score(rows, every)
    out["plain hybrid retrieval"] = _score(rows, {j: (r["hybrid_top"], False) for j, r in enumerate(rows)})
    return out


def _out_of_fold(rows: list[dict[str, Any]], fold_of: list[int], labels: list[str], threads: list[str],
                 share: float = 1.0, salt: str = "") -> dict[int, tuple[str, bool, float]]:
    """Every row's answer from a ranker fitted without its fold: (label, abstained, the confidence shown for it).
    With `share` < 1 each fold's ranker sees only that share of its training threads (`_keep_share`; the learning
    curve)."""
    from kb.diagnose import learned

    preds: dict[int, tuple[str, bool, float]] = {}
    for f in sorted(set(fold_of)):
        test = [j for j, x in enumerate(fold_of) if x == f]
        train = [j for j, x in enumerate(fold_of) if x != f]
        if share < 1.0:
            train = _keep_share(train, threads, share, salt)
        # No thread may sit on both sides (schemes group by thread or by framework, both finer than that).
        assert not {threads[j] for j in test} & {threads[j] for j in train}
        _, p = _fit_predict(rows, train, test, labels)
        preds.update({j: (lab, lab == learned.OUT_OF_SCOPE, conf) for j, (lab, conf, _) in p.items()})
    return preds


def _draws(rows: list[dict[str, Any]], labels: list[str], threads: list[str], folds: int, draws: int,
           first: dict[str, Any] | None = None, share: float = 1.0) -> dict[str, Any]:
    """The grouped scheme over `draws` fold assignments (the first one's score may be given as `first`, already
    computed), each fold's ranker fitted on `share` of its training threads: mean of each number, top-1's
    standard deviation, lowest and highest, and the mean training rows per fold."""
    scores = [first] if first is not None else []
    sizes = []  # training rows per fold, as _out_of_fold keeps them
    for d in range(draws):
        fold_of = _folds(threads, folds, salt=f"draw-{d}:" if d else "")
        if d >= len(scores):
            scores.append(_score(rows, _out_of_fold(rows, fold_of, labels, threads, share, f"share-{d}:")))
        sizes += [len(_keep_share([j for j, x in enumerate(fold_of) if x != f], threads, share, f"share-{d}:"))
                  for f in range(folds)]
    out: dict[str, Any] = {"n_in": scores[0]["n_in"], "n_out": scores[0]["n_out"],
                           "train_cases": round(float(np.mean(sizes)), 1)}
    for k in ("top1", "in_abstained", "out_abstained"):
        vals = [s[k] for s in scores if s[k] is not None]
        out[k] = round(float(np.mean(vals)), 3) if vals else None
    top = [s["top1"] for s in scores if s["top1"] is not None]
    out.update(draws=draws, top1_sd=round(float(np.std(top, ddof=1)), 3) if len(top) > 1 else 0.0,
               top1_min=min(top, default=None), top1_max=max(top, default=None))
    return out


def _keep_share(train: list[int], threads: list[str], share: float, salt: str) -> list[int]:
    """The training rows of `share` of the training threads, drawn by a hash of `salt` and the thread: whole
    threads, and a smaller share keeps a subset of what a larger one keeps (the curve adds cases, never swaps)."""
    distinct = _hash_order((threads[j] for j in train), salt)
    kept = set(distinct[:max(1, round(share * len(distinct)))])
    return [j for j in train if threads[j] in kept]


def learning_curve(kb: Diagnoser, shares: Sequence[float] = (0.25, 0.5, 0.75, 1.0), folds: int = 5,
                   draws: int = 10) -> dict[str, Any]:
    """How out-of-fold quality grows with the case base: the grouped scheme of `cross_validate` over `draws` fold
    assignments, each fold's ranker fitted on only `share` of its training threads (test folds unchanged, so every
    share answers the same reports). Share 1.0 is `cross_validate`'s mean of fold draws."""
    if not shares or any(not 0.0 < s <= 1.0 for s in shares):
        raise InputError("shares must lie in (0, 1]")
    cases, _, rows, labels = _case_base(kb, min_cases=2 * folds)
    threads = [c.thread for c in cases]
    points = []
    for share in sorted(set(shares)):
        mean = _draws(rows, labels, threads, folds, draws, share=share)
        points.append({"share": share, **{k: mean[k] for k in ("train_cases", "top1", "in_abstained",
                                                                 "out_abstained", "top1_sd")}})
    return {"cases": len(cases), "threads": len(set(threads)), "folds": folds, "draws": draws, "points": points}


# The same reports brought differently, answered by rankers fitted on the reports as written: filed through an
# issue form (what real reports look like), with traceback frames or the training script pasted below, and the
# title alone (a short report: a title and a screenshot).
VARIANTS: dict[str, Callable[[Any], str]] = {
    "  the same reports filed through an issue form": lambda c: ISSUE_FORM + c.query(),
    "  the same reports with traceback frames pasted": lambda c: c.query() + "\n" + PASTED_TRACEBACK,
    "  the same reports with a training script pasted": lambda c: c.query() + "\n" + PASTED_SCRIPT,
    "  the same reports, title only": lambda c: c.title,
}


# `kb eval --cv --texts DIR`: the cases that DIR holds another text of, answered from it and as written.
TEXTS_ROW = "  the same reports, from the texts given (--texts)"
TEXTS_ROW_AS_WRITTEN = "  those reports as written"
# A source line at the top of such a file ("# https://...") or a "#PARTIAL" marker is a note, not the report.
_TEXT_NOTE = re.compile(r"#\s*(?:https?://\S+|PARTIAL)\s*")


def load_case_texts(folder: str | Path) -> dict[str, str]:
    """`<case id>.txt` files of a folder -> {case id: text}, each checked as `kb diagnose` checks a paste (size,
    binary, encoding); leading note lines (a source URL, `#PARTIAL`) are left out."""
    from kb.facts import read_text_file

    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"--texts takes a folder of <case id>.txt files; {folder} is not a folder")
    texts: dict[str, str] = {}
    for p in sorted(root.glob("*.txt")):
        lines = read_text_file(p).splitlines()
        while lines and (not lines[0].strip() or _TEXT_NOTE.fullmatch(lines[0].strip())):
            lines.pop(0)
        if lines:
            texts[p.stem] = "\n".join(lines)
    if not texts:
        raise InputError(f"{folder} holds no non-empty <case id>.txt file")
    return texts


def _variant_score(kb: Diagnoser, cases: list, index, rows: list[dict[str, Any]], fold_of: list[int],
                   labels: list[str], text_of: Callable[[Any], str], only: Sequence[int] | None = None
                   ) -> tuple[dict[str, Any], dict[int, tuple[str, bool]]]:
    """Out of fold, every report (or those at `only`) answered as `text_of` brings it, by rankers fitted on the
    reports as written (the training rows are unchanged; only the answered rows change): the score and the
    answers."""
    from kb.diagnose import learned

    at = list(range(len(cases))) if only is None else list(only)
    brought = _case_views(kb, cases, index, text_of, only=None if only is None else at)
    both, n = rows + brought, len(rows)
    where = {j: n + k for k, j in enumerate(at)}  # a case's row among the brought ones
    preds: dict[int, tuple[str, bool]] = {}
    for f in sorted(set(fold_of)):
        test = [j for j in at if fold_of[j] == f]
        if not test:
            continue
        train = [j for j, x in enumerate(fold_of) if x != f]
        _, p = _fit_predict(both, train, [where[j] for j in test], labels)
        preds.update({j: (p[where[j]][0], p[where[j]][0] == learned.OUT_OF_SCOPE) for j in test})
    # scored against the case (the brought row carries the same case)
    return _score(rows, preds), preds


def fit_case_ranker(kb: Diagnoser, out: Path | None = None, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fit the ranker on every case and write kb/diagnose/learned.json (what `kb diagnose` uses); with the
    `cross_validate` report of the same case base, its out-of-fold confidence bins go beside the weights as the
    track record `kb diagnose` quotes ("answers this confident were right 81 % of the time")."""
    from kb.diagnose import learned

    cases, _, rows, labels = _case_base(kb)
    everyone = list(range(len(rows)))
    ranker, _ = _fit_predict(rows, everyone, [], labels)
    meta: dict[str, Any] = {"fitted_on": f"{len(cases)} cases (kb eval --cv --fit)"}
    if report and report.get("confidence") and report.get("cases") == len(cases):
        meta["track_record"] = {"reports": len(cases), "measured": "kb eval --cv, out of fold, first fold assignment",
                                "bins": report["confidence"]["bins"]}
    ranker.save(out or learned.MODEL_FILE, meta)
    return {"weights": dict(zip(learned.FEATURES, [round(float(w), 3) for w in ranker.weights])),
            "label_weights": {f: {lab: round(w, 3) for lab, w in per.items()} for f, per in ranker.label_weights.items()},
            "fitted_on": meta["fitted_on"], "track_record": "track_record" in meta}


def format_cv(report: dict[str, Any]) -> str:
    head = (f"case base: {report['cases']} cases from {report['threads']} threads; out-of-fold numbers "
            f"({report['folds']} folds grouped by thread; leave-one-framework-out)")
    columns = (f"{'method':50} {'in':>4} {'out':>4} {'top-1':>6} {'in-scope abstained':>19} "
               f"{'out-of-scope abstained':>23}")
    lines = [head, columns]
    for name, r in report.items():
        if isinstance(r, dict) and "n_in" in r:
            lines.append(f"{name:50} {r['n_in']:>4} {r['n_out']:>4} {_fmt(r['top1']):>6} "
                         f"{_fmt(r['in_abstained']):>19} {_fmt(r['out_abstained']):>23}")
    for name, r in report.items():
        if isinstance(r, dict) and "draws" in r:
            lines.append(f"grouped by thread over {r['draws']} fold assignments: top-1 {_fmt(r['top1'])} on average, "
                         f"sd {_fmt(r['top1_sd'])}, {_fmt(r['top1_min'])}-{_fmt(r['top1_max'])} (the other rows use "
                         "the first assignment)")
    if report.get("confidence"):
        c = report["confidence"]
        lines.append(f"out of fold, grouped by thread: the confidence shown against how often the answer was right "
                     f"(expected calibration error {_fmt(c['ece'])})")
        lines.extend(f"  {b['bin']}: {b['n']:>4} reports, mean confidence {_fmt(b['mean_confidence'])}, right "
                     f"{_fmt(b['correct'])}" for b in c["bins"])
        lines.append("  in-scope reports answered with a category at this confidence or more: share answered, "
                     "share of those right")
        lines.extend(f"  >= {x['at_least']:.2f}: {_fmt(x['answered'])} answered, {_fmt(x['right'])} right"
                     for x in c["in_scope_by_confidence"])
    if report.get("confusion"):
        lines.append("out of fold, grouped by thread: per true label, right / n, and where the misses went")
        for lab, t in report["confusion"].items():
            went = ", ".join(f"{k} {v}" for k, v in t["went_to"].items())
            lines.append(f"  {lab:34} {t['right']:>3} / {t['n']:<3} {went}")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
