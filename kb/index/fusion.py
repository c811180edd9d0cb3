"""Hybrid fusion: reciprocal-rank fusion of a dense ranking and a BM25 ranking into one score in [0, 1].

BM25 carries the identifiers users paste (max_prompt_length, rpo_alpha, error strings); dense carries
paraphrases. Measured on English, Chinese and cross-language queries (scripts/eval_embedders.py, README
table), dense at half BM25's weight was best.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

RRF_K = 10.0
W_DENSE = 0.5
W_BM25 = 1.0
MODES = ("hybrid", "bm25", "dense")


@dataclass(frozen=True)
class Fused:
    id: str
    score: float  # 1.0 = first in both rankings
    dense_rank: int
    bm25_rank: int | None


def weights_for(mode: str, weights: tuple[float, float] | None = None) -> tuple[float, float]:
    """(dense, bm25) weights; "bm25" / "dense" rank by one signal alone (ablations)."""
    if mode not in MODES:
        raise ValueError(f"unknown retrieval mode {mode!r}; one of {', '.join(MODES)}")
    w_dense, w_bm25 = weights or (W_DENSE, W_BM25)
    if mode == "bm25":
        w_dense = 0.0
    elif mode == "dense":
        w_bm25 = 0.0
    return w_dense, w_bm25


def fuse(dense: Mapping[str, float], bm25: Mapping[str, float], candidates: list[str] | None = None,
         mode: str = "hybrid", weights: tuple[float, float] | None = None) -> list[Fused]:
    """Candidates ranked by fused RRF score, best first (ties by id). Only ids with a BM25 score > 0 get a BM25
    rank; every candidate gets a dense rank (a missing dense similarity counts as -1)."""
    w_dense, w_bm25 = weights_for(mode, weights)
    cands = list(candidates) if candidates is not None else list(dict.fromkeys([*dense, *bm25]))
    dense_rank = {c: r for r, c in enumerate(sorted(cands, key=lambda c: (-dense.get(c, -1.0), c)), 1)}
    with_bm = sorted((c for c in cands if bm25.get(c, 0.0) > 0), key=lambda c: (-bm25[c], c))
    bm_rank = {c: r for r, c in enumerate(with_bm, 1)}
    best = (w_dense + w_bm25) / (RRF_K + 1)
    out = []
    for c in cands:
        s = w_dense / (RRF_K + dense_rank[c]) + (w_bm25 / (RRF_K + bm_rank[c]) if c in bm_rank else 0.0)
        out.append(Fused(c, s / best if best else 0.0, dense_rank[c], bm_rank.get(c)))
    out.sort(key=lambda f: (-f.score, f.id))
    return out


def fuse_arrays(dense: np.ndarray, bm25: np.ndarray, k: int, mode: str = "hybrid",
                weights: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`fuse` on arrays, for a few hundred candidates per query without a Python object each: candidate j has
    dense similarity `dense[j]` (-1 when missing) and BM25 score `bm25[j]` (0 when missing), and candidates are
    numbered in the order of their ids, so that ties break by id as in `fuse`. Returns the best `k` as
    (candidate numbers, scores, dense ranks, BM25 ranks with 0 for none), best first; same numbers as `fuse`."""
    w_dense, w_bm25 = weights_for(mode, weights)
    n = len(dense)
    order = np.arange(n)
    dense_rank = np.empty(n, dtype=np.int64)
    dense_rank[np.lexsort((order, -dense))] = np.arange(1, n + 1)
    has_bm = bm25 > 0
    bm_rank = np.zeros(n, dtype=np.int64)
    with_bm = np.flatnonzero(has_bm)
    bm_rank[with_bm[np.lexsort((with_bm, -bm25[with_bm]))]] = np.arange(1, len(with_bm) + 1)
    best = (w_dense + w_bm25) / (RRF_K + 1)
    s = w_dense / (RRF_K + dense_rank) + np.where(has_bm, w_bm25 / (RRF_K + np.maximum(bm_rank, 1)), 0.0)
    score = s / best if best else np.zeros(n)
    top = np.lexsort((order, -score))[:k]
    return top, score[top], dense_rank[top], bm_rank[top]
