"""Facts: canonical key -> value, each with the evidence (kind, source, line, matched text) that gave it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

# Which kind of evidence wins when two disagree: what the running trainer reports beats an explicit setting,
# which beats a prose mention.
_RANK = {"trainer": 4, "config": 3, "env": 3, "log": 2, "text": 1}
LIST_FACTS = frozenset({"nan_metrics", "zero_metrics", "huge_metrics", "spike_metrics", "errors", "symptom",
                        "fix_changes", "error_messages", "metric_observations", "relations"})
# The detail of a learning rate inferred from a log's records (the highest one logged, kb.facts.logs): it stands for
# the setting only until anything states a higher one, a sentence included ("learning rate 1e-6" beats a warmup's
# logged 4.2e-08; a record's own lower value, read again as text, does not).
INFERRED_LR = "the highest learning rate logged"


class Fact(BaseModel):
    value: Any
    kind: str  # trainer | config | env | log | text
    line: int | None = None  # 1-based line in the input named by `source`
    detail: str = ""
    source: str = "text"


@dataclass
class Facts:
    """Canonical facts with evidence. Scalars keep the strongest / first evidence; list facts accumulate."""

    items: dict[str, Fact] = field(default_factory=dict)
    # Evidence for each element of a list fact (element -> Fact), so every metric / error names its line.
    elements: dict[str, dict[str, Fact]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Scalar keys whose value came from a key that often means something wider (a bare `batch_size`, often the
    # global batch): a specific key for the same fact from the same kind of evidence replaces it (kb.facts.configs).
    loose: set[str] = field(default_factory=set)

    def set(self, key: str, value: Any, kind: str, line: int | None, detail: str, source: str = "text") -> None:
        if value is None:
            return
        if key in LIST_FACTS:
            self.add(key, value, kind, line, detail, source)
            return
        old = self.items.get(key)
        if old is not None and _RANK.get(old.kind, 0) >= _RANK.get(kind, 0) \
                and not (key == "learning_rate" and old.detail.startswith(INFERRED_LR) and kind != "log"
                         and isinstance(value, (int, float)) and isinstance(old.value, (int, float))
                         and old.value < value <= 10_000 * old.value):  # (a cut-off "9.9879" of 9.9879e-06 is none)
            return
        self.items[key] = Fact(value=value, kind=kind, line=line, detail=detail.strip()[:300], source=source)

    def add(self, key: str, element: Any, kind: str, line: int | None, detail: str, source: str = "text") -> None:
        """Append `element` to list fact `key` (once)."""
        els = self.elements.setdefault(key, {})
        if str(element) in els:
            return
        f = Fact(value=element, kind=kind, line=line, detail=detail.strip()[:300], source=source)
        els[str(element)] = f
        cur = self.items.get(key)
        if cur is None:
            self.items[key] = Fact(value=[element], kind=kind, line=line, detail=f.detail, source=source)
        else:
            cur.value.append(element)

    def get(self, key: str) -> Fact | None:
        return self.items.get(key)

    def value(self, key: str, default: Any = None) -> Any:
        f = self.items.get(key)
        return default if f is None else f.value

    def evidence_for(self, key: str, element: Any = None) -> Fact | None:
        if element is not None and key in self.elements:
            for name, f in self.elements[key].items():
                if name.lower() == str(element).lower() or name.lower().endswith("/" + str(element).lower()):
                    return f
        return self.items.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def merge(self, other: Facts) -> None:
        for key, f in other.items.items():
            if key in LIST_FACTS:
                for ef in other.elements.get(key, {}).values():
                    self.add(key, ef.value, ef.kind, ef.line, ef.detail, ef.source)
            else:
                self.set(key, f.value, f.kind, f.line, f.detail, f.source)
        self.warnings.extend(other.warnings)

    def to_dict(self) -> dict[str, Any]:
        return {k: v.model_dump() for k, v in sorted(self.items.items())}

    def values(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.items.items()}
