"""Repro checks of the Chinese-reported incidents, run through the harness: faulty runs fail, fixed runs stay finite."""

from __future__ import annotations

import math

import pytest
from repro_support import check

from kb.repro.harness import evaluate

# Loss-level checks (no transformers import): each runs in well under a second.
FAST = [
    "cppo-grpo-singleton-group-std-nan",
    "glm4-fp16-finetune-grad-norm-nan",
    "llamafactory-qwen-v100-fp16-layernorm-overflow",
    "ms-swift-zero3-offload-hpz-loss-zero",
    "llamafactory-npu-deepspeed-0140-grad-norm-nan",
    "chatglm2-6b-int4-full-finetune-nan",
]


@pytest.mark.parametrize("incident_id", FAST)
def test_fast_checks_confirm_on_cpu(incident_id: str) -> None:
    v = evaluate(check(incident_id), device="cpu", framework=False)
    assert v.error is None
    assert v.reproduced and v.fixed and v.confirmed
    assert math.isnan(v.evidence["faulty"]["loss"]) or math.isnan(v.evidence["faulty"].get("grad_norm", 0.0))
    assert math.isfinite(v.evidence["fixed"]["loss"])


def test_singleton_group_std_is_the_bessel_nan() -> None:
    v = evaluate(check("cppo-grpo-singleton-group-std-nan"), device="cpu", framework=False)
    assert "degrees of freedom" in v.evidence["faulty"]["warning"]
    assert v.evidence["fixed"]["group_size"] == 2 and v.evidence["fixed"]["reward_std"] > 0


def test_nan_steps_are_logged_as_zero_loss() -> None:
    v = evaluate(check("ms-swift-zero3-offload-hpz-loss-zero"), device="cpu", framework=False)
    assert v.evidence["faulty"]["logged_loss"] == 0.0
    assert v.evidence["fixed"]["logged_loss"] > 0.0


def test_fp16_adamw_nan_does_not_depend_on_learning_rate() -> None:
    c = check("chatglm2-6b-int4-full-finetune-nan")
    v = evaluate(c, device="cpu", user_settings={"learning_rate": 0.0}, framework=False)
    assert v.evidence["user"]["nan_embedding_rows"] > 0
    assert v.user_settings_trigger is True


def test_sdpa_check_says_cpu_cannot_show_the_kernel_bug() -> None:
    v = evaluate(check("llamafactory-sdpa-deepspeed-step0-grad-nan"), device="cpu", framework=False)
    assert v.gpu_only_effect and not v.reproduced and not v.confirmed
    assert any("GPU-only" in n for n in v.notes)
