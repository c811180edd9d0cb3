"""A built index: BM25 + FAISS + the rows they cover, written to a fresh folder and published atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from kb.index.bm25 import BM25
from kb.index.vectors import FaissIndex, make_vector_index
from kb.records import Incident
from kb.tokenize import tokenize

FORMAT_VERSION = 2
CURRENT = "CURRENT"


@dataclass
class Row:
    incident_id: str
    lang: str


@dataclass
class IndexBundle:
    rows: list[Row]
    bm25: BM25
    vectors: FaissIndex
    meta: dict
    path: Path

    @property
    def model(self) -> str:
        return self.meta["model"]


def rows_for(records: list[Incident]) -> tuple[list[Row], list[str]]:
    rows, texts = [], []
    for inc in records:
        for lang, text in inc.search_text().items():
            rows.append(Row(inc.id, lang))
            texts.append(text)
    return rows, texts


def build(records: list[Incident], embedder, fingerprint: str, index_root: Path,
          progress: Callable[[int, int], None] | None = None, batch: int = 64) -> IndexBundle:
    """Build into a temporary folder, then flip CURRENT with os.replace: a crash mid-build leaves the
    previous index untouched and usable."""
    index_root.mkdir(parents=True, exist_ok=True)
    rows, texts = rows_for(records)
    t0 = time.perf_counter()
    bm25 = BM25().fit([tokenize(t) for t in texts])
    vecs = make_vector_index(embedder.dim, len(texts))
    done = 0
    for i in range(0, len(texts), batch):
        chunk = texts[i:i + batch]
        vecs.add(embedder.encode(chunk))
        done += len(chunk)
        if progress:
            progress(done, len(texts))
    meta = {
        "format": FORMAT_VERSION, "model": embedder.name, "dim": embedder.dim, "fingerprint": fingerprint,
        "n_records": len(records), "n_rows": len(rows), "vector_index": vecs.kind,
        "built_at": time.time(), "build_seconds": round(time.perf_counter() - t0, 3),
    }
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=index_root))
    try:
        bm25.save(tmp / "bm25.npz")
        vecs.save(tmp / "vectors.faiss")
        (tmp / "rows.json").write_text(json.dumps([[r.incident_id, r.lang] for r in rows]), encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        final = index_root / f"build-{int(time.time())}-{uuid.uuid4().hex[:8]}"
        os.rename(tmp, final)
        _publish(index_root, final.name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _gc(index_root, keep=final.name)
    return IndexBundle(rows, bm25, vecs, meta, final)


def _publish(index_root: Path, name: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".current-", dir=index_root)
    with os.fdopen(fd, "w") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, index_root / CURRENT)


def _gc(index_root: Path, keep: str) -> None:
    # Keep the previous build too: a reader that opened it a moment ago may still be loading files.
    builds = sorted((p for p in index_root.glob("build-*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    for p in builds[:-2]:
        if p.name != keep:
            shutil.rmtree(p, ignore_errors=True)
    for p in index_root.glob(".build-*"):
        if time.time() - p.stat().st_mtime > 3600:
            shutil.rmtree(p, ignore_errors=True)


def load(index_root: Path) -> IndexBundle | None:
    """The published index, or None when there is none (or it is unreadable / of an old format)."""
    try:
        name = (index_root / CURRENT).read_text().strip()
        path = index_root / name
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT_VERSION:
            return None
        rows = [Row(a, b) for a, b in json.loads((path / "rows.json").read_text(encoding="utf-8"))]
        return IndexBundle(rows, BM25.load(path / "bm25.npz"), FaissIndex.load(path / "vectors.faiss"), meta, path)
    except (OSError, ValueError, KeyError, RuntimeError):
        return None


def as_matrix(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)
