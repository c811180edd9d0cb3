"""Okapi BM25 over pre-tokenized documents, stored as CSR arrays so 100k-document corpora load in a blink."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np


class BM25:
    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.vocab: dict[str, int] = {}
        self.indptr = np.zeros(1, dtype=np.int64)
        self.doc_ids = np.zeros(0, dtype=np.int32)
        self.tfs = np.zeros(0, dtype=np.float32)
        self.doc_len = np.zeros(0, dtype=np.float32)
        self.idf = np.zeros(0, dtype=np.float32)
        # Each posting's BM25 term weight, precomputed at build (None for an index written before it existed).
        self.impact: np.ndarray | None = None
        self._avg: float | None = None

    @property
    def n_docs(self) -> int:
        return int(self.doc_len.shape[0])

    def fit(self, docs: list[list[str]]) -> BM25:
        postings: dict[str, list[tuple[int, int]]] = {}
        lens = np.zeros(len(docs), dtype=np.float32)
        for i, toks in enumerate(docs):
            lens[i] = len(toks)
            for term, tf in Counter(toks).items():
                postings.setdefault(term, []).append((i, tf))
        terms = sorted(postings)
        self.vocab = {t: j for j, t in enumerate(terms)}
        sizes = np.array([len(postings[t]) for t in terms], dtype=np.int64)
        self.indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = [p for t in terms for p in postings[t]]
        self.doc_ids = np.array([d for d, _ in flat], dtype=np.int32)
        self.tfs = np.array([tf for _, tf in flat], dtype=np.float32)
        self.doc_len = lens
        self._avg = None
        n = max(len(docs), 1)
        self.idf = np.log(1.0 + (n - sizes + 0.5) / (sizes + 0.5)).astype(np.float32)
        self.impact = self._impacts()
        return self

    def _impacts(self) -> np.ndarray:
        """What `scores` adds for each posting, computed once: the same float32 operations in the same order as
        the per-query formula, so the scores are identical, and a query only gathers and adds."""
        avg = self._avg_len()
        idf = np.repeat(self.idf, np.diff(self.indptr))
        norm = self.tfs + self.k1 * (1 - self.b + self.b * self.doc_len[self.doc_ids] / avg)
        return (idf * self.tfs * (self.k1 + 1) / norm).astype(np.float32)

    def _avg_len(self) -> float:
        if self._avg is None:
            self._avg = float(self.doc_len.mean()) or 1.0 if self.n_docs else 1.0
        return self._avg

    def scores(self, query: list[str]) -> np.ndarray:
        out = np.zeros(self.n_docs, dtype=np.float32)
        if not self.n_docs:
            return out
        avg = self._avg_len()
        for term in set(query):
            j = self.vocab.get(term)
            if j is None:
                continue
            sl = slice(self.indptr[j], self.indptr[j + 1])
            if self.impact is not None:
                out[self.doc_ids[sl]] += self.impact[sl]
                continue
            d, tf = self.doc_ids[sl], self.tfs[sl]
            norm = tf + self.k1 * (1 - self.b + self.b * self.doc_len[d] / avg)
            out[d] += self.idf[j] * tf * (self.k1 + 1) / norm
        return out

    def save(self, path: Path) -> None:
        """A folder of .npy arrays plus the vocabulary as text: `load` memory-maps the arrays, so server
        workers share one copy of the postings through the page cache instead of each reading its own."""
        path.mkdir(parents=True, exist_ok=True)
        for name in ("indptr", "doc_ids", "tfs", "doc_len", "idf"):
            np.save(path / f"{name}.npy", np.ascontiguousarray(getattr(self, name)))
        if self.impact is not None:
            np.save(path / "impact.npy", np.ascontiguousarray(self.impact))
        # Tokens never contain whitespace (see kb.tokenize), so one per line is unambiguous.
        terms = sorted(self.vocab, key=self.vocab.__getitem__)
        (path / "vocab.txt").write_text("\n".join(terms), encoding="utf-8")
        (path / "params.json").write_text(json.dumps({"k1": self.k1, "b": self.b}), encoding="utf-8")

    @classmethod
    def load(cls, path: Path, mmap: bool = True) -> BM25:
        """Load a folder written by `save` (arrays memory-mapped read-only unless mmap=False), or an .npz of
        the previous layout (read into memory) so that an upgrade does not force a rebuild."""
        if path.suffix == ".npz" or not path.is_dir():
            return cls._load_npz(path.with_suffix(".npz"))
        params = json.loads((path / "params.json").read_text(encoding="utf-8"))
        bm = cls(float(params["k1"]), float(params["b"]))
        mode = "r" if mmap else None
        for name in ("indptr", "doc_ids", "tfs", "doc_len", "idf"):
            arr = np.load(path / f"{name}.npy", mmap_mode=mode, allow_pickle=False)
            # A plain ndarray view of the same mapped pages: np.memmap indexes through a Python-level
            # __getitem__, which cost ~4 us per posting-list slice in `scores`.
            setattr(bm, name, arr.view(np.ndarray) if mmap else arr)
        if (path / "impact.npy").is_file():
            arr = np.load(path / "impact.npy", mmap_mode=mode, allow_pickle=False)
            bm.impact = arr.view(np.ndarray) if mmap else arr
        text = (path / "vocab.txt").read_text(encoding="utf-8")
        terms = text.split("\n") if text else []
        bm.vocab = dict(zip(terms, range(len(terms))))
        return bm

    @classmethod
    def _load_npz(cls, path: Path) -> BM25:
        z = np.load(path, allow_pickle=False)
        k1, b = (float(x) for x in z["params"])
        bm = cls(k1, b)
        bm.indptr, bm.doc_ids, bm.tfs = z["indptr"], z["doc_ids"], z["tfs"]
        bm.doc_len, bm.idf = z["doc_len"], z["idf"]
        bm.vocab = {t: j for j, t in enumerate(z["vocab"].tolist())}
        return bm
