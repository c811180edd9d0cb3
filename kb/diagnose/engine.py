"""Diagnosis engine: facts + incident triggers + signatures + hybrid retrieval -> ranked, calibrated diagnoses."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kb.canonical import OUT_OF_SCOPE_ERRORS, OUT_OF_SCOPE_NAMES, OUT_OF_SCOPE_WORDS
from kb.conditions import TriggerResult, describe, evaluate_trigger, normalised, same_value
from kb.cues import score_query
from kb.diagnose import learned
from kb.diagnose.learned import CaseIndex, Ranker
from kb.diagnose.models import Candidate as LabelProbability
from kb.diagnose.models import Diagnosis, DiagnosisItem, Evidence, Question, SimilarReport, TrackRecord
from kb.diagnose.signatures import MaskedLines, SignatureHit, match_signatures
from kb.errors import KBError
from kb.facts import Fact, Facts, answers_as_facts, check_text, facts_from_mapping
from kb.facts.boundary import too_deep
from kb.facts.pipeline import DEFAULT as PIPELINE
from kb.facts.template import narrative
from kb.index import fusion
from kb.records import Incident
from kb.tokenize import paste_lang


class Searcher(Protocol):
    """What ranking needs from retrieval: the records, and hybrid search over them (KnowledgeBase has both)."""

    @property
    def records(self) -> dict[str, Incident]: ...

    def search(self, text: str, k: int = 10, filters: dict[str, str] | None = None, mode: str = "hybrid",
               weights: tuple[float, float] | None = None) -> list[Any]: ...

    def case_model(self) -> tuple[CaseIndex, Ranker] | None:
        """The case index and the fitted ranker, or None when there is no case base (rules only)."""
        ...

    def embed_query(self, text: str) -> Any: ...

class Diagnoser(Searcher, Protocol):
    """A Searcher that also diagnoses (KnowledgeBase): what evaluation needs."""

    def diagnose(self, log: str | None = None, config: str | None = None, question: str | None = None,
                 text: str | None = None, k: int = 3, facts: Mapping[str, Any] | None = None, mode: str = "full",
                 exclude: frozenset[str] = frozenset()) -> Diagnosis: ...


MODES = ("bm25", "dense", "hybrid", "full")
FEATURES = ("trigger", "partial", "blocked", "signature", "meta", "retrieval", "top_retrieval", "dense", "symptom")
FEATURE_SIGNS = {"trigger": 1, "partial": 1, "blocked": -1, "signature": 1, "meta": 1, "retrieval": 1,
                 "top_retrieval": 1, "dense": 1, "symptom": 0}
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
# Hand-set starting weights (logit scale); `kb eval --calibrate` refits them on a labelled set (docs/DIAGNOSE.md).
DEFAULT_WEIGHTS = {"bias": -4.0, "trigger": 3.0, "partial": 1.0, "blocked": -2.5, "signature": 1.5, "meta": 1.5,
                   "retrieval": 2.0, "top_retrieval": 0.8, "dense": 1.0, "symptom": 0.8}
ABSTAIN_BELOW = 0.25
# Below this probability the first category is more likely wrong than right: the questions that would settle it
# are asked even when it is shown as the diagnosis (a product choice, not fitted).
ASK_BELOW = 0.5
RETRIEVAL_K = 20
_QUERY_CHARS = 4000


def _weights() -> tuple[dict[str, float], float]:
    """The calibrated weights and abstention threshold, read once per version of calibration.json."""
    try:
        mtime = CALIBRATION_FILE.stat().st_mtime_ns
    except OSError:
        mtime = 0
    return _read_weights(mtime)


@lru_cache(maxsize=4)
def _read_weights(mtime: int) -> tuple[dict[str, float], float]:
    if mtime:
        try:
            data = json.loads(CALIBRATION_FILE.read_text(encoding="utf-8"))
            return {**DEFAULT_WEIGHTS, **data.get("weights", {})}, float(data.get("abstain_below", ABSTAIN_BELOW))
        except (ValueError, OSError):
            pass
    return dict(DEFAULT_WEIGHTS), ABSTAIN_BELOW


@dataclass
class Candidate:
    incident: Incident
    features: dict[str, float] = field(default_factory=dict)
    triggers: list[TriggerResult] = field(default_factory=list)
    signatures: list[SignatureHit] = field(default_factory=list)
    meta: list[tuple[str, Fact]] = field(default_factory=list)
    retrieval: Any = None
    score: float = 0.0

    @property
    def fired(self) -> list[TriggerResult]:
        return [t for t in self.triggers if t.fired]


def _inputs(log: str | None, config: str | None, question: str | None, text: str | None) -> list[tuple[str, str]]:
    out = []
    for name, value in (("question", question), ("text", text), ("config", config), ("log", log)):
        if value is not None and (isinstance(value, bytes) or value.strip()):
            out.append((name, check_text(value, name)))
    return out


def collect_facts(inputs: list[tuple[str, str]]) -> tuple[Facts, list[tuple[str, int, str]]]:
    return PIPELINE.extract_inputs(inputs)


def retrieval_query(inputs: list[tuple[str, str]], facts: Facts) -> str:
    """The text sent to retrieval: the whole paste when short, else prose + error/metric lines + config facts.
    Both read the reporter's own words (`narrative`): an issue form's scaffolding and environment dump, a
    traceback's frames and a script's plumbing would otherwise pull the incidents that mention LLaMA-Factory or
    DeepSpeed up for every report filed through their forms (the facts still come from every line)."""
    inputs = [(name, narrative(value)) for name, value in inputs]
    whole = "\n".join(v for _, v in inputs)
    if len(whole) <= _QUERY_CHARS:
        return whole
    keep: list[str] = []
    for key in ("errors", "nan_metrics", "zero_metrics", "huge_metrics"):
        for f in facts.elements.get(key, {}).values():
            keep.append(f.detail[:300])
    for name, value in inputs:
        if name in ("question", "text"):
            keep.insert(0, value[:1500])
    keep.append(" ".join(f"{k} {v.value}" for k, v in facts.items.items() if v.kind == "config"))
    return "\n".join(dict.fromkeys(keep))[: _QUERY_CHARS * 2]


def in_scope(facts: Facts) -> bool:
    errs = set(facts.value("errors", []))
    return bool(facts.value("symptom") or facts.value("nan_metrics") or facts.value("zero_metrics")
                or facts.value("huge_metrics") or facts.value("output_collapse") or (errs - OUT_OF_SCOPE_ERRORS))


_RULED: tuple[dict, list[Incident], frozenset[str]] | None = None


def _ruled(records: dict[str, Incident]) -> tuple[list[Incident], frozenset[str]]:
    """The records that carry rules of their own, computed once per loaded record set (a reload makes a new dict)."""
    global _RULED
    cached = _RULED
    if cached is None or cached[0] is not records:
        found = [inc for inc in records.values()
                 if inc.triggers or inc.symptoms.signatures or inc.symptoms.errors]
        cached = _RULED = (records, found, frozenset(inc.id for inc in found))
    return cached[1], cached[2]


def _meta_matches(inc: Incident, facts: Facts) -> list[tuple[str, Fact]]:
    """Structured fields of the incident that the paste agrees with (algorithm, framework, precision, config)."""
    out: list[tuple[str, Fact]] = []
    alg = facts.get("algorithm")
    if alg and inc.algorithm not in ("unknown", "") and same_value(str(alg.value), inc.algorithm.split()[0]):
        out.append((f"algorithm {inc.algorithm}", alg))
    fw = facts.get("framework")
    if fw and inc.framework.name not in ("unknown", "") and same_value(str(fw.value), inc.framework.name):
        out.append((f"framework {inc.framework.name}", fw))
    if inc.precision in ("fp16", "bf16", "fp32"):
        for key in ("precision", "weights_dtype"):
            f = facts.get(key)
            if f and f.value == inc.precision and inc.precision == "fp16":
                out.append((f"{key} {inc.precision}", f))
                break
    # Only settings the incident's triggers reason about count: sharing `max_length: 8192` or `beta: 0.1` with an
    # unrelated report is a coincidence, not evidence.
    causal = {c.fact for t in inc.triggers for c in (*t.all, *t.any)}
    for key, want in inc.config.items():
        f = facts.get(key)
        # precision, algorithm and framework were matched above (once): a config key naming them again is no
        # second piece of evidence.
        if f is None or key in ("precision", "model", "algorithm", "framework") or key not in causal:
            continue
        if isinstance(want, (int, float)) and not isinstance(want, bool) and isinstance(f.value, (int, float)):
            ok = (want > 1 and f.value > 1) if key in ("sequence_parallel_size", "zero_stage") and want > 1 \
                else math.isclose(float(f.value), float(want))
            ok = ok or (key == "zero_stage" and f.value == want)
        else:
            ok = same_value(f.value, normalised(key, want))
        if ok:
            out.append((f"{key} {want}", f))
    return out


def _features(c: Candidate, facts: Facts, hit: Any, top_id: str | None, symptom: bool, mode: str) -> None:
    use_rules = mode == "full"
    fired = [t for t in c.triggers if t.fired]
    trig = max((min(t.trigger.weight, 1.5) for t in fired), default=0.0)
    partial = max((t.fraction for t in c.triggers if not t.fired and not t.blocked_by and t.fraction >= 0.5),
                  default=0.0)
    blocked = 1.0 if any(t.blocked_by and t.fraction >= 1.0 for t in c.triggers) else 0.0
    sig = min(2.0, sum(h.signature.weight for h in c.signatures)) / 2.0
    meta = min(1.0, 0.25 * len(c.meta))
    c.features = {
        "trigger": trig if use_rules else 0.0,
        "partial": partial if use_rules else 0.0,
        "blocked": blocked if use_rules else 0.0,
        "signature": sig if use_rules else 0.0,
        "meta": meta if use_rules else 0.0,
        "retrieval": float(hit.score) if hit is not None else 0.0,
        "top_retrieval": 1.0 if hit is not None and hit.id == top_id else 0.0,
        "dense": max(0.0, float(hit.dense)) if hit is not None and mode != "bm25" else 0.0,
        "symptom": 1.0 if symptom else 0.0,
    }


def _logit(features: dict[str, float], w: dict[str, float]) -> float:
    return w["bias"] + sum(w.get(k, 0.0) * v for k, v in features.items())


def _evidence(c: Candidate) -> list[Evidence]:
    ev: list[Evidence] = []
    seen: set[tuple[Any, ...]] = set()

    def add(kind: str, detail: str, line: int | None, source: str) -> None:
        key = (kind, detail, line, source)
        if key not in seen:
            seen.add(key)
            ev.append(Evidence(kind=kind if kind in ("trainer", "config", "log", "text", "env") else "text",  # type: ignore[arg-type]
                               detail=detail[:400], line=line, source=source))

    for t in c.fired:
        for cond, f in t.matched:
            if f is not None:
                add(f.kind, f"trigger {t.trigger.id}: {describe(cond)} — {f.detail}", f.line, f.source)
    for h in c.signatures:
        add("log" if h.signature.kind in ("log", "error", "metric") else "text",
            f"signature /{h.signature.pattern}/: {h.text}", h.line, h.source)
    for what, f in c.meta:
        add(f.kind, f"{what} — {f.detail}", f.line, f.source)
    if c.retrieval is not None:
        h = c.retrieval
        terms = ", ".join(h.matched_terms[:8])
        ev.append(Evidence(kind="retrieval", detail=f"text similarity: fused {h.score:.2f}, dense {h.dense:.2f}"
                           + (f", shared terms: {terms}" if terms else ""), line=None, source="text"))
    return ev


def _decided_by(winner: Candidate, others: list[Candidate]) -> str:
    """The fact that separated the winner from the best candidate of another category sharing its symptom."""
    rival = next((o for o in others if o.incident.root_cause.category != winner.incident.root_cause.category), None)
    if rival is None:
        return ""
    parts = []
    for o in others:
        if o.incident.root_cause.category == winner.incident.root_cause.category:
            continue
        blocked = [(cond, f) for t in o.triggers if t.fraction >= 1.0 for cond, f in t.blocked_by]
        if blocked:
            cond, f = blocked[0]
            v = f"={f.value}" if f is not None else ""
            where = f" (line {f.line})" if f is not None and f.line else ""
            parts.append(f"{o.incident.root_cause.category} ruled out by {describe(cond)}{v}{where}")
            break
    rival_facts = {cond.fact for t in rival.fired for cond, _ in t.matched}
    # The strongest fired trigger names the fact (learning_rate=1000 rather than precision=fp32 for a learning-rate
    # incident whose fp32 trigger fired too); the next one when it shares every fact with the rival.
    for t in sorted(winner.fired, key=lambda t: -t.trigger.weight):
        own = next(((cond, f) for cond, f in t.matched if cond.fact not in rival_facts and f is not None), None)
        if own is not None:
            cond, f = own
            where = f" (line {f.line})" if f.line else ""
            parts.insert(0, f"{cond.fact}={f.value}{where} fits {winner.incident.root_cause.category}")
            break
    return "; ".join(parts)


def search_without(found: list[Any], exclude: frozenset[str], mode: str) -> list[Any]:
    """Search hits with `exclude` removed and the fusion redone over the rest (as if they were never indexed;
    only BM25's corpus statistics still include them)."""
    rest = {h.id: h for h in found if h.id not in exclude}
    fused = fusion.fuse({i: h.dense for i, h in rest.items()}, {i: h.bm25 for i, h in rest.items()}, mode=mode)
    return [rest[f.id].model_copy(update={"score": round(f.score, 4), "dense_rank": f.dense_rank,
                                          "bm25_rank": f.bm25_rank}) for f in fused[:RETRIEVAL_K]]


def rank(kb: Searcher, facts: Facts, lines: list[tuple[str, int, str]], query: str, mode: str = "full",
         warnings: list[str] | None = None, exclude: frozenset[str] = frozenset()) -> list[Candidate]:
    """Every incident scored; best first. `exclude` drops incidents from the candidate set (`kb eval --holdout`)."""
    if mode not in MODES:
        raise KBError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    records = kb.records
    hits: dict[str, Any] = {}
    top_id = None
    if query.strip():
        try:
            # Beyond the top 20 the retrieval feature is ~0 anyway; search() explains every hit it returns.
            # With exclusions every incident is fetched so the fusion can be redone without them.
            found = kb.search(query, k=len(records) if exclude else max(1, min(len(records), RETRIEVAL_K)),
                              mode="hybrid" if mode == "full" else mode)
            if exclude:
                found = search_without(found, exclude, "hybrid" if mode == "full" else mode)
            hits = {h.id: h for h in found}
            top_id = found[0].id if found else None
        except KBError as e:
            if warnings is not None:
                warnings.append(f"text retrieval unavailable ({e}); ranked by facts and signatures only")
    w, _ = _weights()
    symptom = in_scope(facts)
    masked = MaskedLines(lines) if mode == "full" else None
    cands = []
    # Records with no triggers, signatures or error strings (raw ingested documents) can only be reached through
    # retrieval: scoring every one of them cost ~0.2 s per question at 10k records.
    ruled, ruled_ids = _ruled(records)
    pool = ruled + [records[i] for i in hits if i in records and i not in ruled_ids]
    for inc in pool:
        if inc.id in exclude:
            continue
        c = Candidate(inc, retrieval=hits.get(inc.id))
        if mode == "full":
            c.triggers = [evaluate_trigger(t, facts) for t in inc.triggers]
            c.signatures = match_signatures(inc, masked)
            c.meta = _meta_matches(inc, facts)
        _features(c, facts, c.retrieval, top_id, symptom, mode)
        c.score = 1.0 / (1.0 + math.exp(-_logit(c.features, w)))
        cands.append(c)
    cands.sort(key=lambda c: (-c.score, c.incident.id))
    return cands


def diagnose(kb: Searcher, log: str | None = None, config: str | None = None, question: str | None = None,
             text: str | None = None, k: int = 3, mode: str = "full", exclude: frozenset[str] = frozenset(),
             facts: Mapping[str, Any] | None = None, answers: Mapping[str, Any] | None = None) -> Diagnosis:
    """Diagnose a paste; see docs/DIAGNOSE.md. Raises InputError / InputTooLarge for unusable input.

    `facts`: facts handed over as data (a running trainer, a run folder), `{key: value}` or
    `{key: (value, detail)}`; they outrank anything read from text, and the rules rank them. `answers`: the
    reporter's answers to the differential questions, the same form; they outrank the paste's prose and the
    ranking is redone with them, by the learned ranker when it reads the paste. `exclude`: incident ids left out of
    the candidate set (held-out evaluation)."""
    inputs = _inputs(log, config, question, text)
    if not inputs and not facts and not answers:
        return Diagnosis(abstained=True, reason="empty input: paste a log, config, command line or question")
    given = facts_from_mapping(facts) if facts else Facts()
    if answers:
        given.merge(answers_as_facts(answers))
    facts, lines = collect_facts(inputs)
    given.merge(facts)
    facts = given
    warnings = list(dict.fromkeys(facts.warnings))
    if config and not any(w.startswith("config:") and "JSON" in w for w in warnings):
        _check_config_syntax(config, warnings)
    lang = paste_lang("\n".join(v for _, v in inputs)[:4000]) if inputs else "en"
    records = kb.records
    if not records:
        return Diagnosis(abstained=True, reason="the knowledge base has no incidents", facts=facts.to_dict(),
                         warnings=warnings + ["no incidents loaded (check --incidents-dir)"], lang=lang)
    query = retrieval_query(inputs, facts) if inputs else " ".join(f"{k_} {v.value}" for k_, v in facts.items.items())
    cands = rank(kb, facts, lines, query, mode=mode, warnings=warnings, exclude=exclude)
    model = kb.case_model() if mode == "full" and not exclude else None
    if model is not None:
        whole = "\n".join(v for _, v in inputs)
        return _learned_diagnosis(kb, model, facts, cands, query, whole, lang, k, warnings)
    _, threshold = _weights()
    items: list[DiagnosisItem] = []
    shown: list[Candidate] = []
    for c in cands:
        if any(s.incident.root_cause.category == c.incident.root_cause.category for s in shown):
            continue
        shown.append(c)
        if len(shown) >= max(1, k):
            break
    for i, c in enumerate(shown):
        inc = c.incident
        fix = inc.fix.summary.pick(lang) or (inc.fix.steps[0].pick(lang) if inc.fix.steps else "")
        items.append(DiagnosisItem(
            incident_id=inc.id, category=inc.root_cause.category, confidence=round(c.score, 3),
            title=inc.title.pick(lang), evidence=_evidence(c), fix=fix,
            repro=f"kb repro {inc.id}" if inc.repro.path else "",
            decided_by=_decided_by(c, [o for o in cands if o is not c][:5]) if i == 0 else "",
            score_parts={k_: round(v, 3) for k_, v in c.features.items() if v},
        ))
    abstained, reason = False, ""
    errs = set(facts.value("errors", []))
    if not in_scope(facts) and not (shown and shown[0].fired):
        abstained = True
        oos = sorted(errs & OUT_OF_SCOPE_ERRORS)
        looks = out_of_scope_named(oos, lang)
        if lang == "zh":
            reason = "输入中没有 NaN / inf / loss 为 0 / 输出崩坏等症状" + (f"；看起来是{looks}，不在本知识库范围内" if oos else "")
        else:
            reason = ("no NaN / inf / zero-loss / collapse symptom in the input"
                      + (f"; it looks like {looks}, which this knowledge base does not cover" if oos else ""))
    elif not shown or shown[0].score < threshold:
        abstained = True
        reason = f"best candidate is weak (confidence {shown[0].score:.2f} < {threshold})" if shown else "no candidate"
    return Diagnosis(diagnoses=items, abstained=abstained, reason=reason, facts=facts.to_dict(), warnings=warnings,
                     lang=lang)


def out_of_scope_named(ids: list[str], lang: str) -> str:
    """Out-of-scope error ids / case kinds in words, in the answer's language, each id kept beside its words."""
    i, join = (1, "、".join) if lang == "zh" else (0, ", ".join)
    return join(f"{OUT_OF_SCOPE_NAMES.get(e, (e, e))[i]} ({e})" for e in ids)


def query_view(kb: Searcher, facts: Facts, cands: list[Candidate], query: str, index: CaseIndex,
               text: str = "") -> learned.QueryView:
    """What the rules said about a query, per category, its similarity to every case, and the category cues read on
    its text (the whole paste; `query` when not given). `query` is `retrieval_query`'s, already the reporter's own
    words (kb.facts.template), so the case similarities and the rules' retrieval read the same text."""
    scores: dict[str, float] = {}
    fired: set[str] = set()
    for c in cands:
        cat = c.incident.root_cause.category
        scores[cat] = max(scores.get(cat, 0.0), c.score)
        if c.fired:
            fired.add(cat)
    top = cands[0].incident.root_cause.category if cands else None
    sims = index.similarities(query, kb.embed_query(query)) if query.strip() else np.zeros(len(index.cases))
    return learned.QueryView(facts, scores, fired, top, sims, score_query(facts, text or query))


def _item(c: Candidate, others: list[Candidate], lang: str, confidence: float, first: bool) -> DiagnosisItem:
    inc = c.incident
    fix = inc.fix.summary.pick(lang) or (inc.fix.steps[0].pick(lang) if inc.fix.steps else "")
    return DiagnosisItem(
        incident_id=inc.id, category=inc.root_cause.category, confidence=round(confidence, 3),
        title=inc.title.pick(lang), evidence=_evidence(c), fix=fix,
        repro=f"kb repro {inc.id}" if inc.repro.path else "",
        decided_by=_decided_by(c, others[:5]) if first else "",
        score_parts={k_: round(v, 3) for k_, v in c.features.items() if v},
    )


def _uncurated_title(label: str, lang: str) -> str:
    """The title of a cause that the case base holds but no curated incident describes for this report."""
    if label == learned.FRAMEWORK_BUG:
        return ("某个框架功能或版本的缺陷；没有与此配置匹配的已整理事件" if lang == "zh"
                else "a defect of one framework feature or release; no curated incident matches this setup")
    return "真实报告中出现过；暂无整理好的事件" if lang == "zh" else "seen in real reports; no curated incident yet"


def _learned_diagnosis(kb: Searcher, model: tuple[CaseIndex, Ranker], facts: Facts, cands: list[Candidate],
                       query: str, whole: str, lang: str, k: int, warnings: list[str]) -> Diagnosis:
    """Rules + nearest real reports, weighed by the ranker fitted on the case base (kb.diagnose.learned)."""
    index, ranker = model
    # The fact layer read the whole paste; the text-based parts (nearest reports, text classifiers, scope words)
    # read the reporter's own words, without an issue form's scaffolding and environment dump.
    view = query_view(kb, facts, cands, query, index, whole)
    whole = narrative(whole, limit=8000)  # the learned layer reads the first 4000 characters
    case_labels = [learned.label_of(c) for c in index.cases]
    labels = list(dict.fromkeys([*ranker.labels, *view.category_scores, learned.OUT_OF_SCOPE]))
    prior = learned.priors(case_labels, labels)
    phi, nbrs = learned.label_matrix(view, labels, case_labels, np.ones(len(index.cases), dtype=bool), prior, whole,
                                     ranker.text_scores(whole))
    probs = ranker.probabilities(phi, labels)
    order = learned.ranked(view, probs, labels, whole)
    trainer = any(f.kind == "trainer" for f in facts.items.values())
    if trainer:
        # Facts observed in a running trainer (or a run folder) are not the kind of input the ranker was fitted
        # on (text reports): the rules, which encode each mechanism, rank them; the case base still supplies
        # similar reports and questions.
        engine = np.array([0.0 if learned.ruled_out(lab, facts) else view.category_scores.get(lab, 0.0)
                           for lab in labels])
        probs = engine / engine.sum() if engine.sum() > 0 else probs
        order = [int(i) for i in np.argsort(-engine, kind="stable")]
        order = [i for i in order if not learned.ruled_out(labels[i], facts)] + \
            [i for i in order if learned.ruled_out(labels[i], facts)]
    best = labels[order[0]]
    prob = learned.shown_probabilities(view, probs, labels, order, whole, ranker.not_training_right)
    differential = [LabelProbability(category=labels[i], probability=round(prob[labels[i]], 3)) for i in order[:4]]
    top_label_cases = [i for i in nbrs if case_labels[i] == best]
    similar = [SimilarReport(id=index.cases[i].id, url=index.cases[i].url, title=index.cases[i].title,
                             category=case_labels[i], similarity=round(float(view.sims[i]), 3),
                             fix=index.cases[i].fix) for i in (top_label_cases or nbrs)[:5]]
    out = Diagnosis(facts=facts.to_dict(), warnings=warnings, lang=lang, differential=differential,
                    similar_reports=similar, seen_in=len(top_label_cases))
    # The track record was measured on text reports answered by the ranker; a trainer's facts are ranked by the
    # rules, which it does not describe.
    record = None if trainer else ranker.record_for(prob[best])
    out.track_record = TrackRecord(**record) if record else None
    if best == learned.OUT_OF_SCOPE:
        kinds = Counter(index.cases[i].out_of_scope_kind for i in nbrs if case_labels[i] == learned.OUT_OF_SCOPE)
        errs = sorted(set(facts.value("errors", [])) & OUT_OF_SCOPE_ERRORS)
        zh = lang == "zh"
        # The paste's own out-of-scope error, else what the nearest out-of-scope reports were: when three or more of
        # them agree, or when the paste's own words fit that kind.
        kind = next((k_ for k_, n_ in kinds.most_common() if (n_ >= 3 and n_ * 2 > sum(kinds.values()))
                     or (k_ in OUT_OF_SCOPE_WORDS and OUT_OF_SCOPE_WORDS[k_].search(whole))), None)
        named = out_of_scope_named(errs or ([kind] if kind else []), lang)
        out.abstained, out.route, out.scope = True, "out-of-scope", "out"
        why = learned.not_training(view, whole, lang) or (f"概率 {prob[best]:.2f}" if zh else
                                                          f"probability {prob[best]:.2f}")
        n = len(top_label_cases)
        out.reason = (f"这不是 NaN / 发散问题{f'：看起来是{named}' if named else ''}（{why}；相似报告 {n} 条）" if zh
                      else f"this is not a NaN / divergence problem{f': it looks like {named}' if named else ''}"
                           f" ({why}; seen in {n} similar reports)")
        if not view.symptom and not errs and not trainer and not facts.value("no_symptom"):
            # No bad metric, no divergence word and no out-of-scope error: the paste may just not show it (a title
            # above a screenshot). Ask; an answer that names one re-ranks (docs/DIAGNOSE.md, "The scope question").
            in_scope = next((labels[i] for i in order if labels[i] != learned.OUT_OF_SCOPE), None)
            out.questions = [_question("symptom", lang, [learned.OUT_OF_SCOPE, *([in_scope] if in_scope else [])])]
        return out
    out.scope = "in"
    by_cat: dict[str, Candidate] = {}
    for c in cands:
        by_cat.setdefault(c.incident.root_cause.category, c)
    shown = [lab for lab in (labels[i] for i in order) if lab != learned.OUT_OF_SCOPE][: max(1, k)]
    for n, lab in enumerate(shown):
        c = by_cat.get(lab)
        if c is not None and lab == learned.FRAMEWORK_BUG and not c.fired:
            # A curated framework defect is one feature of one release (shift_attn in LLaMA-Factory, ZeRO++ hpZ in
            # ms-swift): without one of its triggers (its feature in the facts) it is not this report's defect, and
            # its fix would send the user after a setting they do not have. The similar reports stand instead.
            c = None
        if c is not None:
            out.diagnoses.append(_item(c, [o for o in cands if o is not c], lang, prob[lab], n == 0))
        else:
            out.diagnoses.append(DiagnosisItem(
                incident_id="", category=lab, confidence=round(prob[lab], 3),
                title=_uncurated_title(lab, lang),
                evidence=[Evidence(kind="case", detail=f"similar report {index.cases[i].id}: {index.cases[i].url}")
                          for i in nbrs if case_labels[i] == lab][:3]))
        said = facts.get("version_evidence")
        if lab == learned.FRAMEWORK_BUG and said is not None:
            # The reporter's own words tying the failure to a release are the defect's first evidence.
            out.diagnoses[-1].evidence.insert(0, Evidence(
                kind=said.kind, detail=f"version_evidence: {said.value} ({said.detail[:160]})", line=said.line,
                source=said.source))
    if best == learned.FRAMEWORK_BUG:
        out.route = "framework-defect"
        out.bisect = bisect_plan(facts, lang)
        out.reason = ("no known mechanism fits; the evidence points to a defect of a framework feature or release"
                      if lang != "zh" else "没有已知机制匹配；证据指向框架某个功能或版本的缺陷")
    elif prob[best] < ranker.unsure_below:
        out.route = "differential"
        out.reason = (f"the evidence does not separate the candidates (best {prob[best]:.2f})" if lang != "zh"
                      else f"现有证据无法区分候选原因（最高 {prob[best]:.2f}）")
    else:
        out.route = "mechanism"
    # The rules overrode the ranker (a curated mechanism the real reports rarely show): the two disagree, so the
    # facts that would separate the candidates are asked for even when the rules are confident.
    overridden = best != labels[learned.decide(probs, labels)[0]]
    unsettled = prob[best] < ASK_BELOW or (len(order) > 1 and float(probs[order[1]]) > prob[best] / 2)
    # A curated mechanism named without any of its triggers (its conditions not in the facts: sequence parallelism
    # never mentioned for a sequence-parallel answer) is named on resemblance alone: ask for what would confirm it.
    unconfirmed = best in by_cat and best != learned.FRAMEWORK_BUG and not by_cat[best].fired
    if out.route != "mechanism" or overridden or unsettled or unconfirmed:
        out.questions = differential_questions(facts, [lab for lab in shown[:3]], by_cat, lang, probs=prob,
                                               confirm=best if unconfirmed else None)
    return out


SPLIT_WORTH_ASKING = 0.1  # the least share of the candidates' probability a new question's split must set apart


def differential_questions(facts: Facts, candidates: list[str], by_cat: dict[str, Candidate], lang: str,
                           limit: int = 3, probs: dict[str, float] | None = None,
                           confirm: str | None = None) -> list[Question]:
    """The 1-3 unknown facts on which the candidates' triggers differ most, as questions in the user's language.

    A fact that some candidates reason about and others do not splits them in two; the split closest to even in
    the candidates' probabilities (`probs`; equal without) comes first, and of splits equally even, the one about
    the more probable side: what would confirm or rule out the leading candidate before what separates two
    unlikely ones. With `confirm` (a leader named on resemblance alone), a fact one of its triggers requires comes
    first: the question whose answer would make it fire (sequence_parallel_size for a sequence-parallel answer)."""
    from kb.canonical import QUESTIONS

    uses: dict[str, set[str]] = {}
    for cat in candidates:
        c = by_cat.get(cat)
        if c is None:
            continue
        for t in c.incident.triggers:
            for cond in (*t.all, *t.any, *t.none):
                for key in (cond.fact, cond.value_fact):
                    if key and key in QUESTIONS and key not in facts:
                        uses.setdefault(key, set()).add(cat)
    if FRAMEWORK_BUG_LABEL in candidates:
        # One release question is enough: the framework's, or torch's when the framework's is known.
        key = next((k for k in ("framework_version", "torch_version") if k not in facts), None)
        if key is not None:
            uses.setdefault(key, set()).add(FRAMEWORK_BUG_LABEL)
    # A fact that only some candidates reason about separates them; one all of them use separates nothing.
    mass = {c: (probs or {}).get(c, 0.0) if probs else 1.0 for c in candidates}
    total = sum(mass.values()) or 1.0

    def side(key: str) -> float:
        return sum(mass[c] for c in uses[key] if c in mass) / total

    ranked = sorted(uses, key=lambda key: (-(0 < len(uses[key]) < len(candidates)),
                                           -round(min(side(key), 1.0 - side(key)), 2), -side(key), key))
    # Each question another split of the candidates first: two questions about one candidate's setting ask less
    # than one about it and one about the next. A split that sets apart under a tenth of the candidates' mass (a
    # 0.05 candidate beside a 0.4 one) is no such question: it waits behind the leader's second setting.
    seen: set[frozenset[str]] = set()
    first = [k for k in ranked if min(side(k), 1.0 - side(k)) >= SPLIT_WORTH_ASKING
             and frozenset(uses[k]) not in seen and not seen.add(frozenset(uses[k]))]
    ranked = first + [k for k in ranked if k not in first]
    if confirm in by_cat:
        needed = [c.fact for t in by_cat[confirm].incident.triggers for c in t.all]
        lead = next((k for k in ranked if k in needed), None)
        if lead is not None:
            ranked = [lead] + [k for k in ranked if k != lead]
    return [_question(key, lang, uses[key]) for key in ranked[:limit]]


def _question(key: str, lang: str, separates) -> Question:
    from kb.canonical import QUESTIONS

    en, zh, options = QUESTIONS[key]
    return Question(fact=key, question=zh if lang == "zh" else en, options=list(options), separates=sorted(separates))


FRAMEWORK_BUG_LABEL = learned.FRAMEWORK_BUG
# Features to switch off first when bisecting a framework defect: fact -> (en, zh). Order: cheapest first.
_BISECT_FEATURES = (
    ("sequence_parallel_size", "set sequence_parallel_size 1", "把 sequence_parallel_size 设为 1"),
    ("sequence_parallel", "turn sequence / context parallelism off", "关闭序列并行 / 上下文并行"),
    ("attn_implementation", "switch attn_implementation to eager", "把 attn_implementation 换成 eager"),
    ("shift_attn", "turn S2-attention (shift_attn) off", "关闭 shift_attn"),
    ("overlap_comm", "set DeepSpeed overlap_comm false", "把 DeepSpeed overlap_comm 设为 false"),
    ("zero_hpz_partition_size", "drop zero_hpz_partition_size", "去掉 zero_hpz_partition_size"),
    ("zero_stage", "try another ZeRO stage (or none on one GPU)", "换一个 ZeRO stage（或单卡不用 ZeRO）"),
    ("use_peft", "train without the adapter once (full or frozen) to see whether the adapter path is at fault",
     "先不加 adapter 训练一次，看问题是否出在 adapter 路径"),
    ("gradient_checkpointing", "turn gradient checkpointing off", "关闭 gradient checkpointing"),
)


def bisect_plan(facts: Facts, lang: str) -> list[str]:
    """What to switch off or roll back, in order, to find the defective feature or release."""
    zh = lang == "zh"
    plan = []
    versions = [(k, facts.value(k)) for k in ("framework_version", "transformers_version", "trl_version",
                                               "deepspeed_version", "torch_version", "flash_attn_version",
                                               "vllm_version", "peft_version") if k in facts]
    said = facts.get("version_evidence")
    if said is not None:
        plan.append(f"报告把问题与版本联系起来（{said.value}）：在可用和出问题的版本之间二分定位，期间先固定在可用的版本" if zh
                    else f"the report ties it to a release ({said.value}): bisect between the release that works and "
                         "the one that fails, and pin the one that works meanwhile")
    if versions:
        named = ", ".join(f"{k.removesuffix('_version')} {v}" for k, v in versions)
        plan.append(f"回退到上一个版本（当前 {named}），看问题是否消失" if zh
                    else f"roll back one release at a time (now {named}) and see whether the NaN goes away")
    elif said is None:
        plan.append("记录并固定 torch / transformers / 训练框架的版本，再与上一个可用版本对比" if zh
                    else "pin and note the torch / transformers / framework versions, then compare with the last "
                         "release that worked")
    for key, en, zh_text in _BISECT_FEATURES:
        if key in facts and facts.value(key) not in (False, 0, 1, "eager", None) or (
                key == "zero_stage" and key in facts):
            plan.append(zh_text if zh else en)
    plan.append("用最小配置（单卡、fp32、无并行）复现，再逐个打开功能" if zh
                else "reproduce on a minimal setup (one GPU, fp32, no parallelism), then switch features back on "
                     "one at a time")
    plan.append("升级到最新版本，并在框架的 issue 中搜索同样的报错" if zh
                else "try the latest release and search the framework's issues for the same symptom")
    return plan


def _check_config_syntax(config: str, warnings: list[str]) -> None:
    """A config given as such that is neither JSON nor YAML gets a warning (it was still read line by line)."""
    import yaml

    t = config.strip()
    if too_deep(t):
        warnings.append("config is nested too deeply to parse as a whole; read line by line")
        return
    if t.startswith("{"):
        try:
            json.loads(t)
        except ValueError as e:
            warnings.append(f"config is not valid JSON ({e}); read line by line")
        return
    if re.search(r"^\s*[\w.\-]+\s*:", t, re.MULTILINE):
        try:
            yaml.safe_load(t)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            warnings.append(f"config is not valid YAML{where} ({getattr(e, 'problem', e)}); read line by line")
