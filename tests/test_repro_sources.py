"""Repro checks of the incidents curated from corpus/sources.jsonl threads, run through the harness: the fault gives
NaN / inf / a collapse or leak, the fix stays finite, and each check's settings rule answers other settings."""

from __future__ import annotations

import math

import pytest
import torch
from repro_support import check, finite, nan, verdict

CPU_CHECKS = ["llamafactory-s2-attn-fp16-grad-nan", "xtuner-llava-vision-lr-nan", "openrlhf-ring-attn-sft-nan",
              "trl-sft-all-labels-masked-zero-loss", "colossalai-pretrain-truncation-nan",
              "trl-ipo-empty-completion-nan", "trl-kto-unbalanced-batch-nan", "deepspeed-chat-rm-loss-scale-min",
              "transformers-gemma2-flash-attn-nan", "verl-grpo-low-var-kl-nan",
              "llamafactory-baichuan2-fp16-zero-loss", "tinyllama-model-half-nan"]
GPU_ONLY = "pytorch-cudnn-sdpa-nan"


@pytest.mark.parametrize("incident_id", CPU_CHECKS)
def test_check_reproduces_and_fix_holds_on_cpu(incident_id):
    v = verdict(incident_id)
    assert v.error is None, v.notes
    assert v.reproduced and v.fixed and v.exit_code == 0


def test_s2_attn_cat_without_dim_leaks_later_tokens_and_dim2_does_not():
    ev = verdict("llamafactory-s2-attn-fp16-grad-nan").evidence
    assert ev["faulty"]["future_leak"] > 0.1 and ev["fixed"]["future_leak"] == 0.0


def test_ring_shard_without_labels_is_nan_and_guard_gives_finite_loss():
    ev = verdict("openrlhf-ring-attn-sft-nan").evidence
    assert ev["faulty"]["empty_shards"] >= 1 and nan(ev["faulty"]["loss"])
    assert finite(ev["fixed"]["loss"]) and ev["fixed"]["loss"] > 0
    assert check("openrlhf-ring-attn-sft-nan").triggers({"sequence_parallel_size": 1})[0] is False


def test_all_masked_sft_batch_logs_zero_over_a_nan_loss():
    ev = verdict("trl-sft-all-labels-masked-zero-loss").evidence
    assert ev["faulty"]["supervised_tokens"] == 0 and nan(ev["faulty"]["raw_loss"])
    assert ev["faulty"]["logged_loss"] == 0.0
    assert ev["fixed"]["supervised_tokens"] > 0 and finite(ev["fixed"]["raw_loss"])


def test_ipo_rule_and_empty_completion():
    c = check("trl-ipo-empty-completion-nan")
    assert c.triggers({"loss_type": "sigmoid", "max_length": 1024, "max_prompt_length": 1024})[0] is False
    assert c.triggers({"loss_type": "ipo", "max_length": 1024, "max_prompt_length": 512})[0] is False
    assert c.triggers({"loss_type": "ipo", "max_length": 2048, "max_prompt_length": 2048})[0] is True
    ev = verdict("trl-ipo-empty-completion-nan").evidence
    assert ev["faulty"]["min_completion_tokens"] == 0 and nan(ev["faulty"]["loss"])


def test_kto_empty_side_metric_nan_with_finite_gradient():
    ev = verdict("trl-kto-unbalanced-batch-nan").evidence["faulty"]
    assert ev["desirable_in_batch"] == 0 and nan(ev["rewards_chosen"]) and finite(ev["grad_norm"])
    c = check("trl-kto-unbalanced-batch-nan")
    kto = {"algorithm": "KTO"}  # the incident's triggers are shared with diagnosis, so they name the algorithm
    assert c.triggers({**kto, "micro_batch_size": 2})[0] is True and c.triggers({**kto, "micro_batch_size": 64})[0] is False


def test_loss_scaler_reaches_its_floor_in_fp16_only():
    ev = verdict("deepspeed-chat-rm-loss-scale-min").evidence
    assert "loss scale already at minimum" in ev["faulty"]["error"] and ev["faulty"]["loss_scale"] == 1.0
    assert ev["fixed"]["error"] == "" and ev["fixed"]["overflow_steps"] == 0
    assert check("deepspeed-chat-rm-loss-scale-min").triggers({"precision": "bf16"})[0] is False


def test_low_var_kl_forward_finite_backward_nan_until_clamped():
    ev = verdict("verl-grpo-low-var-kl-nan").evidence
    assert ev["faulty"]["max_log_ratio"] > 88 and finite(ev["faulty"]["kl_loss"]) and nan(ev["faulty"]["grad_norm"])
    assert finite(ev["fixed"]["grad_norm"])
    assert check("verl-grpo-low-var-kl-nan").triggers({"kl_estimator": "k2", "use_kl_loss": True})[0] is False


def test_fp16_weights_step1_finite_then_nan_logged_as_zero():
    ev = verdict("tinyllama-model-half-nan").evidence
    assert finite(ev["faulty"]["step1_loss"]) and nan(ev["faulty"]["loss"]) and ev["faulty"]["logged_loss"] == 0.0
    assert finite(ev["fixed"]["loss"]) and ev["fixed"]["logged_loss"] > 0


def test_fp16_outlier_overflows_and_bf16_does_not():
    ev = verdict("llamafactory-baichuan2-fp16-zero-loss").evidence
    assert ev["faulty"]["max_abs_activation"] == math.inf and ev["faulty"]["logged_loss"] == 0.0
    assert 65504 < ev["fixed"]["max_abs_activation"] < 1e6 and finite(ev["fixed"]["loss"])


def test_gemma2_rule_follows_flash_attn_version():
    c = check("transformers-gemma2-flash-attn-nan")
    assert c.triggers({"model_family": "gemma2", "attn_implementation": "flash_attention_2",
                       "flash_attn_version": "2.6.1"})[0] is True
    assert c.triggers({"model_family": "gemma2", "attn_implementation": "flash_attention_2",
                       "flash_attn_version": "2.6.3"})[0] is False
    assert c.triggers({"model_family": "gemma2", "attn_implementation": "eager"})[0] is False


def test_cudnn_sdpa_check_says_it_cannot_run_on_cpu():
    v = verdict(GPU_ONLY)
    assert v.gpu_only_effect and v.cpu_only_skip and v.error is None
    assert any("not reproducible on CPU" in n for n in v.notes)
    assert not v.reproduced and v.exit_code == 1
    c = check(GPU_ONLY)
    assert c.triggers({"torch_version": "2.5.0"})[0] is True and c.triggers({"torch_version": "2.4.0"})[0] is False


def test_cudnn_sdpa_check_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the cuDNN SDPA backend exists only on CUDA")
    v = verdict(GPU_ONLY, device="cuda")
    assert v.error is None and v.fixed
