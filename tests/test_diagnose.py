"""Diagnosis end to end: trigger evaluation, ranking of neighbours that share a symptom, abstention, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb.conditions import check, evaluate_trigger
from kb.cues import score_query
from kb.documents import dump_incident_md
from kb.errors import InputError
from kb.facts import Facts, extract_facts
from kb.kb import KnowledgeBase
from kb.records import Condition, Incident, Trigger

C = Condition


def incident(id_: str, category: str, title: str, triggers: list[Trigger], **kw) -> Incident:
    return Incident(id=id_, title={"en": title, "zh": ""}, summary={"en": title},
                    root_cause={"category": category, "explanation": {"en": title}},
                    fix={"summary": {"en": f"fix for {title}"}}, triggers=triggers, **kw)


# Four neighbours: two share "labels all -100", two share "fp16 + loss 0 / grad_norm nan".
FIXTURES = [
    incident("sp-dpo-nll-nan", "sequence-parallel-label-split",
             "DPO nll_loss NaN with sequence parallel: a shard holds only prompt tokens",
             [Trigger(id="sp", all=[C(fact="sequence_parallel", op="truthy")],
                      any=[C(fact="nan_metrics", op="contains", value="nll_loss"),
                           C(fact="nan_metrics", op="contains", value="acc"),
                           C(fact="errors", op="contains", value="labels_all_masked")])],
             algorithm="DPO", config={"sequence_parallel_size": 4}),
    incident("truncated-prompt-all-masked", "all-labels-masked",
             "SFT loss NaN when the prompt is longer than max_length and every label is -100",
             [Trigger(id="masked", any=[C(fact="errors", op="contains", value="labels_all_masked")],
                      none=[C(fact="sequence_parallel", op="truthy")])]),
    incident("fp16-amp-overflow", "fp16-overflow",
             "fp16 mixed precision overflows; loss NaN after many healthy steps",
             [Trigger(id="amp", any=[C(fact="precision", op="eq", value="float16"),
                                     C(fact="errors", op="in", value=["ds_overflow", "loss_scale_min"])],
                      none=[C(fact="weights_dtype", op="eq", value="fp16")])],
             precision="fp16"),
    incident("fp16-weights-adamw", "half-precision-weights",
             "weights loaded in fp16 (torch_dtype half): loss 0.0 and grad_norm nan from step 2",
             [Trigger(id="half", all=[C(fact="weights_dtype", op="eq", value="half")], weight=1.2)],
             precision="fp16"),
]


@pytest.fixture(scope="module")
def kb(tmp_path_factory) -> KnowledgeBase:
    root = tmp_path_factory.mktemp("kb")
    for inc in FIXTURES:
        (root / "incidents" / inc.id).mkdir(parents=True)
        (root / "incidents" / inc.id / "incident.md").write_text(dump_incident_md(inc), encoding="utf-8")
    return KnowledgeBase.open(data_dir=root / "data", incidents_dir=root / "incidents")


# --- trigger evaluation (pure) -------------------------------------------------------------------------------
def test_condition_ops():
    f = extract_facts("--sequence_parallel_size 4 --max_prompt_length 2048 --max_length 2048 --fp16\n"
                      "{'loss': 0.3, 'nll_loss': nan}\ndeepspeed==0.14.0")
    assert check(C(fact="sequence_parallel_size", op="gt", value=1), f)[0]
    assert check(C(fact="max_prompt_length", op="ge", value_fact="max_length"), f)[0]
    assert check(C(fact="precision", op="eq", value="float16"), f)[0]  # value normalised through kb.canonical
    assert check(C(fact="precision", op="in", value=["fp16", "bf16"]), f)[0]
    assert check(C(fact="nan_metrics", op="contains", value="nll_loss"), f)[0]
    assert check(C(fact="deepspeed_version", op="ge", value="0.12.4"), f)[0]
    assert check(C(fact="deepspeed_version", op="lt", value="0.15"), f)[0]
    assert check(C(fact="model_family", op="absent"), f)[0]
    assert not check(C(fact="model_family", op="ne", value="qwen2"), f)[0]  # unknown facts never fire
    assert check(C(fact="nan_metrics", op="regex", value="^nll"), f)[0]
    _, fact = check(C(fact="nan_metrics", op="contains", value="nll_loss"), f)
    assert fact.line == 2  # the evidence points at the metric line


def test_regex_conditions_keep_their_upper_case_escapes():
    # Lowercasing a pattern turns \W into \w (and \S, \D, \B into their opposites): it must be used as written.
    f = Facts()
    f.set("reported_text", "the batches had num_label_tokens = 0", "text", None, "reported_text")
    assert check(C(fact="reported_text", op="regex", value=r"num_label_tokens\W{0,4}=\s*0\b"), f)[0]
    assert check(C(fact="reported_text", op="regex", value=r"NUM_LABEL_TOKENS\W+=\S*\s*0"), f)[0]  # still case-insensitive
    assert not check(C(fact="reported_text", op="regex", value=r"num_label_tokens\D{0,4}=\s*1"), f)[0]
    # The category cue written with \W reads such a paste (it never fired before).
    assert score_query(Facts(), "NaN loss from the start; the batches had num_label_tokens = 0")["all-labels-masked"] > 0


def test_trigger_all_any_none():
    t = Trigger(id="t", all=[C(fact="algorithm", op="eq", value="kto")], any=[C(fact="vanilla_loss", op="truthy")],
                none=[C(fact="micro_batch_size", op="ge", value=8)])
    assert evaluate_trigger(t, extract_facts("deepspeed train_kto.py --vanilla_loss --micro_train_batch_size 2")).fired
    r = evaluate_trigger(t, extract_facts("deepspeed train_kto.py --vanilla_loss --micro_train_batch_size 16"))
    assert not r.fired and r.blocked_by


# --- ranking -------------------------------------------------------------------------------------------------
def test_sequence_parallel_beats_plain_masked_labels_and_says_why(kb):
    d = kb.diagnose(text="发现label全为-100 导致nll_loss为nan\nswift rlhf --rlhf_type dpo --sequence_parallel_size 4")
    top = d.diagnoses[0]
    assert not d.abstained and top.category == "sequence-parallel-label-split"
    assert "all-labels-masked ruled out by sequence_parallel truthy" in top.decided_by
    assert any(e.line == 2 and e.kind == "config" for e in top.evidence)


def test_masked_labels_without_sp(kb):
    d = kb.diagnose(log="labels will all be -100, which will cause loss to become nan")
    assert d.diagnoses[0].category == "all-labels-masked"


def test_fp16_weights_vs_fp16_mixed_precision(kb):
    d = kb.diagnose(question="reward model, torch_dtype half: 'loss': 1.19e+34, 'grad_norm': nan, then 'loss': 0.0")
    assert d.diagnoses[0].category == "half-precision-weights"
    d = kb.diagnose(question="使用qwen2、fp16 进行sft全参数微调的时候，loss为0。bf16 and fp32 is correct, V100")
    assert d.diagnoses[0].category == "fp16-overflow"
    assert "half-precision-weights" not in [x.category for x in d.diagnoses[:1]]


def test_json_shape(kb):
    d = kb.diagnose(config='{"fp16": {"enabled": true}}', log="[rank0]: OVERFLOW! Rank 0 Skipping step.\nloss nan")
    out = json.loads(d.model_dump_json())
    assert set(out) >= {"diagnoses", "abstained", "facts", "warnings"}
    item = out["diagnoses"][0]
    assert set(item) >= {"incident_id", "category", "confidence", "title", "evidence", "fix", "repro"}
    assert 0.0 <= item["confidence"] <= 1.0
    assert out["facts"]["precision"]["kind"] == "config"
    assert {e["source"] for e in item["evidence"]} >= {"config", "log"}


# --- abstention ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ERROR: Could not find a version that satisfies the requirement flash-attn",
    "My SFT loss plateaus at 2.3 and does not go down",
    "请问怎么把模型部署成 API 服务？",
    "asdf qwer zxcv",
])
def test_abstains_out_of_scope(kb, text):
    d = kb.diagnose(text=text)
    assert d.abstained and d.reason


def test_rules_only_route_names_an_out_of_scope_error_in_words_and_in_the_reporters_language(kb):
    """Without the case model (hybrid mode, or `kb eval --holdout`) the rules abstain too, and say why the same way."""
    d = kb.diagnose(text="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", mode="hybrid")
    assert d.abstained and "running out of GPU memory (cuda_oom)" in d.reason
    d = kb.diagnose(text="torch.OutOfMemoryError: CUDA out of memory.\n单卡 24G 上用 LoRA 微调就显存不够了", mode="hybrid")
    assert d.abstained and "显存不足 (cuda_oom)" in d.reason and d.lang == "zh"


def test_empty_input_abstains(kb):
    d = kb.diagnose(text="   ")
    assert d.abstained and "empty" in d.reason


def test_abstain_set_file_is_well_formed(repo_root: Path):
    rows = [json.loads(x) for x in (repo_root / "tests/data/abstain.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) >= 10 and all(r["expected_category"] is None for r in rows)
    assert {r["lang"] for r in rows} == {"en", "zh"}


# --- malformed input -----------------------------------------------------------------------------------------
def test_binary_and_broken_config(kb):
    with pytest.raises(InputError):
        kb.diagnose(log="\x00\x00\x01\x02" * 50)
    d = kb.diagnose(config="fp16: true\n  bad: [unclosed\nloss: nan", question="loss nan")
    assert any("YAML" in w for w in d.warnings)
    d = kb.diagnose(config='{"fp16": {"enabled": true}, "zero_optimization": {"stage": 2', question="loss nan")
    assert any("JSON" in w for w in d.warnings) and d.facts["zero_stage"]["value"] == 2


def test_cli_diagnose_json_and_exit_codes(kb, tmp_path, capsys):
    from kb.cli import main

    log = tmp_path / "train.log"
    log.write_text("{'loss': 0.0, 'grad_norm': nan}\nmodel = model.half()\n")
    args = ["--data-dir", str(kb.data_dir), "--incidents-dir", str(kb.incidents_dir), "diagnose"]
    assert main(args + [str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["diagnoses"][0]["category"] == "half-precision-weights"
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x00\x01" * 100)
    assert main(args + [str(binary)]) == 2
    assert main(args + [str(tmp_path / "missing.log")]) == 2
    assert main(args + [str(tmp_path)]) == 2  # a directory


def _cli(kb, *extra: str) -> list[str]:
    return ["--data-dir", str(kb.data_dir), "--incidents-dir", str(kb.incidents_dir), "diagnose", *extra]


def test_cli_binary_junk_and_empty_stdin_are_clear_errors(kb, tmp_path, capsys, monkeypatch):
    import io
    import random

    from kb.cli import main

    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    assert main(_cli(kb, str(junk))) == 2
    assert "binary" in capsys.readouterr().err

    class _Stdin(io.TextIOWrapper):
        def isatty(self) -> bool:
            return False

    monkeypatch.setattr("sys.stdin", _Stdin(io.BytesIO(b"")))
    assert main(_cli(kb)) == 2
    assert "empty input" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", _Stdin(io.BytesIO(b"  \n")))
    assert main(_cli(kb, "-")) == 2


def test_cli_truncated_json_and_broken_yaml_give_partial_diagnoses(kb, tmp_path, capsys):
    from kb.cli import main

    cfg = tmp_path / "ds.json"
    cfg.write_text('{"fp16": {"enabled": true}, "zero_optimization": {"stage": 2, "overlap_comm": tr')
    assert main(_cli(kb, "--config", str(cfg), "--question", "loss becomes nan after 300 steps", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["facts"]["zero_stage"]["value"] == 2 and any("JSON" in w for w in out["warnings"])
    assert out["diagnoses"][0]["category"] == "fp16-overflow"
    yml = tmp_path / "train.yaml"
    yml.write_text("fp16: true\n  bad: [unclosed\nlearning_rate: 2e-5\n")
    assert main(_cli(kb, "--config", str(yml), "--question", "loss nan", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("YAML" in w for w in out["warnings"]) and out["facts"]["precision"]["value"] == "fp16"


def test_cli_50mb_log_is_read_head_salient_tail(kb, tmp_path, capsys, monkeypatch):
    from kb.cli import main

    # A small line budget keeps the test fast; the 50 MB are still decoded, split and scanned for salient lines.
    monkeypatch.setenv("KB_DIAGNOSE_MAX_LINES", "3000")
    big = tmp_path / "train.log"
    healthy = "{'loss': 1.0312, 'grad_norm': 0.81, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
    with big.open("w") as fh:
        fh.write("model = model.half()\n")
        n = 50_000_000 // len(healthy) + 2
        fh.write(healthy * (n // 2))
        fh.write("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}\n")
        fh.write(healthy * (n // 2))
    assert big.stat().st_size >= 50_000_000
    assert main(_cli(kb, str(big), "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("lines in between" in w for w in out["warnings"])
    assert out["facts"]["nan_metrics"]["value"] == ["grad_norm"] and out["facts"]["nan_metrics"]["line"] == n // 2 + 2
    assert out["diagnoses"][0]["category"] == "half-precision-weights"
