"""Learning from the case base: the nearest real reports, and a ranker over root-cause labels (every category plus
`out-of-scope`) fitted on cases, so that what the rules and retrieval say is weighed by what real reports showed.

The ranker is a conditional logit: each label gets a score w·φ(query, label) from a handful of features (the rule
engine's best confidence for the label, whether one of its triggers fired, the label's share among the nearest
training cases, the label's frequency, and a few scope / framework-defect signals), and a softmax turns scores into
probabilities. Its weights are fitted on the case base; `kb eval --cv` refits them inside each fold, grouped by
source thread, so every reported number is out of fold.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from kb.canonical import (
    FRAMEWORKS,
    KERNEL_WORD,
    NAMES_THAT_ARE_WORDS,
    OUT_OF_SCOPE_ERRORS,
    is_grad_norm,
    is_loss_like,
)
from kb.cases import Case
from kb.facts import Facts
from kb.facts.logs import env_facts
from kb.facts.prose import names_model_family
from kb.facts.template import narrative
from kb.index.bm25 import BM25
from kb.tokenize import tokenize

OUT_OF_SCOPE = "out-of-scope"
FRAMEWORK_BUG = "framework-bug"
MODEL_FILE = Path(__file__).with_name("learned.json")
NEIGHBOURS = 8
# Below this probability an in-scope answer is shown as a differential (with questions), not as the diagnosis.
UNSURE_BELOW = 0.35
# A band of the track record with fewer reports than this says too little to quote.
TRACK_RECORD_MIN = 20
FEATURES = ("engine", "engine_top", "fired", "knn", "nn1", "prior",
            "oos_bias", "oos_no_symptom", "oos_error", "oos_symptom", "oos_knn", "oos_inference",
            "fw_bias", "fw_versions", "fw_no_rule", "fw_release_words", "text", "oos_text", "cue", "algo_mismatch",
            "precision_mismatch")
# Features that also get a weight of their own per label, on top of the shared one (a label's deviation from it, which
# the L2 penalty shrinks to 0 where the cases say little). The cue table's weights are hand-set per cue, and how far a
# category's cues can be trusted differs by category (the masked-labels cues against the learning-rate ones): out of
# fold this was worth about 0.01 top-1 grouped by thread and 0.02 leaving one framework out (README).
LABEL_FEATURES = ("cue",)
# Words of a report about generation or serving, not training (an out-of-scope signal when no metric went bad).
_INFERENCE_WORDS = re.compile(r"inference|推理|generat\w*|生成|cli_demo|deploy\w*|部署|serving|vllm serve|乱码|gibberish|"
                              r"repeat\w*|复读", re.IGNORECASE)
# Words of a training run. A report with generation words and none of these is about inference (issue 11's scope:
# "NaN only at inference/generation" is not a training divergence).
_TRAINING_WORDS = re.compile(r"train\w*|fine-?tun\w*|finetun\w*|pre-?train\w*|训练|微调|\bsft\b|q?lora\b|\b(?:dpo|kto|orpo|"
                             r"simpo|grpo|ppo|rlhf|rlvr|rloo)\b|reward model|grad\w*|backward|optimi[sz]er|learning[_ ]rate|"
                             r"\blr\b|\bepochs?\b|\bsteps?\b|\biter(?:ation)?s?\b|\bloss\w*|损失|梯度|deepspeed|\bzero[-_ ]?[0123]\b|"
                             r"\bfsdp\b|"
                             # RL training: its rollouts are generation, but inside a training run
                             r"\brl\b|reinforcement learning|强化学习|\brollouts?\b|\bactor\b|\bcritic\b", re.IGNORECASE)
# When the rules are this confident (their calibrated probability, docs/DIAGNOSE.md), their category leads, unless
# the ranker is surer of another cause (`ranked`): the case base is thin for the mechanisms the curated incidents
# describe best. Chosen among 0.3-0.85 on the
# out-of-fold case numbers and the dev set (a development choice; README says so).
RULES_CONFIDENT = 0.6
# When the ranker itself is unsure (its best in-scope label below UNSURE_BELOW) it defers to the rules' category
# if the rules would not abstain on it themselves (engine.ABSTAIN_BELOW, 0.25): short questions about a curated
# mechanism ("DPO NLL loss nan") have few look-alikes among real reports. Was 0.3; lowered to the rules' own
# threshold with the text features (out of fold unchanged: 0.614 top-1 either way; a development choice).
RULES_WHEN_UNSURE = 0.25
# Above this probability the report is out of scope: all in-scope labels together are less likely.
OUT_OF_SCOPE_ABOVE = 0.5
_RELEASE_WORDS = re.compile(r"upgrad\w*|updat\w*|new (?:version|release)|regression|after (?:bumping|updating)|"
                            r"downgrad\w*|roll(?:ed|ing)? ?back|revert\w*|(?:older|earlier|previous) (?:version|release|"
                            r"revision|commit)|"
                            r"\bv?\d+\.\d+(?:\.\d+)?\b.{0,20}(?:break|broke|introduc)|版本|升级|更新后|回退|降级",
                            re.IGNORECASE)
# Mechanisms that exist only under some training algorithms: KTO's unbalanced batches, ORPO's log-odds, the group
# std of GRPO-style advantages, an RL run's KL estimator and reward function, the length normalisation of a
# preference loss. A report whose algorithm is known and is none of these cannot have that cause, whatever its
# words resemble (an ORPO NaN is no KTO batch problem). RM is allowed with the RL mechanisms: an RL report often
# names its reward model before its algorithm.
_RL = frozenset({"GRPO", "PPO", "RM"})
CATEGORY_ALGORITHMS: dict[str, frozenset[str]] = {
    "kto-unbalanced-batch": frozenset({"KTO"}),
    "log-odds-cancellation": frozenset({"ORPO"}),
    "grpo-group-std-degenerate": _RL,
    "kl-estimator-overflow": _RL,
    "nan-reward-propagation": _RL,
    "empty-response-length-normalization": frozenset({"DPO", "SimPO", "IPO", "ORPO", "CPO", "KTO"}),
}
_VERSION_FACTS = ("torch_version", "transformers_version", "trl_version", "deepspeed_version", "framework_version",
                  "flash_attn_version", "vllm_version", "peft_version", "version_evidence")


# ------------------------------------------------------------------------------------------------ case index
@dataclass
class CaseIndex:
    """Hybrid similarity of a query to every case: dense cosine and BM25 (scaled to the query's best), averaged."""

    cases: list[Case]
    dense: np.ndarray
    bm25: BM25

    @classmethod
    def build(cls, cases: list[Case], embedder, cache: Path | None = None) -> CaseIndex:
        texts = [narrative(c.query())[:2000] for c in cases]
        key = _texts_key(texts, getattr(embedder, "name", "?"))
        tokens_key = _texts_key(texts, _tokenizer_stamp())
        dense, tokens = None, None
        if cache is not None and cache.is_file():
            try:
                with np.load(cache, allow_pickle=False) as z:
                    if str(z["key"]) == key:
                        dense = z["dense"]
                    if "tokens" in z and str(z["tokens_key"]) == tokens_key:
                        tokens = _split_tokens(str(z["tokens"]), len(texts))
            except (OSError, ValueError, KeyError):
                dense, tokens = None, None
        if dense is None or tokens is None:
            # The cases' Chinese text is not in the index's saved segmentations: tokenizing it loads jieba's
            # dictionary (1-2 s, ~100 MB), so the cuts are cached with the vectors.
            if dense is None:
                dense = embedder.encode(texts) if texts else np.zeros((0, 1), dtype=np.float32)
            if tokens is None:
                tokens = [tokenize(t) for t in texts]
            if cache is not None:
                try:
                    _save_npz(cache, key=np.array(key), dense=dense, tokens_key=np.array(tokens_key),
                              tokens=np.array(_join_tokens(tokens)))
                except OSError:
                    pass  # a read-only or full data dir only costs the embedding next time
        return cls(cases, np.asarray(dense, dtype=np.float32), BM25().fit(tokens))

    def similarities(self, text: str, qv: np.ndarray | None, embedder=None) -> np.ndarray:
        if not self.cases:
            return np.zeros(0, dtype=np.float32)
        if qv is None:
            qv = embedder.encode([text[:4000]], query=True)[0]
        dense = np.clip(self.dense @ qv, 0.0, 1.0)
        bm = self.bm25.scores(tokenize(text[:4000]))
        top = float(bm.max()) if bm.size else 0.0
        return (0.5 * dense + 0.5 * (bm / top if top > 0 else bm)).astype(np.float32)


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write atomically under a name of this process and thread: workers that fill the same cache at once each
    replace it whole, never with another's half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}-{threading.get_ident()}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _tokenizer_stamp() -> str:
    """Names the tokenizer's behaviour: its source and jieba's version (a change re-tokenizes cached text)."""
    import hashlib
    from importlib import metadata

    from kb import tokenize as tok

    try:
        jieba_version = metadata.version("jieba")
    except metadata.PackageNotFoundError:
        jieba_version = "?"
    return "tokens-" + jieba_version + "-" + hashlib.sha256(Path(tok.__file__).read_bytes()).hexdigest()


def _join_tokens(tokens: list[list[str]]) -> str:
    return "\x1e".join("\x1f".join(t) for t in tokens)


def _split_tokens(blob: str, n: int) -> list[list[str]] | None:
    rows = blob.split("\x1e") if n else []
    if len(rows) != n:
        return None
    return [r.split("\x1f") if r else [] for r in rows]


def _texts_key(texts: list[str], model: str) -> str:
    import hashlib

    h = hashlib.sha256(model.encode())
    for t in texts:
        h.update(t.encode("utf-8", errors="replace"))
        h.update(b"\x00")
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ features
@dataclass
class QueryView:
    """What the rule engine and the fact layer said about one query, computed once and reused for every label."""

    facts: Facts
    category_scores: dict[str, float]  # best incident confidence per category
    fired: set[str]  # categories with a fired trigger
    engine_top: str | None
    sims: np.ndarray  # similarity to every case of the index
    # The category cue table (kb/data/category_cues.yaml, the taxonomy's signals) read on the paste: summed weight
    # per category. Unlike the rules it names no incident, so it speaks for a mechanism whose incidents are
    # missing or held out.
    cues: dict[str, float] = field(default_factory=dict)

    @property
    def symptom(self) -> bool:
        """A training divergence is named: a bad metric, a NaN/inf/zero-loss/overflow/divergence word, or an
        in-scope error string (generated gibberish alone is not: it is as often an inference problem)."""
        f = self.facts
        return bool(f.value("symptom") or f.value("nan_metrics") or f.value("zero_metrics")
                    or f.value("huge_metrics") or set(f.value("errors", [])) - OUT_OF_SCOPE_ERRORS)

    @property
    def bad_metric(self) -> bool:
        f = self.facts
        return bool(f.value("nan_metrics") or f.value("zero_metrics") or f.value("huge_metrics"))


def label_of(case: Case) -> str:
    return OUT_OF_SCOPE if case.scope == "out" else case.category


def neighbours(view: QueryView, usable: np.ndarray, k: int = NEIGHBOURS) -> list[int]:
    """Indices of the k most similar usable cases, most similar first."""
    idx = np.nonzero(usable)[0]
    if idx.size == 0:
        return []
    order = idx[np.argsort(-view.sims[idx], kind="stable")]
    return [int(i) for i in order[:k]]


# What the two text classifiers (TextModel) say about one query: the scope score and a score per category.
TextScores = tuple[float, dict[str, float]]


def features(view: QueryView, label: str, nbrs: list[int], labels: Sequence[str], prior: dict[str, float],
             text: str = "", text_scores: TextScores | None = None) -> np.ndarray:
    sims = [float(view.sims[i]) for i in nbrs]
    total = sum(sims) or 1.0
    knn = sum(s for i, s in zip(nbrs, sims) if labels[i] == label) / total
    nn1 = 1.0 if nbrs and labels[nbrs[0]] == label else 0.0
    oos, fw = label == OUT_OF_SCOPE, label == FRAMEWORK_BUG
    errs = set(view.facts.value("errors", []))
    f = {
        "engine": view.category_scores.get(label, 0.0),
        "engine_top": 1.0 if label == view.engine_top else 0.0,
        "fired": 1.0 if label in view.fired else 0.0,
        "knn": knn,
        "nn1": nn1,
        "prior": prior.get(label, math.log(1e-3)),
        "oos_bias": 1.0 if oos else 0.0,
        "oos_no_symptom": 1.0 if oos and not view.symptom else 0.0,
        "oos_error": 1.0 if oos and errs & OUT_OF_SCOPE_ERRORS else 0.0,
        "oos_symptom": 1.0 if oos and view.symptom else 0.0,
        "oos_knn": knn if oos else 0.0,
        "oos_inference": 1.0 if oos and not view.bad_metric and _INFERENCE_WORDS.search(text[:4000]) else 0.0,
        "fw_bias": 1.0 if fw else 0.0,
        "fw_versions": 1.0 if fw and versions_told(view.facts, text) else 0.0,
        "fw_no_rule": 1.0 if fw and not view.fired else 0.0,
        "fw_release_words": 1.0 if fw and _RELEASE_WORDS.search(text[:4000]) else 0.0,
        "text": 0.0 if oos or text_scores is None else text_scores[1].get(label, 0.0),
        "oos_text": text_scores[0] if oos and text_scores is not None else 0.0,
        "cue": math.log1p(view.cues.get(label, 0.0)),
        "algo_mismatch": 1.0 if algorithm_mismatch(label, view.facts) else 0.0,
        "precision_mismatch": 1.0 if precision_mismatch(label, view.facts) else 0.0,
    }
    return np.array([f[k] for k in FEATURES], dtype=np.float64)


def algorithm_mismatch(label: str, facts: Facts) -> bool:
    """The report's algorithm is known and the label's mechanism cannot occur under it (CATEGORY_ALGORITHMS)."""
    allowed = CATEGORY_ALGORITHMS.get(label)
    algo = facts.value("algorithm")
    return bool(allowed and algo and str(algo) not in allowed)


# The precisions under which a label's mechanism occurs: fp16's dynamic loss scaling and narrow range.
CATEGORY_PRECISIONS = {"fp16-overflow": ("fp16",)}


def precision_mismatch(label: str, facts: Facts) -> bool:
    """The report names its run's precision and the label's mechanism needs another (an fp16 overflow in a bf16 run).
    A learned feature, like `algo_mismatch`: a report's stated precision can be wrong or partial (fp16 weights
    under a bf16 autocast)."""
    allowed = CATEGORY_PRECISIONS.get(label)
    precision = facts.value("precision")
    return bool(allowed and precision and str(precision) not in allowed and facts.value("weights_dtype") != "fp16")


SEQUENCE_PARALLEL_SPLIT = "sequence-parallel-label-split"


def ruled_out(label: str, facts: Facts) -> bool:
    """A setting the report states makes the label's mechanism impossible: sequence parallelism off (degree 1, or
    said off) for the sequence-parallel label split. This is how the answer to the question "does it still happen with
    sequence_parallel_size 1?" re-ranks. (A known algorithm that rules a mechanism out is a learned feature,
    `algo_mismatch`, since reports name their algorithm loosely.)"""
    if label == SEQUENCE_PARALLEL_SPLIT:
        on, size = facts.value("sequence_parallel"), facts.value("sequence_parallel_size")
        return on is False or (isinstance(size, (int, float)) and not isinstance(size, bool) and size <= 1)
    return False


def versions_told(facts: Facts, text: str) -> bool:
    """The report names a release in its own words ("after upgrading to trl 0.9.6", "deepspeed==0.12.2 fails"),
    not only in the environment dump its issue form asks for (`text` is the narrative, kb.facts.template): every
    report filed through such a form lists versions, whatever went wrong."""
    if "version_evidence" in facts:
        return True
    told = Facts()
    env_facts(list(enumerate(text[:4000].split("\n"), 1)), told, "text")
    return any(k in told for k in _VERSION_FACTS)


def priors(labels: Sequence[str], all_labels: Sequence[str], smoothing: float = 1.0) -> dict[str, float]:
    """Log frequency of each label among the training cases, smoothed so that a mechanism the curated incidents
    know but few reports show is not ruled out by its rarity."""
    counts = Counter(labels)
    n = len(labels) + smoothing * len(all_labels)
    return {lab: math.log((counts.get(lab, 0) + smoothing) / n) for lab in all_labels}


# ------------------------------------------------------------------------------------------------ text classifiers
# Hashed feature space: words (kb.tokenize, so Chinese is segmented) and character 2-4-grams of the lower-cased
# text. Hashing (crc32, stable across runs) keeps the shipped weights a fixed-size array with no vocabulary.
TEXT_DIM = 1 << 14
_CHAR_NGRAMS = (2, 3, 4)
# Ridge penalties of the two text classifiers (scope: words; category: character n-grams). Chosen among
# {0.1, 0.3, 1, 3} on the out-of-fold case numbers (a development choice; docs/DIAGNOSE.md says so).
SCOPE_RIDGE = 1.0
CATEGORY_RIDGE = 0.3
SCOPE_MIN_DF = 2
CATEGORY_MIN_DF = 3


# Names the hashing below in the fitted model's cache key: a change of it refits the classifiers.
TEXT_HASH = "crc32-words/poly64-grams"
_GRAM_MUL = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime
_MIX = np.uint64(0xFF51AFD7ED558CCD)  # murmur3's finaliser constant


def _bucket(s: str) -> int:
    return zlib.crc32(s.encode("utf-8", errors="replace")) & (TEXT_DIM - 1)


def gram_buckets(flat: str) -> np.ndarray:
    """Hashed bucket of every character 2-, 3- and 4-gram of `flat`, computed on whole arrays: a 4,000-character
    paste has ~12,000 n-grams, and hashing each one as a Python string took ~9 ms of a diagnosis. The hash of
    an n-gram is a fixed polynomial of its code points, mixed (murmur3's finaliser) so that nearby grams spread
    over the buckets; it is the same on every machine and run."""
    codes = np.frombuffer(flat.encode("utf-32-le", errors="replace"), dtype=np.uint32).astype(np.uint64)
    out = []
    with np.errstate(over="ignore"):
        for n in _CHAR_NGRAMS:
            m = len(codes) - n + 1
            if m <= 0:
                continue
            h = np.full(m, np.uint64(n), dtype=np.uint64)
            for j in range(n):
                h = (h * _GRAM_MUL) ^ codes[j:j + m]
            h ^= h >> np.uint64(33)
            h *= _MIX
            h ^= h >> np.uint64(33)
            out.append(h & np.uint64(TEXT_DIM - 1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


# a kernel or an optimizer names a part the mechanism may live in: it stays in the text
_NOT_A_TOOL = re.compile(KERNEL_WORD.pattern + r"|kernel|liger|adopt", re.IGNORECASE)


def tool_names(cases: Sequence[Case]) -> tuple[str, ...]:
    """The names of the tools reports ran: the training frameworks kb knows and every case's framework or project
    ("LLaMA-Factory", "MedicalGPT", "minimind"), lower-cased, longest first. The text classifiers read a
    report without them: a tool's name says which tool ran, not which mechanism broke, and learned from a few
    threads of one project it pulls every report of that project towards their category (out of fold on the 683,
    10 fold draws: top-1 0.683 -> 0.689).
    Names that also say something else stay: a kernel ("flash-attention", "liger-kernel"), an optimizer ("adopt"), a
    model family ("qwen2.5-vl", "moe-llava"), and a short project name that is also a word or a library ("roll",
    "apex", "peft")."""
    known = {n.lower() for name, aliases in FRAMEWORKS.items() for n in (name, *aliases)} - NAMES_THAT_ARE_WORDS
    projects = {c.framework.name.strip().lower() for c in cases}
    projects = {n for n in projects if len(n) > 4 and "unknown" not in n and not names_model_family(n)}
    return tuple(sorted((n for n in known | projects if len(n) >= 3 and not _NOT_A_TOOL.search(n)),
                        key=lambda n: (-len(n), n)))


@lru_cache(maxsize=8)
def _names_pattern(names: tuple[str, ...]) -> re.Pattern[str] | None:
    if not names:
        return None
    return re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(re.escape(n) for n in names) + r")(?![A-Za-z0-9])",
                      re.IGNORECASE)


def text_counts(text: str, names: tuple[str, ...] = ()) -> tuple[Counter[int], Counter[int]]:
    """(hashed word counts, hashed character n-gram counts) of a report, from its first 4000 characters, without the
    tool `names` (`tool_names`)."""
    text = text[:4000]
    rx = _names_pattern(names)
    if rx is not None:
        text = rx.sub(" ", text)
    words = Counter(_bucket("w:" + t) for t in tokenize(text))
    keys, counts = np.unique(gram_buckets(re.sub(r"\s+", " ", text.lower())), return_counts=True)
    return words, Counter(dict(zip(keys.tolist(), counts.tolist())))


def _tf(counts: Sequence[Counter[int]]) -> np.ndarray:
    """Sub-linear term frequencies, one row per text."""
    m = np.zeros((len(counts), TEXT_DIM), dtype=np.float32)
    for i, c in enumerate(counts):
        if c:
            keys = np.fromiter(c.keys(), dtype=np.int64, count=len(c))
            vals = np.fromiter(c.values(), dtype=np.float32, count=len(c))
            m[i, keys] = 1.0 + np.log(vals)
    return m


def _idf(tf: np.ndarray, min_df: int) -> np.ndarray:
    """Inverse document frequency over the training rows; zero for features seen in fewer than `min_df` of them
    (one report's own strings say nothing about its category)."""
    df = (tf > 0).sum(axis=0)
    return (np.log((1.0 + len(tf)) / (1.0 + df)) + 1.0).astype(np.float32) * (df >= max(1, min_df))


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def _ridge(X: np.ndarray, Y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Ridge regression in its dual form (few rows, many columns): (primal weights, leave-one-out predictions
    of the training rows, exact in closed form)."""
    K = X @ X.T
    A = np.linalg.inv(K + lam * np.eye(len(K)))
    alpha = A @ Y
    H = K @ A
    h = np.clip(np.diag(H), None, 1.0 - 1e-6)[:, None]
    loo = (H @ Y - h * Y) / (1.0 - h)
    return X.T @ alpha, loo


@dataclass
class TextModel:
    """Two linear text classifiers fitted on the cases: one for scope (out of scope vs. a training divergence,
    from words), one over in-scope categories (from character n-grams, fitted on in-scope cases only)."""

    scope_w: np.ndarray  # (TEXT_DIM,)
    scope_idf: np.ndarray
    cat_w: np.ndarray  # (TEXT_DIM, categories)
    cat_idf: np.ndarray
    categories: list[str]
    names: tuple[str, ...] = ()  # tool names read out of the text before counting (`tool_names`)

    def scores(self, text: str) -> tuple[float, dict[str, float]]:
        return self.scores_of(*text_counts(text, self.names))

    def scores_of(self, words: Counter[int], grams: Counter[int]) -> tuple[float, dict[str, float]]:
        xs = _unit(_tf([words])[0] * self.scope_idf)
        xc = _unit(_tf([grams])[0] * self.cat_idf)
        cat = xc @ self.cat_w
        return float(xs @ self.scope_w), {c: float(v) for c, v in zip(self.categories, cat)}

    @classmethod
    def fit(cls, counts: Sequence[tuple[Counter[int], Counter[int]]], labels: Sequence[str], train: Sequence[int],
            names: tuple[str, ...] = ()) -> tuple[TextModel, list[tuple[float, dict[str, float]]]]:
        """Fit on the rows `train` (`counts` read without the tool `names`, which the model keeps for the text it
        scores); also return every row's scores: leave-one-out for the training rows (so the ranker is fitted on
        scores like the ones an unseen report gets), the fitted model's for the others."""
        train = list(train)
        words, grams = _tf([c[0] for c in counts]), _tf([c[1] for c in counts])
        s_idf = _idf(words[train], SCOPE_MIN_DF)
        Xs = _unit(words * s_idf)
        y_scope = np.array([[1.0 if labels[j] == OUT_OF_SCOPE else -1.0] for j in train])
        s_w, s_loo = _ridge(Xs[train], y_scope, SCOPE_RIDGE)
        scope = Xs @ s_w[:, 0]
        scope[train] = s_loo[:, 0]
        ins = [j for j in train if labels[j] != OUT_OF_SCOPE]
        cats = sorted({labels[j] for j in ins})
        c_idf = _idf(grams[ins], CATEGORY_MIN_DF) if ins else np.zeros(TEXT_DIM, dtype=np.float32)
        Xc = _unit(grams * c_idf)
        if ins:
            Y = np.array([[1.0 if labels[j] == c else 0.0 for c in cats] for j in ins])
            c_w, c_loo = _ridge(Xc[ins], Y, CATEGORY_RIDGE)
        else:
            c_w, c_loo = np.zeros((TEXT_DIM, 0)), np.zeros((0, 0))
        cat = Xc @ c_w
        cat[ins] = c_loo
        model = cls(s_w[:, 0].astype(np.float32), s_idf, c_w.astype(np.float32), c_idf, cats, tuple(names))
        return model, [(float(scope[j]), dict(zip(cats, map(float, cat[j])))) for j in range(len(counts))]

    @classmethod
    def for_cases(cls, cases: Sequence[Case], cache: Path | None = None) -> TextModel | None:
        """The classifiers fitted on every case, as `kb eval --cv --fit` fitted them beside the ranker. Fitted from
        the case base on first use (a few seconds) and cached under the data dir, keyed by the cases' texts and
        labels, so an added or edited case refits them and nothing fitted is shipped in the package."""
        if not cases:
            return None
        texts = [narrative(c.query()) for c in cases]
        labels = [label_of(c) for c in cases]
        names = tool_names(cases)
        key = _texts_key([f"{lab}\0{t[:4000]}" for lab, t in zip(labels, texts)] + ["\0names", *names],
                         f"text-{TEXT_DIM}-{TEXT_HASH}-{SCOPE_RIDGE}-{CATEGORY_RIDGE}-{SCOPE_MIN_DF}-{CATEGORY_MIN_DF}")
        if cache is not None:
            model = cls.load(cache, key)
            if model is not None:
                return model
        model, _ = cls.fit([text_counts(t, names) for t in texts], labels, range(len(texts)), names)
        if cache is not None:
            try:
                model.save(cache, key)
            except OSError:
                pass  # a read-only data dir only costs the refit next time
        return model

    def save(self, path: Path, key: str = "") -> None:
        _save_npz(path, dim=np.array(TEXT_DIM), key=np.array(key), scope_w=self.scope_w, scope_idf=self.scope_idf,
                  cat_w=self.cat_w, cat_idf=self.cat_idf, categories=np.array(self.categories),
                  names=np.array(self.names, dtype=str))

    @classmethod
    def load(cls, path: Path, key: str | None = None) -> TextModel | None:
        """A saved model, or None when it is missing, damaged, of another size, or (with `key`) fitted on other
        cases."""
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["dim"]) != TEXT_DIM or (key is not None and str(z["key"]) != key):
                    return None
                return cls(z["scope_w"].astype(np.float32), z["scope_idf"].astype(np.float32),
                           z["cat_w"].astype(np.float32), z["cat_idf"].astype(np.float32),
                           [str(c) for c in z["categories"]], tuple(str(n) for n in z["names"]))
        except (OSError, ValueError, KeyError):
            return None


# ------------------------------------------------------------------------------------------------ the ranker
@dataclass
class Ranker:
    """Conditional logit over labels; `weights` follow FEATURES, and `label_weights[f][label]` adds a label's own
    weight for each feature f of LABEL_FEATURES (a label it was not fitted on has none: the shared weight alone)."""

    weights: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))
    labels: list[str] = field(default_factory=list)
    label_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    unsure_below: float = UNSURE_BELOW
    text: TextModel | None = None  # the text classifiers behind the `text` / `oos_text` features
    # How often answers were right per band of confidence, out of fold on the case base (`kb eval --cv --fit`
    # writes it beside the weights): {"reports": 670, "bins": [{"bin": "0.75-0.90", "n": .., "correct": ..}, ..]}.
    track_record: dict | None = None
    # How often a report that `not_training` calls out of scope was out of scope, on the rows the ranker was fitted
    # on (Laplace-smoothed): the confidence shown when that rule, not the ranker, decides the scope.
    not_training_right: float | None = None

    def record_for(self, confidence: float) -> dict | None:
        """The out-of-fold track record of answers as confident as this one: its band, how many reports fell in
        it and the share answered right; None without a record or with too few reports in the band to say."""
        for b in (self.track_record or {}).get("bins", []):
            lo, hi = _band(b)
            if lo <= confidence < hi or (hi >= 1.0 and confidence >= hi):
                if b.get("n", 0) < TRACK_RECORD_MIN or b.get("correct") is None:
                    return None
                n = int(b["n"])
                right_n = round(float(b["correct"]) * n)  # the share was stored to 3 decimals of a count
                return {"band": b["bin"], "reports": n, "right": float(b["correct"]),
                        "of": int(self.track_record.get("reports", 0)), "percent": (200 * right_n + n) // (2 * n)}
        return None

    def text_scores(self, text: str) -> TextScores | None:
        return self.text.scores(text) if self.text is not None else None

    def probabilities(self, phi: np.ndarray, labels: Sequence[str] | None = None) -> np.ndarray:
        """Each row's probability: phi is (labels x FEATURES), its rows for `labels` (default: the ranker's own)."""
        s = phi @ self.weights
        rows = self.labels if labels is None else labels
        for f, per_label in self.label_weights.items():
            s = s + phi[:, FEATURES.index(f)] * np.array([per_label.get(lab, 0.0) for lab in rows])
        s = s - s.max()
        e = np.exp(s)
        return e / e.sum()

    @classmethod
    def fit(cls, groups: list[np.ndarray], targets: list[int], labels: list[str], l2: float = 0.002,
            steps: int = 3000, lr: float = 0.5) -> Ranker:
        """Maximum likelihood with an L2 penalty by gradient descent: groups[i] is the (labels x features) matrix
        of query i and targets[i] the row of its true label (every group has `labels`, in that order). Each feature
        of LABEL_FEATURES is also copied into one column per label, so that its label's weight is fitted beside
        the shared one."""
        k = len(FEATURES)
        if not groups:
            return cls(np.zeros(k), list(labels))
        X = np.stack(groups)  # (queries, labels, features)
        n_lab = X.shape[1]
        own = np.zeros((X.shape[0], n_lab, len(LABEL_FEATURES) * n_lab))
        for j, f in enumerate(LABEL_FEATURES):
            own[:, np.arange(n_lab), j * n_lab + np.arange(n_lab)] = X[:, :, FEATURES.index(f)]
        X = np.concatenate([X, own], axis=2)
        w = np.zeros(X.shape[2])
        onehot = np.zeros(X.shape[:2])
        onehot[np.arange(len(targets)), targets] = 1.0
        n = len(groups)
        for _ in range(steps):
            s = X @ w
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            grad = np.einsum("ql,qlf->f", p - onehot, X) / n + l2 * w
            w -= lr * grad
        per_label = {f: {lab: float(w[k + j * n_lab + i]) for i, lab in enumerate(labels)}
                     for j, f in enumerate(LABEL_FEATURES)}
        return cls(w[:k], list(labels), per_label)

    def save(self, path: Path = MODEL_FILE, meta: dict | None = None) -> None:
        data = {"features": list(FEATURES), "weights": [round(float(x), 6) for x in self.weights],
                "label_weights": {f: {lab: round(float(x), 6) for lab, x in per.items()}
                                  for f, per in self.label_weights.items()},
                "labels": self.labels, "unsure_below": self.unsure_below, **(meta or {})}
        if self.not_training_right is not None:
            data["not_training_right"] = round(float(self.not_training_right), 4)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path = MODEL_FILE) -> Ranker | None:
        """The shipped ranker weights (read once per KnowledgeBase, offline), or None when missing or fitted for
        another feature set (refit with `kb eval --cv --fit`). Its text classifiers come from the case base
        (TextModel.for_cases)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if data.get("features") != list(FEATURES):
            return None
        record = data.get("track_record")
        if not (isinstance(record, dict) and isinstance(record.get("bins"), list)
                and all(_band(b) is not None for b in record["bins"])):
            record = None  # damaged by hand: the weights still serve, nothing is quoted
        right = data.get("not_training_right")
        if isinstance(right, bool) or not isinstance(right, (int, float)) or not 0.0 < right <= 1.0:
            right = None  # missing or damaged: the ranker's own probability is shown
        # A file fitted before there were per-label weights has none: its shared weights are the whole model.
        per_label = data.get("label_weights", {})
        if not (isinstance(per_label, dict) and set(per_label) <= set(LABEL_FEATURES)
                and all(isinstance(v, dict) for v in per_label.values())):
            return None  # damaged or fitted for another feature set: refit with `kb eval --cv --fit`
        try:
            per_label = {f: {str(lab): float(x) for lab, x in v.items()} for f, v in per_label.items()}
        except (TypeError, ValueError):
            return None
        return cls(np.asarray(data["weights"], dtype=np.float64), list(data.get("labels", [])), per_label,
                   float(data.get("unsure_below", UNSURE_BELOW)), track_record=record,
                   not_training_right=None if right is None else float(right))


def _band(b: object) -> tuple[float, float] | None:
    """A track-record bin's confidence band ("0.75-0.90" -> (0.75, 0.9)), or None when it is not one."""
    try:
        lo, hi = (float(x) for x in b["bin"].split("-"))  # type: ignore[index]
        int(b["n"])  # type: ignore[index]
        if b.get("correct") is not None:  # type: ignore[union-attr]
            float(b["correct"])  # type: ignore[index]
        return (lo, hi) if 0.0 <= lo < hi <= 1.0 else None
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def decide(probs: np.ndarray, labels: Sequence[str]) -> list[int]:
    """Label indices best first, with the scope decided first: out of scope only when its probability beats all
    in-scope labels together; in scope, the categories rank by their own probability."""
    order = [int(i) for i in np.argsort(-probs, kind="stable")]
    if OUT_OF_SCOPE not in labels:
        return order
    oos = list(labels).index(OUT_OF_SCOPE)
    rest = [i for i in order if i != oos]
    return [oos, *rest] if probs[oos] > OUT_OF_SCOPE_ABOVE else [*rest, oos]


def no_divergence(view: QueryView) -> bool:
    """Nothing in the report went NaN, inf or zero or diverged, and no curated mechanism's rule fired: whatever it
    is, it is not a training divergence (issue 11's scope), however much it reads like one. A fired rule keeps a
    symptom-less paste in scope (a config pasted on its own is a question about that config), except when the
    paste's own error is an out-of-scope one (out of memory, an import or install error): that error is the
    problem, and the configuration merely resembles a mechanism's."""
    if view.symptom:
        return False
    return not view.fired or bool(set(view.facts.value("errors", [])) & OUT_OF_SCOPE_ERRORS)


def inference_only(text: str) -> bool:
    """The report is about generation or serving and never mentions training (a NaN in `generate` is not a
    training divergence, whatever precision or kernel caused it)."""
    head = text[:4000]
    return bool(_INFERENCE_WORDS.search(head)) and not _TRAINING_WORDS.search(head)


def zero_loss_by_design(view: QueryView) -> bool:
    """A GRPO loss logged as 0 and nothing else wrong: expected. With one update per batch the importance ratio is 1
    and the group-normalised advantages average to zero, so the policy term is 0; the KL term starts at 0 too
    (the maintainers' answer in the cases gh-huggingface-trl-2703 and gh-huggingface-open-r1-239). A zero
    grad_norm, NaN or any other symptom makes it a real failure again."""
    f = view.facts
    return (str(f.value("algorithm") or "").upper() == "GRPO" and set(f.value("symptom", [])) == {"zero_loss"}
            and not f.value("nan_metrics") and not f.value("huge_metrics") and not view.fired
            and not set(f.value("errors", [])) - OUT_OF_SCOPE_ERRORS)


# Words that say a loss-scaler overflow comes now and then, not on every step: "偶尔出现", "every 2000 steps".
_OCCASIONAL = re.compile(r"\boccasional\w*|\bsometimes\b|now and then|from time to time|once in a while|"
                         r"\bevery \d[\d,]* (?:steps|iterations|iters)\b|偶尔|偶发|不时|时不时|间歇", re.IGNORECASE)


def occasional_overflow(view: QueryView, text: str) -> bool:
    """An fp16 loss scaler that overflows now and then, and nothing else wrong: how dynamic loss scaling works (it
    skips that step and halves the scale; the maintainers' answer in gh-hiyouga-llamafactory-3432 and
    gh-nvidia-apex-864). Overflow on every step, a scale at its minimum, or any bad metric is the failure again."""
    f = view.facts
    return (set(f.value("symptom", [])) == {"overflow"} and not view.bad_metric
            and "loss_scale_min" not in f.value("errors", []) and bool(_OCCASIONAL.search(text[:4000])))


# Why a report is out of scope whatever the ranker says (`not_training`), in English and Chinese.
NOT_TRAINING_REASONS = {
    "no_divergence": ("no metric went NaN, inf or zero and nothing diverged in the input",
                      "输入中没有指标变成 NaN、inf 或 0，也没有发散"),
    "inference": ("the input is about generation / inference, not a training run",
                  "输入讲的是生成 / 推理，不是训练过程"),
    "occasional_overflow": (("an fp16 loss scaler that overflows now and then is working as designed: it skips that step and "
                             "lowers the scale; it is a failure only when the scale keeps falling to its minimum or a metric "
                             "goes NaN / inf / 0"),
                            ("fp16 动态损失缩放偶尔溢出是正常行为：跳过这一步并调低缩放系数；只有缩放系数一路降到最小值，"
                             "或指标变成 NaN / inf / 0 时才是故障")),
    "grpo_zero": (("a GRPO loss of 0 is expected: the group-normalised advantages average to zero and the KL term "
                   "starts at 0; it is a failure only when grad_norm is 0 too or reward / kl go NaN"),
                  ("GRPO 的 loss 为 0 是预期行为：组内归一化后的优势均值为 0，KL 项起始也为 0；只有 grad_norm 也为 0，"
                   "或 reward / kl 变成 NaN 时才是故障")),
}


def not_training(view: QueryView, text: str, lang: str = "en") -> str:
    """Why the report is out of scope whatever the ranker says ("" when it may be in scope), in `lang`."""
    if no_divergence(view):
        key = "no_divergence"
    elif inference_only(text):  # the curated rules describe training mechanisms, so a fired rule does not count
        key = "inference"
    elif zero_loss_by_design(view):
        key = "grpo_zero"
    elif occasional_overflow(view, text):
        key = "occasional_overflow"
    else:
        return ""
    en, zh = NOT_TRAINING_REASONS[key]
    return zh if lang == "zh" else en


def ranked(view: QueryView, probs: np.ndarray, labels: Sequence[str], text: str = "") -> list[int]:
    """The final order: out of scope first when the report is not about a training divergence (`not_training`),
    else the rules' category first when they are confident and at least as confident as the ranker's best cause,
    else the ranker's (`decide`)."""
    order = decide(probs, labels)
    if OUT_OF_SCOPE in labels and not_training(view, text):
        oos = list(labels).index(OUT_OF_SCOPE)
        return [oos, *[j for j in order if j != oos]]
    top = view.engine_top
    rules = view.category_scores.get(top, 0.0) if top in labels else 0.0
    unsure = labels[order[0]] != OUT_OF_SCOPE and float(probs[order[0]]) < UNSURE_BELOW
    # The rules lead only when they are at least as confident as the ranker's best in-scope answer: a confident
    # rule must not push a more confident cause down (the list stays ordered by confidence). Against a confident
    # out of scope they still lead: a configuration pasted on its own, with no symptom, is a question about it.
    best_in = max((float(probs[j]) for j in order if labels[j] != OUT_OF_SCOPE), default=0.0)
    # Nor does a rule lead with a mechanism the report's algorithm or precision rules out (an ORPO report's words can
    # retrieve the KTO incident first, a bf16 report's the fp16 one).
    possible = top is not None and not algorithm_mismatch(top, view.facts) and not precision_mismatch(top, view.facts)
    if possible and rules >= best_in and (rules >= RULES_CONFIDENT or (unsure and rules >= RULES_WHEN_UNSURE)):
        i = list(labels).index(top)
        order = [i, *[j for j in order if j != i]]
    if labels[order[0]] == OUT_OF_SCOPE and training_went_nan(view.facts):
        # A training loss or gradient norm the paste shows going NaN / inf is what kb is for: the ranker's "out of
        # scope" (a paste that reads like code, out-of-scope neighbours) does not overrule it; the best in-scope
        # cause leads, with its own (low) probability and the questions that would settle it.
        first_in = next((j for j in order if labels[j] != OUT_OF_SCOPE and not ruled_out(labels[j], view.facts)), None)
        if first_in is not None:
            order = [first_in, *[j for j in order if j != first_in]]
    out = [j for j in order if not ruled_out(labels[j], view.facts)]
    return out + [j for j in order if j not in out]


_EVAL_METRIC = re.compile(r"^(?:eval|val|valid|validation|test)[_/]", re.IGNORECASE)


def training_went_nan(facts: Facts) -> bool:
    """A training loss or gradient norm read as NaN / inf, with no out-of-scope error (OOM, install, crash) beside it."""
    if set(facts.value("errors", [])) & OUT_OF_SCOPE_ERRORS:
        return False
    return any((is_loss_like(m) or is_grad_norm(m)) and not _EVAL_METRIC.match(m)
               for m in facts.value("nan_metrics", []) or [])


def shown_probabilities(view: QueryView, probs: np.ndarray, labels: Sequence[str], order: Sequence[int],
                        text: str = "", not_training_right: float | None = None) -> dict[str, float]:
    """The probability shown per label, best first (`order`): the ranker's, except that a first label the rules put
    first too keeps the rules' own calibrated confidence when that is higher, and that out of scope put first by
    `not_training` (whatever the ranker said) shows how often that rule was right (`Ranker.not_training_right`), the
    other labels sharing what is left in their own proportions. `kb diagnose` shows these, and `kb eval --cv`
    measures their reliability out of fold."""
    prob = {labels[i]: 0.0 if ruled_out(labels[i], view.facts) else float(probs[i]) for i in order}
    best = labels[order[0]] if len(order) else None
    raised = prob.get(best, 0.0)
    if best is not None and best == view.engine_top:
        raised = max(raised, view.category_scores.get(best, 0.0))
    if best == OUT_OF_SCOPE and not_training_right is not None and not_training(view, text):
        raised = max(raised, not_training_right)
    if best is not None and raised > prob[best]:
        # The others share what is left, in their own proportions: the probabilities shown still add up to one.
        rest = sum(p for lab, p in prob.items() if lab != best)
        scale = (1.0 - raised) / rest if rest > 0 else 0.0
        prob = {lab: raised if lab == best else p * scale for lab, p in prob.items()}
    return prob


def not_training_precision(views: Sequence[QueryView], texts: Sequence[str], out_of_scope: Sequence[bool]
                           ) -> float:
    """Laplace-smoothed share of the reports `not_training` calls out of scope that are (`Ranker.not_training_right`)."""
    hits = [o for v, t, o in zip(views, texts, out_of_scope) if not_training(v, t)]
    return (sum(hits) + 1.0) / (len(hits) + 2.0)


def label_matrix(view: QueryView, all_labels: Sequence[str], case_labels: Sequence[str], usable: np.ndarray,
                 prior: dict[str, float], text: str, text_scores: TextScores | None = None
                 ) -> tuple[np.ndarray, list[int]]:
    nbrs = neighbours(view, usable)
    return np.stack([features(view, lab, nbrs, case_labels, prior, text, text_scores) for lab in all_labels]), nbrs
