"""Helpers the integration tests share: one real knowledge base per session, tiny causal-LM datasets whose
failure mechanism is chosen per test, and reading kb-diagnosis.json back.

Imported as `from integrations_support import ...` (tests/ is on sys.path in pytest's default import mode)."""

from __future__ import annotations

import json
import os
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch

from kb.diagnose.models import Diagnosis
from kb.kb import KnowledgeBase
from kb.repro.tiny import token_batch

REPO = Path(__file__).resolve().parent.parent
SEQ = 24
VOCAB = 128
# Where the in-run tests train: "cpu" (CI, the default) or "cuda" (`KB_TEST_DEVICE=cuda`, on a GPU machine; the
# README's "GPU run" records what they showed there).
DEVICE = os.environ.get("KB_TEST_DEVICE", "cpu")
ON_CPU = not DEVICE.startswith("cuda")
if not ON_CPU and not torch.cuda.is_available():
    raise RuntimeError(f"KB_TEST_DEVICE={DEVICE} but torch {torch.__version__} sees no CUDA device")


@cache
def real_kb() -> KnowledgeBase:
    """The curated incidents with the real embedding model, indexed once per test session in a temp dir."""
    data = Path(tempfile.mkdtemp(prefix="kb-integrations-"))
    kb = KnowledgeBase.open(data_dir=data, incidents_dir=REPO / "incidents")
    kb.build_index()
    return kb


def lm_rows(n: int = 16, masked: bool = False) -> list[dict[str, list[int]]]:
    """Causal-LM rows of random tokens; with `masked`, rows 0, 1 of every 4 have every label -100 (so some
    micro-batches of 2 carry no supervised token)."""
    rows = []
    for i in range(n):
        ids = token_batch(VOCAB, (SEQ,), seed=i).tolist()
        labels = [-100] * SEQ if masked and i % 4 in (0, 1) else list(ids)
        rows.append({"input_ids": ids, "labels": labels, "attention_mask": [1] * SEQ})
    return rows


def lm_batches(rows: list[dict[str, list[int]]], size: int = 2) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.tensor([r[k] for r in rows[i:i + size]]) for k in rows[0]} for i in range(0, len(rows), size)]


def masked_batches() -> list[dict[str, torch.Tensor]]:
    """Micro-batches in a fixed order where the third is all -100 (for loops without a shuffling sampler)."""
    rows = lm_rows(8)
    rows[4]["labels"] = [-100] * SEQ
    rows[5]["labels"] = [-100] * SEQ
    return lm_batches(rows)


def report(out_dir: str | Path) -> dict[str, Any] | None:
    p = Path(out_dir) / "kb-diagnosis.json"
    if not p.is_file():
        return None
    data = json.loads(p.read_text(encoding="utf-8"))
    Diagnosis.model_validate(data)  # the same JSON as `kb diagnose --json`
    return data


def first_category(data: dict[str, Any]) -> str:
    """The first category of a confident (not abstained) diagnosis."""
    assert data["diagnoses"] and not data["abstained"], (data["reason"], data["diagnoses"][:1])
    return data["diagnoses"][0]["category"]


def evidence_text(data: dict[str, Any]) -> str:
    return "\n".join(e["detail"] for d in data["diagnoses"] for e in d["evidence"])
