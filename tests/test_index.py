"""Index build, reload, staleness and atomic publication with the real embedding model and FAISS."""

import shutil

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
