"""Dify's external knowledge API (`POST /retrieval`) on a real server, checked against the spec's examples."""

from __future__ import annotations

import httpx
import pytest

from api.app import create_app
from api.loopback import LoopbackServer
from api.settings import Settings

KEY = "dify-test-key-0123456789"
# The request example of Dify's spec (docs.dify.ai, External Knowledge API), verbatim in shape.
SPEC_REQUEST = {"knowledge_id": "your-knowledge-id", "query": "your question",
                "retrieval_setting": {"top_k": 2, "score_threshold": 0.5}}


@pytest.fixture(scope="module")
def url(tmp_path_factory, repo_root, monkeypatch_module):
    monkeypatch_module.delenv("KB_DIFY_API_KEYS", raising=False)
    data = tmp_path_factory.mktemp("dify-data")
    app = create_app(Settings(data_dir=str(data), incidents_dir=str(repo_root / "incidents"), api_keys=KEY))
    with LoopbackServer(app) as base:
        assert app.state.ready.wait(300), "index warm-up did not finish"
        yield base


@pytest.fixture(scope="module")
def lib(url, tmp_path_factory, repo_root):
    """The library's own answer, to check the adapter against (the ranking itself is tested elsewhere)."""
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=tmp_path_factory.mktemp("dify-lib"), incidents_dir=repo_root / "incidents")
    return kb.ask


ANSWERABLE = ["DPO NLL loss nan", "DPO NLL loss nan sequence parallel", "loss nan fp16", "fp16 loss nan overflow",
              "序列并行 DPO nll_loss 为 nan", "ms-swift DPO rpo_alpha sequence_parallel_size nll_loss nan"]


def answerable(lib, lang: str | None = None) -> str:
    """A query the knowledge base answers (does not abstain on) with at least three results."""
    for q in ANSWERABLE:
        res = lib(q, k=5)
        if not res.abstained and len(res.results) >= 3 and (lang is None or res.lang == lang):
            return q
    pytest.fail("the knowledge base abstains on every question in ANSWERABLE")


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def post(url: str, body: dict, auth: str | None = f"Bearer {KEY}") -> httpx.Response:
    headers = {"Authorization": auth} if auth is not None else {}
    return httpx.post(url + "/retrieval", json=body, headers=headers, timeout=120)


def ours(query: str, top_k: int = 3, threshold: float = 0.0) -> dict:
    return {"knowledge_id": "kb-nan", "query": query, "retrieval_setting": {"top_k": top_k, "score_threshold": threshold}}


def test_records_have_the_spec_shape(url, lib):
    q = answerable(lib)
    expected = [r for r in lib(q, k=3).results if r.score >= 0.5]
    r = post(url, ours(q, top_k=3, threshold=0.5))
    assert r.status_code == 200, r.text
    records = r.json()["records"]
    assert [x["metadata"]["id"] for x in records] == [e.id for e in expected] and records
    for rec in records:
        assert set(rec) == {"content", "score", "title", "metadata"}
        assert isinstance(rec["content"], str) and rec["content"]
        assert 0.5 <= rec["score"] <= 1.0
        assert isinstance(rec["metadata"], dict)  # never null: Dify breaks on it
        assert all(u.startswith("https://") for u in rec["metadata"]["sources"])
    top, first = records[0], expected[0]
    assert ("Fix:" in top["content"] or "修复:" in top["content"]) and top["metadata"]["repro"] == first.repro
    assert top["title"] == first.title and top["metadata"]["category"] == first.category
    assert [x["score"] for x in records] == sorted((x["score"] for x in records), reverse=True)


def test_top_k_and_threshold_are_honoured(url, lib):
    q = answerable(lib)
    many = post(url, ours(q, top_k=5)).json()["records"]
    assert len(many) == len(lib(q, k=5).results) >= 3
    assert len(post(url, ours(q, top_k=2)).json()["records"]) == 2
    cut = (many[0]["score"] + many[-1]["score"]) / 2
    strict = post(url, ours(q, top_k=5, threshold=cut)).json()["records"]
    assert 1 <= len(strict) < len(many) and all(x["score"] >= cut for x in strict)


def test_chinese_query_gets_chinese_content(url, lib):
    q = "序列并行 DPO nll_loss 为 nan"
    res = lib(q, k=1)
    records = post(url, ours(q, top_k=1)).json()["records"]
    if res.abstained:
        assert records == []
    else:
        assert records[0]["metadata"]["lang"] == "zh" and "修复" in records[0]["content"]


def test_a_cause_with_no_curated_incident_is_a_record_too(url, lib):
    q = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.01}"
    first = lib(q, k=3).results[0]
    assert first.id == "" and first.category == "framework-bug"  # a framework defect without its feature
    r = post(url, ours(q, top_k=3))
    assert r.status_code == 200, r.text
    top = r.json()["records"][0]
    assert top["metadata"]["id"] == "" and top["metadata"]["category"] == "framework-bug"
    assert "no curated incident" in top["content"] and "similar report" in top["content"]
    assert top["metadata"]["sources"] and all(u.startswith("https://") for u in top["metadata"]["sources"])


def test_an_unsure_answer_tells_the_app_which_questions_to_ask(url, lib):
    q = "用 Qwen2.5-7B-Instruct 做 DPO，loss 变成 nan"
    res = lib(q, k=3)
    assert res.questions and not res.abstained, res  # a differential: kb is not sure which mechanism it is
    records = post(url, ours(q, top_k=3)).json()["records"]
    top = records[0]
    assert top["metadata"]["questions"] == [x.question for x in res.questions]
    assert "请用户回答下面的问题" in top["content"] and res.questions[0].question in top["content"]
    assert all("questions" not in r["metadata"] for r in records[1:])
    sure = answerable(lib)
    if not lib(sure, k=3).questions:
        assert "questions" not in post(url, ours(sure, top_k=3)).json()["records"][0]["metadata"]


def test_nothing_fits_gives_an_empty_list(url, lib):
    assert lib("how do I bake sourdough bread at home").abstained
    r = post(url, ours("how do I bake sourdough bread at home"))
    assert r.status_code == 200 and r.json() == {"records": []}


def test_spec_example_request_names_an_unknown_knowledge(url):
    r = post(url, SPEC_REQUEST)
    assert r.status_code == 404
    assert r.json()["error_code"] == 2001 and "does not exist" in r.json()["error_msg"]


@pytest.mark.parametrize("auth", [None, "", "Basic abc", "Bearer", "Bearer a b", KEY])
def test_bad_authorization_header_format_is_1001(url, auth):
    r = post(url, ours("loss nan"), auth=auth)
    assert r.status_code == 403
    assert r.json() == {"error_code": 1001,
                        "error_msg": "Invalid Authorization header format. Expected 'Bearer <api-key>' format."}


def test_wrong_key_is_1002(url):
    r = post(url, ours("loss nan"), auth="Bearer not-the-key")
    assert r.status_code == 403 and r.json()["error_code"] == 1002


def test_a_dify_only_key(url, monkeypatch_module):
    monkeypatch_module.setenv("KB_DIFY_API_KEYS", "dify-only-key")
    try:
        assert post(url, ours("loss nan"), auth="Bearer dify-only-key").status_code == 200
        assert post(url, ours("loss nan")).json()["error_code"] == 1002  # the server key no longer works here
    finally:
        monkeypatch_module.delenv("KB_DIFY_API_KEYS")


@pytest.mark.parametrize("body", [{}, {"knowledge_id": "kb-nan", "query": "x"},
                                  {"knowledge_id": "kb-nan", "query": "", "retrieval_setting": {"top_k": 2,
                                                                                                "score_threshold": 0.5}},
                                  ours("x", top_k=0), ours("x", threshold=1.5)])
def test_malformed_bodies_are_422_not_500(url, body):
    r = post(url, body)
    assert r.status_code == 422, r.text
    assert "Traceback" not in r.text


def test_metadata_condition_is_accepted(url):
    body = {**ours("KTO loss nan", top_k=2),
            "metadata_condition": {"logical_operator": "and",
                                   "conditions": [{"name": "category", "comparison_operator": "is", "value": "x"}]}}
    assert post(url, body).status_code == 200
