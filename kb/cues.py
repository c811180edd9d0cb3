"""Root-cause category cues: weighted triggers in the one condition language, each listed as evidence.

The cues are data (kb/data/category_cues.yaml): each is a trigger over facts (kb.conditions), so ingest, diagnosis
and repro checks read conditions the same way. Ingest uses them to categorise a raw article (`score_categories`);
diagnosis reads them on a user's paste (`score_query`), as one signal of the case ranker that names no incident.
Facts beat prose: a configuration fact (sequence_parallel_size = 4, torch_dtype half, --vanilla_loss with KTO)
weighs more than a phrase, so an article that mentions labels of -100 but runs sequence parallelism lands on
`sequence-parallel-label-split`, not `all-labels-masked`. A fix that undoes a setting ("remove
--sequence_parallel_size", "use bf16 instead of fp16") is strong evidence too: it is what made the NaN go away.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from kb.conditions import describe, evaluate_trigger
from kb.facts import Facts
from kb.records import Trigger

FALLBACK_CATEGORY = "uncategorized"
# Below this total the category is a guess; parse_document says so in a warning.
WEAK_SCORE = 3.0
CUES_FILE = Path(__file__).resolve().parent / "data" / "category_cues.yaml"


@dataclass(frozen=True)
class Cue:
    category: str
    weight: float
    trigger: Trigger

    @property
    def name(self) -> str:
        return self.trigger.description


@dataclass
class CategoryScore:
    category: str
    score: float
    evidence: list[str] = field(default_factory=list)


@lru_cache(maxsize=1)
def cues() -> tuple[Cue, ...]:
    """The cue table, read once."""
    out = []
    for i, row in enumerate(yaml.safe_load(CUES_FILE.read_text(encoding="utf-8"))):
        t = Trigger(id=f"cue-{i}", description=row["name"], all=row.get("all", []), any=row.get("any", []),
                    none=row.get("none", []), weight=row["weight"])
        out.append(Cue(row["category"], float(row["weight"]), t))
    return tuple(out)


def _shown(cond, fact) -> str:
    if cond.op == "regex" and fact is not None:
        text = " ".join(map(str, fact.value)) if isinstance(fact.value, list) else str(fact.value)
        m = re.search(str(cond.value), text, re.IGNORECASE)
        if m:
            snippet = re.sub(r"\s+", " ", m.group(0)).strip()
            return f"{cond.fact} says {snippet!r}"
    value = f" = {fact.value!r}" if fact is not None and not isinstance(fact.value, list) else ""
    return f"{describe(cond)}{value}"


def score_categories(facts: Facts, known: set[str] | None = None) -> list[CategoryScore]:
    """Every category with at least one firing cue, best first; each carries the cues that fired."""
    scores: dict[str, CategoryScore] = {}
    for cue in cues():
        if known is not None and cue.category not in known:
            continue
        res = evaluate_trigger(cue.trigger, facts)
        if not res.fired:
            continue
        s = scores.setdefault(cue.category, CategoryScore(cue.category, 0.0))
        s.score += cue.weight
        detail = " and ".join(_shown(c, f) for c, f in res.matched)
        s.evidence.append(f"+{cue.weight:g} {cue.name}: {detail}")
    return sorted(scores.values(), key=lambda s: (-s.score, s.category))


# A paste is read up to this many characters for the cues (their regexes are linear; this bounds the cost).
QUERY_CUE_CHARS = 20_000


def score_query(facts: Facts, text: str) -> dict[str, float]:
    """The cue table applied to a user's paste (diagnosis): the paste is both the reported text and the text, with
    its error strings, metric observations and relations, next to the facts already extracted from it (an
    article's onset and fix sections have no counterpart in a paste). {category: summed weight of the cues that
    fired}."""
    from kb.facts.statements import extract_errors, extract_metrics, extract_relations

    text = text[:QUERY_CUE_CHARS]
    paste = Facts()
    paste.merge(facts)
    for key in ("reported_text", "text"):
        paste.set(key, text, "text", None, key)
    for key, values in (("error_messages", extract_errors(text)), ("metric_observations", extract_metrics(text)),
                        ("relations", [f"{a} {op} {b}" for a, op, b, _ in extract_relations(text)])):
        for v in values:
            paste.add(key, v, "text", None, v)
    return {c.category: c.score for c in score_categories(paste)}
