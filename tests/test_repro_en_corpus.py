"""Repro checks of the English-reported incidents, run through the harness: NaN / inf / explosion with the fault,
finite with the fix, and what each check's settings rule says about other settings."""

from __future__ import annotations

import math

import pytest
import torch
from repro_support import check, finite, nan, verdict

from kb.repro.harness import Verdict, cli_main

CPU_CHECKS = ["trl-orpo-log1p-backward-nan", "deepspeed-chat-rm-left-padding-nan",
              "nemo-rl-grpo-loo-std-advantage-explosion", "ms-swift-gdpo-nan-reward-advantages",
              "verl-ppo-micro-batch-exceeds-mini-batch-nan", "miles-ppo-ratio-exp-overflow-nan",
              "unsloth-llama3-untrained-tokens-nan", "llava-fastchat-tokenization-mismatch-zero-loss"]
GPU_ONLY = ["deepspeed-zero2-overlap-comm-multistream-race", "deepspeed-zero2-overlap-comm-buffer-recycle"]


@pytest.mark.parametrize("incident_id", CPU_CHECKS)
def test_check_reproduces_and_fix_holds_on_cpu(incident_id):
    v = verdict(incident_id)
    assert v.error is None, v.notes
    assert v.reproduced and v.fixed and v.confirmed and v.exit_code == 0
    assert v.device == "cpu" and not v.gpu_only_effect


def test_template_that_does_not_fit_the_tokenizer_masks_every_sample_and_the_trainer_logs_zero():
    v = verdict("llava-fastchat-tokenization-mismatch-zero-loss")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["mismatched_samples"] == faulty["samples"] and faulty["supervised_tokens"] == 0
    assert nan(faulty["raw_loss"]) and faulty["logged_loss"] == 0.0  # NaN steps, logged as 0.0 by the HF filter
    assert fixed["mismatched_samples"] == 0 and fixed["supervised_tokens"] > 0
    assert finite(fixed["raw_loss"]) and fixed["logged_loss"] > 0


def test_orpo_bf16_log_prob_rounds_to_zero_and_fp32_log1mexp_is_finite():
    v = verdict("trl-orpo-log1p-backward-nan")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert v.dtype == "bf16" and faulty["chosen_logp"] == 0.0  # true value ~ -7.6e-4, lost to bf16 spacing
    assert nan(faulty["log_odds"]) and nan(faulty["loss"]) and nan(faulty["grad_norm"])
    assert fixed["chosen_logp"] < 0 and finite(fixed["log_odds"]) and finite(fixed["grad_norm"])
    assert v.user_settings_trigger is True


def test_orpo_in_fp32_is_not_triggered_and_fp16_is():
    fp32 = verdict("trl-orpo-log1p-backward-nan", precision="fp32")
    assert fp32.user_settings_trigger is False and fp32.exit_code == 1
    assert fp32.evidence["user"]["chosen_logp"] < 0 and finite(fp32.evidence["user"]["loss"])
    fp16 = verdict("trl-orpo-log1p-backward-nan", precision="fp16")
    assert fp16.user_settings_trigger is True and nan(fp16.evidence["user"]["log_odds"])
    ok, _ = check("trl-orpo-log1p-backward-nan").triggers({"algorithm": "DPO", "precision": "bf16"})
    assert ok is False


def test_reward_model_left_padding_averages_an_empty_slice():
    v = verdict("deepspeed-chat-rm-left-padding-nan")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["padding_side"] == "left" and nan(faulty["loss"])
    assert finite(faulty["loss_right_padded"])  # the same loss code is fine on right padding (OPT)
    assert finite(fixed["loss"]) and fixed["grad_norm"] > 0
    assert v.user_settings_trigger is True


def test_reward_model_padding_side_decides_the_trigger():
    opt = verdict("deepspeed-chat-rm-left-padding-nan", model="facebook/opt-350m")
    assert opt.user_settings_trigger is None and finite(opt.evidence["user"]["loss"])
    right = verdict("deepspeed-chat-rm-left-padding-nan", model="bloom-560m", padding_side="right")
    assert right.user_settings_trigger is False and right.exit_code == 1


def test_leave_one_out_std_zero_and_fp32_residue_explode():
    v = verdict("nemo-rl-grpo-loo-std-advantage-explosion")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["exact_zero_min_peer_std"] == 0.0 and faulty["exact_zero_max_abs_advantage"] >= 1e5
    assert 0 < faulty["residue_min_peer_std"] < 1e-3  # E[x^2]-E[x]^2 in fp32 leaves a residue, not 0
    assert faulty["residue_max_abs_advantage"] >= 1e3
    assert fixed["exact_zero_max_abs_advantage"] <= 1.0 + 1e-6 and fixed["residue_max_abs_advantage"] < 1.0
    assert v.user_settings_trigger is None  # normalize_rewards / leave-one-out are not canonical facts


def test_leave_one_out_trigger_from_logged_huge_advantages():
    c = check("nemo-rl-grpo-loo-std-advantage-explosion")
    settings = c.settings_from_facts({"algorithm": "GRPO", "huge_metrics": ["advantages/max"]})
    assert c.triggers(settings)[0] is True
    assert c.triggers({"algorithm": "DPO"})[0] is False


def test_gdpo_one_nan_reward_poisons_every_advantage():
    v = verdict("ms-swift-gdpo-nan-reward-advantages")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["nan_rewards"] == 1 and faulty["nan_advantages"] == faulty["advantages"] == 8
    assert nan(faulty["loss"]) and nan(faulty["grad_norm"])
    assert fixed["nan_advantages"] == 0 and finite(fixed["loss"]) and finite(fixed["grad_norm"])


def test_verl_micro_batch_above_per_gpu_mini_batch_divides_by_zero():
    v = verdict("verl-ppo-micro-batch-exceeds-mini-batch-nan")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["per_gpu_mini_batch"] == 4 and faulty["micro_batch"] == 8
    assert faulty["gradient_accumulation"] == 0 and math.isinf(faulty["loss"]) and nan(faulty["grad_norm"])
    assert finite(faulty["grad_norm_on_1_gpu"])  # the same micro-batch on one GPU is fine
    assert fixed["gradient_accumulation"] >= 1 and finite(fixed["grad_norm"])


def test_verl_trigger_needs_the_mini_batch_and_follows_the_gpu_count():
    base = {"ppo_mini_batch_size": 8, "rollout_n": 2, "micro_batch_size": 8}
    two = verdict("verl-ppo-micro-batch-exceeds-mini-batch-nan", num_gpus=2, **base)
    assert two.user_settings_trigger is False and finite(two.evidence["user"]["grad_norm"])
    eight = verdict("verl-ppo-micro-batch-exceeds-mini-batch-nan", num_gpus=8, **base)
    assert eight.user_settings_trigger is True and nan(eight.evidence["user"]["grad_norm"])
    ok, why = check("verl-ppo-micro-batch-exceeds-mini-batch-nan").triggers({"num_gpus": 4, "micro_batch_size": 8})
    assert ok is None and "per_gpu_mini_batch_size" in why


def test_ppo_ratio_overflow_inf_times_zero_advantage():
    v = verdict("miles-ppo-ratio-exp-overflow-nan")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["log_ratio_max"] == 120.0 and math.isinf(faulty["max_ratio"])
    assert nan(faulty["loss"]) and nan(faulty["grad_norm"])
    assert fixed["log_ratio_max"] == 20.0 and finite(fixed["max_ratio"]) and finite(fixed["loss"])


def test_untrained_template_rows_cannot_be_learned_with_frozen_embeddings():
    v = verdict("unsloth-llama3-untrained-tokens-nan")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["untrained_tokens_in_batch"] == 3 and faulty["untrained_token_ids"] == "40 41 42"
    assert faulty["eot_logit_abs_max"] == 0.0 and faulty["eot_row_grad_norm"] == 0.0  # pinned, never updated
    assert faulty["eot_loss"] > 1.0 > fixed["eot_loss"]
    c = check("unsloth-llama3-untrained-tokens-nan")
    assert c.triggers({"use_peft": True, "trainable_embeddings": True})[0] is False
    assert c.triggers(c.settings_from_facts({"use_peft": True, "errors": ["untrained_tokens"]}))[0] is True


@pytest.mark.parametrize("incident_id", GPU_ONLY)
def test_gpu_only_check_says_it_cannot_show_the_race_on_cpu(incident_id):
    v = verdict(incident_id)
    assert v.gpu_only_effect and v.cpu_only_skip and v.error is None
    assert any("not reproducible on CPU" in n and "GPU-only effect" in n for n in v.notes)
    assert not v.reproduced and not v.confirmed and v.evidence == {}
    assert v.exit_code == 1  # not confirmed here; the notes say a GPU is needed, nothing is pretended


def test_gpu_only_settings_rules():
    race, recycle = check(GPU_ONLY[0]), check(GPU_ONLY[1])
    assert recycle.triggers({"zero_stage": 2, "overlap_comm": True})[0] is True
    assert race.triggers({"zero_stage": 2, "overlap_comm": True})[0] is None  # also needs a compiled backward
    for c in (race, recycle):
        assert c.triggers({"zero_stage": 2, "overlap_comm": False})[0] is False
        assert c.triggers({"zero_stage": 3, "overlap_comm": True})[0] is False


def test_gpu_only_check_command_line_exits_1_with_the_reason(capsys):
    rc = cli_main(type(check(GPU_ONLY[1])), ["--device", "cpu", "--json", "--no-framework"])
    v = Verdict.model_validate_json(capsys.readouterr().out)
    assert rc == 1 and v.gpu_only_effect and v.cpu_only_skip
    assert any("GPU-only effect" in n for n in v.notes)


@pytest.mark.parametrize("incident_id", GPU_ONLY)
def test_gpu_only_check_on_cuda(incident_id):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the stream race needs CUDA streams and the caching allocator")
    v = verdict(incident_id, device="cuda")
    assert v.error is None and v.reproduced and v.fixed
    assert v.evidence["fixed"]["bad_runs"] == 0 and v.evidence["faulty"]["bad_runs"] >= 1
