"""Root-cause category keys: the starting vocabulary plus the project's additions (kb/data/categories_extra.md)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

# Keys are stable identifiers (../shared/taxonomy.md); descriptions here are our own one-line summaries.
BASE_CATEGORIES: dict[str, str] = {
    "sequence-parallel-label-split": "sequence/context parallelism leaves a shard with no supervised tokens; "
    "its local mean loss is 0/0",
    "all-labels-masked": "a sample, micro-batch or rank has no supervised tokens (labels all -100) without sequence "
    "parallelism; a masked mean divides by zero",
    "empty-response-length-normalization": "a length-normalised preference loss divides by a response length of 0",
    "kto-unbalanced-batch": "KTO averages desirable/undesirable examples separately per micro-batch and one side is empty",
    "fp16-overflow": "fp16 mixed precision overflows activations or gradients; the loss scale collapses",
    "half-precision-weights": "trainable weights are stored and updated in fp16 without an fp32 master copy",
    "kl-estimator-overflow": "the k3/low_var_kl estimator or an importance ratio exponentiates a large log-ratio",
    "zero2-overlap-comm-bug": "a DeepSpeed ZeRO-2 gradient-reduction defect corrupts gradients",
    "attention-kernel-bug": "the attention kernel returns NaN (flash-attn softcap, cuDNN SDPA, fully masked rows)",
    "untrained-token-embeddings": "tokens whose embedding rows were never trained blow up activations",
    "log-odds-cancellation": "ORPO's log1p(-exp(logp)) cancels catastrophically for confident policies",
    "lr-too-high": "the learning rate of the model or a sub-module is too large; spikes precede the NaN",
    "framework-bug": "a specific framework defect, fixed by an upgrade",
    "micro-batch-misconfig": "micro-batch / accumulation settings produce degenerate batches",
    "padding-side-mismatch": "padding on the wrong side corrupts positions or masks",
    "grpo-group-std-degenerate": "group-normalised advantages divide by a zero standard deviation",
}

EXTRA_FILE = Path(__file__).resolve().parent / "data" / "categories_extra.md"
_ROW = re.compile(r"^\|\s*`([a-z0-9][a-z0-9-]+)`\s*\|\s*([^|]*)\|")


@lru_cache(maxsize=1)
def categories() -> dict[str, str]:
    """All known category keys -> one-line description."""
    out = dict(BASE_CATEGORIES)
    if EXTRA_FILE.is_file():
        for line in EXTRA_FILE.read_text(encoding="utf-8").splitlines():
            m = _ROW.match(line.strip())
            if m and m.group(1) not in out:
                out[m.group(1)] = m.group(2).strip()
    return out

