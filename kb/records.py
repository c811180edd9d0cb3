"""Typed incident records: the one data model shared by parsing, indexing, diagnosis and repro."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Lang(str, Enum):
    zh = "zh"
    en = "en"


class Bilingual(BaseModel):
    """A text in both languages; either may be empty for raw-ingested records."""

    model_config = ConfigDict(extra="forbid")
    zh: str = ""
    en: str = ""

    def pick(self, lang: str) -> str:
        """The text in `lang`, falling back to the other language."""
        primary = self.zh if lang == "zh" else self.en
        return primary or self.en or self.zh

    def both(self) -> str:
        return "\n".join(t for t in (self.en, self.zh) if t)


class FrameworkInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "unknown"
    # Versions the reporter ran, e.g. ["3.1.0"].
    reported_versions: list[str] = Field(default_factory=list)
    # Human-readable ranges, e.g. ">=3.1,<3.4.1"; empty when unknown.
    affected_versions: str = ""
    fixed_versions: str = ""


Op = Literal["eq", "ne", "gt", "ge", "lt", "le", "in", "present", "absent", "truthy", "falsy", "contains", "regex"]


class Condition(BaseModel):
    """One test over a canonical fact (see kb.canonical). `value_fact` compares against another fact."""

    model_config = ConfigDict(extra="forbid")
    fact: str
    op: Op = "present"
    value: Any = None
    value_fact: str | None = None


class Trigger(BaseModel):
    """Machine-readable condition under which an incident applies.

    All of `all` must hold and at least one of `any` (when `any` is non-empty). `none` must all fail:
    it encodes the facts that tell this incident apart from a neighbour sharing its symptom.
    """

    model_config = ConfigDict(extra="forbid")
    id: str
    description: str = ""
    all: list[Condition] = Field(default_factory=list)
    any: list[Condition] = Field(default_factory=list)
    none: list[Condition] = Field(default_factory=list)
    weight: float = 1.0


class Signature(BaseModel):
    """A symptom pattern matched against the user's paste (case-insensitive regex over lines)."""

    model_config = ConfigDict(extra="forbid")
    pattern: str
    kind: Literal["log", "error", "metric", "text"] = "log"
    weight: float = 1.0
    description: str = ""


class Symptoms(BaseModel):
    model_config = ConfigDict(extra="forbid")
    errors: list[str] = Field(default_factory=list)  # exact error strings as printed
    metrics: list[str] = Field(default_factory=list)  # e.g. "nll_loss: nan", "grad_norm: nan then loss 0.0"
    onset: Bilingual = Field(default_factory=Bilingual)  # when the NaN first appears
    signatures: list[Signature] = Field(default_factory=list)


class RootCause(BaseModel):
    model_config = ConfigDict(extra="forbid")
    category: str
    explanation: Bilingual = Field(default_factory=Bilingual)
    status: Literal["confirmed", "unconfirmed", "disputed"] = "unconfirmed"
    # Why this category was assigned (raw ingest: the matched cues).
    evidence: list[str] = Field(default_factory=list)


class Fix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    summary: Bilingual = Field(default_factory=Bilingual)  # the fix in one line
    steps: list[Bilingual] = Field(default_factory=list)
    config_changes: dict[str, Any] = Field(default_factory=dict)  # canonical key -> recommended value


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = ""
    file: str = ""  # seed file name for scraped articles
    title: str = ""
    lang: str = ""

    @field_validator("url")
    @classmethod
    def _strip(cls, v: str) -> str:
        return v.strip()


class ReproRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = ""  # relative to the incident folder, e.g. "repro.py"
    gpu_only: bool = False  # the failure needs a GPU kernel; a CPU run can only show the arithmetic
    # Settings the check runs at besides `config` (canonical keys): toy-size overrides and what the report
    # implies but does not state. The check's defaults are `config` updated by these.
    settings: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""


class Incident(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    title: Bilingual
    summary: Bilingual = Field(default_factory=Bilingual)
    lang: Lang = Lang.en  # language the incident was first reported in
    origin: Literal["curated", "raw"] = "curated"
    framework: FrameworkInfo = Field(default_factory=FrameworkInfo)
    model: str = "unknown"
    algorithm: str = "unknown"
    precision: str = "unknown"
    parallelism: str = "unknown"
    config: dict[str, Any] = Field(default_factory=dict)  # canonical key -> reported value
    symptoms: Symptoms = Field(default_factory=Symptoms)
    root_cause: RootCause
    fix: Fix = Field(default_factory=Fix)
    triggers: list[Trigger] = Field(default_factory=list)
    sources: list[Source] = Field(default_factory=list)
    related: list[str] = Field(default_factory=list)  # ids of incidents with the same mechanism
    repro: ReproRef = Field(default_factory=ReproRef)
    body: Bilingual = Field(default_factory=Bilingual)  # prose sections, markdown
    tags: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _slug(cls, v: str) -> str:
        import re

        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,80}", v):
            raise ValueError(f"incident id must be a lowercase slug, got {v!r}")
        return v

    def search_text(self) -> dict[str, str]:
        """The text indexed for retrieval, per language (both languages of every record are indexed)."""
        common = " ".join(
            [
                self.framework.name,
                self.model,
                self.algorithm,
                self.precision,
                self.parallelism,
                self.root_cause.category,
                " ".join(f"{k} {v}" for k, v in self.config.items()),
                " ".join(self.symptoms.errors),
                " ".join(self.symptoms.metrics),
                " ".join(self.tags),
            ]
        )
        out: dict[str, str] = {}
        for lang in ("en", "zh"):
            parts = [
                getattr(self.title, lang),
                getattr(self.summary, lang),
                getattr(self.root_cause.explanation, lang),
                getattr(self.fix.summary, lang),
                " ".join(getattr(s, lang) for s in self.fix.steps),
                getattr(self.symptoms.onset, lang),
                getattr(self.body, lang),
            ]
            text = "\n".join(p for p in parts if p)
            if text.strip():
                out[lang] = text + "\n" + common
        return out
