"""Fact extraction from pastes: each log format, config format and framework command line, with evidence."""

from __future__ import annotations

import json

import pytest

from kb.errors import InputError, InputTooLarge
from kb.facts import extract_facts, mask_line


def values(text: str) -> dict:
    return extract_facts(text).values()


# --- logs ----------------------------------------------------------------------------------------------------
def test_hf_trainer_dict_lines_give_nan_metrics_and_first_bad_step():
    log = ("{'loss': 1.0431, 'grad_norm': 42.09, 'learning_rate': 1e-06, 'rewards/chosen': 0.0, 'kl': 0.0, 'epoch': 0.0}\n"
           "{'loss': nan, 'grad_norm': 41.94, 'learning_rate': 2e-06, 'rewards/rejected': nan, 'kl': 0.0, "
           "'logps/rejected': nan, 'epoch': 0.0}")
    f = extract_facts(log)
    assert {"loss", "rewards/rejected", "logps/rejected"} <= set(f.value("nan_metrics"))
    assert f.value("first_bad_step") == 2
    assert f.get("first_bad_step").line == 2 and f.get("first_bad_step").kind == "log"
    assert "zero_metrics" not in f  # rewards 0.0 at step 1 is not a collapse


def test_huge_loss_then_zero_on_one_line():
    f = values("logs show 'loss': 1.19e+34, 'grad_norm': nan, then 'loss': 0.0 with nan metrics.")
    assert f["huge_metrics"] == ["loss"] and f["zero_metrics"] == ["loss"] and "grad_norm" in f["nan_metrics"]


@pytest.mark.parametrize("line, metric", [
    ("step:12 - actor/kl_loss:nan - actor/pg_loss:0.12 - critic/score/mean:0.5", "actor/kl_loss"),  # verl
    ("step 13 | loss nan | grad_norm nan", "grad_norm"),
    (" 30%|###  | 30/100 [00:10<00:20, loss=nan, grad_norm=3.2]", "loss"),  # tqdm / OpenRLHF postfix
    ('{"loss": 1.2, "nll_loss": NaN, "global_step": 7}', "nll_loss"),  # ms-swift jsonl
    ("{'loss': 0.61, 'grad_norm': inf, 'learning_rate': 5e-05, 'epoch': 0.1}", "grad_norm"),  # LLaMA-Factory
])
def test_metric_line_formats(line, metric):
    assert metric in values(line)["nan_metrics"]


def test_markdown_table_of_a_metric():
    f = values("| Step | grad_norm |\n|---|---|\n| 0 | 23068.8 |\n| 1 | 24.89 |\n| 4 | NaN |\n| 5 | NaN |")
    assert f["nan_metrics"] == ["grad_norm"] and f["first_bad_step"] == 4 and f["huge_metrics"] == ["grad_norm"]


@pytest.mark.parametrize("text, err", [
    ("RuntimeError: probability tensor contains either `inf`, `nan` or element < 0", "prob_tensor_invalid"),
    ("RuntimeError: Function 'Log1PBackward0' returned nan values in its 0th output.", "log1p_backward_nan"),
    ("[2024-01-01 10:00:00] [INFO] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536", "ds_overflow"),
    ("Exception: Current loss scale already at minimum - cannot decrease scale anymore.", "loss_scale_min"),
    ("ValueError: Unsloth: Untrained tokens found, but embed_tokens & lm_head not trainable", "untrained_tokens"),
    ("发现label全为-100 导致nll_loss为nan", "labels_all_masked"),
    # Unsloth's own message (train_on_responses_only when no response marker is found or samples are cut)
    ("ZeroDivisionError: Unsloth: All labels in your dataset are -100. Training losses will be all 0.",
     "labels_all_masked"),
    ("WARNING: tokenization mismatch: 132 vs. 124. (ignored)", "tokenization_mismatch"),
    ("torch.backends.cuda.enable_cudnn_sdp(False)", "cudnn_sdp"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
    ("ModuleNotFoundError: No module named 'flash_attn'", "import_error"),
    ("ValueError: Attempting to unscale FP16 gradients.", "dtype_crash"),
    ("RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::Half != float", "dtype_crash"),
    ("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     "dtype_crash"),
])
def test_known_error_strings(text, err):
    f = extract_facts(text)
    assert err in f.value("errors")
    assert f.evidence_for("errors", err).line == 1


def test_out_of_memory_is_a_word_not_the_end_of_bloom():
    assert "cuda_oom" in extract_facts("step 40: OOM, reduced the batch size").value("errors")
    assert "cuda_oom" in extract_facts("训练时 oom 了").value("errors")
    for text in ("reward model on bloom-560m gives NaN loss", "训练 BLOOM 时 loss 不降", "no room for the response"):
        assert "cuda_oom" not in (extract_facts(text).value("errors") or [])


def test_a_lone_nan_metric_is_read_and_a_lone_setting_or_an_infinite_limit_is_not():
    f = values("training went wrong after step 3\ngrad_norm=nan\n'loss': inf,")
    assert set(f["nan_metrics"]) == {"grad_norm", "loss"} and "nan" in f["symptom"] and "inf" in f["symptom"]
    quiet = values("max_grad_norm: inf\nclip_ratio=inf\nlearning_rate: 2e-5\nloss_type: sigmoid")
    assert "nan_metrics" not in quiet
    assert values("minibatch_loss=nan")["nan_metrics"] == ["minibatch_loss"]  # "min" as a word only


def test_lightning_precision_strings_name_compute_and_weights():
    got = values("python finetune/adapter.py --precision 16-true")
    assert got["precision"] == "fp16" and got["weights_dtype"] == "fp16"
    assert values('fabric = L.Fabric(precision="bf16-mixed")') == {"precision": "bf16"}
    assert values("fine-tuning Falcon-7B with 16-true precision on V100, loss nan")["weights_dtype"] == "fp16"
    assert values("loss nan with 16-true; switched to 16-mixed and it trained fine")["weights_dtype"] == "fp16"
    assert "weights_dtype" not in values("loss nan with 16-mixed; switched to bf16-true and it trained fine")


def test_a_dtype_the_gpu_cannot_use_is_not_the_runs_precision():
    f = values("全参 SFT loss 为 nan，显卡是 V100，用不了 bf16。")
    assert "precision" not in f and f["gpu_bf16"] is False
    assert values("my T4 doesn't support bf16, so training runs in fp16")["precision"] == "fp16"


def test_the_model_a_run_starts_from_is_not_its_algorithm():
    # "SFT 过的 / the SFT model / after SFT" says where the checkpoint came from; the run is the RL or preference one
    assert "algorithm" not in values("ms-swift 用 SAPO 训练 SFT 过的 Qwen3.5-4B，loss 一直是 0")
    assert values("用 SFT 后的模型做 PPO，kl 变成 nan")["algorithm"] == "PPO"
    assert values("after SFT, the DPO loss is nan")["algorithm"] == "DPO"
    for sft in ("swift sft --model qwen2-7b, loss nan", "SFTTrainer loss 0", "SFT 训练 loss 为 0", "SFT 过程中 loss 为 nan"):
        assert values(sft)["algorithm"] == "SFT", sft


def test_a_huge_loss_said_in_words_is_a_symptom():
    assert values("the loss jumped to 153318 at step 40")["huge_metrics"] == ["loss"]
    assert values("loss 突然变成 1e5")["symptom"] == ["huge"]
    assert values("reward model lora loss 1.19e+34 grad_norm nan")["huge_metrics"] == ["loss"]
    assert values("grad_norm reached 250000")["huge_metrics"] == ["grad_norm"]
    # a plain training loss in the hundreds is far above ln(vocabulary size): a symptom as well
    assert values("微调 MiniCPM 时首步 loss 高达 500 多")["huge_metrics"] == ["loss"]
    assert values("the training loss starts at 800 and never drops")["symptom"] == ["huge"]
    for calm in ("the loss of 10000 samples", "max_grad_norm 100000", "loss at step 12000 is 2.1",
                 "we trained for 20000 steps and the loss is 2.1", "loss 从约 3000 开始下降",
                 "value loss is 300", "loss of 100 steps", "loss 2.3 at step 500", "loss: 120 tokens"):
        assert "huge_metrics" not in values(calm), calm
    # group-normalised advantages are z-scores: one in the hundreds means a group std near zero
    assert values("normalized advantages of -1,000,000 and +1,000,000")["huge_metrics"] == ["advantages"]
    assert values("the odd sample's advantage spikes to about -2075")["symptom"] == ["huge"]
    for calm in ("advantages mean 0.01 std 1.0 max 2.3", "advantage of 1000 samples",
                 "the advantages were computed over 512 prompts", "the advantage is not 1000"):
        assert "huge_metrics" not in values(calm), calm


def test_a_model_held_in_half_precision_is_its_weights_dtype():
    assert values("Qwen1.5-7B-Chat (model run in float16), loss nan from the second step")["weights_dtype"] == "fp16"
    assert values("the model is kept in fp16 and trained with AdamW")["weights_dtype"] == "fp16"
    assert values("after loading the checkpoint weights as float16, the loss became NaN")["weights_dtype"] == "fp16"
    assert values("fine-tuning Gemma-7B-it with the weights loaded in fp16 gives NaN loss")["weights_dtype"] == "fp16"
    assert "weights_dtype" not in values("loading the model in fp16 for inference is fine; training runs in bf16")
    assert "weights_dtype" not in values("the model trains in bf16 and the loss is nan at step 40")
    # "trained in fp16" is how people say mixed precision: the compute dtype, not where the weights live
    assert "weights_dtype" not in values("the model was trained in fp16 and the loss went nan")


def test_a_spike_and_a_lower_learning_rate_said_in_words():
    f = values("LLaMA2-7B 微调，loss 陡增后变为 0")
    assert f["spike_metrics"] == ["loss"] and "collapse" in f["symptom"]
    assert values("the training loss suddenly shot up in epoch 3")["spike_metrics"] == ["loss"]
    assert "spike_metrics" not in values("no spike in the loss, it just plateaus")
    assert "spike_metrics" not in values("the loss does not spike, it slowly goes to nan")
    assert "spike_metrics" not in values("loss 没有突增，直接变成 nan")
    # the metric after the word, and a jump "by orders of magnitude"
    f = values("TRL PPO examples show sudden huge spikes in the policy loss")
    assert f["spike_metrics"] == ["loss"] and "collapse" in f["symptom"]
    assert values("the policy loss now and then jumps by orders of magnitude")["spike_metrics"] == ["loss"]
    assert values("we saw spikes in the grad_norm before it broke")["spike_metrics"] == ["grad_norm"]
    assert "spike_metrics" not in values("there were no spikes in the loss at all")
    assert "spike_metrics" not in values("spikes in the reward are normal for this task")


def test_a_trainer_and_rollout_that_disagree_on_log_probs_is_a_divergence():
    said = ["the logged training-vs-rollout log-prob difference stayed very large",
            "the metric vllm_vs_local_logprob_diff_mean kept rising over training", "训推不一致，logprob 差异很大"]
    for text in said:
        assert values(text)["symptom"] == ["rollout_mismatch"], text
    assert "symptom" not in values("there was no large logprob gap between the trainer and vllm")
    assert "symptom" not in values("the logprob of the chosen responses rose during DPO")
    f = values("把学习率提高到 5e-3 后 loss 直接为 nan，降到 2e-5 后训练正常下降")
    assert f["fix_changes"] == ["learning_rate=lower"] and f["learning_rate"] == 5e-3
    assert values("LoRA with a learning rate of 2e-4, loss nan after 300 steps")["learning_rate"] == 2e-4
    assert "learning_rate" not in values("switched the lr to 1e-5 and it trains fine")
    assert values("--learning_rate 1e-5\nbefore, learning rate was 1e-3")["learning_rate"] == 1e-5  # the setting wins


def test_a_release_the_failure_depends_on():
    assert values("ChatGLM3 LoRA loss 一直为 0\n把 peft 降到 0.6.0 后 loss 恢复正常")["version_evidence"] == \
        "rolled back to peft 0.6.0"
    assert values("deepspeed==0.12.2 (bad), 0.11.1 (good)")["version_evidence"] == "deepspeed 0.12.2 fails"
    assert values("transformers 4.48 下 loss 居高不下，4.51 则正常")["version_evidence"] == "transformers 4.51 works"
    assert values("NaN right after the first step, starting with transformers 4.21.0")["version_evidence"] == \
        "changed with the upgrade to transformers 4.21.0"
    assert values("After upgrading transformers from 4.45 to 4.46 the loss is nan")["version_evidence"] == \
        "changed with the upgrade to transformers 4.46"
    assert values("训练一个 epoch 后 loss 变成 0，几天前的代码还正常")["version_evidence"] == "an older release worked"
    # A loss that decreases, a metric that is fine, and a rollback that did not help say nothing about a release.
    for text in ("loss 从 -0.6 降到 -0.9 以下", "loss 1.5 正常", "step 100 loss 0.5 fine",
                 "I downgraded transformers to 4.30 but the loss is still nan", "python 3.10 works"):
        assert "version_evidence" not in values(text), text


def test_metrics_named_together_and_a_zero_gradient_norm():
    f = values("swift GRPO 训练中 loss 和 grad_norm 一直为 0")
    assert f["zero_metrics"] == ["loss"] and set(f["symptom"]) == {"zero_loss", "zero_grad"}
    assert set(values("loss、grad_norm 都是 nan")["nan_metrics"]) == {"loss", "grad_norm"}
    assert values("loss and grad norm stay at 0")["zero_metrics"] == ["loss"]  # a two-word metric after "and"
    assert values("the loss and the gradient norm are nan")["nan_metrics"] == ["loss", "grad_norm"]
    assert values("the logged grad_norm was zero")["symptom"] == ["zero_grad"]
    assert "zero_grad" in values('{"loss": -0.0, "grad_norm": 0.0, "kl": 0.0}')["symptom"]
    assert "symptom" not in values("loss 和 acc 正常, grad_norm 1.2")


def test_an_evaluation_loss_named_in_prose_is_the_eval_loss():
    f = values("llama-recipes fine-tuning: evaluation loss is nan while training loss is fine")
    assert f["nan_metrics"] == ["eval_loss"]
    assert values("训练 loss 正常下降，验证集 loss 为 nan")["nan_metrics"] == ["eval_loss"]
    assert values("val loss becomes nan after epoch 2")["nan_metrics"] == ["eval_loss"]
    assert values("the loss is nan at step 3")["nan_metrics"] == ["loss"]
    assert values("at some intervals loss nan")["nan_metrics"] == ["loss"]  # "val" inside a word is not one


def test_a_loss_that_climbs_instead_of_falling_is_a_divergence():
    for text in ("用张量并行训练 BLOOM 时 loss 不降反升", "grad_norm 越来越大",
                 "the logged gradient norm rose abnormally with ZeRO-0", "the loss keeps growing after step 1000"):
        assert "collapse" in values(text).get("symptom", []), text
    assert "symptom" not in values("the eval accuracy keeps growing")
    # said only in numbers: the loss climbs back to three times the low it had reached
    for text in ("the loss first fell from 4.31 to 1.44 by step 20, then rose to 7.08, 15.06 and 16.02",
                 "loss falls to ~0.8 then climbs to ~6.2 and oscillates", "loss 降到 0.8 后又升到 6"):
        assert values(text)["symptom"] == ["collapse"], text
    for calm in ("loss dropped to 1.2 then rose to 1.5", "loss fell to 0.5 at step 100 and the lr increased to 3e-4",
                 "loss fell to 0.5 and the grad norm increased to 30", "loss fell to 1.0 at step 100, we increased to 1000 steps"):
        assert "symptom" not in values(calm), calm
    # A symptom said to be absent is not a symptom.
    assert "symptom" not in values("loss flat at 1.4 after 300 steps. No errors, no nan. Is this expected?")
    assert "symptom" not in values("没有出现 nan，loss 不下降")
    assert "symptom" not in values("loss 每个 epoch 开头骤降，没有报 nan") and "symptom" not in values("loss drops each epoch, not reported nan")
    assert values("the loss is nan after 100 steps, no inf")["symptom"] == ["nan"]


def test_a_loss_said_to_be_a_number_starting_with_zero_is_not_a_zero_loss():
    # "the loss is 0.5" is a loss of one half; "the loss is 0" and "loss becomes zero" are the symptom.
    for calm in ("the loss is 0.5 after an epoch", "loss becomes 0.69", "loss drops to 0.3 and stays",
                 "a loss of 0.6931 at step 1 is expected"):
        assert "zero_loss" not in values(calm).get("symptom", []), calm
    for text in ("loss is 0 from step 2", "loss becomes zero", "the loss is 0, grad_norm nan"):
        assert "zero_loss" in values(text)["symptom"], text


def test_a_lower_learning_rate_that_worked_is_the_fix_not_the_setting():
    v = values("默认超参（学习率 5e-5）GRPO 后策略坍塌；把学习率改成 1e-6 后训练稳定收敛。")
    assert v["learning_rate"] == 5e-5 and v["fix_changes"] == ["learning_rate=lower"]
    # a higher rate that worked is no "lower the learning rate"; with no rate of the run known, nothing is said
    assert "fix_changes" not in values("lr=1e-4 diverged; lr set to 5e-4 trained stably")
    assert "fix_changes" not in values("with lr set to 1e-5 it trains fine")


def test_a_pairwise_loss_that_cannot_separate_the_pair_is_a_collapse():
    # Chosen and rejected scored alike pin the pairwise loss at ln 2 = 0.693.
    for text in ("Bradley-Terry reward model gives the same score for chosen and rejected",
                 "训练 reward model 时 chosen 和 rejected 的分数一样", "RM training loss stuck at 0.693 from the start"):
        assert values(text)["symptom"] == ["collapse"], text
    assert "symptom" not in values("the reward model loss started at 0.693 and fell to 0.45")


def test_environment_dump():
    f = values("ms-swift=v3.1.0\ndeepspeed==0.14.0\ntorch==2.3.1\nPyTorch version: 2.5.0-rc10\n"
               "flash-attn==2.6.1\nGPU 0: Tesla V100-SXM2-32GB")
    assert f["framework"] == "ms-swift" and f["framework_version"] == "3.1.0"
    assert f["deepspeed_version"] == "0.14.0" and f["flash_attn_version"] == "2.6.1"
    assert f["gpu"] == "V100" and f["gpu_bf16"] is False


def test_masking_makes_two_users_lines_equal():
    a = "[rank6]: 2024-05-01 10:11:12 step 120 loss 1.2e+34 at /home/a/x.py:88 ptr 0x7f3a"
    b = "[rank0]: 2025-01-09 01:02:03 step 7 loss 3.5 at /data/b/y.py:12 ptr 0x1"
    assert mask_line(a) == mask_line(b)
    assert "<NUM>" in mask_line(a) and "<PATH>" in mask_line(a)


# --- configs -------------------------------------------------------------------------------------------------
def test_deepspeed_json_config():
    cfg = json.dumps({"fp16": {"enabled": True, "loss_scale": 0}, "zero_optimization": {"stage": 2,
                                                                                       "overlap_comm": True}}, indent=2)
    f = extract_facts(cfg, source="config")
    assert f.value("precision") == "fp16" and f.value("zero_stage") == 2 and f.value("overlap_comm") is True
    assert f.get("zero_stage").kind == "config" and f.get("zero_stage").line == 7


def test_fp16_auto_says_nothing():
    assert "precision" not in values('{"fp16": {"enabled": "auto"}, "bf16": {"enabled": false}}')


def test_yaml_config_llamafactory():
    f = values("model_name_or_path: Qwen/Qwen2-7B\nstage: dpo\npref_loss: simpo\ncutoff_len: 2048\n"
               "fp16: true\ndeepspeed: examples/deepspeed/ds_z3_config.json\n")
    assert f["algorithm"] == "DPO" and f["loss_type"] == "simpo" and f["max_length"] == 2048
    assert f["precision"] == "fp16" and f["zero_stage"] == 3


def test_python_config_call_and_dtype():
    f = values('training_args = ORPOConfig(\n    per_device_train_batch_size=16,\n    bf16=True,\n'
               '    max_length=1024,\n    max_prompt_length=384,\n    learning_rate=2e-5,\n)\n'
               'model = AutoModelForCausalLM.from_pretrained("google/gemma-2-9b", attn_implementation='
               '"flash_attention_2", torch_dtype=torch.float16)')
    assert f["precision"] == "bf16" and f["weights_dtype"] == "fp16" and f["learning_rate"] == 2e-5
    assert f["attn_implementation"] == "flash_attention_2" and f["model_family"] == "gemma2"


def test_model_half_call():
    assert values("model = model.half()\ntrainer.train()")["weights_dtype"] == "fp16"


def test_broken_yaml_and_truncated_json_still_read_line_by_line():
    f = extract_facts('{\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_comm": true', source="config")
    assert f.value("zero_stage") == 2 and any("JSON" in w for w in f.warnings)


# --- command lines -------------------------------------------------------------------------------------------
def test_swift_rlhf_command():
    f = values("CUDA_VISIBLE_DEVICES=0,1,2,3 NPROC_PER_NODE=4  swift rlhf --model /m/Qwen2.5-7B --rlhf_type dpo "
               "--max_length 8192 --sequence_parallel_size 4 --rpo_alpha 1.0")
    assert f["framework"] == "ms-swift" and f["algorithm"] == "DPO" and f["sequence_parallel_size"] == 4
    assert f["num_gpus"] == 4 and f["rpo_alpha"] == 1.0 and f["sequence_parallel"] is True


def test_openrlhf_deepspeed_script_with_continuations():
    cmd = ("deepspeed --num_gpus 8train_kto.py \\\n     --micro_train_batch_size 2 \\\n     --max_len 8192 \\\n"
           "     --zero_stage 3 \\\n     --vanilla_loss")
    f = extract_facts(cmd)
    assert f.value("algorithm") == "KTO" and f.value("framework") == "OpenRLHF" and f.value("vanilla_loss") is True
    assert f.value("micro_batch_size") == 2 and "num_gpus" not in f and f.get("vanilla_loss").line == 1


def test_llamafactory_and_accelerate_and_verl():
    f = values("CUDA_VISIBLE_DEVICES=3 python src/train_bash.py --stage sft --finetuning_type lora --fp16")
    assert f["framework"] == "LLaMA-Factory" and f["algorithm"] == "SFT" and f["precision"] == "fp16"
    assert values("accelerate launch --mixed_precision fp16 train.py")["precision"] == "fp16"
    f = values("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo actor_rollout_ref.actor.use_kl_loss=True "
               "actor_rollout_ref.actor.kl_loss_type=low_var_kl")
    assert f["framework"] == "verl" and f["algorithm"] == "GRPO" and f["use_kl_loss"] is True
    assert f["kl_estimator"] == "k3"
    assert values("llamafactory-cli train examples/train_lora/llama3_lora_dpo.yaml")["framework"] == "LLaMA-Factory"
    assert values("xtuner train internlm2_chat_7b_qlora_sft.py")["framework"] == "xtuner"


# --- prose ---------------------------------------------------------------------------------------------------
def test_chinese_prose_precision_and_what_worked():
    f = values("使用qwen2、fp16 进行sft全参数微调的时候，有些token会输出nan, 导致loss为0。bf16 and fp32 is correct, "
               "however, V100 do not support bf16")
    assert f["precision"] == "fp16" and f["working_dtype"] == "bf16" and f["zero_metrics"] == ["loss"]
    assert f["gpu_bf16"] is False


def test_prose_metrics_in_both_languages():
    assert values("nll_loss一直为nan")["nan_metrics"] == ["nll_loss"]
    assert values("训练都异常，具体表现为acc为nan")["nan_metrics"] == ["acc"]
    f = values("loss and grad_norm will be nan at step 2")
    assert {"loss", "grad_norm"} <= set(f["nan_metrics"])


@pytest.mark.parametrize(("text", "symptoms"), [
    ("the FSDP loss drops very slowly. No NaN or inf appears.", None),  # a case-base plateau report's words
    ("no nan, inf or overflow in the log", None),
    ("neither nan nor inf", None),
    ("没有出现 nan 或 inf", None),
    ("loss is nan or inf", ["nan", "inf"]),
    ("not nan but inf", ["inf"]),
    ("loss 为 nan，没有 inf", ["nan"]),
])
def test_a_negation_reaches_along_a_list_of_symptom_words(text, symptoms):
    assert values(text).get("symptom") == symptoms


@pytest.mark.parametrize(("text", "symptoms"), [
    # an issue form's "Expected behavior": what should have happened is no symptom
    ("### Expected behavior\n\nThe loss should not become nan or 0, grad_norm should stay finite.", None),
    ("grad_norm shouldn't be inf", None),
    ("loss 不应该出现 nan", None),
    ("Expected: loss should decrease. Actual: loss is nan", ["nan"]),
    ("loss nan at step 30; it should not happen", ["nan"]),
])
def test_what_should_not_happen_is_no_symptom(text, symptoms):
    assert values(text).get("symptom") == symptoms


# Settings a paste states without using them (real pastes of the case base: a pip pin, a switch set off, the
# library an ms-swift full fine-tune names as its tuner backend, an environment dump's package list).
@pytest.mark.parametrize(("text", "want", "absent"), [
    ("deepspeed==0.10.3\ntorch==2.1.0+cu118", {"deepspeed_version": "0.10.3"}, ["deepspeed_config"]),
    ("swift sft --tuner_backend peft --train_type full --torch_dtype float32 --fp16 false",
     {"finetuning_type": "full", "weights_dtype": "fp32", "precision": "fp32"}, ["use_peft"]),
    ("python train.py --fp16 false --bf16 true", {"precision": "bf16"}, []),
    ("python train.py --vanilla_loss x.py", {"vanilla_loss": True}, []),
    ("--flash_attn False", {}, ["attn_implementation"]),
    ("flash_attn: auto", {}, ["attn_implementation"]),
    ("--flash_attn disable", {}, ["attn_implementation"]),
    ("use_flash_attn=False", {}, ["attn_implementation"]),
    ("flash_attn: disabled", {"attn_implementation": "eager"}, []),
    ("--flash_attn fa2", {"attn_implementation": "flash_attention_2"}, []),
    ("- PEFT version: 0.12.0", {"peft_version": "0.12.0"}, ["use_peft"]),
    ("peft==0.12.0", {"peft_version": "0.12.0"}, ["use_peft"]),
    ("LoRA fine-tuning with peft, the loss is nan", {"use_peft": True}, []),
])
def test_a_setting_stated_but_not_used_is_not_a_fact_of_the_run(text, want, absent):
    f = values(text)
    assert {k: f.get(k) for k in want} == want
    assert not set(absent) & set(f), {k: f[k] for k in absent if k in f}


# Found by `scripts/fact_audit.py` (facts read from a report against what the case's collector recorded from the
# whole thread): the run compared with another setup, a stage of the recipe that went through, a hardware figure,
# the rest of an env-dump line, a word after a kernel's name. Each text is a case-base report's shape.
@pytest.mark.parametrize(("text", "want", "absent"), [
    ("Full-parameter fine-tuning with FSDP made the loss collapse to 0; the same script with LoRA trained normally.",
     {"finetuning_type": "full"}, ["use_peft"]),
    ("MiniCPM-V 2.0 用 ZeRO-3 全量微调报错，LoRA 微调正常", {"finetuning_type": "full"}, ["use_peft"]),
    ("Full fine-tuning Gemma crashed; LoRA and QLoRA runs were not affected.", {"finetuning_type": "full"},
     ["use_peft"]),
    ("LoRA fine-tuning gives NaN; full fine-tuning works.", {"use_peft": True}, ["finetuning_type"]),
    ("LoRA 微调 loss 开始正常，后来 nan", {"use_peft": True}, []),  # named alone, LoRA is the run's
    ("全参数微调 loss 为 nan", {"finetuning_type": "full"}, ["use_peft"]),
    ("Pretraining looked normal, but the fine-tuning stage showed a training loss of 0.", {"algorithm": "SFT"}, []),
    ("预训练阶段正常，微调阶段 loss 为 0", {"algorithm": "SFT"}, []),
    ("SFT went fine, then DPO gives nan", {"algorithm": "DPO"}, []),
    ("pretraining loss spikes", {"algorithm": "pretrain"}, []),
    ("GPU: NVIDIA GeForce RTX 3060 Laptop GPU | Peak FLOPS (BF16): inf", {"gpu": "RTX 3060"},
     ["symptom", "precision"]),
    ("GPU: nVidia A6000 (the Ampere one)", {"gpu": "A6000"}, []),
    ("mfu: nan", {}, ["symptom"]),
    ("loss: inf", {"symptom": ["inf"]}, []),  # inf only: no NaN was reported
    ("Sliding-window models with flash attention: training loss wrong", {"attn_implementation": "flash_attention_2"},
     []),
    ("attention: training", {}, ["attn_implementation"]),
    ("attn_impl: triton", {"attn_implementation": "triton"}, []),
    ("hit it with attn_implementation flash_attention_2.", {"attn_implementation": "flash_attention_2"}, []),
    ("训练集 loss 正常下降，但验证集上的 loss 和 PPL 都是 nan。", {"nan_metrics": ["eval_loss", "ppl"]}, []),
    ("the validation set's loss is nan", {"nan_metrics": ["eval_loss"]}, []),
    # a dtype's verdict is said in its own part of the sentence; "fine-tuning" is no "fine"
    ("Gradient norm keeps growing with ZeRO-0 + bf16, normal with ZeRO-1/2/3", {"precision": "bf16"},
     ["working_dtype"]),
    ("LoRA bf16 fine-tuning of gemma-4 with Unsloth gives nan", {"precision": "bf16"}, ["working_dtype"]),
    ("LoRA fine-tuning on Apple silicon (bf16) produced NaN", {"precision": "bf16"}, ["working_dtype"]),
    ("用 fp16 训练 loss nan，换成 bf16 就正常了", {"precision": "fp16", "working_dtype": "bf16"}, []),
    ("fp16 时 grad_norm 为 nan，bf16 正常", {"precision": "fp16", "working_dtype": "bf16"}, []),
    ("With bf16, it works.", {"working_dtype": "bf16"}, ["precision"]),
])
def test_what_the_audit_found_is_read_as_the_run(text, want, absent):
    f = values(text)
    got = {k: sorted(f[k]) if isinstance(f.get(k), list) else f.get(k) for k in want}
    assert got == {k: sorted(v) if isinstance(v, list) else v for k, v in want.items()}
    assert not set(absent) & set(f), {k: f[k] for k in absent if k in f}


# Symptoms said in a report's title alone (issue 11's "short reports"): each text is the shape of a case-base title
# that `kb eval --cv`'s title-only row had answered "nothing went NaN, inf or zero" (found by reading those rows).
@pytest.mark.parametrize(("text", "symptom"), [
    ("V100 上 chatglm2-6b 4bit 量化 LoRA 微调，loss 从头到尾都是 0.0", "zero_loss"),
    ("GKDTrainer reports 0 loss", "zero_loss"),
    ("LLaVA-style fine-tuning with DeepSpeed ZeRO-2 - loss normal at first, then suddenly 0", "zero_loss"),
    ("QLoRA on a pre-quantized 4-bit model: loss starts ~7-11, then 0.000000 from step 4", "zero_loss"),
    ("pretraining and fine-tuning loss stays at 0 with all-zero image tensors", "zero_loss"),
    ("bf16 FSDP2: finite loss, non-finite grad norm, half the steps skipped", "nan"),
    ("verl RL on non-Hopper GPUs with vLLM rollouts: actor grad-norm explosion", "collapse"),
    ("扩充词表后用 fp16 继续预训练，一段时间后 loss 突刺且不再收敛", "collapse"),
    ("bf16 fine-tune - loss jumps sharply after the first update", "collapse"),
    ("metrics flat for 100 steps, then KL diverges and the loss goes nan", "collapse"),
    ("training divergence after 2k steps", "collapse"),
    ("the agentic example gives all-zero advantages, so the policy gets no learning signal", "zero_grad"),
    ("所有样本得分都是 -1、优势全为 0", "zero_grad"),
    ("loss 飞了", "collapse"), ("训练到一半 loss 直接炸了", "collapse"), ("loss 飙到几万", "huge"),
])
def test_a_symptom_said_in_a_short_title(text, symptom):
    assert symptom in values(text).get("symptom", [])


@pytest.mark.parametrize("text", [
    "fused linear cross entropy stops with ZeroDivisionError when a sample has no non-ignored labels",
    "it happens when the sample has no labels other than the ignore index",
])
def test_a_sample_with_no_label_left_said_in_words_is_the_masked_labels_error(text):
    assert "labels_all_masked" in values(text).get("errors", [])


@pytest.mark.parametrize(("text", "symptom"), [
    ("the loss is 2.5 then 0.5", "zero_loss"), ("no non-finite values in the log", "nan"),
    ("clip_grad_norm_(error_if_nonfinite=True)", "nan"), ("advantages are all 0.5", "zero_grad"),
    ("the loss stays at 0.693", "zero_loss"), ("step 0 loss 2.31", "zero_loss"),
    ('negative KL and the "KL divergence is starting to become negative" warning', "collapse"),
    ("Both give identical results. Nothing diverged.", "collapse"),
    ("显存爆了", "collapse"), ("the loss quickly becomes 0.5", "zero_loss"),
])
def test_words_near_a_symptom_that_say_none(text, symptom):
    assert symptom not in values(text).get("symptom", [])


@pytest.mark.parametrize(("text", "key", "name"), [
    ("训练到某一步后 kl 指标变为 NaN", "nan_metrics", "kl"),
    ("kl 变成了 nan", "nan_metrics", "kl"),
    ("the kl divergence goes to NaN", "nan_metrics", "kl"),
    ("训练 loss 在第 300 步后变为 nan", "nan_metrics", "loss"),
    ("loss 在几步之后变为 nan", "nan_metrics", "loss"),
    ("the loss suddenly becomes nan", "nan_metrics", "loss"),
    ("loss 变成了 0", "zero_metrics", "loss"),
    ("loss 很快就降到 0", "zero_metrics", "loss"),
    ("the loss quickly drops to 0", "zero_metrics", "loss"),
])
def test_prose_metric_with_words_of_time_or_speed_between(text, key, name):
    assert name in values(text).get(key, [])


@pytest.mark.parametrize(("text", "name"), [
    ("Unsloth MLX distributed evaluation reports NaN eval loss on every rank", "eval_loss"),
    ("the evaluation loss came out NaN on every rank", "eval_loss"),
    ("RL training of the Moonlight model produced a NaN gradient norm", "grad_norm"),
    ("Fine-tuning an LLM on Dolly-15k produces NaN training loss", "loss"),
    ("some examples gave NaN losses", "loss"),
])
def test_a_bad_value_said_before_its_metric(text, name):
    assert name in values(text).get("nan_metrics", [])


@pytest.mark.parametrize("text", ["the loss quickly becomes NaN", "it is normal at first, then nan",
                                  "apply nan checks", "accelerate nan"])
def test_words_that_merely_contain_a_metric_name_are_no_metric(text):
    assert not {"quickly", "normal", "apply", "accelerate"} & set(values(text).get("nan_metrics", []))


@pytest.mark.parametrize("text", ["there is no NaN loss at all", "there is no nan in the loss"])
def test_a_bad_value_before_its_metric_said_absent(text):
    assert "nan_metrics" not in values(text)


@pytest.mark.parametrize("text", ["loss 没有变成 nan", "the loss did not drop to 0", "loss 降到 0.05",
                                  "loss is fine but grad_norm is nan", "loss 先降到 0.3 然后变成 nan"])
def test_prose_metric_gap_with_a_negation_another_metric_or_a_value_is_not_read(text):
    f = values(text)
    assert "loss" not in f.get("nan_metrics", []) and "loss" not in f.get("zero_metrics", [])


def test_fix_context_is_not_the_failing_setting():
    f = values("the reason was using the model in fp16 precision. When I changed it to `torch_dtype=torch.float32` "
               "in model creation it trained")
    assert f["weights_dtype"] == "fp16" and f["working_dtype"] == "fp32"


def test_output_collapse_and_sequence_parallel_prose():
    assert values("the output is filled with exclamation marks")["output_collapse"] is True
    assert values("completion 的采样结果全部为“！”，如下图")["output_collapse"] is True  # quoted, full width
    assert values("生成的内容是！！！！！！")["output_collapse"] is True
    assert "output_collapse" not in values("训练完成了！效果不错！")
    assert values("for ring-attn during sft phase")["sequence_parallel"] is True


# --- malformed input -----------------------------------------------------------------------------------------
def test_binary_junk_is_an_input_error():
    with pytest.raises(InputError):
        extract_facts("\x00\x01\x02garbage" * 100)


def test_huge_paste_keeps_head_and_tail(monkeypatch):
    monkeypatch.setenv("KB_DIAGNOSE_MAX_BYTES", "20000")
    body = "{'loss': 1.0, 'grad_norm': 2.0}\n" * 5000 + "{'loss': nan, 'grad_norm': nan}\n"
    f = extract_facts(body)
    assert "loss" in f.value("nan_metrics") and f.warnings
    assert f.evidence_for("nan_metrics", "loss").line == 5001
    with pytest.raises(InputTooLarge):
        extract_facts("x" * 300_000)


def test_huge_log_keeps_salient_middle_lines(monkeypatch):
    monkeypatch.setenv("KB_DIAGNOSE_MAX_LINES", "400")
    body = ("fp16: true\n" + "{'loss': 1.0, 'grad_norm': 2.0}\n" * 3000 + "{'loss': nan, 'grad_norm': nan}\n"
            + "{'loss': 1.0, 'grad_norm': 2.0}\n" * 3000)
    f = extract_facts(body)
    assert f.value("precision") == "fp16" and f.evidence_for("nan_metrics", "loss").line == 3002
    assert any("lines in between" in w for w in f.warnings)


# --- fixes reported by colleagues and found on the corpus excerpts -------------------------------------------
@pytest.mark.parametrize("line", [
    ("algorithm.kl_ctrl.kl_coef=0.001 actor_rollout_ref.actor.kl_loss_type=low_var_kl "
    "actor_rollout_ref.actor.use_kl_loss=True"),
    ("actor_rollout_ref.actor.kl_loss_type=low_var_kl algorithm.kl_ctrl.kl_coef=0.001 "
    "actor_rollout_ref.actor.use_kl_loss=True"),
])
def test_several_hydra_overrides_on_one_line_are_each_read(line):
    f = values(line)
    assert f["kl_estimator"] == "k3" and f["kl_coef"] == 0.001 and f["use_kl_loss"] is True


def test_override_value_stops_at_a_line_continuation():
    f = values("    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\\n    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B \\")
    assert f["kl_estimator"] == "k3" and f["model"] == "Qwen/Qwen2.5-7B"


@pytest.mark.parametrize("text", [
    'attn_implementation="flash_attention_2" google/gemma-2-9b',
    "attn_implementation='flash_attention_2', torch_dtype=torch.float16",
    'attn_implementation: "flash_attention_2" # from the model card',
])
def test_quoted_value_ends_at_its_closing_quote(text):
    assert values(text)["attn_implementation"] == "flash_attention_2"


@pytest.mark.parametrize("text", ["当我开启S^2 Attention，grad_norm为nan", "开启了 S²-Attn 以后 loss nan",
                                  "--shift_attn", "shift_attn: true", "LongLoRA fine-tuning, grad_norm nan"])
def test_shift_attention_in_prose_and_flags(text):
    assert values(text)["shift_attn"] is True


def test_from_pretrained_call_is_not_a_model_name_but_its_argument_is():
    f = values('model = AutoModelForCausalLM.from_pretrained(\n    "google/gemma-2-9b",\n    use_cache=False,\n)')
    assert f["model"] == "google/gemma-2-9b"
    assert "model" not in values("model = AutoModelForCausalLM.from_pretrained(\n    args.model_name_or_path,\n)")


def test_mixed_case_nan_in_prose_and_low_var_kl_named():
    f = values("在某一个step模型的输出突然全变为!，kl变为Nan。the exp in `low_var_kl` overflows")
    assert f["nan_metrics"] == ["kl"] and f["kl_estimator"] == "k3" and f["output_collapse"] is True
    assert values("Loss Nan (LLaVA training in xtuner)")["nan_metrics"] == ["loss"]


def test_metric_trajectory_ending_in_nan():
    assert values("loss: 11.201002 -> 11.165665 -> nan (ZeRO-2 only)")["nan_metrics"] == ["loss"]
    assert values("grad_norm 1.2 → 35.0 → inf")["nan_metrics"] == ["grad_norm"]


def test_advantage_stats_and_reward_function_returning_none():
    assert values("Normalized advantages stats: min=-1000000.0000, max=1000000.0000")["huge_metrics"] == ["advantages"]
    assert "nan_reward" in values("my reward function returns None when the judge API times out")["errors"]
    assert "masked_row_nan" in values("the padded query rows are fully masked, so sdpa returns nan")["errors"]


def test_loss_scaling_messages_imply_fp16():
    f = extract_facts("Exception: Current loss scale already at minimum - cannot decrease scale anymore.")
    assert f.value("precision") == "fp16" and f.get("precision").kind == "log"
    assert values("bf16: true\n[deepspeed] OVERFLOW! Rank 0 Skipping step.")["precision"] == "bf16"


def test_prose_loss_type_kto_words_and_lr_fix():
    assert values("with 'dpo' training goes well, but if I use 'ipo' then I get NaN")["loss_type"] == "ipo"
    assert values('if self.loss_type == "ipo":')["loss_type"] == "ipo"
    assert values("2k desired completions and 10k undesired ones, loss nan")["algorithm"] == "KTO"
    assert values("After I set a lower lr for the vision encoder, the loss becomes normal")["fix_changes"] == [
        "learning_rate=lower"]
    assert values("学习率太大了")["fix_changes"] == ["learning_rate=lower"]


def test_step_counters_are_not_gpu_names_and_new_canonical_keys():
    assert "gpu" not in values("step 2070 | loss 1.2 | lr 1e-5\nstep 3090 | loss 1.1")
    assert values("GPU 0: NVIDIA GeForce RTX 2080 Ti")["gpu_bf16"] is False
    f = values("tokenizer.padding_side = 'left'\nactor_rollout_ref.actor.ppo_mini_batch_size=4 "
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16\n--placeholder_token ки")
    assert f["padding_side"] == "left" and f["mini_batch_size"] == 4 and f["micro_batch_size"] == 16
    assert f["placeholder_token"] == "ки"


def test_truncated_json_keeps_complete_values():
    f = extract_facts('{"fp16": {"enabled": true}, "zero_optimization": {"stage": 2, "overlap_comm": tr', source="config")
    assert f.value("precision") == "fp16" and f.value("zero_stage") == 2 and any("truncated" in w for w in f.warnings)


def test_utf16_with_bom_is_text_not_binary():
    f = extract_facts("loss nan with fp16".encode("utf-16"))
    assert f.value("precision") == "fp16" and f.value("nan_metrics") == ["loss"]


def test_space_separated_metric_lines():
    # "step N loss X" without ':' or '=' is a common hand-written / custom-loop log format.
    from kb.facts import extract_facts

    facts = extract_facts("step 10 loss 3.2, step 20 loss nan\nstep 30 loss nan grad_norm nan").values()
    assert facts["first_bad_step"] == 20
    assert set(facts["nan_metrics"]) >= {"loss", "grad_norm"}


# --- steps, not record numbers (issue 11: "step numbers from the log, not record numbers") ------------------
@pytest.mark.parametrize(("log", "step", "metric"), [
    # Megatron: the iteration counter is the step; "grad norm" in two words is the grad_norm
    ((" iteration      120/  100000 | consumed samples:        15360 | learning rate: 2.999E-04 | "
     "lm loss: NAN | loss scale: 1.0 | grad norm: nan | number of skipped iterations:   1 |"), 120, "grad_norm"),
    # XTuner / mmengine
    (("12/01 10:00:00 - mmengine - INFO - Iter(train) [ 120/3000]  lr: 2.0e-04  eta: 1:00:00  time: 1.2  "
     "loss: nan  grad_norm: nan"), 120, "loss"),
    # ms-swift's dict line carries its own counter
    (("{'loss': nan, 'grad_norm': nan, 'learning_rate': 9.9e-05, 'memory(GiB)': 22.1, 'epoch': 0.12, "
     "'global_step/max_steps': '45/380'}"), 45, "grad_norm"),
    # a notebook's Trainer table pasted with its tabs
    ("[80/80 02:02, Epoch 0/1]\nStep\tTraining Loss\n10\t2.040200\n20\tnan\n30\tnan", 20, "loss"),
    # a batch counter (nanoVLM), LAVIS's bracketed counter (not the epoch's "[0]"), a line that opens with its step
    ("Batch 706/56191 - Loss: nan", 706, "loss"),
    ("Train: data epoch: [0]  [  50/4427]  eta: 6:32:09  lr: 0.000001  loss: nan  time: 5.3553  max mem: 34957", 50,
     "loss"),
    ("step 00003 (0.27%) | loss: 2.784387 | lrm: 0.01\nstep 00004 (0.33%) | loss: nan | lrm: 0.02", 4, "loss"),
    ("Iter 1: Val loss 2.1, Val took 61.907s\nIter 10: Train loss nan, Learning Rate 1.000e-05", 10, "loss"),
    # a verl line wrapped in two: the second half belongs to the first half's step
    (("(main_task pid=1) step:83 - global_seqlen/min:22900.000 - global_seqlen/max:23135.000\n"
     "actor/kl_loss:nan - actor/kl_coef:0.001 - actor/pg_loss:nan"), 83, "actor/pg_loss"),
    # a sentence first, then the log: the sentence's place is no step, the table's counter is
    (("ZeRO-2 full fine-tuning on AMD GPUs: grad_norm NaN and loss 0 after a few steps\n| step | loss |\n|---|---|\n"
     "| 38 | 1.5178 |\n| 39 | NaN |"), 39, "loss"),
    # the reference DPO trainer's stats line counts examples and updates: the updates are the step
    (("train stats after 160736 examples: {'rewards_train/chosen': '0.31', 'loss/train': '0.62', 'grad_norm': '3.1', "
      "'counters/examples': 160736, 'counters/updates': 5023}\n"
      "train stats after 160768 examples: {'rewards_train/chosen': 'nan', 'loss/train': 'nan', 'grad_norm': 'nan', "
      "'counters/examples': 160768, 'counters/updates': 5024}"), 5024, "grad_norm"),
])
def test_the_logs_own_step_counter_is_the_step(log, step, metric):
    f = extract_facts(log)
    assert f.value("first_bad_step") == step and metric in f.value("nan_metrics") and not f.warnings


def test_a_lone_python_dict_line_is_no_json_and_no_step():
    for line in ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.05}",
                 "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.01}",  # issue 11's own example
                 "{'loss': nan, 'grad_norm': nan, ...}"):
        f = extract_facts(line)
        assert "grad_norm" in f.value("nan_metrics")
        assert not f.warnings  # not "JSON is truncated": it is Python's repr of a dict
        assert "first_bad_step" not in f  # one record from somewhere in a run: its number is not a step
    f = extract_facts("{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.0}")
    assert f.value("first_bad_step") == 1  # an epoch still 0.0 is the run's start
    # records from mid-run (epoch 2.5) do not start at step 1 either
    f = extract_facts("{'loss': 1.04, 'grad_norm': 42.1, 'epoch': 2.5}\n{'loss': nan, 'grad_norm': nan, 'epoch': 2.51}")
    assert "first_bad_step" not in f and f.value("nan_metrics") == ["loss", "grad_norm"]


@pytest.mark.parametrize("text", [
    "Epoch 0, Loss nan, LR 1.00e-05:  12%|█████",  # an epoch's index, not a fraction of one
    "Epoch [1/3] loss: nan lr: 1e-5",  # the epoch's counter is not a step
    # sentences, not records: a title and what was seen, each naming values
    ("ZeRO-2 full fine-tuning on AMD GPUs: grad_norm NaN and loss 0 after a few steps\n"
    "The run is fine at first, then grad_norm nan and loss 0.0 on every step."),
    ("TRL reward model with LoRA (SEQ_CLS): loss ~1e34 and grad_norm nan, then loss 0.0\n"
    "The first logged loss is 1.19e+34 with grad_norm nan, then loss 0.0 on every step."),
    "V100 上 glm-4-9b LoRA SFT 出现 grad_norm nan\n第一条日志 loss 3.6，随后 loss 63、grad_norm nan，再之后 loss 0.0",
    "action_accuracy:  tensor(0., device='cuda:0')\ntrain_loss:  nan",  # "cuda:0" is no metric, so no second record
])
def test_a_records_place_in_the_paste_is_no_step(text):
    f = extract_facts(text)
    assert f.value("nan_metrics") and "first_bad_step" not in f


@pytest.mark.parametrize(("text", "nan_metrics"), [
    ("ORPO loss nan, Log1PBackward0 returned nan values", ["loss"]),  # "returned" is no metric ("returns" is)
    ("critic/returns/mean: nan, critic/values/mean: 0.1", ["critic/returns/mean"]),
    ("grad_norm 第一步就是 nan", ["grad_norm"]),
    ("grad_norm is already NaN at step 0", ["grad_norm"]),  # not a metric named "already" ("lr" in it)
    ("the delta weight's gradient is already NaN after the first backward", None),
    # a hand-written loop names its metrics in two words and capitals; they are the trainers' names
    ("Step 5, Loss: NaN, Grad Norm: nan", ["loss", "grad_norm"]),
    ("Epoch 2: Train Loss: 1.23, Val Loss: nan", ["eval_loss"]),
    ("Epoch 1 | Loss: nan | LR: 1e-5", ["loss"]),
    ("the gradient norm is inf after step 3", ["grad_norm"]),
    ("the norm is nan", ["norm"]),
    ("grad norm spikes, then grad norm is nan", ["grad_norm"]),
])
def test_metric_names_in_two_words_or_capitals(text, nan_metrics):
    assert extract_facts(text).value("nan_metrics") == nan_metrics


def test_a_gradient_norm_that_spikes_is_the_grad_norm():
    assert extract_facts("the run shows gradient-norm spikes and entropy collapse").value("spike_metrics") == ["grad_norm"]
    # "爆炸" as "exploded" is: a spike of the metric it follows; not GPU memory, not said absent
    assert extract_facts("训练几步后梯度爆炸").value("spike_metrics") == ["grad_norm"]
    assert extract_facts("loss 爆炸").value("spike_metrics") == ["loss"]
    assert extract_facts("显存爆炸了").value("spike_metrics") is None
    assert extract_facts("loss 没有爆炸，但是 eval_loss 是 nan").value("spike_metrics") is None


@pytest.mark.parametrize(("text", "precision", "working"), [
    # issue 11: a setting the reporter tried and dropped, or merely asks about, is not the run's
    ("I tried fp16 first but switched to bf16; the loss is still nan", "bf16", None),
    ("换成 bf16 之后还是 nan", "bf16", None),  # switched to it, and it still fails: the run's now
    ("Should I use fp16 or bf16? my loss is nan with bf16", "bf16", None),
    ("要不要换成 bf16？现在 fp16 训练 loss 为 nan", "fp16", None),
    ("Is it a fp16 problem? The loss is nan", None, None),
    ("试过 bf16，也是 nan，现在用 fp16", "fp16", None),
    ("I also tried bf16, and it works", None, "bf16"),
    ("改成 bf16 后 loss 不再一直为 0，但偶尔仍为 0", None, "bf16"),  # it helped, whatever else still fails
    ("main.py --type ACTOR with its default (non-bf16) precision produced a NaN training loss", None, None),
    ("用非 bf16 的默认精度训练，loss 为 nan", None, None),
])
def test_a_dtype_tried_or_asked_about_is_not_the_runs(text, precision, working):
    f = values(text)
    assert (f.get("precision"), f.get("working_dtype")) == (precision, working)


@pytest.mark.parametrize(("text", "facts"), [
    # a feature said not to be in use is not the run's (issue 11: a setting the reporter ... is not the run's)
    ("I don't use sequence parallel. DPO nll_loss nan", {"sequence_parallel": False}),
    ("没有开序列并行，DPO nll_loss 为 nan", {"sequence_parallel": False}),
    ("sequence parallel is off, nll_loss nan", {"sequence_parallel": False}),
    ("I'm not using flash attention, loss nan", {}),
    ("未开启 shift_attn，loss 为 nan", {"shift_attn": False}),
    ("without LoRA, full fine-tuning, loss nan", {"finetuning_type": "full"}),
    # turned off as the fix: the run had it, and the fix is the switch
    ("序列并行关掉之后就正常了", {"sequence_parallel": True, "fix_changes": ["sequence_parallel_size=1"]}),
    ("关闭 flash attention 后正常", {"attn_implementation": "flash_attention_2",
                                     "fix_changes": ["attn_implementation=eager"]}),
    # "without it" as the comparison that trained, and plain use
    ("no NaN without flash attention, NaN with it", {"attn_implementation": "flash_attention_2"}),
    ("with sequence parallel the nll_loss is nan", {"sequence_parallel": True}),
    ("shift_attn 开启后 grad_norm nan", {"shift_attn": True}),
])
def test_a_feature_said_off_is_not_the_runs(text, facts):
    keys = ("sequence_parallel", "attn_implementation", "shift_attn", "use_peft", "finetuning_type", "fix_changes")
    assert {k: v for k, v in values(text).items() if k in keys} == facts


@pytest.mark.parametrize(("text", "facts"), [
    # the run's GPU, not the one compared with or denied
    ("It's not a V100, it's an A100 80G; fp16 loss nan", {"gpu": "A100", "gpu_bf16": True}),
    ("之前在 V100 上跑正常，换到 A100 后 loss nan", {"gpu": "A100", "gpu_bf16": True}),
    ("on A100 it works, on V100 the loss is nan", {"gpu": "V100", "gpu_bf16": False}),
    ("8 张 RTX 3090 训练，loss nan", {"gpu": "RTX 3090", "gpu_bf16": True}),
    ("V100 上 swift sft 用 --fp16 false 全参训练仍出现 NaN", {"gpu": "V100", "gpu_bf16": False, "framework": "ms-swift"}),
    # a dtype the GPU cannot use, said after it, and a framework said unused
    ("bf16 is not supported on my GPU, so I use fp32; loss nan", {"gpu_bf16": False}),
    ("not using deepspeed, single GPU, loss nan", {}),
])
def test_the_runs_gpu_and_framework_not_the_ones_compared_or_denied(text, facts):
    v = values(text)
    assert {k: v[k] for k in ("gpu", "gpu_bf16", "framework") if k in v} == facts
    if "not supported" in text:
        assert v.get("precision") != "bf16"


@pytest.mark.parametrize(("text", "peft", "full"), [
    # the adapter switched to is tried beside the run, whatever came of it
    ("全参数微调 BLOOMZ-1.7B 一直 CUDA out of memory，换 LoRA 脚本也一样", None, "full"),
    ("full fine-tuning gives nan; switched to LoRA and it is fine", None, "full"),
    ("LoRA 微调 loss nan，换成全参数微调后正常", True, None),
])
def test_the_adapter_switched_to_is_not_the_runs(text, peft, full):
    v = values(text)
    assert (v.get("use_peft"), v.get("finetuning_type")) == (peft, full)


@pytest.mark.parametrize(("text", "family"), [
    # the tool's name is no model family; the model the run loads names it first
    ("- `llamafactory` version: 0.9.2\nmodel_name_or_path: Qwen/Qwen2.5-7B-Instruct\nloss nan", "qwen2.5"),
    ("LLaMA-Factory 微调 loss 为 nan", None),
    ("ollama serve; llama.cpp; LlamaIndex; exllama==0.0.19", None),
    ("LLaMA-Efficient-Tuning 微调 Baichuan-13B loss nan", "baichuan"),  # LLaMA-Factory's old name
    ("--model_name_or_path path_to_llama_model\nBaichuan2-13B 用 fp16 微调 loss 为 0", "baichuan2"),  # a placeholder
    ("Llama-3-8B LoRA loss nan", "llama3"),
])
def test_the_model_family_is_the_models_not_the_tools(text, family):
    assert values(text).get("model_family") == family


def test_a_printed_python_config_dict_is_read_as_a_config():
    f = values("{'fp16': True, 'learning_rate': 2e-05, 'deepspeed': {'zero_optimization': {'stage': 2, "
               "'overlap_comm': True}}}")
    assert f["precision"] == "fp16" and f["zero_stage"] == 2 and f["overlap_comm"] is True
    assert values("{'a': __import__('os').getcwd()}") == {}  # read as data, never evaluated


@pytest.mark.parametrize("text", ["{'fp16': True, 'x': b'ab'}", "{'fp16': True, 'c': 1+2j}", "{'fp16': True, 'e': ...}",
                                  "{'fp16': True, 'tags': {1, 2}}"])
def test_a_printed_dict_holding_what_json_cannot_is_no_traceback(text):
    """A bytes value crashed the JSON flattening of a printed dict (TypeError); such a dict is not a config."""
    assert "precision" not in values(text)


@pytest.mark.parametrize(("text", "step"), [
    ("训练日志从第一步起 loss 和 grad_norm 就都是 0。", 1),
    ("grad_norm is nan from the very first step", 1),
    ("the loss is 0.0 from the first step", 1),
    ("从第一步开始 loss 正常，之后变为 nan", None),  # the first step was fine
    ("It worked fine at the first step. Later the loss is nan.", None),
    ("ZeRO-3 gives an abnormally high loss on the first step", None),  # high is not a bad value; ZeRO is not zero
    ("TinyLLaVA pretraining logs loss 0.0 and grad_norm 0.0 from the start", 1),
    ("loss 从一开始就是 nan", 1), ("开始训练就 nan", 1),
    ("the loss was normal from the start, then nan", None), ("loss 0.05 from the start", None),
    # a later step said in words, in digits or in Chinese numerals
    ("the loss becomes NaN at step 300", 300), ("nanochat SFT collapses to loss NaN at step 4", 4),
    ("第 120 步开始 loss 变成 nan", 120), ("从第十二步起 grad_norm 为 nan", 12),
    ("qwen2.5 lora sft，loss 第二步开始就是 0", 2),
    ("at step 50 the learning rate warmup ends and loss is normal", None),
    # "after N steps", "after step N", "训练了 N 步之后": when it went bad, said as what came before it
    ("verl GRPO, after step 120 the actor/pg_loss becomes nan", 120),
    ("T5 under apex O1 returned a NaN loss after about 34 iterations", 34),
    ("loss becomes 0 after ~200 steps and stays there", 200), ("训练了 300 步之后 loss 变成 nan", 300),
    ("after 500 steps the loss becomes 1.5", None), ("after 3 epochs the loss is nan", None),
    ("用 xtuner 微调，训练到 200 个 iter 左右 loss 变成 nan", 200), ("跑到 12000 步 loss 突然飙升然后 nan", 12000),
    ("开启 kl loss 后训练到 1000 多步时 loss 出现 nan", 1000), ("训练了 300 余步之后 loss 变成 nan", 300),
    ("前 20 步左右 loss 在 10 到 20 之间，大约 20 多步后 loss 开始为 nan", 20), ("每 100 步后 loss 变成 nan", None),
    ("从第 0 步起梯度范数就是 nan", 1), ("第 0 步即溢出，grad_norm 为 inf", 1),
    # "fine-tuning" does not say the run was fine
    ("lr=1e-3 for full fine-tuning qwen2-7b, loss spikes to 12 then nan at step 150", 150),
    ("fine-tuning with LoRA: loss nan from the first step", 1),
    ("reward normalization on, loss nan from the first step", 1),  # nor does "normalization"
])
def test_the_first_bad_step_said_in_words(text, step):
    assert values(text).get("first_bad_step") == step


@pytest.mark.parametrize(("text", "collapse"), [
    ("GRPO 一轮后准确率从 57% 跌到 2.4%，策略坍塌", True), ("训练奖励迅速塌方", True), ("跑到第 300 步模型崩了", True),
    ("训崩了", True), ("训练进程崩溃了", False),  # a crash is not a divergence
])
def test_collapse_said_in_chinese(text, collapse):
    assert ("collapse" in values(text).get("symptom", [])) is collapse


def test_sequence_parallelism_and_the_nll_term_described_in_words():
    f = values("DPO preference training: each sample is split across GPUs, some ranks keep only prompt tokens "
               "and the NLL term turns nan")
    assert f["sequence_parallel"] is True and f["nan_metrics"] == ["nll_loss"]
    assert values("一条样本被切分到多张卡上，nll 项变成 nan")["sequence_parallel"] is True
    # samples spread over ranks is data parallelism
    assert "sequence_parallel" not in values("the samples are split between ranks and the loss turns nan")


@pytest.mark.parametrize(("text", "framework"), [
    ("用 LLaMA-Efficient-Tuning 微调 llama2，loss 从第一步起一直是 0", "LLaMA-Factory"),  # its name before 2024
    ("slime 跑 Qwen3.5-VL grounding RL，同一 SFT 权重用 HF transformers 推理正常", "slime"),
    ("torchtitan llama3 8b pretraining loss nan", "torchtitan"),
    ("EasyR1 GRPO kl nan at step 40", "EasyR1"),
    ("PaddleNLP 做 RL 训练，loss 出现 nan", "PaddleNLP"),
    ("GPU 迁移到 NPU 后用 MindSpeed-LLM 训练，第 0 步梯度溢出", "MindSpeed-LLM"),
    ("Mistral-Nemo 12B fine-tune with axolotl: grad norm inf", "axolotl"),  # a model named Nemo is not a framework
    # the raw openings' frameworks kb did not list (docs/DIAGNOSE.md, "What the fact layer misread in raw thread
    # openings"); at one position the longer name wins over Megatron-LM's "megatron" and NeMo's "nemo"
    ("Megatron-Bridge Qwen3 MoE pretraining: grad norm nan at iteration 1200", "Megatron-Bridge"),
    ("NeMo Automodel SFT of Llama-3.1-8B, loss nan after 30 steps", "NeMo Automodel"),
    ("NeMo 2.0 llama3 pretraining recipe: reduced_train_loss nan", "NeMo"),
    ("transformer_engine fp8 recipe: loss nan from the first step", "TransformerEngine"),
    ("Megatron-LM with TransformerEngine fp8: lm loss nan", "Megatron-LM"),
    ("mlx_lm.lora on an M2: Val loss nan", "mlx-lm"),
    ("InternEvo 7B pretraining, loss nan at step 3000", "InternEvo"),
    ("llm-foundry mpt-7b finetune: loss goes to nan", "llm-foundry"),
    ("alibaba/ROLL GRPO on Qwen2.5-7B: reward 0 and kl nan", "ROLL"),
])
def test_frameworks_named_in_prose(text, framework):
    assert values(text)["framework"] == framework


@pytest.mark.parametrize("text", [
    "Mistral-Nemo-Instruct LoRA: loss nan at step 20",  # a model, not NeMo
    "loss nan at step 20, so I had to roll back to the older checkpoint",  # a word, not ROLL
])
def test_framework_names_that_are_words(text):
    assert "framework" not in values(text)


_MEGATRON = (" iteration      200/   10000 | consumed samples:        25600 | elapsed time per iteration (ms): 1234.5 | "
             "learning rate: 2.000000E-05 | global batch size:   128 | lm loss: {loss} | loss scale: 1.0 | grad norm: "
             "{gn} | number of skipped iterations:   0 | number of nan iterations:   {nans} |")


@pytest.mark.parametrize(("loss", "gn", "nans", "symptoms", "step"), [
    ("2.345678E+00", "1.234", "0", set(), None),  # NaNs counted and none found: no NaN
    ("0.000000E+00", "0.000", "0", {"zero_loss", "zero_grad"}, 200),
    ("nan", "nan", "1", {"nan"}, 200),
    ("2.345678E+00", "1.234", "3", {"nan"}, None),  # Megatron counted iterations whose gradients were NaN
])
def test_megatrons_iteration_line(loss, gn, nans, symptoms, step):
    v = values(_MEGATRON.format(loss=loss, gn=gn, nans=nans))
    assert set(v.get("symptom", [])) == symptoms
    assert v.get("first_bad_step") == step
    assert "micro_batch_size" not in v  # the global batch is not the per-device micro-batch


@pytest.mark.parametrize(("text", "micro"), [
    ("global batch size 256, micro batch size 2", 2),
    ("全局批次大小 256，每卡批次大小 2", 2),
    ("with an effective batch size of 128 the loss goes nan", None),
    ("total train batch size 64, loss nan", None),
    ("  Instantaneous batch size per device = 4\n  Total train batch size (w. parallel, distributed & accumulation) = 64",
     4),  # the HF Trainer's own banner
    ("batch size 8, loss nan", 8),
])
def test_a_batch_size_across_devices_is_not_the_micro_batch(text, micro):
    assert values(text).get("micro_batch_size") == micro


@pytest.mark.parametrize(("text", "version"), [
    ("O^O/ \\_/ \\    Pytorch: 2.4.0+cu121. CUDA = 8.0. CUDA Toolkit = 12.1.", "2.4.0+cu121"),  # unsloth's banner
    ("torch==2.1.0.post1", "2.1.0.post1"),
    ("PyTorch version: 2.3.1+cu118.", "2.3.1+cu118"),
])
def test_a_version_ends_before_the_sentences_full_stop(text, version):
    assert values(text).get("torch_version") == version


@pytest.mark.parametrize(("text", "facts"), [
    (("***** train metrics *****\n  epoch                    =        1.0\n  train_loss               =        0.0\n"
      "  train_runtime            = 0:10:00.00\n  train_samples_per_second =      5.123"),
     {"zero_metrics": ["train_loss"], "symptom": ["zero_loss"]}),
    (("***** eval metrics *****\n  epoch                   =        3.0\n  eval_loss               =        nan\n"
      "  eval_runtime            = 0:00:10.00"), {"nan_metrics": ["eval_loss"], "symptom": ["nan"]}),
    ("***** train metrics *****\n  epoch                    =        3.0\n  train_loss               =     1.2345\n",
     {}),  # a healthy run's summary
    ("***** Running training *****\n  Num examples = 1,000\n  Num Epochs = 3", {}),  # the banner before a run
])
def test_the_hf_trainers_metrics_summary_is_one_record(text, facts):
    v = values(text)
    assert {k: v[k] for k in ("zero_metrics", "nan_metrics", "symptom") if k in v} == facts


@pytest.mark.parametrize(("text", "on"), [
    ("用 PaddleNLP 做 RL 训练并开启 kl loss，训练到 1000 多步时 loss 出现 nan", True),
    ("GRPO with the KL loss enabled, loss nan at step 300", True),
    ("kl loss is on and pg_loss goes nan", True),
    ("verl grpo use_kl_loss=True, kl nan", True),
    ("没有开启 kl loss，reward 变成 nan", False),
    ("actor/kl_loss: nan", None),  # a logged value, not the setting
    ("关闭 kl loss 后正常", None),  # the fix, not the run's setting
    ("GRPO without the kl loss, reward nan", None),
])
def test_the_kl_loss_said_on_in_words(text, on):
    assert values(text).get("use_kl_loss") is on


@pytest.mark.parametrize(("text", "metric"), [
    ("the loss oscillates and then goes nan", "loss"),
    ("loss 一直震荡甚至直接变成 nan", "loss"),
    ("kl loss is on and pg_loss goes nan", "pg_loss"),
    ("the loss went nan at step 30", "loss"),
    ("the loss fluctuates and is not 0", None),
    ("loss goes down normally", None),
])
def test_how_a_metric_moved_before_it_broke_is_no_gap(text, metric):
    assert (values(text).get("nan_metrics") or [None])[0] == metric


@pytest.mark.parametrize(("text", "key", "metric"), [
    ("损失变成 nan", "nan_metrics", "loss"), ("梯度范数为 nan", "nan_metrics", "grad_norm"),
    ("梯度为 nan", "nan_metrics", "grad_norm"), ("验证集上的损失为 nan，训练损失正常", "nan_metrics", "eval_loss"),
    ("奖励变为 nan", "nan_metrics", "reward"), ("KL 散度变成 inf", "nan_metrics", "kl"),
    ("训练曲线上的损失掉到 0", "zero_metrics", "loss"), ("loss 开始为 nan", "nan_metrics", "loss"),
    ("the loss started being nan", "nan_metrics", "loss"),
    # said absent, or no bad value
    ("没有出现梯度为 nan 的情况", "nan_metrics", None), ("损失从 2.3 降到 0.5", "zero_metrics", None),
    ("loss 开始下降", "nan_metrics", None),
])
def test_a_metric_named_in_chinese(text, key, metric):
    assert (values(text).get(key) or [None])[0] == metric


def test_a_zero_gradient_norm_named_in_chinese_is_no_gradient():
    assert "zero_grad" in values("梯度范数一直为 0")["symptom"]


@pytest.mark.parametrize(("text", "kernel"), [
    ("attn_impl: triton, loss nan at head dim 8", "triton"),  # the sentence after the comma is no kernel name
    ("attn_implementation: eager, and it works", "eager"),
    ("attn_implementation flash_attention_2.", "flash_attention_2"),
])
def test_an_attention_kernel_named_before_the_rest_of_a_sentence(text, kernel):
    assert values(text)["attn_implementation"] == kernel


@pytest.mark.parametrize(("text", "stage"), [
    ("SFT 全参数微调，开启 deepspeed 报错；设置z2则第二个step开始之后grad_norm就是nan", 2),  # LLaMA-Factory's shorthand
    ("deepspeed z3 offload, loss nan", 3),
    ("deepspeed with zero3.json: loss nan", 3),
    ("deepspeed installed; the weights are in /data/z2/model and loss is nan", None),  # a path, not a stage
    ("z2 loss nan", None),  # no DeepSpeed named: "z2" alone says nothing
])
def test_a_zero_stage_said_as_shorthand(text, stage):
    assert values(text).get("zero_stage") == stage


def test_a_namespaced_length_metric_is_no_length_limit():
    # ms-swift / TRL GRPO log lines: the longest completion sampled, not max_length
    f = values("{'loss': 0.0, 'grad_norm': 0.0, 'completions/mean_length': 357.5, 'completions/max_length': 401.75}")
    assert "max_length" not in f and "zero_grad" in f["symptom"]
    assert values("max_length: 4096\n'completions/max_length': 401.75")["max_length"] == 4096


def test_a_launcher_scripts_own_variables_are_read_through():
    script = ("MODEL_PATH=/nas/llm_weights/qwen2.5-7b-it\nexport LR=4e-7\nMIN_BS_PER_GPU=16\n"
              "poetry run python -m verl.trainer.main_ppo \\\n    algorithm.adv_estimator=grpo \\\n"
              "    actor_rollout_ref.model.path=$MODEL_PATH \\\n    actor_rollout_ref.actor.optim.lr=${LR} \\\n"
              "    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MIN_BS_PER_GPU \\\n"
              "    actor_rollout_ref.actor.grad_clip=1.0")
    f = values(script)
    assert f["model"] == "/nas/llm_weights/qwen2.5-7b-it" and f["learning_rate"] == 4e-7
    assert f["micro_batch_size"] == 16 and f["framework"] == "verl"  # `poetry run` wraps the launcher
    # a variable the paste never sets is a name, not a value
    f = values("swift sft --model $model_id_or_path --torch_dtype float32 --train_type full")
    assert "model" not in f and f["weights_dtype"] == "fp32"


def test_grad_norms_in_the_plural():
    assert values("I found that the actor grad norms were always NaN.")["nan_metrics"] == ["grad_norm"]


# --- raw thread openings read on 2026-12-07 (issue 11: facts from real pastes) -----------------------------------
@pytest.mark.parametrize(("text", "key", "value"), [
    # a feature's name inside a setting's name says nothing; its value does
    ("ulysses_sequence_parallel_size: 1", "sequence_parallel", None),
    ("ulysses_sequence_parallel_size: 4", "sequence_parallel", True),
    ("--context_parallel_size 1", "sequence_parallel", None),
    # a warmup's logged learning rate is not the setting: the highest one logged stands for it, 0.0 never does
    ("{'loss': 2.1, 'learning_rate': 4e-07, 'epoch': 0.01}\n{'loss': nan, 'learning_rate': 2.4e-06, 'epoch': 0.02}",
     "learning_rate", 2.4e-06),
    ("{'loss': 2.7584, 'grad_norm': 12.1, 'learning_rate': 0.0, 'epoch': 0.0}", "learning_rate", None),
    ("learning_rate: 1e-4\n{'loss': 2.7, 'learning_rate': 3e-08, 'epoch': 0.0}", "learning_rate", 1e-4),
    # a metric's name is ASCII: the Chinese words before it are not part of it
    ("使用cuda bf16訓練總是出現loss': 0.0, 'grad_norm': nan", "zero_metrics", ["loss"]),
    ("grad norm nan，loss 0.0", "nan_metrics", ["grad_norm"]),
    ("llama3-llava-next-8b FT的时候grad norm nan，loss 0.0", "nan_metrics", ["grad_norm"]),
    # NaN said in words
    ("(WorkerDict pid=9092) WARN: grad_norm is not finite: nan", "nan_metrics", ["grad_norm"]),
    ("AssertionError: Rank 3: found NaN in local grad norm in backwards pass", "nan_metrics", ["grad_norm"]),
    ("训练到六百多步，报Nan grad norm occurs", "nan_metrics", ["grad_norm"]),
    ("[bug] loss always be nan when sft", "nan_metrics", ["loss"]),
    ("grad_norm总是nan，loss=0", "zero_metrics", ["loss"]),
    # a link to another thread names that thread's repository, not this run's framework
    ("does someone has similar issues like https://github.com/volcengine/verl/issues/2626", "framework", None),
    ("I run https://github.com/hiyouga/LLaMA-Factory/blob/main/examples/train_lora/x.yaml", "framework",
     "LLaMA-Factory"),
    # a release named in a sentence is not the one installed; the `transformers env` torch line is
    ("it should have been resolved with transformers>=4.47. So I guess this is something else.",
     "transformers_version", None),
    ("transformers>=4.40", "transformers_version", "4.40"),
    ("- PyTorch version (GPU?): 2.1.0+cu121 (True)", "torch_version", "2.1.0+cu121"),
    # a logged metric's path is bookkeeping; a script's path names the algorithm
    ("step:34 - actor/ppo_kl:-8.16e-06 - actor/pg_loss:nan", "algorithm", None),
    ("python examples/scripts/reward_modeling.py", "algorithm", "RM"),
    # the checkpoint a run starts from is no pretraining run
    ("用的预训练模型是 qwen2-7b，微调时 loss nan", "algorithm", None),
    ("the pre-training model I'm using is llama2-chinese-7b-chat", "algorithm", None),
    ("增量预训练 loss nan", "algorithm", "pretrain"),
    ("after the Stage 1 - Supervised Finetuning, loss nan", "algorithm", "SFT"),
    # a model's name among Chinese words; the class that loads it is none
    ("model: modelscope上的chatglm3-6b-32k的权重", "model", "chatglm3-6b-32k"),
    ("model = LlamaForCausalLM.from_pretrained(model_name, torch_dtype=torch.float16)", "model", None),
    ("model = get_peft_model(model, config)", "model", None),
    ("--model_name_or_path path_to_llama_model", "model", None),
    ("--model_type mimo_vl", "model", "mimo_vl"),
    ("model_name = model_args.model_name_or_path", "model", None),
    ('model_name="unsloth/gemma-2-2b-it-bnb-4bit"', "model", "unsloth/gemma-2-2b-it-bnb-4bit"),
    ("--hf-checkpoint /root/Qwen3-235B-A22B-Thinking-2507", "model", "/root/Qwen3-235B-A22B-Thinking-2507"),
    ("sequence_len: 8192", "max_length", 8192),  # axolotl's name for it
    ("Starts at 15.3 loss and is spikey as all hell.", "spike_metrics", ["loss"]),
    ("--deepspeed `zero3-offload`", "deepspeed_config", "zero3-offload"),
    # argparse defaults are values, not switches
    ("parser.add_argument('--max_seq_len', default=512, type=int)", "max_length", 512),
    ('parser.add_argument("--batch_size", type=int, default=32, help="batch size")', "micro_batch_size", 32),
    ('parser.add_argument("--dtype", type=str, default="bfloat16", help="混合精度类型")', "precision", "bf16"),
    ("accumulative_counts = 32*4", "gradient_accumulation_steps", 128),
    # GPUs named between Chinese characters, in lower case, by count of cards
    ("在A100上训练 loss nan", "gpu", "A100"),
    ("机器配置 ：2张4090", "gpu", "RTX 4090"),
    ("on 8*4090", "gpu", "RTX 4090"),
    ("NPU 910B训练loss异常", "gpu", "910B"),
    ("Ascend910B2C NPU", "gpu", "910B2C"),
    ("2 a800 GPU", "gpu", "A800"),
    ("on GB300", "gpu", "GB300"),
    ("step 4090 loss nan", "gpu", None),
    # an option of the issue form left unticked
    (("- [ ] One of the scripts in the examples/ folder of Accelerate or an officially supported `no_trainer` "
      "script in the `examples` folder of the `transformers` repo"), "framework", None),
    # a script's accumulator and a loss term's weight are no loss at 0
    ("    total_loss = 0", "symptom", None),
    ("weight_soft_loss: 0\nweight_hard_loss: 1", "symptom", None),
    # the first bad step, said in words
    ("getting nan loss at step=4", "first_bad_step", 4),
    ("it always output nan when it comes to step 152", "first_bad_step", 152),
    ("训练到 step 205 左右出现 nan", "first_bad_step", 205),
    # names next to Chinese characters
    ("Qwen3-vl-8B-instruct lora微调时 grad_norm为Nan", "use_peft", True),
    ("用sdpa训练loss nan", "attn_implementation", "sdpa"),
    ("用deepspeed zero2训练", "zero_stage", 2),
    ("export CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7\npython train.py", "num_gpus", 7),
    # the upgrade did not help: nothing about a release
    ("升级到最新版本还是有这个问题：ms_swift==3.6.0.dev0", "version_evidence", None),
    # second round (2026-12-07): preference, NPU / ROCm, notebook and Chinese blog openings
    ("bf16: false\n没有使用bf16，在训练几个step之后，就会出现nan", "precision", None),
    ("{'loss': 0.69, 'learning_rate': 9.99231529256779e-06, 'epoch': 0.01}\n{'loss': 0.69, 'learning_rate': 9.9879",
     "learning_rate", 9.99231529256779e-06),  # the paste cut the last number short
    ("This situation didn't happen when I used a smaller base model (e.g., 30B) to train RM.", "model", None),
    ('model: "/path/to/mlx/model"', "model", None),
    ("python pretraining.py --model_type auto --model_name_or_path /data/XVERSE-13B", "model", "/data/XVERSE-13B"),
    ("--base_model='/home/u/models/llama-30b-hf'", "model_family", "llama"),  # LLaMA-1 30B, not Llama 3
    ("[bug] loss always be nan when sft qwen3.5", "model_family", "qwen3.5"),
    ("pretrain an Olmo 1B model on 8 MI 250 GPUs", "num_gpus", 8),
    ("pretrain an Olmo 1B model on 8 MI 250 GPUs", "gpu", "MI250"),
    ("Here are the relevant ds_config im using:", "deepspeed_config", None),
    ("昇腾910B 8卡lora训练loss nan", "num_gpus", 8),
    ("ASCEND_RT_VISIBLE_DEVICES=0,1,2,3 llamafactory-cli train x.yaml", "num_gpus", 4),
    ("nohup deepspeed --include localhost:1,2,3 src/train_bash.py --stage orpo", "num_gpus", 3),
    ("### model\nmodel_name_or_path: qwen\n# flash_attn: fa2\n# deepspeed: ds_z3_config.json", "attn_implementation",
     None),  # settings commented out
    ("### model\nmodel_name_or_path: qwen\n# flash_attn: fa2\n# deepspeed: ds_z3_config.json", "zero_stage", None),
    ("# Loss: nan after step 3", "nan_metrics", ["loss"]),  # a heading, not a commented-out setting
    ("The new version TRL (0.26.2) breaks GRPO", "trl_version", "0.26.2"),
    ("| Torch | 2.5.1+cpu |\n| TRL | 0.19 |", "torch_version", "2.5.1+cpu"),
    (('ds_config.json为:\n{\n"zero_optimization": {\n"stage": 2,\n"overlap_comm": true\n},\n"bf16": {\n'
     '"enabled": true\n}\n}'), "zero_stage", 2),  # JSON pasted flush left nests by its braces
    ('my config\n{"zero_optimization": {"stage": 2}}', "zero_stage", 2),
    (('{"loss": 2.1, "learning_rate": 1e-07, "global_step/max_steps": "1/100"}\n'
     '{"loss": NaN, "learning_rate": 5e-06, "global_step/max_steps": "8/100"}'), "learning_rate", 5e-06),
    ("训练损失突然降至零", "zero_metrics", ["loss"]),
    ("训练损失在约114步后突降至0", "zero_metrics", ["loss"]),
    ("训练过程中损失值(loss)突然变为NaN", "nan_metrics", ["loss"]),
    ("loss值迅速变为NaN", "nan_metrics", ["loss"]),
    # NaN gradients said in words: recorded as such, not as a logged grad_norm (which the curated triggers read)
    ("There are NaNs in the gradients being computed", "nan_metrics", ["gradients"]),
    ("the gradients become nan", "nan_metrics", ["gradients"]),
    ("NaN gradient detected in Linear4bit's input gradient", "nan_metrics", ["gradients"]),
    ("nan gradient checkpointing", "nan_metrics", None),
    ("no NaN gradients were found", "nan_metrics", None),
])
def test_raw_thread_openings(text, key, value):
    assert values(text).get(key) == value


# The third round of raw thread openings (Megatron / NeMo / TransformerEngine, RL frameworks, Chinese reports, forums):
# what the fact layer misread, as a line each.
_MEGATRON_ARGS = ("------------------------ arguments ------------------------\n"
                  "  bf16 ............................................ True\n"
                  "  clip_grad ....................................... 1.0\n"
                  "  lr .............................................. 0.0001\n"
                  "  micro_batch_size ................................ 8\n"
                  "  max_tokens_to_oom ............................... 12000\n"
                  "  seq_length ...................................... 4096\n"
                  "  load ............................................ None\n")


@pytest.mark.parametrize(("text", "key", "value"), [
    # FP8 runs (TransformerEngine, torchao float8, MXFP8 recipes)
    ("nan loss when training in fp8", "precision", "fp8"),
    (("float8 rowwise ended up crashing due to NaN's. As a control, the same run was done with BF16 and did not "
     "encounter any issue."), "precision", "fp8"),
    (("float8 rowwise ended up crashing due to NaN's. As a control, the same run was done with BF16 and did not "
     "encounter any issue."), "working_dtype", "bf16"),
    ("Loss NaN in training (fp16/bf16)", "precision", None),  # a pair names neither
    # an inf is no NaN; NaN said in the plural
    ("the loss is inf", "symptom", ["inf"]),
    ("Unexpected result inf (message='found Inf in local grad norm')", "symptom", ["inf"]),
    ("the policy loss becomes nans.", "nan_metrics", ["loss"]),
    ("At step 8,000, the loss suddenly jumps to NaN", "nan_metrics", ["loss"]),
    ("At step 8,000, the loss suddenly jumps to NaN", "first_bad_step", 8000),
    ("Qwen2 使用bf16微调，loss训练一会后变成nan", "nan_metrics", ["loss"]),
    # good words in a question say nothing worked
    ("微调Qwen2-7B-Instruct，用的bf16，训练一段时间后loss=nan，请问这个有什么方法解决吗？", "precision", "bf16"),
    ("微调Qwen2-7B-Instruct，用的bf16，训练一段时间后loss=nan，请问这个有什么方法解决吗？", "working_dtype", None),
    # names
    ("Gemma 27B模型训练时loss nan", "model_family", "gemma"),  # the 2 of 27B is no Gemma 2
    ("gemma-2-9b loss nan", "model_family", "gemma2"),
    ("Qwen 32B lora loss nan", "model_family", "qwen"),
    ("使用DPO Lora微调Qwen25 VL，loss为nan", "model_family", "qwen2.5"),
    ("使用h20卡训练，torch版本为2.5.0", "gpu", "H20"),
    ("使用h20卡训练，torch版本为2.5.0", "torch_version", "2.5.0"),
    ("- GPU number: 8\n- GPU type: NVIDIA A800", "num_gpus", 8),
    # setting names of NeMo-RL, verl scripts, GLM-4's finetune configs and Chinese blogs
    ("num_generations_per_prompt: 32\nreference_policy_kl_penalty: 0.01", "num_generations", 32),
    ("num_generations_per_prompt: 32\nreference_policy_kl_penalty: 0.01", "kl_coef", 0.01),
    ("n_resp_per_prompt=8", "num_generations", 8),
    ("max_input_length: 1024\nmax_output_length: 512", "max_prompt_length", 1024),
    ("批量大小为2,梯度累积步数为8", "micro_batch_size", 2),
    # Megatron's argument dump
    (_MEGATRON_ARGS, "micro_batch_size", 8),
    (_MEGATRON_ARGS, "learning_rate", 0.0001),
    (_MEGATRON_ARGS, "max_length", 4096),
    (_MEGATRON_ARGS, "precision", "bf16"),
    (_MEGATRON_ARGS, "errors", None),  # max_tokens_to_oom is an argument, not an OOM
    # an empty form field names nothing; a YAML key with its block below still does
    ("- Transformers:\n- Python: 3.10\nloss nan with chatglm", "framework", None),
    ("Megatron version: \nPython version: 3.11\nloss nan", "framework", None),
    ("LLaMA-Factory:\n  stage: sft", "framework", "LLaMA-Factory"),
    # a metric's path names no algorithm; a loss switched to as the fix is not the run's
    ("GRPO run: the actor/ppo_kl remains consistently 0.", "algorithm", "GRPO"),
    ("the actor/ppo_kl remains consistently 0.", "algorithm", None),
    ("Standard sigmoid DPO loss saturates. Switch to IPO loss (loss_type='ipo') and the grad_norm no longer collapses",
     "loss_type", None),
    ("DPO with loss_type=ipo gives nan", "loss_type", "ipo"),
    # an issue title's value is no log record; the log's own counter says when
    (("how to fix : grad_norm: nan\n"
     "12/05 10:00:01 - mmengine - INFO - Epoch(train) [1][230/735]  lr: 2.0e-05  loss: 1.2  grad_norm: 3.1\n"
     "12/05 10:00:11 - mmengine - INFO - Epoch(train) [1][240/735]  lr: 2.0e-05  loss: nan  grad_norm: nan"),
     "first_bad_step", 240),
    ("[BUG] FP8+PP+Recompute+GA>1, loss = nan\n\nFP8+PP+Recompute+GA>1, loss = nan\nFP8+PP+GA>1, loss is normal",
     "first_bad_step", None),
    # a metric named in Chinese, shown as its value
    ("Loss值归零且梯度范数(grad_norm)显示为NaN", "nan_metrics", ["grad_norm"]),
    ("Loss值归零且梯度范数(grad_norm)显示为NaN", "zero_metrics", ["loss"]),
    ("梯度范数持续显示为NaN", "nan_metrics", ["grad_norm"]),
    # shell arithmetic in verl's example scripts
    (("max_prompt_length=$((1024))\nmax_response_length=$((1024 * 8))\npython3 -m verl.trainer.main_ppo "
     "data.max_prompt_length=${max_prompt_length} data.max_response_length=${max_response_length}"),
     "max_completion_length", 8192),
    ("data.max_response_length=$((1024 * 4))", "max_completion_length", 4096),
])
def test_raw_thread_openings_third_round(text, key, value):
    assert values(text).get(key) == value


# The fourth round (unsloth / axolotl / notebooks, DeepSpeed / FSDP / PEFT, preference and reward training, Chinese
# ms-swift / verl / multimodal reports).
@pytest.mark.parametrize(("text", "key", "value"), [
    # no model: a preposition, a variable, a type annotation
    ("Finetuning Llama 3.1 8B Base Model on ChatML Format Dataset", "model", None),
    ("trainer = SFTTrainer(\n model = model,\n tokenizer = tokenizer,\n)", "model", None),
    ('model_name: str="PATH/to/LLAMA/7B"\nlr: float=1e-4', "model", None),
    ('model_name: str="PATH/to/LLAMA/7B"\nlr: float=1e-4', "learning_rate", 1e-4),  # a dataclass field's default
    ("torchrun supervised_finetuning.py --model_type llama --model_name_or_path /data/Llama-2-7b-hf", "model",
     "/data/Llama-2-7b-hf"),  # MedicalGPT's model_type is an architecture
    ("swift sft --model_type qwen2_5-14b-instruct --dataset x", "model", "qwen2_5-14b-instruct"),
    ("model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen3-0.6B', dtype='auto')", "precision", None),
    # a hub id in a sentence is the model; a file or an output folder is not
    ("I fine-tune meta-llama/Llama-3.1-8B and the loss is nan.", "model", "meta-llama/Llama-3.1-8B"),
    ("see bloom-inference-scripts/bloom-ds-zero-inference.py", "model", None),
    ("saved to results/sft-gemma-4-31b, loss nan", "model", None),
    # metrics in words
    ("the training loss reduces to 0 following the gradient accumulation steps", "zero_metrics", ["loss"]),
    ("the training loss consistently remains NaN.", "nan_metrics", ["loss"]),
    ("Loss Reaches NaN", "nan_metrics", ["loss"]),
    ("it gives nan in the validation loss and no log in the training loss", "nan_metrics", ["eval_loss"]),
    ("用baichuan2-7B训练reward模型loss很快到0", "zero_metrics", ["loss"]),
    ("用baichuan2-7B训练reward模型loss很快到0", "algorithm", "RM"),
    ("loss 都是零", "zero_metrics", ["loss"]),
    ("grpo训练400step时KL骤增，reward下降", "spike_metrics", ["kl"]),
    # LoRA in code
    ("lora_alpha = 16\nlora_dropout = 0.1\nlora_r = 64", "use_peft", True),
    ("peft_config = LoraConfig(r=64, lora_alpha=16)", "use_peft", True),
    ("LoraConfig(r=8, task_type=TaskType.SEQ_CLS)", "lora_task_type", "seq_cls"),
    # settings
    (("KTO full parameter训练，learning rate 1e-6\n{'loss': 0.58, 'grad_norm': 0.16, 'learning_rate': 4.22e-08, "
     "'epoch': 0.0}"), "learning_rate", 1e-06),  # stated beats a warmup's logged value
    ("KTO full parameter训练，learning rate 1e-6", "finetuning_type", "full"),
    ("a max context length of 18000", "max_length", 18000),
    ("max seq length of 2048", "max_length", 2048),
    ("--batch_size_training 16 --context_length 4096", "micro_batch_size", 16),
    ("--batch_size_training 16 --context_length 4096", "max_length", 4096),
    ("loss scale at minimum, I am not using zero3 with deepspeed", "zero_stage", None),
    ("deepspeed --num_gpus 8 src/train.py --deepspeed $cur_path/ds_config_zero3.json --stage kto", "zero_stage", 3),
    ("PER_DEVICE_BATCH_SIZE=${PER_DEVICE_BATCH_SIZE:-1}", "micro_batch_size", 1),  # its default, not -1 (ninth round)
    # hardware and versions
    ("# batch size per gpu: 4\nloss一直为0", "gpu", None),
    ("- GPU type: NVIDIA GeForce RTX 4070 Ti SUPER", "gpu", "RTX 4070 Ti SUPER"),
    ("- GPU type: NVIDIA TITAN RTX", "gpu_bf16", False),
    ("On my local single 4090, loss nan", "gpu", "RTX 4090"),
    ("GPU：7 个 NVIDIA 3090 24G\nPyTorch：2.1.2+cu121", "torch_version", "2.1.2+cu121"),
    ("LLaMA-Factory版本：v0.5.3", "framework_version", "0.5.3"),
    ("- PyTorch version (accelerator?): 2.9.0+cu128 (CUDA)", "torch_version", "2.9.0+cu128"),
    ("两机十六卡训练", "num_gpus", None),  # not the 六卡 of 十六卡
    ('执行命令：`CUDA_VISIBLE_DEVICES=0,1,3 llamafactory-cli train x.yaml`', "num_gpus", 3),
    ("==((====))==  Unsloth 2025.3.17: Fast Gemma3 patching. Transformers: 4.50.0.dev0.", "framework_version",
     "2025.3.17"),
    ("Unsloth: Fast Mistral patching release 2024.7", "framework_version", "2024.7"),
    ("RM loss nan with trlx 0.5.0", "framework", "trlx"),
    # a repository's image or wiki link names no model
    ("DPO rewards are 0\n![image](https://github.com/foo/llama3-Chinese-chat/assets/1/abc.png)", "model_family", None),
    # log records: a preference loss pinned at ln 2 with zero margins; ms-swift's own records
    (("{'loss': 0.6931, 'rewards/chosen': 0.0, 'rewards/rejected': 0.0, 'rewards/margins': 0.0, 'epoch': 0.01}\n"
     "{'loss': 0.6931, 'rewards/chosen': 0.0, 'rewards/rejected': 0.0, 'rewards/margins': 0.0, 'epoch': 0.02}"),
     "pairwise_tie", True),
    ("{'loss': 0.6931, 'rewards/chosen': 0.0, 'rewards/rejected': 0.0, 'rewards/margins': 0.0, 'epoch': 0.01}",
     "pairwise_tie", None),  # every DPO run's first step
    (("{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'memory(GiB)': 30.2, 'train_speed(iter/s)': 0.1, "
     "'epoch': 0.5, 'global_step/max_steps': '805/1966'}"), "framework", "ms-swift"),
])
def test_raw_thread_openings_fourth_round(text, key, value):
    assert values(text).get(key) == value


# The fifth round (multimodal fine-tuning, long training logs, plain PyTorch loops and small projects, masking /
# template / padding reports).
_NEOX = (" samples/sec: 1.702 | iteration        {i}/   55000 | elapsed time per iteration (ms): 9398.3 | learning rate: "
         "{lr} | approx flops per GPU: 47.4TFLOPS | lm_loss: {loss} | loss scale: 4096.0 |")


@pytest.mark.parametrize(("text", "key", "value"), [
    # log formats
    (("[pretrain.py][INFO] Epoch:[0/2](6000/293491) loss:4.294 lr:0.0000991\n"
     "[pretrain.py][INFO] Epoch:[0/2](7000/293491) loss:nan lr:0.0000987"), "first_bad_step", 7000),
    (_NEOX.format(i=1, lr="1.212E-09", loss="2.275809E+00") + "\n" + _NEOX.format(i=2, lr="2.424E-09", loss="nan"),
     "learning_rate", 2.424e-09),  # GPT-NeoX's lines are records; their rate is a logged one, not a setting
    ("Epoch 0:  71%|#####| 5880/8295 [04:01<01:39, 24.37it/s, v_num=0, train_loss_step=nan.0]", "nan_metrics",
     ["train_loss_step"]),  # Lightning prints nan.0
    ('{"loss": 0.0, "global_step/max_steps": "1/10000", "memory(GiB)": 55.33, "train_speed(s/it)": 35.87}',
     "framework", "ms-swift"),
    (("[rank0]:[titan] 2025-01-01 - root - INFO - step: 79  loss:  7.62585  grad_norm: 26.6250\n"
     "[rank0]:[titan] 2025-01-01 - root - INFO - step: 80  loss:  nan  grad_norm: nan"), "framework", "torchtitan"),
    ("time (ms) | forward: 1897.36 | backward: 3000.1 | optimizer: 1450.71 | batch generator: 3.2", "optim", None),
    # steps and values in words
    ("训练到20000多steps就出现了nan", "first_bad_step", 20000),
    ("在第300步后loss变成nan", "first_bad_step", 300),
    ("the loss was always 0.", "zero_metrics", ["loss"]),
    ("loss is 0.5.", "zero_metrics", None),
    ("with bf16 the loss is 0 and `grad_norm` is nan", "nan_metrics", ["grad_norm"]),
    ("The perplexity and cross-entropy become NaN after about 480000 steps", "nan_metrics", ["loss"]),
    ("loss为0 grand_norm为nan", "nan_metrics", ["grad_norm"]),
    ("loss is nan. No pre-crash signature, no reward-std collapse.", "symptom", ["nan"]),
    # no ZeRO stage from a recipe's stage; no attention from an installed package
    ("Loss becomes zero and grad_norm turns to NaN during stage 2 training", "zero_stage", None),
    ("deepspeed stage 2 loss nan", "zero_stage", 2),
    ("flash-attn==2.5.8\nloss nan", "attn_implementation", None),
    ("use flash attention 2, loss nan", "attn_implementation", "flash_attention_2"),
    # dtypes: given up, or a hardware check
    ("I changed the --mixed_precision to FP16 instead of BF16 since this GPU card cannot work on BF16. Loss is nan.",
     "working_dtype", None),
    ("The GPU passed a bf16 GEMM check with zero ECC errors. Loss is nan at step 30.", "precision", None),
    # algorithms: a projector's path and argument are no pretraining run; a stage that went fine is passed over
    ("loss is nan\n--lora_enable True --pretrain_mm_mlp_adapter ./checkpoints/llava-pretrain/mm_projector.bin",
     "algorithm", None),
    ("Pretraining was fine. Fine-tuning gives loss nan.", "algorithm", "SFT"),
    # frameworks: trl listed among installed packages is no framework
    ("loss变成nan\n[57323] - TRL version: 0.9.6", "framework", None),
    ("rinna/japanese-gpt-neox-3.6b-instruction-ppo in 8 bit: eval_loss nan", "framework", None),  # a model's name
    # GPUs
    ("device: 2080ti, loss nan", "gpu", "RTX 2080 Ti"),
    ("Training on 8xH100, loss goes nan at step 30.", "gpu", "H100"),
    ("Running on 1 Nvidia L40S", "num_gpus", 1),
    ("训练loss骤降\n![Image](https://github.com/user-attachments/assets/8906c13c-bc18-4a40-b3bb-9fb5997f96e3)", "num_gpus",
     None),  # not "4a40" inside an attachment's id
    # commands and shell variables
    ("export CUDA_VISIBLE_DEVICES=\"1,6,7\" && DS_SKIP_CUDA_CHECK=1 torchrun --standalone --nproc_per_node=gpu train.py",
     "num_gpus", 3),
    (("BATCH_SIZE=${BATCH_SIZE:-128}\nPER_DEVICE_BATCH_SIZE=${PER_DEVICE_BATCH_SIZE:-1}\n"
     "torchrun train.py --per_device_train_batch_size ${PER_DEVICE_BATCH_SIZE}"), "micro_batch_size", 1),
    ("python reward_modeling.py --max_source_length 256 --max_target_length 256", "max_prompt_length", 256),
    # masking set up in code, and TRL's warning that an instance was masked whole
    ('trainer = train_on_responses_only(trainer, instruction_part = "user", response_part = "model")',
     "completion_only_loss", True),
    ("collator = DataCollatorForCompletionOnlyLM(response_template, tokenizer=tokenizer)", "completion_only_loss", True),
    ("UserWarning: Could not find response key [22559, 25, 220] in the following instance.", "errors",
     ["labels_all_masked"]),
    ('{"image": ["a.jpg"], "text": "Human: <image>", "task_type": "xxx"}', "lora_task_type", None),
])
def test_raw_thread_openings_fifth_round(text, key, value):
    assert values(text).get(key) == value


# The sixth round: out-of-scope look-alikes (English and Chinese), whose false symptoms would send a report in scope,
# and reports on 2025-2026 models.
@pytest.mark.parametrize(("text", "key", "value"), [
    # no symptom from an NCCL watchdog line, an identifier, a sampling error's wording, a feature request
    ("[PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception", "symptom", None),
    ("the model outputs token id 0 only", "symptom", ["collapse"]),
    ("multi_tensor_applier(self.multi_tensor_adam, self._dummy_overflow_buf, tensors)", "symptom", None),
    ("[deepspeed] OVERFLOW! Rank 0 Skipping step", "symptom", ["overflow"]),
    ("训练正常，推理时报错 RuntimeError: probability tensor contains either `inf`, `nan` or element < 0", "symptom", None),
    ("It would be useful to stop training when the loss is NaN.", "nan_metrics", None),
    ("Please add an option to skip the batch if grad_norm is nan.", "symptom", None),
    ("What happens if the loss becomes 0?", "zero_metrics", None),
    ("training stops when the loss becomes nan at step 300", "nan_metrics", ["loss"]),
    # no setting from a supposition, from alternatives, from install lines, from a scheduler's 0
    ("假如用bf16来微调的话，V100是不支持bf16的吧，那模型能在V100上跑吗？", "precision", None),
    ("max_length = 2048或者4096\nbatch_size = 1或者9", "max_length", None),
    ("使用两张v100或者4张v100，loss 为 nan", "num_gpus", None),
    ("%pip uninstall torch transformers trl peft -y\n%pip install -Uq bitsandbytes trl peft", "framework", None),
    ("%pip uninstall torch transformers trl peft -y\n%pip install -Uq bitsandbytes trl peft", "use_peft", None),
    ("In the later stage of GRPO training, lr=0, grad_norm=NaN", "learning_rate", None),
    ("swift rlhf --rlhf_type grpo --external_plugins plugin/custom_reward.py", "algorithm", "GRPO"),
    ("actor_rollout_ref.actor.megatron.use_mbridge=True", "framework", "verl"),  # Megatron is verl's backend here
    ("[VRAM] After base model load: 65.2 GB alloc", "model", None),
    # read
    ("batchsize设置为1，deepspeed zero3配置，仍然显示显存不够", "micro_batch_size", 1),
    ("batchsize设置为1，deepspeed zero3配置，仍然显示显存不够", "errors", ["cuda_oom"]),
    ("我环境的transformer版本4.39.3，torch 2.2.2。loss 为 nan", "transformers_version", "4.39.3"),
    ("- paddlenlp: 3.0.0b2\nloss 为 nan", "framework_version", "3.0.0b2"),
    ("axolotl version: 0.12.2", "framework_version", "0.12.2"),
    ("batch_size: 4\ngrad_accum_steps: 4", "gradient_accumulation_steps", 4),
    ("gpu_count=2 #$(nvidia-smi -L | wc -l)\ntorchrun --nproc-per-node ${gpu_count} train.py", "num_gpus", 2),
    ("A800  80G *8 的机器  zero2，loss 为 nan", "num_gpus", 8),
    ("Qwen3-30B-A3B OOM with GRPO on 4x8H200 141G", "gpu", "H200"),
    ("Qwen3-30B-A3B OOM with GRPO on 4x8H200 141G", "num_nodes", 4),
    ('base_model=\\"Qwen/Qwen2.5-1.5B-Instruct\\"', "model", "Qwen/Qwen2.5-1.5B-Instruct"),
    (("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
     "V100-PCIE-32GB GPU has compute capability 7.0"), "errors", ["dtype_crash"]),
    ("```CUDA_VISIBLE_DEVICES=0 python src/train_bash.py --stage sft --model_name_or_path /Qwen-1_8B --fp16```",
     "framework", "LLaMA-Factory"),
    # model families of 2025-2026
    ("--model google/gemma-4-31b-it", "model_family", "gemma4"),
    ('model_name="gpt-oss-20b"', "model_family", "gpt-oss"),
    ("Llama-4-Scout-17B-16E-Instruct LoRA: loss nan", "model_family", "llama4"),
])
def test_raw_thread_openings_sixth_round(text, key, value):
    assert values(text).get(key) == value


# The seventh round: the opening posts of case-base threads as their reporters wrote them (`kb eval --cv --texts`),
# set beside our own write-up of the same report. What the opening states and the write-up's facts had, but the
# opening's were missing (or false):
@pytest.mark.parametrize(("text", "key", "value"), [
    ("使用baichuan2-13B进行微调时出现loss全为0的情况", "zero_metrics", ["loss"]),
    ("loss在训练过程中（1个epoch之后）突然降至0", "zero_metrics", ["loss"]),
    ("loss（没有）降至0", "zero_metrics", None),  # an aside that negates is not passed over
    ("采用amp模式进行训练step1 loss直接走到Nan，优化器用的adam", "nan_metrics", ["loss"]),
    ("All settings are standard, eval loss keeps coming back as `nan`. Why might this be?", "nan_metrics", ["eval_loss"]),
    ("Eval loss is 'nan'", "nan_metrics", ["eval_loss"]),
    ('I got "NaN" in training loss and validation loss as below:', "nan_metrics", ["loss"]),
    ("[FA3] `nan` gradients in the BW pass", "nan_metrics", ["gradients"]),
    # the sentence goes on about the metric in a clause of its own
    ("loss先在2左右上下波动，然后突然变成0，后面一直保持为0，应该是出问题了吧。", "zero_metrics", ["loss"]),
    ("采用freeze 调试时，Loss突然增大，然后变为0，有大佬遇到过没有", "zero_metrics", ["loss"]),
    ("the loss decreases normally, then suddenly becomes nan", "nan_metrics", ["loss"]),
    ("the loss decreases, then grad_norm becomes nan", "nan_metrics", ["grad_norm"]),
    ("loss 正常下降，然后不会变成0", "zero_metrics", None),
    ("loss 从 2 降到 1，然后降到 0.5", "zero_metrics", None),
    ("[GKD] 0 loss", "symptom", ["zero_loss"]),
    ("Epoch 0 loss: 2.3", "symptom", None),
    ("the loss becomes the following:\ntensor(nan, device='cuda:1', dtype=torch.float16, grad_fn=<NllLossBackward0>)",
     "nan_metrics", ["loss"]),
    ("* Before the change, the loss dramatically rises after an update.", "spike_metrics", ["loss"]),
    ("如图第一步loss为500多，在其他模型刚开始的时候都是3-4左右", "huge_metrics", ["loss"]),
    ("loss为500多步", "huge_metrics", None),
    ("## Fixes a bug where the GKD loss and gradient norm become unexpectedly large when using TRL >= 0.24",
     "symptom", ["collapse"]),
    # false
    ("With `if self.optimizer is not None and self.fp16_enabled():`, a BF16 optimizer will not execute it",
     "optim", None),
    ("optimizer: adamw_torch", "optim", "adamw_torch"),
    # Unsloth's issue form lists "TRL = 0.21.0": a version, not the `trl` command line
    ("Torch = 2.6.0+cu124\nUnsloth = 2025.8.5\nTRL = 0.21.0", "framework", "unsloth"),
    ("TRL = 0.21.0", "trl_version", "0.21.0"),
    ("trl sft --model_name_or_path Qwen/Qwen2-0.5B --dataset_name x", "framework", "trl"),
    # a count read from a word: "on" is no max_length
    ("the reporter shared a runnable sweep over max_length on pythia-160m.", "max_length", None),
    ("max_length: 2048", "max_length", 2048),
    # what worked, not the run's setting
    ("但是将max_length改为4096时loss正常", "max_length", None),
    ("按默认超参（5e-5）训练后策略坍塌，lr=1e-6 可稳定收敛。", "learning_rate", None),
    ("按默认超参（5e-5）训练后策略坍塌，lr=1e-6 可稳定收敛。", "fix_changes", ["learning_rate=1e-06"]),
    ("max_length 2048 时 loss 为 0", "max_length", 2048),
    # an issue form's "Model:" line: the hub id among the words, or none
    ("  - Model: unsloth/Qwen3.5-4B and unsloth/Qwen3.5-9B (both affected)", "model", "unsloth/Qwen3.5-4B"),
    ("- Model: `unsloth/gemma-4-26B-A4B-it` loaded via `FastModel.from_pretrained` (bf16, no quantization)", "model",
     "unsloth/gemma-4-26B-A4B-it"),
    ("- Model: 219.33B-param MoE (Cohere2Moe class), 128 experts, top-8 routing", "model", None),
    ("model: Llama 2 7B", "model", "Llama 2 7B"),
    ("(bf16, no quantization, `full_finetuning=False`)", "finetuning_type", None),
    ("full_finetuning=True", "finetuning_type", "full"),
    # a training loss that falls and climbs back; zero gradients said in words
    ("During the training, the loss first drops and then rises", "symptom", ["collapse"]),
    ("训练loss先下降后上升", "symptom", ["collapse"]),
    ("eval loss first decreases and then increases", "symptom", None),  # overfitting
    ("验证集loss先降后升", "symptom", None),
    ("the fused-loss kernel produces zero gradients with a last-assistant-only label mask", "symptom", ["zero_grad"]),
    ("the gradients are all zero", "symptom", ["zero_grad"]),
    ("zero gradient accumulation steps", "symptom", None),
    # from a second draw of openings (English), whose first reading left these in-scope titles without a symptom
    ("[Question] The loss first normal, but suddenly become 0", "zero_metrics", ["loss"]),
    ("[Question] lora finetune loss=0.00", "zero_metrics", ["loss"]),
    ("loss=0.05", "symptom", None),
    ("Zero Training Loss while finetuning a mistral model for summarization", "symptom", ["zero_loss"]),
    ("[BUG] Gradient norm abnormally increases when training with ZeRO-0", "symptom", ["collapse"]),
    ("Abnormal loss rises during finetune_task_lora.sh", "symptom", ["collapse"]),
    ("loss 正常，但是突然变成 nan", "nan_metrics", ["loss"]),
    ("Getting inf loss followed by 0.0 loss and nan", "symptom", ["inf", "nan", "zero_loss"]),
    ("Distillation loss produces NaNs", "nan_metrics", ["loss"]),
    # from a fourth draw (in scope and out of scope): false metrics
    ("Reset loss to zero on logging in Trainer to avoid bfloat16 issues", "zero_metrics", None),
    ("the loss goes to zero", "zero_metrics", ["loss"]),
    ("(no dataset completions → `num_items = 0` → loss `= sum/0 = NaN`, poisoning the model)", "nan_metrics", None),
    ("pg_loss和adv/mean接近0", "zero_metrics", None),  # near 0, and "adv/mean接近" is no metric
    ("loss和grad_norm都是0", "zero_metrics", ["loss"]),
])
def test_raw_thread_openings_seventh_round(text, key, value):
    assert values(text).get(key) == value


@pytest.mark.parametrize("text,key,value", [
    # a bare batch_size beside a micro-batch is the global batch (alpaca-lora's finetune.py)
    ("--batch_size=384 --micro_batch_size=12 loss nan", "micro_batch_size", 12),
    ("python finetune.py --base_model x --micro_batch_size 4 --batch_size 128", "micro_batch_size", 4),
    ("--batch_size 16 --lr 1e-5", "micro_batch_size", 16),
    ("batch_size: 8\nper_device_train_batch_size: 2", "micro_batch_size", 2),
    # forum posts and blog write-ups (2026-12-07, eighteenth session)
    ("TRL hardcodes `use_cache=False`, which breaks Gemma 4's KV-sharing attention.", "sequence_parallel", None),
    ("ring attention on, loss nan", "sequence_parallel", True),
    ("The 4-bit quantization in QLoRA adds error that plain full-precision LoRA does not have. Loss goes nan.",
     "precision", None),
    ("training in full precision, loss nan", "precision", "fp32"),
    ("DPO training with trl DPOTrainer using adamw_8bit optimizer, loss is nan", "optim", "adamw_8bit"),
    ("I use the adamw_torch_fused optimizer and the loss is nan", "optim", "adamw_torch_fused"),
    ("not using paged_adamw_8bit, loss nan", "optim", None),
    ("One 4090, axolotl, qLoRA, 4-bit, batch size 1. Loss is nan.", "gpu", "RTX 4090"),
    ("One 4090, axolotl, qLoRA, 4-bit, batch size 1. Loss is nan.", "num_gpus", 1),
    ("two 4090s, loss nan", "num_gpus", 2),
    ("at step 4090 loss nan", "gpu", None),
    ("the 2080s", "gpu", None),
    ("8 A100s, loss is nan", "gpu", "A100"),
    ("8 A100s, loss is nan", "num_gpus", 8),
    ("two A100s, loss is nan", "num_gpus", 2),
    ("8 A4000s split 4/4 between a vLLM generation server and DDP training", "gpu", "A4000"),
    ("RTX A4000, loss is nan", "gpu", "A4000"),
    # less-covered frameworks' issues (ColossalAI, OpenRLHF, torchtitan, Megatron, open-r1, ms-swift, axolotl)
    ("torchrun train_sft.py --accumulation_steps 8", "gradient_accumulation_steps", 8),
    ("colossalai=0.3.3", "framework_version", "0.3.3"),
    ("But when training one step, the loss becomes NAN.", "first_bad_step", 1),
    ("after the first step the loss is nan", "first_bad_step", 1),
    ("after two steps loss is nan", "first_bad_step", 2),
    ("after one step of warmup the loss is fine", "first_bad_step", None),
    ("The loss hits NaN around 80 iters in.", "first_bad_step", 80),
    ("The run crashed due to NaN's for the loss.", "nan_metrics", ["loss"]),
    ("--bf16 \\\n--fp8-format hybrid \\\n--transformer-impl transformer_engine", "precision", "fp8"),
    ("--fp8-hybrid --bf16", "precision", "fp8"),
    ("fp8: null\nbf16: true", "precision", "bf16"),
    ("# Num processes is less by 1 as vLLM is using 1 GPU\nnum_processes: 4", "num_gpus", 4),
    ("NPROC_PER_NODE=8 megatron sft --model Qwen/Qwen3-8B --train_type lora", "framework", "ms-swift"),
    ("Train loss stays at 0.0 at micro_batch_size=1 and a seqlen of 2048", "max_length", 2048),
    # Chinese fine-tuning repositories (ChatGLM, Baichuan, Qwen, MedicalGPT, minimind, Pai-Megatron-Patch)
    ("单张4090上使用ptuning文件夹里面的train.sh进行微调，loss一直是0", "num_gpus", 1),
    ("单卡A100训练，loss为nan", "num_gpus", 1),
    ("与单卡A100不一致", "num_gpus", None),
    ("TP=4、PP=2 在两台 4090 机器上训练", "num_gpus", None),
    ("使用一张4090显卡在windows上进行训练，bs=2，loss 为 0", "num_gpus", 1),
    ("2张4090上训练，loss 为 nan", "num_gpus", 2),
    ("两张3090训练，loss为nan", "num_gpus", 2),
    ("8*4090 训练 loss nan", "num_gpus", 8),
    ("我在3090*8上进行的微调，loss 为 nan", "gpu", "RTX 3090"),
    ("我在3090*8上进行的微调，loss 为 nan", "num_gpus", 8),
    ("deepspeed train.py --ds_file ds_zero3_no_offload.json ; loss: nan", "zero_stage", 3),
    ("学习率为代码中默认的5e-7，训练到第二个epoch loss为nan", "learning_rate", 5e-7),
    ("Deepseek V3 finetune 特别大的loss, 第二步 loss Nan", "first_bad_step", 2),
    ("第20步loss变成nan", "first_bad_step", 20),
    ("step 100 时 loss 变成 nan", "first_bad_step", 100),
    ("每 100 步 loss 为 nan", "first_bad_step", None),
    ("loss and grad_norm both become 0", "symptom", ["zero_loss", "zero_grad"]),
    ("Qwen1.5-14B-Chat 全参数微调时loss降为0", "model_family", "qwen2"),  # Qwen1.5 is the Qwen2 architecture
    ("``CUDA_VISIBLE_DEVICES=0 python3 supervised_finetuning.py --fp16", "num_gpus", 1),
    # Chinese RLHF and preference-training threads (verl, OpenRLHF, ms-swift, LLaMA-Factory)
    ("KL/grad_norm became nan", "nan_metrics", ["kl", "grad_norm"]),
    ("rewards/chosen is nan", "nan_metrics", ["rewards/chosen"]),
    ("llama-factory 0.6.2，训练过程loss为0", "framework_version", "0.6.2"),
    ("我使用的是llamafactory，DPO 训练后推理重复输出\ntrl 0.11.4", "framework", "LLaMA-Factory"),
    ("swift rlhf --rlhf_type grpo --model-type qwq", "model_family", "qwen2.5"),
    ("swift rlhf --rlhf_type grpo --model-type llama", "model", None),
    ("python3 -m openrlhf.cli.train_ppo_ray --actor_num_nodes 2 --actor_num_gpus_per_node 8", "num_gpus", 8),
    ("python3 -m openrlhf.cli.train_ppo_ray --actor_num_nodes 2 --actor_num_gpus_per_node 8", "num_nodes", 2),
    ("PPO loss nan\ntorch>=1.13.1\ntrl>=0.7.4\npeft>=0.7.0", "torch_version", None),
    ("PPO loss nan\ntorch>=1.13.1\ntrl>=0.7.4\npeft>=0.7.0", "framework", None),
    ("PPO训练过程中KL divergence出现负值", "symptom", None),
    ("训练发生divergence了", "symptom", ["collapse"]),
    ("PPO 训练 loss nan，机器配置RTX3090 24GB", "gpu", "RTX 3090"),
    ("- GPU type: NVIDIA GeForce RTX 4090\nloss is nan", "gpu", "RTX 4090"),
    ("每一步都有warning提示grad_norm 为nan", "first_bad_step", 1),
    ("grad_norm is nan at every step", "first_bad_step", 1),
    ("The first logged loss is 1.19e+34, then loss 0.0 on every step.", "first_bad_step", None),
    # RL fine-tuning reports of 2025-2026 (TRL GRPO, verl, OpenRLHF, slime, AReaL, NeMo-RL, SkyRL, unsloth)
    ("I am running slime v0.1.0 and the grad norm is nan.", "framework_version", "0.1.0"),
    ("step 1: {'train/loss': 0.10, 'train/grad_norm': 2955012562.82, 'train/lr-pg_0': 1e-07, 'train/step': 1}",
     "learning_rate", 1e-07),
    ("grad_norm eventually starts to spike after 10k steps", "spike_metrics", ["grad_norm"]),
    ("Actor/policy loss steep rise, and mean reward steep fall", "spike_metrics", ["loss"]),
    ("Resuming led to an unexpected, dramatic increase in PPO KL loss.", "spike_metrics", ["loss"]),
    ("    n_nodes=2 \\\n    n_gpus_per_node=8 \\\nreward is nan", "num_gpus", 8),
    ("    n_nodes=2 \\\n    n_gpus_per_node=8 \\\nreward is nan", "num_nodes", 2),
    ("    actor.path=/fs/models/Qwen/Qwen3-4B \\\n    ppo.gen.max_new_tokens=4096 \\\nreward is nan", "max_completion_length",
     4096),
    ("python3 -m openrlhf.cli.train_ppo_ray --advantage_estimator group_norm --zero_stage 3", "algorithm", "GRPO"),
    ("python3 -m openrlhf.cli.train_ppo_ray --zero_stage 3", "algorithm", "PPO"),
    ("export lr=10\npolicy loss goes nan", "learning_rate", None),
    ("--lr 1.0 --optim prodigy", "learning_rate", 1.0),
    ("GRPO Stuck on Step 0\n- TRL version: 0.16.0.dev0\n- Transformers version: 4.49.0", "framework", "trl"),
    ("- `llamafactory` version: 0.9.2\n- TRL version: 0.9.6", "framework", "LLaMA-Factory"),
    ("accelerate launch --num_processes=7 src/open_r1/grpo.py ; loss goes nan", "framework", "trl"),
    ("I am seeing very high token_mult_prob_error when running GRPO", "symptom", ["rollout_mismatch"]),
    ("the training/rollout_probs_diff_max is very large", "symptom", ["rollout_mismatch"]),
    ("step 1: {'train/loss': 0.0006256469641812146, 'train/pg_loss': 0.0, 'train/step': 1}", "zero_metrics",
     ["train/pg_loss"]),
    ("GPU: NVIDIA GeForce RTX 2080 Ti. Max memory: 22.0 GB. Platform: Windows.", "gpu", "RTX 2080 Ti"),
    ("    gpu_memory_utilization = 0.9, # Reduce if out of memory", "errors", None),
    # preference and reward-model training (TRL, SimPO, trlX, EasyDeL)
    ("loss: nan\n{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-7, 'epoch': 0.45}", "first_bad_step", None),
    ("{'loss': 1.0, 'epoch': 0.01}\n{'loss': nan, 'epoch': 0.02}", "first_bad_step", 2),
    ('os.environ["CUDA_VISIBLE_DEVICES"] = "0"\nKTO loss is 0.0', "num_gpus", 1),
    ("- CUDA device(s): NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-80GB\nDPO rewards nan",
     "num_gpus", 3),
    ("trlx 0.5.0, loss is nan", "framework_version", "0.5.0"),
    ("I trained on hiyouga/DPO-En-Zh-20k and the rewards decreased rapidly.\nsimpo_gamma 0.5", "algorithm", "SimPO"),
    ("python examples/scripts/dpo.py --model x\nloss nan", "algorithm", "DPO"),
    ("from easydel import DPOTrainer\nfrom transformers import AutoTokenizer\nNan losses when training", "framework",
     None),
    ("from transformers import Trainer, TrainingArguments\nloss nan", "framework", "transformers"),
    # pretraining runs (nanoGPT, Megatron, NeMo, litgpt, llm-foundry, OLMo, GPT-NeoX)
    ("I am running on 2x 4090", "num_gpus", 2),
    ("I am training nanoGPT on an A100 GPU.", "num_gpus", 1),
    ("it's not an A100, loss nan", "num_gpus", None),
    ("I used a single GPU, loss nan", "num_gpus", 1),
    ("my loss keeps exploding between 30k and 100k iterations", "spike_metrics", ["loss"]),
    ("We are training an MPT-1B model, loss explodes", "model_family", "mpt"),
    ("pretraining OLMo-7B, loss nan", "model_family", "olmo"),
    ("grad norm is nan; there is no loss spike", "spike_metrics", None),
    ("The main training configuration is TP=8, PP=1, CP=1, sequence length 4096, BF16, MBS=24, and GBS=768.",
     "micro_batch_size", 24),
    ("I am using litgpt to pretrain Llama3.1-70b with 4 nodes each having 8 h100 Gpus", "num_nodes", 4),
    ("Nemo Version: NeMo-25.09", "framework", "NeMo"),
    ("from nemo.collections import llm", "framework", "NeMo"),
    ("Mistral-Nemo-12B loss nan", "framework", None),
    ("a change caused the loss to become NaN after 40 or so steps.", "first_bad_step", 40),
    ('always got a "nan loss encountered" error', "errors", ["nan_loss_error"]),
    ("When I use bf16, the loss becomes very large after the weight is updated for the first time.", "symptom",
     ["collapse"]),
    ("ValueError: nan loss detected", "nan_metrics", ["loss"]),
    # Chinese multimodal fine-tuning (InternVL, MiniCPM-V, Qwen-VL, GLM-4V, DeepSeek-VL, Ascend)
    ("The learning rate is 1e-7.", "learning_rate", 1e-7),
    ("The learning rate is 0.0001.", "learning_rate", 0.0001),
    ("torchrun --nproc_per_node=2 internvl/train/internvl_chat_finetune.py --use_llm_lora 16\nloss=0", "use_peft", True),
    ("the loss will decrease to 0 after step-1", "first_bad_step", 1),
    ("推理会报错`inf`, `nan` or element < 0", "symptom", None),
    ("更换2机16卡后，grad_norm变成nan", "num_nodes", 2),
    ("更换2机16卡后，grad_norm变成nan", "num_gpus", 8),
    (("{'loss': '0', 'global_step/max_steps': '3/294'}\n{'loss': '0', 'global_step/max_steps': '2/294'}\n"
     "{'loss': '12.9', 'global_step/max_steps': '1/294'}"), "first_bad_step", 2),  # a log viewer's newest-first paste
    ("第二个step及以后 loss变为0", "first_bad_step", 2),
    ("loss在100个step后变成0", "first_bad_step", 100),
    ("gradnorm为nan", "nan_metrics", ["grad_norm"]),
    ("swift sft --model_id_or_path /data/ckpt/my-model --sft_type full\nloss=0", "model", "/data/ckpt/my-model"),
    ("我在8张3090上面训练会超显存", "errors", ["cuda_oom"]),
    ("- Transformers version: 4.49.0\n- TRL version: 0.9.6\nstage: sft\nfinetuning_type: full\nloss变成nan", "framework",
     "transformers"),
    ("[57325] - GPU number: 8\nloss变成nan", "num_gpus", 8),
    (("[INFO|2025-07-01 16:31:40] llamafactory.model.adapter:143 >> Upcasting trainable params to float32.\n"
     "Gradient overflow. Skipping step"), "precision", "fp16"),
    # Hugging Face library issues, and out-of-scope look-alikes (which must stay out of scope)
    ("The 0 loss and NaN outputs appear immediately as training begins.", "first_bad_step", 1),
    ("the loss becomes inf right away.", "first_bad_step", 1),
    ("In the first batch of training, after the backward of AdamW optimizer, the loss is nan.", "first_bad_step", 1),
    ("on the second step, loss will become `NaN`.", "first_bad_step", 2),
    ("on the second step, loss will become `NaN`.", "nan_metrics", ["loss"]),
    ("it gives ```nan``` in the validation loss", "nan_metrics", ["eval_loss"]),
    ("PER_DEVICE_BATCH = 1\nGRAD_ACCUM = 8", "micro_batch_size", 1),
    ("I'm using autocast with GradScaler to train on mixed precision. After few epochs the loss turns to nan.",
     "precision", "fp16"),
    ("NCCL 通信超时", "errors", ["nccl_error"]),
    ("NCCL operation timed out during GRPO training", "errors", ["nccl_error"]),
    ("model_name_or_path: /root/.cache/modelscope/hub/Qwen/Qwen2___5-7B-Instruct\nloss nan", "model_family", "qwen2.5"),
    ("4*A100 (80G) 全参微调 loss nan\n# torchrun --nproc_per_node=3\naccelerate launch src/train_sft.py --fp16",
     "num_gpus", 4),
    ("运行 torchrun --nproc_per_node 8 --nnodes 1 src/train.py configs/train_dpo/test.yaml\nstage: dpo\nloss nan",
     "framework", "LLaMA-Factory"),
    ("First of all, my gpu is rtx3090. loss becomes nan", "gpu", "RTX 3090"),
    ("Qwen-72b-Chat lora+Deepspeed-3微调 loss nan", "zero_stage", 3),
    ("DeepSpeed 0.9.3 loss nan", "zero_stage", None),
    ("grad_norm为nan\nnvidia-smi: NVIDIA H20, 535.216.03\nNVIDIA H20, 535.216.03\nNVIDIA H20, 535.216.03", "num_gpus", 3),
    ("GPU 0: NVIDIA H20 (UUID: GPU-1)\nGPU 1: NVIDIA H20 (UUID: GPU-2)\nloss nan", "num_gpus", 2),
    ('args = TrainingArguments(output_dir="out", fp16=True)\ntrainer = Trainer(model, args)\nloss is nan', "framework",
     "transformers"),
])
def test_raw_thread_openings_eighth_round(text, key, value):
    assert values(text).get(key) == value


# Left from the eighth round, fixed on 2026-12-08: a dtype said to work beside one that failed, a second metric
# named before the fall.
@pytest.mark.parametrize("text,key,value", [
    ("fp16 works well but bf16 loss is nan", "precision", "bf16"),
    ("fp16 works well but bf16 loss is nan", "working_dtype", None),
    ("bf16 loss is nan, fp16 works fine", "precision", "bf16"),
    ("fp16 训练正常，但是 bf16 loss 为 nan", "precision", "bf16"),
    ("fp16训练正常几百步后loss变nan", "precision", "fp16"),
    ("I train in fp16 and it works fine for 1000 steps then loss nan", "precision", "fp16"),
    ("bf16 training works fine but fp16 training gives nan loss", "precision", "fp16"),
    ("bf16 training works fine but fp16 training gives nan loss", "working_dtype", "bf16"),
    ("Loss and acc drop to 0 after 200 steps", "zero_metrics", ["loss"]),
    ("the loss and grad norm dropped to 0", "zero_metrics", ["loss"]),
    ("loss和grad_norm降到0", "zero_metrics", ["loss"]),
    # NVFP4 / MXFP4: FP4 GEMMs are a precision of their own, beside a --bf16 like FP8
    ("training with nvfp4, loss becomes nan", "precision", "fp4"),
    ("torchrun pretrain_gpt.py --bf16 --fp4-format nvfp4 --fp4-recipe nvfp4", "precision", "fp4"),
    ("fp4: e2m1", "precision", "fp4"),
    ("fp4: false", "precision", None),
    ("gpt-oss-20b mxfp4 weights, lora sft loss nan", "precision", None),
])
def test_left_from_the_eighth_round(text, key, value):
    assert values(text).get(key) == value


# Ninth round (2026-12-08): misreadings found in thread openings kb had never seen, each pinned by a minimal input.
@pytest.mark.parametrize("text,key,value", [
    # RL runs: a collapse named as a risk or as what a change prevents; the group-relative family; verl's entry point
    ("Clip-Higher promotes diversity and prevents entropy collapse.", "symptom", None),
    ("Symmetric clipping can cause entropy collapse.", "symptom", None),
    ("entropy collapse after 200 steps", "symptom", ["collapse"]),
    ("加了梯度裁剪防止 loss 变成 nan", "nan_metrics", None),
    ("加了梯度裁剪防止 loss 变成 nan，但 loss 还是 nan", "nan_metrics", ["loss"]),
    ("loss 还是 nan", "nan_metrics", ["loss"]),
    ("In the DAPO training scripts, ppo_epochs is not set.", "algorithm", "GRPO"),
    ("GSPO: actor_rollout_ref.actor.ppo_mini_batch_size=16", "algorithm", "GRPO"),
    ("DAPO training, kl is nan", "algorithm", "GRPO"),
    ("RLOOTrainer loss nan", "algorithm", "GRPO"),
    ("python3 -m verl.trainer.main_ppo data.train_batch_size=8\nGRPO training, loss nan", "algorithm", "GRPO"),
    ("python3 -m verl.trainer.main_ppo data.train_batch_size=8\nloss nan", "algorithm", "PPO"),
    ("grad_norm starts to become unstable and spike", "spike_metrics", ["grad_norm"]),
    ("grad_norm and kl loss skyrocket after a fixed number of steps", "spike_metrics", ["grad_norm"]),
    ("grad_norm和kl loss会急剧上升", "spike_metrics", ["grad_norm"]),
    ("the loss is fine but the grad_norm spikes", "spike_metrics", ["grad_norm"]),
    ("we use warmup to avoid loss spikes", "spike_metrics", None),
    ("NNODES=${NNODES:-16}", "num_nodes", 16),
    ("export NNODES=${NNODES:-2}", "num_nodes", 2),
    ("lr=${LR:-1e-6}", "learning_rate", 1e-6),
    ("NGPUS_PER_NODE=${NGPUS_PER_NODE:-8}", "num_gpus", 8),
    # preference and reward models
    ("accelerate launch --config_file recipes/accelerate_configs/deepspeed_zero3.yaml train.py", "zero_stage", 3),
    ("accelerate launch --config_file configs/fsdp_stage2.yaml train.py", "zero_stage", None),
    ("`CUDA_VISIBLE_DEVICES=0,1 python train.py --bf16", "num_gpus", 2),
    ("Run with `CUDA_VISIBLE_DEVICES=0,1 python train.py`", "num_gpus", 2),
    ("facebook/opt-iml-max-1.3b DPO loss nan", "model_family", "opt"),
    # env dumps and tracebacks
    ("actor_rollout_ref.model.enable_gradient_checkpointing=True", "gradient_checkpointing", True),
    ("torchrun pretrain_gpt.py --recompute-granularity full --bf16", "gradient_checkpointing", True),
    ("activation_checkpoint.mode: none", "gradient_checkpointing", False),
    ("16 GPUs across 2 nodes", "num_gpus", 8),
    ("16 GPUs across 2 nodes", "num_nodes", 2),
    ("2 nodes (16 GPUs), loss nan", "num_gpus", 8),
    ("The grad_norm is abnormally large.", "huge_metrics", ["grad_norm"]),
    ("grad_norm 变得异常大", "huge_metrics", ["grad_norm"]),
    ("grad norm is large at the start", "huge_metrics", None),
    ("the grad norm is not too large", "huge_metrics", None),
    ("sentence-transformers 2.2.2", "framework", None),
    ("transformers_stream_generator==0.0.4", "framework", None),
    ("deepspeed-mii 0.1", "framework", None),
    ("RuntimeError: 'probability tensor contains inf/nan'", "errors", ["prob_tensor_invalid"]),
    ("RuntimeError: 'probability tensor contains inf/nan'", "symptom", None),
    # multimodal and pretraining
    ("MiniCPM-2B sft loss nan", "model_family", "minicpm"),
    ("MiniCPM-Llama3-V-2_5 loss nan", "model_family", "llama3"),
    ("vicuna-7b lora loss 0", "model_family", "llama"),
    ("- LR 5e-5", "learning_rate", 5e-5),
    ("loss becomes extremely large (around 5e30)", "huge_metrics", ["loss"]),
    ('generate 报错 `inf`, `nan` or element < 0', "errors", ["prob_tensor_invalid"]),
    # Chinese fine-tuning threads
    ("loss=nan的情况", "nan_metrics", ["loss"]),
    ("grad_norm=Nan的情况", "nan_metrics", ["grad_norm"]),
    ("训练loss逐渐变大", "symptom", ["collapse"]),
    ("loss不降反增", "symptom", ["collapse"]),
    ("eval loss逐渐变大", "symptom", None),
    ("突然loss异常增大，然后接着loss就为0了", "spike_metrics", ["loss"]),
    ("--model_name_or_path F:\\data\\glm-4-9b-chat --bf16", "model", "F:\\data\\glm-4-9b-chat"),
    ("GPU: 8 x H100 80GB", "num_gpus", 8),
    ("GPU：7 个 NVIDIA 3090", "num_gpus", 7),
    ("machine: 8 A100", "num_gpus", 8),
    ("Instantiating LlamaForCausalLM model under default dtype torch.bfloat16.", "precision", None),
    ("python train.py --deepspeed ds_zero2.json, loss nan", "framework", "DeepSpeed"),
    ("loss在第1000步变成nan", "first_bad_step", 1000),
    ("grad_norm在第500步变成NaN", "first_bad_step", 500),
])
def test_raw_thread_openings_ninth_round(text, key, value):
    assert values(text).get(key) == value


def test_a_bilingual_issue_form_heading_is_not_the_reporters_language():
    from kb.tokenize import paste_lang

    form = "### Bug Description / Bug 描述\n{}\n### How to Reproduce / 如何复现"
    assert paste_lang(form.format("The KL divergence becomes NaN after a few hundred GRPO steps.")) == "en"
    assert paste_lang(form.format("训练几百步之后 KL 变成 NaN。")) == "zh"
    assert paste_lang("loss / 损失 变成 nan 了") == "zh"


def test_a_chinese_title_above_an_english_log_is_a_chinese_report():
    from kb.tokenize import paste_lang

    log = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.1}\nTraceback (most recent call last):"
    assert paste_lang("glm4微调出现nan\n" + log) == "zh"
    assert paste_lang("微调出现nan\nWhen I train with fp16 the loss becomes nan after a few steps\n" + log) == "en"
    assert paste_lang("loss nan\n" + log) == "en"


def test_a_dpo_loss_stuck_near_ln2_with_zero_margins_is_a_tie():
    one = "{'loss': 0.6934, 'rewards/chosen': 0.0, 'rewards/rejected': 0.0, 'rewards/margins': 0.0, 'epoch': 0.%d}"
    log = "\n".join(one % i for i in (1, 2))  # two records: one is every DPO run's first step
    assert values(log).get("pairwise_tie") is True
    assert values(one % 1).get("pairwise_tie") is None
    assert values(log.replace("0.6934", "0.6952")).get("pairwise_tie") is None
