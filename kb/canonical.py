"""The one place that knows canonical config keys, their aliases across frameworks, and value normalisation.

Every parser (raw articles, configs, command lines, logs) maps what it reads through `canonical_key` and
`normalise_value`, so that `--fp16`, `fp16: true` and `"fp16": {"enabled": true}` all become
`precision = "fp16"`, and `--sequence_parallel_size 4`, `ulysses_sequence_parallel_size=4` and
`ring_attn_size 4` all become `sequence_parallel_size = 4`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FactSpec:
    key: str
    kind: str  # "int" | "float" | "bool" | "str" | "dtype" | "version"
    aliases: tuple[str, ...] = ()
    description: str = ""
    # Values written by users mapped to the canonical value (lowercased keys).
    values: dict[str, Any] = field(default_factory=dict)


_DTYPE = {
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "torch.half": "fp16", "16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32", "32": "fp32", "full": "fp32",
    "auto": "auto",
}

FACTS: tuple[FactSpec, ...] = (
    # --- precision -------------------------------------------------------------------------------------
    FactSpec("precision", "dtype", ("mixed_precision", "dtype", "compute_dtype", "amp_dtype", "torch_dtype_compute"),
             "compute precision of the training step (mixed precision / autocast)", _DTYPE),
    FactSpec("weights_dtype", "dtype", ("torch_dtype", "model_dtype", "param_dtype", "model.half"),
             "dtype in which the trainable weights are stored (no fp32 master copy when fp16)", _DTYPE),
    FactSpec("fp16_loss_scale", "float", ("loss_scale", "initial_scale_power", "fp16_scale_tolerance"),
             "fp16 loss scaling setting"),
    # --- parallelism -----------------------------------------------------------------------------------
    FactSpec("sequence_parallel_size", "int",
             ("sequence_parallel_size", "sp_size", "ulysses_sequence_parallel_size", "ulysses_sp_size",
              "sequence_parallel_degree", "ring_attn_size", "ring_attention_size", "context_parallel_size",
              "cp_size", "context_parallel_degree", "sequence_parallel"),
             "sequence / context parallel degree (Ulysses, ring attention, CP)"),
    FactSpec("zero_stage", "int", ("zero_stage", "zero_optimization.stage", "stage3", "ds_stage"),
             "DeepSpeed ZeRO stage"),
    FactSpec("overlap_comm", "bool", ("overlap_comm", "zero_optimization.overlap_comm"), "DeepSpeed overlap_comm"),
    FactSpec("num_gpus", "int", ("num_gpus", "nproc_per_node", "gpus", "n_gpus", "world_size", "trainer.n_gpus_per_node"),
             "GPUs per node"),
    FactSpec("num_nodes", "int", ("num_nodes", "nnodes", "trainer.nnodes"), "nodes"),
    # --- lengths ---------------------------------------------------------------------------------------
    FactSpec("max_length", "int",
             ("max_length", "max_len", "cutoff_len", "max_seq_len", "max_seq_length", "model_max_length",
              "seq_length", "max_sequence_length", "data.max_length"),
             "maximum total sequence length"),
    FactSpec("max_prompt_length", "int", ("max_prompt_length", "max_prompt_len", "prompt_max_len", "data.max_prompt_length"),
             "maximum prompt length"),
    FactSpec("max_completion_length", "int",
             ("max_completion_length", "max_response_length", "max_target_length", "generate_max_len",
              "data.max_response_length"),
             "maximum completion / response length"),
    FactSpec("truncation_mode", "str", ("truncation_mode",), "which end is kept when truncating"),
    FactSpec("completion_only_loss", "bool", ("completion_only_loss", "train_on_prompt", "mask_prompt"),
             "loss only on completion tokens"),
    # --- algorithm / loss ------------------------------------------------------------------------------
    FactSpec("algorithm", "str", ("rlhf_type", "stage", "algorithm", "trainer_type", "algorithm.adv_estimator",
                                  "adv_estimator"),
             "training algorithm (sft, dpo, kto, simpo, orpo, rm, ppo, grpo, pretrain)"),
    FactSpec("loss_type", "str", ("loss_type", "dpo_loss", "pref_loss"), "preference loss variant"),
    FactSpec("vanilla_loss", "bool", ("vanilla_loss",), "OpenRLHF vanilla KTO loss"),
    FactSpec("rpo_alpha", "float", ("rpo_alpha",), "weight of the NLL (RPO) term on a DPO loss"),
    FactSpec("beta", "float", ("beta", "pref_beta", "dpo_beta", "kto_beta", "orpo_beta"), "preference beta"),
    FactSpec("average_log_prob", "bool", ("average_log_prob", "average_logps", "length_normalize"),
             "log-probs averaged over length"),
    FactSpec("use_kl_loss", "bool", ("use_kl_loss", "actor_rollout_ref.actor.use_kl_loss"), "KL as a loss term"),
    FactSpec("kl_estimator", "str",
             ("kl_estimator", "kl_loss_type", "actor_rollout_ref.actor.kl_loss_type", "kl_penalty",
              "algorithm.kl_penalty"),
             "KL estimator (k1, k2, k3 / low_var_kl, mse)",
             {"low_var_kl": "k3", "k3": "k3", "k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "abs": "abs",
              "k3+": "k3"}),
    FactSpec("kl_coef", "float", ("kl_coef", "kl_loss_coef", "init_kl_coef", "actor_rollout_ref.actor.kl_loss_coef"),
             "KL coefficient"),
    # --- attention / model -----------------------------------------------------------------------------
    FactSpec("attn_implementation", "str",
             ("attn_implementation", "attn_impl", "flash_attn", "use_flash_attn", "flash_attention", "attention"),
             "attention kernel", {"flash_attention_2": "flash_attention_2", "fa2": "flash_attention_2",
                                  "flash_attn": "flash_attention_2", "true": "flash_attention_2",
                                  "sdpa": "sdpa", "eager": "eager", "flash_attention_3": "flash_attention_3",
                                  "fa3": "flash_attention_3"}),
    FactSpec("shift_attn", "bool", ("shift_attn", "s2_attn", "use_s2_attn"), "LongLoRA shifted sparse attention"),
    FactSpec("model", "str", ("model", "model_name_or_path", "pretrain", "model_type", "model_id",
                              "actor_rollout_ref.model.path", "base_model"), "model name or path"),
    FactSpec("finetuning_type", "str", ("finetuning_type", "train_type", "sft_type", "tuner_type"),
             "full / lora / qlora"),
    FactSpec("use_peft", "bool", ("use_peft", "use_lora", "lora"), "PEFT adapters"),
    FactSpec("lora_task_type", "str", ("lora_task_type", "task_type"), "PEFT task type"),
    FactSpec("trainable_embeddings", "bool", ("train_embeddings", "modules_to_save_embed"),
             "embed_tokens / lm_head trained"),
    # --- optimisation ----------------------------------------------------------------------------------
    FactSpec("learning_rate", "float", ("learning_rate", "lr", "actor_learning_rate", "optim.lr",
                                        "actor_rollout_ref.actor.optim.lr"), "learning rate"),
    FactSpec("vision_learning_rate", "float", ("vision_tower_lr", "vit_lr", "vision_lr", "freeze_vision_tower"),
             "learning rate of the vision tower"),
    FactSpec("micro_batch_size", "int",
             ("per_device_train_batch_size", "micro_train_batch_size", "micro_batch_size", "batch_size",
              "train_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu"), "per-device micro-batch size"),
    FactSpec("gradient_accumulation_steps", "int", ("gradient_accumulation_steps", "grad_accum", "accumulative_counts"),
             "gradient accumulation steps"),
    FactSpec("max_grad_norm", "float", ("max_grad_norm", "gradient_clipping", "grad_clip", "clip_grad"), "clipping"),
    FactSpec("optim", "str", ("optim", "optimizer", "optimizer.type"), "optimizer"),
    FactSpec("gradient_checkpointing", "bool", ("gradient_checkpointing", "grad_checkpoint"), "activation checkpointing"),
    # --- environment -----------------------------------------------------------------------------------
    FactSpec("framework", "str", ("framework",), "training framework"),
    FactSpec("torch_version", "version", ("torch", "pytorch", "torch_version"), "PyTorch version"),
    FactSpec("deepspeed_version", "version", ("deepspeed", "deepspeed_version"), "DeepSpeed version"),
    FactSpec("transformers_version", "version", ("transformers", "transformers_version"), "transformers version"),
    FactSpec("trl_version", "version", ("trl", "trl_version"), "TRL version"),
    FactSpec("framework_version", "version", ("ms-swift", "swift", "openrlhf", "xtuner", "llamafactory", "verl"),
             "version of the training framework"),
    FactSpec("flash_attn_version", "version", ("flash-attn", "flash_attn_version"), "flash-attn version"),
    FactSpec("gpu", "str", ("gpu", "gpu_name", "device_name"), "GPU model"),
)

_BY_KEY: dict[str, FactSpec] = {f.key: f for f in FACTS}
_ALIAS: dict[str, str] = {}
for _spec in FACTS:
    _ALIAS[_spec.key] = _spec.key
    for _a in _spec.aliases:
        _ALIAS.setdefault(_a.lower(), _spec.key)


def spec(key: str) -> FactSpec | None:
    return _BY_KEY.get(key)


def _clean_key(raw: str) -> str:
    k = raw.strip().strip("-").strip().lower().replace("-", "_")
    return re.sub(r"\s+", "_", k)


def canonical_key(raw: str) -> str | None:
    """Map a user-written key (`--cutoff_len`, `zero_optimization.stage`, `max-len`) to its canonical key."""
    k = _clean_key(raw)
    if k in _ALIAS:
        return _ALIAS[k]
    # Dotted paths (verl / hydra overrides, nested YAML): try the full path, then its tail.
    parts = k.split(".")
    for i in range(1, len(parts)):
        tail = ".".join(parts[i:])
        if tail in _ALIAS:
            return _ALIAS[tail]
    return None


_TRUE = {"true", "yes", "on", "1", "enable", "enabled", "y"}
_FALSE = {"false", "no", "off", "0", "disable", "disabled", "n", "none", "null"}


def parse_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return bool(v)
    s = str(v).strip().strip("'\"").lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    return None


def parse_number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    s = str(v).strip().strip("'\"").replace("_", "")
    try:
        return float(s)
    except ValueError:
        return None


def normalise_value(key: str, value: Any) -> Any:
    """Normalise `value` for canonical `key`; returns None when the value cannot be understood."""
    s = _BY_KEY.get(key)
    if s is None:
        return value
    if s.kind == "bool":
        return parse_bool(value)
    if s.kind == "int":
        n = parse_number(value)
        if n is None:
            b = parse_bool(value)
            return None if b is None else int(b)
        return int(n)
    if s.kind == "float":
        return parse_number(value)
    text = str(value).strip().strip("'\"")
    if s.kind == "dtype":
        return _DTYPE.get(text.lower())
    if s.values:
        return s.values.get(text.lower(), text.lower())
    if s.kind == "str" and key in {"algorithm", "loss_type", "finetuning_type", "optim", "lora_task_type",
                                   "truncation_mode"}:
        return text.lower()
    return text


def canonical(raw_key: str, value: Any) -> tuple[str, Any] | None:
    """(canonical key, normalised value) or None when the key is unknown or the value unusable."""
    key = canonical_key(raw_key)
    if key is None:
        return None
    v = normalise_value(key, value)
    if v is None:
        return None
    return key, v


# Framework names and their aliases, as they appear in prose, commands and package lists.
FRAMEWORKS: dict[str, tuple[str, ...]] = {
    "ms-swift": ("ms-swift", "ms_swift", "swift", "modelscope swift"),
    "OpenRLHF": ("openrlhf",),
    "trl": ("trl", "huggingface trl"),
    "xtuner": ("xtuner",),
    "LLaMA-Factory": ("llama-factory", "llamafactory", "llama_factory", "llamafactory-cli"),
    "verl": ("verl",),
    "DeepSpeed": ("deepspeed",),
    "DeepSpeed-Chat": ("deepspeed-chat", "deepspeedexamples", "deepspeed chat"),
    "unsloth": ("unsloth",),
    "ColossalAI": ("colossalai", "colossal-ai", "colossal ai"),
    "transformers": ("transformers", "hf trainer", "huggingface trainer"),
    "pytorch": ("pytorch", "torch"),
    "axolotl": ("axolotl",),
    "Megatron-LM": ("megatron", "megatron-lm"),
    "nemo-rl": ("nemo-rl", "nemo rl"),
}

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "SFT": ("sft", "supervised fine-tuning", "指令微调", "监督微调"),
    "DPO": ("dpo", "direct preference optimization", "直接偏好优化"),
    "KTO": ("kto", "kahneman-tversky"),
    "SimPO": ("simpo",),
    "IPO": ("ipo",),
    "ORPO": ("orpo",),
    "CPO": ("cpo",),
    "RM": ("reward model", "reward modeling", "rm", "奖励模型"),
    "PPO": ("ppo",),
    "GRPO": ("grpo",),
    "pretrain": ("pretrain", "pretraining", "pre-training", "continue pretrain", "预训练"),
}


def canonical_framework(text: str) -> str | None:
    t = text.strip().lower()
    for name, aliases in FRAMEWORKS.items():
        if t == name.lower() or t in aliases:
            return name
    return None


def canonical_algorithm(text: str) -> str | None:
    t = text.strip().lower()
    for name, aliases in ALGORITHMS.items():
        if t == name.lower() or t in aliases:
            return name
    return None
