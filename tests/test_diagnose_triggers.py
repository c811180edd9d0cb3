"""Trigger audit of the curated incidents: a realistic paste of each failure fires the incident's own trigger and
no trigger of an incident in another category that shares the symptom."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.canonical import LOG_FACTS, spec
from kb.conditions import evaluate_trigger
from kb.documents import load_incidents
from kb.facts import extract_facts

REPO = Path(__file__).resolve().parent.parent

# One short paste per incident, written the way a user reports it (command / config / log lines / prose).
PASTES = {
    "chatglm-efficient-tuning-high-lr-loss-zero":
        "python train_sft.py --model_name_or_path THUDM/chatglm2-6b --learning_rate 1e-3\n"
        "{'loss': 2.01, 'learning_rate': 0.001}\n{'loss': 0.0, 'learning_rate': 0.001}",
    "ms-swift-gdpo-nan-reward-advantages":
        "swift rlhf --rlhf_type grpo --scale_rewards gdpo\nmy reward function returns None when the judge API times out\n"
        "{'loss': 0.0, 'grad_norm': nan, 'rewards/acc/mean': nan}",
    "openrlhf-prm-placeholder-token-mismatch-nan":
        "deepspeed --module openrlhf.cli.train_prm --pretrain Qwen/Qwen2.5-Math-7B --placeholder_token ки\nloss: nan",
    "openrlhf-ring-attn-sft-nan":
        "deepspeed --module openrlhf.cli.train_sft --pretrain meta-llama/Llama-3-8B --ring_attn_size 4\nloss=nan on some batches",
    "pytorch-sdpa-fully-masked-padding-row-nan":
        "attn_implementation='sdpa', torch==2.1.0, per_device_train_batch_size=8\n"
        "the padded query rows are fully masked and the loss is nan",
    "deepspeed-chat-rm-left-padding-nan":
        "deepspeed main.py --model_name_or_path bigscience/bloom-1b1 --num_padding_at_beginning 1  # step2 reward model\n"
        "chosen_reward nan, rejected_reward nan, loss: nan",
    "verl-grpo-low-var-kl-nan":
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.actor.kl_loss_type=low_var_kl\n"
        "step:120 - actor/kl_loss:nan - actor/pg_loss:0.02",
    "verl-ppo-micro-batch-exceeds-mini-batch-nan":
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.ppo_mini_batch_size=4 "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16\nstep:1 - actor/pg_loss:nan - actor/grad_norm:nan",
    "transformers-gemma2-flash-attn-nan":
        'model = AutoModelForCausalLM.from_pretrained("google/gemma-2-9b", attn_implementation="flash_attention_2", '
        "torch_dtype=torch.bfloat16)\n{'loss': 2.31, 'grad_norm': nan}",
    "deepspeed-zero2-overlap-comm-buffer-recycle":
        '{"zero_optimization": {"stage": 2, "overlap_comm": true}, "bf16": {"enabled": true}}\n'
        "loss: 11.201002 -> 11.165665 -> nan",
    "nemo-rl-grpo-loo-std-advantage-explosion":
        "GRPO with use_leave_one_out_baseline: true\nNormalized advantages stats: min=-1000000.0000, max=1000000.0000",
    "cppo-grpo-singleton-group-std-nan":
        "GRPOTrainer num_generations=1\nUserWarning: std(): degrees of freedom is <= 0\n{'loss': 0.0, 'reward_std': nan}",
    "trl-kto-unbalanced-batch-nan":
        "KTOTrainer, 2k desirable and 10k undesirable examples, per_device_train_batch_size=2\n{'loss': nan, 'kl': 0.0}",
    "colossalai-pretrain-truncation-nan":
        "continue pretraining: the context is longer than max_length so all labels are -100 and the loss is nan",
    "trl-sft-all-labels-masked-zero-loss":
        "SFTConfig(max_length=256, completion_only_loss=True)\n{'loss': 0.0, 'mean_token_accuracy': 0.0}",
    "trl-simpo-empty-response-nan":
        "CPOConfig(loss_type='simpo', max_length=1024, max_prompt_length=1024)\n{'loss': nan, 'logps/chosen': nan}",
    "ms-swift-zero3-offload-hpz-loss-zero":
        "swift sft --deepspeed zero3_offload\nzero_hpz_partition_size: 8\n{'loss': 0.0, 'grad_norm': 0.0}",
}


@pytest.fixture(scope="module")
def incidents():
    incs, _problems = load_incidents(REPO / "incidents")
    if not incs:
        pytest.skip("no curated incidents in ./incidents")
    return {i.id: i for i in incs}


def _fired(inc, facts) -> list[str]:
    return [t.trigger.id for t in (evaluate_trigger(tr, facts) for tr in inc.triggers) if t.fired]


@pytest.mark.parametrize("inc_id", sorted(PASTES))
def test_realistic_paste_fires_its_incident_and_no_other_category(incidents, inc_id):
    if inc_id not in incidents:
        pytest.skip(f"{inc_id} is not in ./incidents any more")
    facts = extract_facts(PASTES[inc_id])
    inc = incidents[inc_id]
    assert _fired(inc, facts), facts.values()
    others = {o.id: f for o in incidents.values() if o.root_cause.category != inc.root_cause.category
              and (f := _fired(o, facts))}
    assert not others, others


def test_every_incident_has_triggers_over_known_facts(incidents):
    for inc in incidents.values():
        assert inc.triggers, inc.id
        for t in inc.triggers:
            for c in (*t.all, *t.any, *t.none):
                known = spec(c.fact) is not None or c.fact in LOG_FACTS or c.fact in (
                    "prompt_exceeds_max_length", "model_family", "fix_changes", "working_dtype", "gpu_bf16")
                assert known, f"{inc.id}/{t.id}: unknown fact {c.fact}"


def test_reward_model_nan_alone_does_not_mean_left_padding(incidents):
    facts = extract_facts("training a reward model with trl RewardTrainer, loss: nan after 100 steps")
    assert not _fired(incidents["deepspeed-chat-rm-left-padding-nan"], facts)
    facts = extract_facts("reward model training, tokenizer.padding_side = 'left'\nloss: nan")
    assert _fired(incidents["deepspeed-chat-rm-left-padding-nan"], facts)


def test_masked_labels_with_a_length_normalised_loss_is_not_all_labels_masked(incidents):
    facts = extract_facts('loss_type="simpo": the shorter response is truncated to nothing, labels are all -100, '
                          "logps nan")
    for iid in ("trl-sft-all-labels-masked-zero-loss", "colossalai-pretrain-truncation-nan"):
        assert not _fired(incidents[iid], facts)
    assert _fired(incidents["trl-simpo-empty-response-nan"], facts)


def test_a_setting_matched_as_the_incidents_algorithm_is_not_counted_again_from_its_config(incidents):
    from kb.diagnose.engine import _meta_matches

    inc = incidents["trl-reward-lora-fp16-head-nan"]
    assert "algorithm" in inc.config  # the incident names its algorithm twice: as a field and in its config
    shown = [label.lower() for label, _ in _meta_matches(inc, extract_facts("reward model lora loss 1.19e+34"))]
    assert shown.count("algorithm rm") == 1, shown


def test_collapsed_rollouts_point_to_the_kl_estimator_only_in_rl_and_only_weakly_without_a_nan(incidents):
    """Outputs collapsing to "!!!!" is the KL estimator's overflow in an RL run that also went NaN; without a NaN it
    is one cause among several (a vLLM or weight-sync regression does the same: cases gh-verl-project-verl-3308,
    gh-verl-project-verl-6813), and a supervised run has no KL term at all (gh-verl-project-verl-785)."""
    inc = incidents["verl-grpo-low-var-kl-nan"]

    def fired(text):
        return set(_fired(inc, extract_facts(text)))

    rl_nan = fired("verl GRPO run: loss nan at step 120, then every rollout is '!!!!!!!!' repeated. vllm==0.7.3")
    assert "rl-output-collapse" in rl_nan
    rl_only = fired("verl GRPO run: after 100 steps every rollout is '!!!!!!!!' repeated. vllm==0.7.3")
    assert rl_only == {"rl-output-collapse-no-nan"}
    weights = {t.id: t.weight for t in inc.triggers}
    assert weights["rl-output-collapse-no-nan"] < weights["rl-output-collapse"]
    assert not fired("SFT with verl's fsdp_sft_trainer: loss nan at the same step, then the model only generates "
                     "'!!!!!!'")


def test_a_reward_model_with_a_nan_loss_is_not_a_reward_returning_nan():
    for text in ("Training the reward model on BLOOM gave a NaN loss on every step.",
                 "reward-model training on the WebGPT dataset gives NaN loss and metrics"):
        assert "nan_reward" not in extract_facts(text).value("errors", [])
    assert "nan_reward" in extract_facts("the reward model outputs NaN for some prompts").value("errors", [])
