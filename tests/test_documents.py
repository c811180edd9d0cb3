"""Curated documents parse into typed records and round-trip; broken ones give clear errors."""

import pytest

from kb.documents import dump_incident_md, load_incidents, parse_incident_md
from kb.errors import InputError, ValidationFailed

DOC = """---
id: demo-simpo-empty
title: {en: "SimPO NaN with an empty response", zh: "SimPO 响应为空导致 NaN"}
summary: {en: "Length-normalised loss divides by zero.", zh: "长度归一化除以零。"}
lang: en
framework: {name: trl, reported_versions: ["0.16.1"]}
algorithm: SimPO
config: {max_prompt_length: 2048, max_length: 2048}
root_cause: {category: empty-response-length-normalization, status: confirmed}
sources: [{url: "https://example.org/t/1"}]
---
## English
### Symptoms
loss nan
## 中文
### 现象
损失为 nan
"""


def test_parse_curated_document_splits_languages():
    inc = parse_incident_md(DOC)
    assert inc.id == "demo-simpo-empty"
    assert inc.config["max_length"] == 2048
    assert "loss nan" in inc.body.en and "损失" in inc.body.zh


def test_round_trip():
    inc = parse_incident_md(DOC)
    again = parse_incident_md(dump_incident_md(inc))
    assert again == inc


def test_malformed_yaml_is_a_clear_error():
    with pytest.raises(InputError, match="malformed YAML"):
        parse_incident_md("---\nid: [unclosed\n---\nbody\n")


def test_missing_front_matter():
    with pytest.raises(InputError, match="front matter"):
        parse_incident_md("just text")


def test_schema_violation_names_the_field():
    with pytest.raises(ValidationFailed, match="root_cause"):
        parse_incident_md("---\nid: x-y\ntitle: {en: a, zh: b}\n---\n")


def test_loader_collects_problems_and_keeps_good_files(tmp_path):
    (tmp_path / "demo-simpo-empty").mkdir()
    (tmp_path / "demo-simpo-empty" / "incident.md").write_text(DOC, encoding="utf-8")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "incident.md").write_text("---\nid: [\n---\n", encoding="utf-8")
    recs, problems = load_incidents(tmp_path)
    assert [r.id for r in recs] == ["demo-simpo-empty"]
    assert len(problems) == 1 and "broken" in problems[0].path


def test_shipped_corpus_loads_cleanly(repo_root):
    recs, problems = load_incidents(repo_root / "incidents")
    assert not problems, problems
    assert len(recs) >= 5
