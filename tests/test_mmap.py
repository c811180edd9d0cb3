"""Memory-mapped loading: the published index and the pre-converted embedder give the same answers mapped."""

import shutil

import numpy as np
import pytest

from kb.embed import USEMultilingual
from kb.index import bundle as index_bundle
from kb.index.bm25 import BM25
from kb.index.vectors import FaissIndex
from kb.kb import KnowledgeBase
from kb.tokenize import tokenize


@pytest.fixture()
def built(tmp_path, repo_root):
    inc = tmp_path / "incidents"
    for p in sorted((repo_root / "incidents").glob("*/incident.md"))[:6]:
        shutil.copytree(p.parent, inc / p.parent.name)
    kb = KnowledgeBase.open(data_dir=tmp_path / "data", incidents_dir=inc)
    kb.build_index()
    return kb


def test_index_loads_memory_mapped_and_answers_the_same(built):
    mapped = index_bundle.load(built.index_root)
    copied = index_bundle.load(built.index_root, mmap=False)
    # Mapped: a read-only view of the file's pages; copied: an array that owns its memory.
    assert not mapped.bm25.tfs.flags.owndata and not mapped.bm25.tfs.flags.writeable
    assert isinstance(mapped.bm25.tfs.base, np.memmap)
    assert copied.bm25.tfs.flags.writeable and not isinstance(copied.bm25.tfs.base, np.memmap)
    q = tokenize("DPO nll_loss nan sequence_parallel")
    assert np.array_equal(mapped.bm25.scores(q), copied.bm25.scores(q))
    qv = built.embedder.encode(["DPO NLL loss nan"], query=True)[0]
    for a, b in zip(mapped.vectors.search(qv, 5), copied.vectors.search(qv, 5)):
        assert np.allclose(a, b)


def test_bm25_reads_the_previous_npz_layout(tmp_path):
    docs = [tokenize("loss nan with fp16"), tokenize("序列并行 标签 切分"), tokenize("rpo_alpha nll loss")]
    bm = BM25().fit(docs)
    z = tmp_path / "bm25.npz"
    with open(z, "wb") as f:
        np.savez(f, indptr=bm.indptr, doc_ids=bm.doc_ids, tfs=bm.tfs, doc_len=bm.doc_len, idf=bm.idf,
                 vocab=np.array(sorted(bm.vocab, key=bm.vocab.__getitem__), dtype=str),
                 params=np.array([bm.k1, bm.b]))
    bm.save(tmp_path / "bm25")
    for loaded in (BM25.load(z), BM25.load(tmp_path / "bm25")):
        assert np.allclose(loaded.scores(tokenize("nll loss")), bm.scores(tokenize("nll loss")))
        assert loaded.vocab == bm.vocab


def test_hnsw_above_the_flat_limit_round_trips_mapped(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    idx = FaissIndex(32, n_expected=FaissIndex.FLAT_LIMIT + 1)
    assert idx.kind == "IndexHNSWFlat"
    idx.add(x)
    idx.save(tmp_path / "v.faiss")
    back = FaissIndex.load(tmp_path / "v.faiss")
    sims, ids = back.search(x[7], 3)
    assert ids[0] == 7 and sims[0] == pytest.approx(1.0, abs=1e-5)


def test_use_cache_is_written_once_and_gives_identical_vectors(tmp_path):
    texts = ["DPO NLL loss nan", "序列并行时 nll_loss 为 nan", "loss scale overflow fp16"]
    first = USEMultilingual(cache_dir=tmp_path)
    assert not first.from_cache and any(tmp_path.glob("use-multilingual-*/meta.json"))
    second = USEMultilingual(cache_dir=tmp_path)
    assert second.from_cache
    assert np.array_equal(first.encode(texts), second.encode(texts))
    assert np.array_equal(first.encode(texts[:1], query=True), second.encode(texts[:1], query=True))


def test_english_question_on_a_built_index_does_not_load_jieba(built):
    # The index carries jieba's cuts of the corpus, so only a question with new Chinese text needs jieba.
    import os
    import subprocess
    import sys

    code = ("import sys\nfrom kb.kb import KnowledgeBase\n"
            f"kb = KnowledgeBase.open(data_dir={str(built.data_dir)!r}, incidents_dir={str(built.incidents_dir)!r})\n"
            "r = kb.ask('DPO NLL loss nan sequence_parallel')\nprint('jieba' in sys.modules, len(r.results))\n"
            "kb.ask('序列并行 为什么 nan')\nprint('jieba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    first, second = out.stdout.split("\n")[:2]
    assert first.split()[0] == "False" and int(first.split()[1]) > 0
    assert second == "True"


def test_rebuild_embeds_only_changed_rows(built):
    b1 = index_bundle.load(built.index_root)
    assert (b1.path / "row_sha.txt").is_file() and "row_sha" not in b1.meta
    doc = next(built.incidents_dir.glob("*/incident.md"))
    text = doc.read_text(encoding="utf-8")
    doc.write_text(text.replace("## English", "## English\nextra words for the rebuild", 1), encoding="utf-8")
    fresh = KnowledgeBase.open(data_dir=built.data_dir, incidents_dir=built.incidents_dir)
    b2 = fresh.build_index()
    assert b2.path != b1.path
    # Vectors of unchanged rows are reused (the edit is past the embedded head, so none is re-embedded)
    # while BM25 sees the new words.
    assert b2.meta["embedded_rows"] < b2.meta["n_rows"]
    assert "rebuild" in b2.bm25.vocab and "rebuild" not in b1.bm25.vocab
