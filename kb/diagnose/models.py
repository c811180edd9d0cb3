"""Pydantic models of a diagnosis, shared by the library, the CLI (`--json`) and the HTTP API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Evidence(BaseModel):
    """Why an incident was ranked: one matched fact, signature or retrieval signal."""

    kind: Literal["trainer", "config", "log", "text", "env", "retrieval", "case"]
    detail: str
    line: int | None = None  # 1-based line in the input named by `source`
    source: str = "text"  # which input the line refers to: text | log | config | question | trainer


class DiagnosisItem(BaseModel):
    incident_id: str
    category: str
    confidence: float  # calibrated probability that `category` is the root cause (docs/DIAGNOSE.md)
    title: str
    evidence: list[Evidence] = Field(default_factory=list)
    fix: str = ""
    repro: str = ""
    decided_by: str = ""  # the fact that separated this category from a neighbour sharing its symptom
    score_parts: dict[str, float] = Field(default_factory=dict)


class SimilarReport(BaseModel):
    """A real report from the case base that resembles the input ("seen in N reports like yours")."""

    id: str
    url: str
    title: str
    category: str
    similarity: float
    fix: str = ""


class Question(BaseModel):
    """A question whose answer separates the candidates; answer it by passing the fact (`--answer key=value`)."""

    fact: str
    question: str
    options: list[str] = Field(default_factory=list)
    separates: list[str] = Field(default_factory=list)  # the candidate categories it tells apart

    def worded(self) -> str:
        """The question with its options, as the CLI and the Dify records print it: "Do you train in ...? (fp16 / bf16)"."""
        return f"{self.question} ({' / '.join(self.options)})" if self.options else self.question


class Candidate(BaseModel):
    category: str
    probability: float


class TrackRecord(BaseModel):
    """How often kb's first answer was right when it was this confident: out of fold on the case base."""

    band: str  # the band of confidence the first answer falls in, e.g. "0.75-0.90"
    reports: int  # case-base reports whose out-of-fold first answer fell in that band
    right: float  # the share of them answered right
    of: int  # reports measured in all (`kb eval --cv`, first fold assignment)
    # The share in whole percent, half up, from the count answered right: what every display quotes (the CLI, the
    # page and the bots once rounded 0.925 of 375 three ways: 92 % and 93 %; 347 of 375 is 92.53 %, so 93 %).
    percent: int


class Diagnosis(BaseModel):
    diagnoses: list[DiagnosisItem] = Field(default_factory=list)
    abstained: bool = False
    reason: str = ""
    facts: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    lang: str = "en"
    # How the answer was reached: "mechanism" (a known incident), "framework-defect" (a defect of a framework
    # feature or release, with a bisect plan), "out-of-scope" (not a NaN / divergence problem), "differential"
    # (in scope, but the evidence does not separate the candidates: see `questions`), "rules" (no case base).
    route: str = "rules"
    scope: Literal["in", "out", "unknown"] = "unknown"
    differential: list[Candidate] = Field(default_factory=list)
    questions: list[Question] = Field(default_factory=list)
    similar_reports: list[SimilarReport] = Field(default_factory=list)
    seen_in: int = 0  # how many of the nearest real reports share the top category
    track_record: TrackRecord | None = None  # how often answers this confident were right (None: not measured)
    bisect: list[str] = Field(default_factory=list)
