"""The triggers over logged metrics, the facts -> text rendering the engine reads today, and the report outputs
(JSON identical to `kb diagnose --json`, webhook bodies per platform)."""

from __future__ import annotations

import json
import math

import pytest

from kb.diagnose.models import Diagnosis, DiagnosisItem
from kb.facts import extract_facts
from kb.integrations.collect import Collected, render
from kb.integrations.monitor import Monitor
from kb.integrations.report import REPORT_FILE, webhook_body, webhook_kind, write_json


def feed(rows: list[dict]) -> tuple[Monitor, list]:
    m = Monitor()
    fired = [t for i, r in enumerate(rows, 1) if (t := m.observe(i, r)) is not None]
    return m, fired


def test_healthy_noisy_run_does_not_fire():
    rows = [{"loss": 2.0 + 0.3 * math.sin(i), "grad_norm": 1.0 + (i % 5), "learning_rate": 1e-5 * i, "epoch": i}
            for i in range(200)]
    assert feed(rows)[1] == []


@pytest.mark.parametrize(("rows", "words", "fatal"), [
    ([{"loss": 2.1}, {"loss": float("nan")}], "loss is nan at step 2", True),
    ([{"loss": 2.1, "grad_norm": 1.0}, {"loss": 2.0, "grad_norm": float("inf")}], "grad_norm is inf", True),
    ([{"loss": 2.1}, {"loss": 1.9}, {"loss": 0.0}], "loss dropped to exactly 0.0", True),
    ([{"loss": 2.1}, {"loss": 2.0}, {"loss": 350.0}], "loss jumped", False),
    ([{"loss": 2.1, "loss_scale": 4.0}, {"loss": 2.1, "loss_scale": 1.0}], "loss scale at its minimum", True),
    ([{"loss": 0.5, "objective/kl": 0.01}, {"loss": 0.5, "objective/kl": float("nan")}], "objective/kl is nan", True),
    ([{"loss": 0.1, "reward": 0.5, "reward_std": 0.2}, {"loss": 0.1, "reward": 1.0, "reward_std": 0.0}],
     "rewards all equal", False),
    ([{"loss": 0.1, "rewards/chosen": float("nan")}], "rewards/chosen is nan", True),
])
def test_triggers(rows, words, fatal):
    _, fired = feed(rows)
    assert len(fired) == 1 and words in fired[0].reason and fired[0].nonfinite is fatal


def test_zero_at_the_first_step_is_not_a_collapse_and_one_warning_then_one_fatal():
    assert feed([{"loss": 0.0}, {"loss": 0.0}])[1] == []
    m, fired = feed([{"loss": 2.0}, {"loss": 900.0}, {"loss": float("nan")}, {"loss": float("nan")}])
    assert [t.nonfinite for t in fired] == [False, True]
    assert m.records[-1]["loss"] != m.records[-1]["loss"]  # the NaN record is kept for the report


def test_rendered_facts_read_back_by_the_engine():
    c = Collected(trigger="loss is nan at step 7")
    c.set("weights_dtype", "fp16", "model.lm_head.weight dtype float16 (trainable)")
    c.set("learning_rate", 2e-5, "TrainingArguments learning_rate=2e-05")
    c.set("loss_type", "simpo", "CPOConfig loss_type='simpo'")
    c.set("torch_version", "2.13.0", "installed torch==2.13.0")
    c.add("findings", "micro-batch 3 of step 7 on rank 0 has 0 supervised tokens: no supervised tokens", "probe")
    c.records = [{"loss": 1.5, "grad_norm": 0.9, "epoch": 0.1, "step": 6},
                 {"loss": float("nan"), "grad_norm": float("nan"), "epoch": 0.2, "step": 7}]
    text = render(c)
    assert "{'loss': nan, 'grad_norm': nan, 'epoch': 0.2, 'step': 7}" in text and "torch==2.13.0" in text
    f = extract_facts(text)
    assert f.value("weights_dtype") == "fp16" and f.value("learning_rate") == 2e-5
    assert f.value("loss_type") == "simpo" and f.value("torch_version") == "2.13.0"
    assert set(f.value("nan_metrics")) == {"loss", "grad_norm"} and f.value("first_bad_step") == 7
    assert f.value("errors") == ["labels_all_masked"]


def test_report_json_and_webhook_bodies(tmp_path):
    d = Diagnosis(diagnoses=[DiagnosisItem(incident_id="x", category="half-precision-weights", confidence=0.9,
                                           title="fp16 weights", fix="load in fp32")])
    p = write_json(d, tmp_path)
    assert p.name == REPORT_FILE and json.loads(p.read_text()) == json.loads(json.dumps(d.model_dump(mode="json")))
    assert webhook_kind("https://hooks.slack.com/services/T/B/x") == "slack"
    assert webhook_kind("https://open.feishu.cn/open-apis/bot/v2/hook/abc") == "feishu"
    assert webhook_kind("https://oapi.dingtalk.com/robot/send?access_token=t") == "dingtalk"
    assert "half-precision-weights" in webhook_body("slack", d)["text"]
    assert webhook_body("dingtalk", d)["msgtype"] == "markdown"
    assert "load in fp32" in webhook_body("feishu", d)["content"]["text"]


@pytest.mark.slow
def test_a_loss_explosion_after_a_healthy_step_is_the_learning_rate_not_sdpa():
    """What the first GPU run showed (H100, 2026-11-24): the tiny model at learning_rate=1000 trained on CUDA logs
    grad_norm NaN at step 2, right after its loss jumped 4.5e6x (on CPU grad_norm stays finite), and the SDPA
    trigger, meant for grad_norm NaN from the very first step, named attention-kernel-bug (0.85). These are that
    run's facts and records, as the callback collected them."""
    from integrations_support import real_kb

    from kb.integrations.collect import diagnose_collected

    c = Collected(trigger="loss jumped from ~4.88 to 2.21e+07 (4538844x) at step 2")
    c.set("attn_implementation", "sdpa", "model.config._attn_implementation = sdpa")
    c.set("precision", "fp32", "TrainingArguments fp16=False, bf16=False (no mixed precision)")
    c.set("learning_rate", 1000.0, "TrainingArguments learning_rate=1000.0")
    c.records = [{"loss": 4.8812, "grad_norm": 1.31, "learning_rate": 1000.0, "epoch": 0.125, "step": 1},
                 {"loss": 22129324.0, "grad_norm": float("nan"), "learning_rate": 875.0, "epoch": 0.25, "step": 2},
                 {"loss": 0.0, "grad_norm": float("nan"), "learning_rate": 750.0, "epoch": 0.375, "step": 3}]
    d = diagnose_collected(real_kb(), c)
    assert d.diagnoses[0].category == "lr-too-high"
    assert d.diagnoses[0].decided_by.startswith("learning_rate=1000")  # the strongest fired trigger speaks first
    assert "attention-kernel-bug ruled out by first_bad_step" in d.diagnoses[0].decided_by


@pytest.mark.slow
def test_the_same_run_pasted_with_two_config_lines_is_the_learning_rate_too():
    """That run's log pasted into `kb diagnose` with `attn_implementation: sdpa` and `learning_rate: 1000` and no
    precision: the SDPA incident's retrieval and signature used to outweigh the learning rate (0.43 against 0.15);
    a learning rate of 1e-2 or more is now a cue for lr-too-high (kb/data/category_cues.yaml)."""
    from integrations_support import real_kb

    log = ("{'loss': 4.8812, 'grad_norm': 1.31, 'learning_rate': 1000.0, 'epoch': 0.125, 'step': 1}\n"
           "{'loss': 22129324.0, 'grad_norm': nan, 'learning_rate': 875.0, 'epoch': 0.25, 'step': 2}\n"
           "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 750.0, 'epoch': 0.375, 'step': 3}")
    d = real_kb().diagnose(log=log, config="attn_implementation: sdpa\nlearning_rate: 1000\n")
    assert d.diagnoses[0].category == "lr-too-high"
