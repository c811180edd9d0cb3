"""The `kb` command end to end, as a user runs it: real subprocesses, a real data dir."""

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def run(tmp_path_factory, repo_root):
    data = tmp_path_factory.mktemp("cli-data")
    env = {**os.environ, "KB_DATA_DIR": str(data), "KB_INCIDENTS_DIR": str(repo_root / "incidents")}

    def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kb.cli", *args], capture_output=True, text=True,
                              env=env, input=stdin, timeout=300, cwd=repo_root, check=False)

    _run.env = env  # type: ignore[attr-defined]
    return _run


def test_index_then_ask_json(run):
    r = run("index")
    assert r.returncode == 0, r.stderr
    r = run("ask", "--json", "DPO NLL loss nan")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["query"] == "DPO NLL loss nan"
    first = out["results"][0]
    assert first["id"] == "ms-swift-dpo-sp-nll-nan"
    assert set(first) >= {"id", "title", "category", "framework", "algorithm", "score", "evidence", "fix", "sources"}


def test_an_answer_on_the_command_line_is_weighed_with_the_paste(run):
    text = ("After upgrading transformers from 4.45 to 4.46, full fine-tuning Llama-3-8B: loss is 0.0 and grad_norm "
            "nan from the first step. 4.45 was fine.")
    r = run("diagnose", "--json", "--question", text, "--answer", "framework_version=4.46.0")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["diagnoses"][0]["category"] == "framework-bug" and out["route"] == "framework-defect"
    assert out["facts"]["framework_version"]["source"] == "answer"
    bad = run("diagnose", "--question", text, "--answer", "no-equals-sign")
    assert bad.returncode != 0 and "KEY=VALUE" in bad.stderr and "Traceback" not in bad.stderr
    bad = run("diagnose", "--question", text, "--answer", "symptom=weird")
    assert bad.returncode == 2 and "symptom takes" in bad.stderr and "Traceback" not in bad.stderr
    # The scope question, printed with the command line that answers it.
    r = run("diagnose", "--question", "LLaMA-Factory LoRA SFT of Qwen2.5-7B: the loss curve looks strange, screenshot")
    assert r.returncode == 1 and "--answer symptom=" in r.stdout


def test_an_unsure_ask_prints_the_questions_that_would_settle_it_and_a_sure_one_does_not(run):
    r = run("ask", "DPO NLL loss nan")
    assert r.returncode == 0, r.stderr
    assert "not settled yet" in r.stdout and "--answer sequence_parallel" in r.stdout
    sure = run("ask", "--json", "ms-swift DPO sequence_parallel_size 4 nll_loss nan")
    assert sure.returncode == 0 and json.loads(sure.stdout)["questions"] == []
    unsure = json.loads(run("ask", "--json", "DPO NLL loss nan").stdout)
    assert any(q["fact"].startswith("sequence_parallel") for q in unsure["questions"])


def test_ask_table_shows_evidence_and_fix(run):
    r = run("ask", "序列并行 DPO nll_loss 为 nan")
    assert r.returncode == 0, r.stderr
    assert "ms-swift-dpo-sp-nll-nan" in r.stdout and "证据" in r.stdout and "修复" in r.stdout


def test_show_list_stats(run):
    r = run("show", "ms-swift-dpo-sp-nll-nan")
    assert r.returncode == 0 and "## 中文" in r.stdout and "## English" in r.stdout
    r = run("list", "--framework", "trl", "--json")
    assert r.returncode == 0 and all(x["framework"]["name"] == "trl" for x in json.loads(r.stdout))
    r = run("stats", "--json")
    s = json.loads(r.stdout)
    assert s["records"] >= 5 and "sequence-parallel-label-split" in s["by_category"]


def test_unknown_id_is_a_clear_error_not_a_traceback(run):
    r = run("show", "no-such-incident")
    assert r.returncode == 3
    assert "unknown incident" in r.stderr and "Traceback" not in r.stderr


def test_validate_passes_on_shipped_corpus(run):
    r = run("validate")
    assert r.returncode == 0, r.stdout + r.stderr


def test_schema_file_is_current(run, repo_root):
    r = run("schema")
    assert r.returncode == 0
    shipped = json.loads((repo_root / "kb" / "schema" / "incident.schema.json").read_text(encoding="utf-8"))
    assert json.loads(r.stdout) == shipped, "run `kb schema --write` after changing kb/records.py"


def test_empty_question_is_rejected(run):
    r = run("ask", " ")
    assert r.returncode == 2 and "empty" in r.stderr


def test_a_reader_that_leaves_early_is_not_an_abstention(run, repo_root):
    """`kb ask ... | head -2`: the pipe closes before kb writes; exit 0 and no traceback, not 1 ("abstained")."""
    run("index")  # the shared data dir has its index, so the run below only loads and answers
    env = {**run.env, "KB_DAEMON": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "kb.cli", "ask", "DPO NLL loss nan"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=repo_root)
    proc.stdout.close()  # the reader is gone before the first byte is written
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert b"Traceback" not in err
