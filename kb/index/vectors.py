"""Dense vector backends behind one interface (txtai-style); FAISS is the one we ship."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np


class VectorIndex(ABC):
    kind: str

    @abstractmethod
    def add(self, vectors: np.ndarray) -> None: ...

    @abstractmethod
    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(similarities, row ids) for one query vector; ids are -1 where fewer than k rows exist."""

    @abstractmethod
    def count(self) -> int: ...

    @abstractmethod
    def save(self, path: Path) -> None: ...


class FaissIndex(VectorIndex):
    # Exact search costs ~0.15-0.6 ms per 1k rows of 512-d per query on one core (quiet vs shared machine),
    # so up to FLAT_LIMIT rows it is exact, cheapest to build and still a few ms; above it HNSW (M=32,
    # efSearch=64: recall@10 0.999 on clustered data, retrieval-findings.md; 1.2 ms at 20k rows measured
    # here) keeps an ask's vector search near 1 ms at 100k+ rows, for seconds of graph building.
    FLAT_LIMIT = 10_000

    def __init__(self, dim: int, n_expected: int = 0, index=None) -> None:
        import faiss

        self.dim = dim
        if index is not None:
            self._index = index
        elif n_expected > self.FLAT_LIMIT:
            self._index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
            self._index.hnsw.efConstruction = 80
            self._index.hnsw.efSearch = 64
        else:
            self._index = faiss.IndexFlatIP(dim)
        self.kind = type(self._index).__name__

    def add(self, vectors: np.ndarray) -> None:
        if len(vectors):
            self._index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = max(1, min(k, self.count()))
        if self.count() == 0:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        import faiss

        # One query runs on one OpenMP thread: on the shared 2-core machine a 20k-row flat search took 59 ms
        # with 2 threads and 12 ms with 1 (threads spinning against each other and other processes).
        # Restored afterwards, so that a build in the same process still adds vectors on every core.
        prev = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            sims, ids = self._index.search(np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32), k)
        finally:
            faiss.omp_set_num_threads(prev)
        return sims[0], ids[0]

    def count(self) -> int:
        return int(self._index.ntotal)

    def reconstruct_all(self) -> np.ndarray:
        return self._index.reconstruct_n(0, self.count())

    def save(self, path: Path) -> None:
        import faiss

        faiss.write_index(self._index, str(path))

    @classmethod
    def load(cls, path: Path, mmap: bool = True) -> FaissIndex:
        """Read an index; with mmap the vectors stay in the file (IO_FLAG_MMAP_IFC), so worker processes
        share them through the page cache. Published index files are never rewritten (a rebuild writes
        a new folder), which is what makes mapping them safe."""
        import faiss

        flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mmap else 0
        idx = faiss.read_index(str(path), flags)
        return cls(idx.d, index=idx)


def make_vector_index(dim: int, n_expected: int) -> VectorIndex:
    return FaissIndex(dim, n_expected)
