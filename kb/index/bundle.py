"""A built index: BM25 + FAISS + the rows they cover, written to a fresh folder and published atomically."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kb.index.bm25 import BM25
from kb.index.vectors import FaissIndex, make_vector_index
from kb.records import Incident
from kb.tokenize import register_segmentations, save_segmentations, tokenize

FORMAT_VERSION = 3
CURRENT = "CURRENT"
# Dense vectors see the head of each row (title, summary, root cause, fix: the gist); BM25 sees all of it.
# Embedding cost grows with length, and the long prose tail mostly repeats the head in more words.
DENSE_CHARS = 1200


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


def text_sha(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _reusable_vectors(previous: IndexBundle | None, embedder) -> dict[str, np.ndarray]:
    """Vectors of the previous build by text hash, when it used the same model: an ingest then embeds only
    the rows that changed instead of the whole corpus."""
    if previous is None or previous.meta.get("model") != embedder.name or previous.meta.get("dim") != embedder.dim:
        return {}
    shas = previous.meta.get("row_sha") or _read_shas(previous.path)
    if len(shas) != previous.vectors.count():
        return {}
    try:
        mat = previous.vectors.reconstruct_all()
    except RuntimeError:
        return {}
    return {sha: mat[i] for i, sha in enumerate(shas)}


# A build fans the embedding out to worker processes only when there is this much to embed: each worker
# costs ~0.5 s to start (pre-converted model), and small ingests should not pay that.
PARALLEL_MIN_ROWS = 2000


def embed_procs(n_rows: int) -> int:
    """Worker processes for embedding n_rows: KB_EMBED_PROCS, default one per core. Processes, not BLAS
    threads: the numpy models run single-threaded fastest per row (kb.embed._threads), so cores are used by
    running one model per core on its own share of the rows."""
    if n_rows < PARALLEL_MIN_ROWS:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        return max(1, int(os.environ.get("KB_EMBED_PROCS", cores)))
    except ValueError:
        return cores


def _embed_in_worker(name: str, texts: list[str]) -> np.ndarray:
    from kb.embed import get_embedder

    return get_embedder(name).encode(texts)


def _embed_chunks(embedder, batches: list[list[str]], keys: list):
    """(key, vectors) per batch, in order; in parallel processes for big builds of process-safe models
    (the numpy ones; a torch model already spreads over the cores by itself)."""
    procs = embed_procs(sum(len(b) for b in batches)) if getattr(embedder, "process_parallel", False) else 1
    if procs <= 1:
        for key, b in zip(keys, batches):
            yield key, embedder.encode(b)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: the parent may hold BLAS / OpenMP thread pools that a forked child would inherit broken.
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield from zip(keys, ex.map(_embed_in_worker, [embedder.name] * len(batches), batches))


def _read_shas(path: Path) -> list[str]:
    try:
        text = (path / "row_sha.txt").read_text(encoding="utf-8")
    except OSError:
        return []
    return text.split("\n") if text else []


def build(records: list[Incident], embedder, fingerprint: str, index_root: Path,
          progress: Callable[[int, int], None] | None = None, batch: int = 64,
          previous: IndexBundle | None = None) -> IndexBundle:
    """Build into a temporary folder, then flip CURRENT with os.replace: a crash mid-build leaves the
    previous index untouched and usable."""
    index_root.mkdir(parents=True, exist_ok=True)
    rows, texts = rows_for(records)
    shas = [text_sha(t[:DENSE_CHARS]) for t in texts]
    t0 = time.perf_counter()
    bm25 = BM25().fit([tokenize(t) for t in texts])
    cache = _reusable_vectors(previous, embedder)
    matrix = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    todo = [i for i, s in enumerate(shas) if s not in cache]
    for i, s in enumerate(shas):
        if s in cache:
            matrix[i] = cache[s]
    done = len(texts) - len(todo)
    if progress:
        progress(done, len(texts))
    chunks = [todo[j:j + batch] for j in range(0, len(todo), batch)]
    for idx, vecs_ in _embed_chunks(embedder, [[texts[i][:DENSE_CHARS] for i in idx] for idx in chunks], chunks):
        matrix[idx] = vecs_
        done += len(idx)
        if progress:
            progress(done, len(texts))
    vecs = make_vector_index(embedder.dim, len(texts))
    vecs.add(matrix)
    meta = {
        "format": FORMAT_VERSION, "model": embedder.name, "dim": embedder.dim, "fingerprint": fingerprint,
        "n_records": len(records), "n_rows": len(rows), "vector_index": vecs.kind,
        "built_at": time.time(), "build_seconds": round(time.perf_counter() - t0, 3),
        "embedded_rows": len(todo),
    }
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=index_root))
    try:
        bm25.save(tmp / "bm25")
        vecs.save(tmp / "vectors.faiss")
        save_segmentations(texts, tmp / "segmentations.marshal")
        (tmp / "rows.json").write_text(json.dumps([[r.incident_id, r.lang] for r in rows]), encoding="utf-8")
        # Row hashes only serve the next incremental build; in meta.json they made every open parse ~45 MB
        # of JSON at 1M rows.
        (tmp / "row_sha.txt").write_text("\n".join(shas), encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        for f in tmp.rglob("*"):
            if f.is_file():
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


def load(index_root: Path, mmap: bool = True) -> IndexBundle | None:
    """The published index, or None when there is none (or it is unreadable / of an old format).

    By default the BM25 arrays and the vectors are memory-mapped read-only: loading costs no copy, and
    processes that open the same build (server workers, the daemon) share its pages."""
    try:
        name = (index_root / CURRENT).read_text().strip()
        path = index_root / name
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT_VERSION:
            return None
        rows = [Row(a, b) for a, b in json.loads((path / "rows.json").read_text(encoding="utf-8"))]
        if (path / "segmentations.marshal").is_file():
            register_segmentations(path / "segmentations.marshal")
        bm_path = path / "bm25" if (path / "bm25").is_dir() else path / "bm25.npz"
        return IndexBundle(rows, BM25.load(bm_path, mmap=mmap), FaissIndex.load(path / "vectors.faiss", mmap=mmap),
                           meta, path)
    except (OSError, ValueError, KeyError, RuntimeError):
        return None

