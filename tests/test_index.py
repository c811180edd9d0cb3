"""Index build, reload, staleness and atomic publication with the real embedding model and FAISS."""

import shutil
import threading

import pytest

from kb.index import bundle as index_bundle
from kb.kb import KnowledgeBase


@pytest.fixture()
def small_kb(tmp_path, repo_root):
    inc = tmp_path / "incidents"
    src = sorted((repo_root / "incidents").glob("*/incident.md"))[:6]
    for p in src:
        shutil.copytree(p.parent, inc / p.parent.name)
    return KnowledgeBase.open(data_dir=tmp_path / "data", incidents_dir=inc)


def test_build_then_reload_from_disk(small_kb):
    b = small_kb.build_index()
    assert b.meta["n_records"] == len(small_kb.records)
    assert b.vectors.count() == b.meta["n_rows"] == b.bm25.n_docs
    again = KnowledgeBase.open(data_dir=small_kb.data_dir, incidents_dir=small_kb.incidents_dir)
    assert again.index_is_current()
    loaded = index_bundle.load(again.index_root)
    assert loaded.meta["fingerprint"] == b.meta["fingerprint"]
    assert loaded.meta["model"] == "use-multilingual"


def test_index_goes_stale_when_a_record_changes(small_kb):
    small_kb.build_index()
    doc = next(small_kb.incidents_dir.glob("*/incident.md"))
    doc.write_text(doc.read_text(encoding="utf-8").replace("## English", "## English\nextra words", 1),
                   encoding="utf-8")
    fresh = KnowledgeBase.open(data_dir=small_kb.data_dir, incidents_dir=small_kb.incidents_dir)
    assert not fresh.index_is_current()
    fresh.ask("loss nan")  # ask rebuilds a stale index
    assert fresh.index_is_current()


def test_index_remembers_its_model(small_kb):
    small_kb.build_index()
    # Staleness is decided from the stored model name, without loading the other model.
    other = KnowledgeBase.open(data_dir=small_kb.data_dir, incidents_dir=small_kb.incidents_dir, model="static-64")
    assert not other.index_is_current()
    same = KnowledgeBase.open(data_dir=small_kb.data_dir, incidents_dir=small_kb.incidents_dir)
    assert same.index_is_current()


def test_crash_mid_build_leaves_previous_index_usable(small_kb):
    first = small_kb.build_index()

    def crash(done, total):
        raise RuntimeError("simulated crash while embedding")

    with pytest.raises(RuntimeError):
        small_kb.build_index(force=True, progress=crash)
    survivor = index_bundle.load(small_kb.index_root)
    assert survivor is not None and survivor.path == first.path
    assert not list(small_kb.index_root.glob(".build-*"))
    assert small_kb.ask("loss nan").results


def test_readers_answer_from_the_previous_index_while_a_rebuild_runs(small_kb):
    small_kb.build_index()
    small_kb.case_model()
    src = next(small_kb.incidents_dir.glob("*/incident.md"))
    copy = src.read_text(encoding="utf-8").replace(f"id: {src.parent.name}", "id: rebuilt-copy", 1)
    assert small_kb.ingest_text(copy, name="incident.md", allow_duplicate=True).status == "created"

    in_build, release = threading.Event(), threading.Event()

    def hold(done, total):  # the rebuild pauses mid-way until the reader has its answer
        in_build.set()
        assert release.wait(120)

    builder = threading.Thread(target=small_kb.build_index, kwargs={"progress": hold})
    builder.start()
    try:
        assert in_build.wait(120)
        answers: list = []
        reader = threading.Thread(target=lambda: answers.append(small_kb.ask("loss nan")))
        reader.start()
        reader.join(60)  # before, the reader waited on the builder's lock, i.e. forever here
        assert not reader.is_alive(), "a reader waited for the rebuild"
        assert answers and answers[0].results
        assert "rebuilt-copy" not in {h.id for h in answers[0].results}  # the previous index, without the copy
    finally:
        release.set()
        builder.join(120)
    assert small_kb.index_is_current()
    assert "rebuilt-copy" in {h.id for h in small_kb.search(copy[:2000], k=20)}


def test_array_fusion_ranks_exactly_as_the_reference_fusion():
    """`fuse_arrays` (what search runs) and `fuse` (the readable reference) give the same order, scores and
    ranks, ties included: few distinct values, missing dense (-1) and BM25 (0) scores, every mode."""
    import numpy as np

    from kb.index import fusion

    rng = np.random.default_rng(0)
    for trial in range(300):
        n = int(rng.integers(0, 40))
        ids = sorted({f"inc-{int(x):03d}" for x in rng.integers(0, 500, size=n)})
        dense = np.round(rng.uniform(-0.2, 1.0, size=len(ids)), 1)  # rounded: many ties
        dense[rng.random(len(ids)) < 0.3] = -1.0
        bm = np.round(rng.uniform(0, 3, size=len(ids)), 0)
        mode = ("hybrid", "bm25", "dense")[trial % 3]
        ref = fusion.fuse({i: float(d) for i, d in zip(ids, dense) if d != -1.0},
                          {i: float(v) for i, v in zip(ids, bm) if v > 0}, ids, mode=mode)
        top, score, dr, br = fusion.fuse_arrays(dense, bm, k=len(ids), mode=mode)
        assert [ids[j] for j in top] == [f.id for f in ref]
        assert score.tolist() == [f.score for f in ref]
        assert dr.tolist() == [f.dense_rank for f in ref]
        assert [b or None for b in br.tolist()] == [f.bm25_rank for f in ref]


def test_precomputed_bm25_impacts_give_the_same_scores_and_old_indexes_still_load(tmp_path):
    import numpy as np

    from kb.index.bm25 import BM25

    rng = np.random.default_rng(1)
    vocab = [f"t{i}" for i in range(60)] + ["loss", "nan", "序列并行"]
    docs = [[vocab[int(j)] for j in rng.integers(0, len(vocab), size=int(rng.integers(0, 40)))] for _ in range(300)]
    bm = BM25().fit(docs)
    assert bm.impact is not None
    queries = [["loss", "nan"], ["t3", "t3", "序列并行"], ["absent"], vocab[:20]]
    with_impacts = [bm.scores(q) for q in queries]
    bm.impact = None  # the per-query formula, as an index written before impacts existed computes it
    for q, s in zip(queries, with_impacts):
        assert np.array_equal(bm.scores(q), s)
    bm.impact = bm._impacts()
    bm.save(tmp_path / "bm25")
    loaded = BM25.load(tmp_path / "bm25")
    assert loaded.impact is not None and np.array_equal(loaded.scores(queries[0]), with_impacts[0])
    (tmp_path / "bm25" / "impact.npy").unlink()  # the previous layout
    old = BM25.load(tmp_path / "bm25")
    assert old.impact is None and np.array_equal(old.scores(queries[1]), with_impacts[1])
