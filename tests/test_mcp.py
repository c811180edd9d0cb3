"""`kb mcp` as a real stdio subprocess, driven by the official MCP SDK's own client."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import anyio
import pytest

pytest.importorskip("mcp")
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

pytestmark = pytest.mark.slow

LOG = "{'loss': nan, 'grad_norm': nan, 'nll_loss': nan, 'epoch': 0.02}\n"
CONFIG = "rlhf_type: dpo\nrpo_alpha: 1.0\nsequence_parallel_size: 4\n"


@pytest.fixture(scope="module")
def params(tmp_path_factory, repo_root) -> StdioServerParameters:
    data = tmp_path_factory.mktemp("mcp-data")
    env = {**os.environ, "KB_DATA_DIR": str(data), "KB_INCIDENTS_DIR": str(repo_root / "incidents"),
           "PYTHONPATH": str(repo_root)}
    subprocess.run([sys.executable, "-m", "kb.cli", "-q", "index"], env=env, check=True, timeout=600,
                   capture_output=True)
    return StdioServerParameters(command=sys.executable, args=["-m", "kb.cli", "mcp"], env=env, cwd=str(repo_root))


def _attr(obj, *names):
    """The SDK renamed camelCase fields to snake_case in 2.x; accept either."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    raise AttributeError(names)


def is_error(result) -> bool:
    return bool(_attr(result, "is_error", "isError"))


def _payload(result) -> dict:
    assert not is_error(result), result.content
    structured = getattr(result, "structuredContent", None) or getattr(result, "structured_content", None)
    if structured:
        return structured.get("result", structured) if set(structured) == {"result"} else structured
    return json.loads(result.content[0].text)


async def _session(params, fn):
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await fn(session)


def run(params, fn):
    return anyio.run(_session, params, fn)


def test_lists_the_four_tools(params):
    async def fn(s):
        return await s.list_tools()

    tools = {t.name: t for t in run(params, fn).tools}
    assert set(tools) >= {"diagnose", "ask", "show_incident", "run_repro"}
    assert "text" in _attr(tools["diagnose"], "input_schema", "inputSchema")["properties"]


def test_diagnose_ask_show_and_errors(params):
    async def fn(s):
        return (await s.call_tool("diagnose", {"text": LOG + CONFIG}),
                await s.call_tool("ask", {"question": "序列并行 DPO nll_loss 为 nan", "k": 3}),
                await s.call_tool("show_incident", {"incident_id": "ms-swift-dpo-sp-nll-nan"}),
                await s.call_tool("show_incident", {"incident_id": "ms-swift-dpo-sp-nll-nam"}),
                await s.call_tool("diagnose", {"text": "   "}))

    diag, ask, show, typo, empty = run(params, fn)
    # The server is a transport: its answers are the library's answers on the same data.
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=params.env["KB_DATA_DIR"], incidents_dir=params.env["KB_INCIDENTS_DIR"])
    want = kb.diagnose(text=LOG + CONFIG, k=3)
    d = _payload(diag)
    assert d["abstained"] == want.abstained and d["route"] == want.route
    assert [(x["category"], x["confidence"]) for x in d["diagnoses"]] == [(x.category, x.confidence)
                                                                           for x in want.diagnoses]
    if want.diagnoses:
        assert d["diagnoses"][0]["repro"] == want.diagnoses[0].repro
        assert any(e["line"] for e in d["diagnoses"][0]["evidence"])
    a = _payload(ask)
    want_ask = kb.ask("序列并行 DPO nll_loss 为 nan", k=3)
    assert a["lang"] == "zh" and [r["id"] for r in a["results"]] == [r.id for r in want_ask.results]
    assert all(u.startswith("http") for r in a["results"] for u in r["sources"])
    rec = _payload(show)
    assert rec["category"] == "sequence-parallel-label-split" and rec["fix"] and rec["sources"]
    assert is_error(typo) and "did you mean ms-swift-dpo-sp-nll-nan" in typo.content[0].text
    assert is_error(empty) and "nothing to diagnose" in empty.content[0].text


def test_questions_are_answered_by_calling_diagnose_again_with_answers(params):
    vague = ("Qwen3 SFT with ZeRO++ (zero_hpz_partition_size 4): after resuming from a checkpoint the training curve "
             "looks wrong, see screenshot")

    async def fn(s):
        return (await s.call_tool("diagnose", {"text": vague}),
                await s.call_tool("diagnose", {"text": vague, "answers": {"symptom": "nan"}}),
                await s.call_tool("diagnose", {"text": vague, "answers": {"symptom": "weird"}}))

    first, answered, refused = run(params, fn)
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=params.env["KB_DATA_DIR"], incidents_dir=params.env["KB_INCIDENTS_DIR"])
    d = _payload(first)
    assert d["abstained"] and [q["fact"] for q in d["questions"]] == ["symptom"], d
    want = kb.diagnose(text=vague, k=3, answers={"symptom": "nan"})
    a = _payload(answered)
    assert [(x["category"], x["confidence"]) for x in a["diagnoses"]] == [(x.category, x.confidence)
                                                                           for x in want.diagnoses]
    assert a["diagnoses"][0]["category"] == "framework-bug" and a["facts"]["symptom"]["source"] == "answer"
    assert is_error(refused) and "symptom takes one or more of" in refused.content[0].text


def test_run_repro_with_the_users_settings(params):
    async def fn(s):
        return await s.call_tool("run_repro", {"incident_id": "ms-swift-dpo-sp-nll-nan", "config": CONFIG,
                                               "device": "cpu"})

    v = _payload(run(params, fn))
    assert v["incident_id"] == "ms-swift-dpo-sp-nll-nan" and v["error"] is None
    assert v["confirmed"] and v["reproduced"] and v["fixed"]
    assert v["user_settings_trigger"] is True
