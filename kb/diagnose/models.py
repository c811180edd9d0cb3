"""Pydantic models of a diagnosis, shared by the library, the CLI (`--json`) and the HTTP API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class Evidence(BaseModel):
    """Why an incident was ranked: one matched fact, signature or retrieval signal."""

    kind: Literal["config", "log", "text", "env", "retrieval"]
    detail: str
    line: int | None = None  # 1-based line in the input named by `source`
    source: str = "text"  # which input the line refers to: text | log | config | question


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


class Diagnosis(BaseModel):
    diagnoses: list[DiagnosisItem] = Field(default_factory=list)
    abstained: bool = False
    reason: str = ""
    facts: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    lang: str = "en"
