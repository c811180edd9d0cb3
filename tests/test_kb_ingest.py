"""Ingesting through the KnowledgeBase: stored in SQLite, idempotent, indexed, near-duplicates reported."""

import shutil

import pytest

from kb.kb import KnowledgeBase

RAW_EN = """# Loss becomes NaN when training a reward model in pure fp16

## Symptoms
Training a reward model with --fp16 weights loaded as torch_dtype=float16, the first logged loss is
huge and from step 2 on `grad_norm: nan` and `loss: 0.0`.

## Root cause
The score head is trained as fp16 parameters without an fp32 master copy.

## Fix
Load the model in float32 or bfloat16 and let mixed precision handle fp16 compute.
"""


@pytest.fixture()
def kb(tmp_path, repo_root):
    inc = tmp_path / "incidents"
    for p in sorted((repo_root / "incidents").glob("*/incident.md"))[:4]:
        shutil.copytree(p.parent, inc / p.parent.name)
    return KnowledgeBase.open(data_dir=tmp_path / "data", incidents_dir=inc)


def test_raw_document_is_stored_and_searchable(kb, tmp_path):
    doc = tmp_path / "rm-fp16.md"
    doc.write_text(RAW_EN, encoding="utf-8")
    [out] = kb.ingest([doc], allow_duplicate=True)
    assert out.status == "created", out
    rec = kb.get(out.id)
    assert rec.origin == "raw"
    reopened = KnowledgeBase.open(data_dir=kb.data_dir, incidents_dir=kb.incidents_dir)
    assert out.id in reopened.records
    hits = reopened.search("reward model pure fp16 score head grad_norm nan", k=3)
    assert out.id in [h.id for h in hits]


def test_ingesting_twice_updates_never_duplicates(kb, tmp_path):
    doc = tmp_path / "rm-fp16.md"
    doc.write_text(RAW_EN, encoding="utf-8")
    first = kb.ingest([doc], allow_duplicate=True)[0]
    n = len(kb.records)
    second = kb.ingest([doc], allow_duplicate=True)[0]
    assert second.id == first.id and second.status == "unchanged"
    doc.write_text(RAW_EN + "\nAlso seen with gradient accumulation 32.\n", encoding="utf-8")
    third = kb.ingest([doc], allow_duplicate=True)[0]
    assert third.id == first.id and third.status == "updated"
    assert len(kb.records) == n


def test_bad_files_are_reported_per_file_and_store_is_untouched(kb, tmp_path):
    junk = tmp_path / "junk.txt"
    junk.write_bytes(b"\x00\x01\x02\xff" * 1000)
    missing = tmp_path / "missing.md"
    before = len(kb.records)
    outs = kb.ingest([junk, missing])
    assert [o.status for o in outs] == ["error", "error"]
    assert all(o.error and "Traceback" not in o.error for o in outs)
    assert len(kb.records) == before


def test_near_duplicate_is_reported_before_adding(kb, tmp_path):
    original = next(iter(kb.records.values()))
    doc = tmp_path / "copy.md"
    src = (kb.incidents_dir / original.id / "incident.md").read_text(encoding="utf-8")
    doc.write_text(src.replace(f"id: {original.id}", "id: copy-of-an-incident", 1), encoding="utf-8")
    [out] = kb.ingest([doc])
    assert out.status == "duplicate" and original.id in out.near_duplicates
    assert "copy-of-an-incident" not in kb.records
