"""The one place that knows canonical config keys, their aliases across frameworks, and value normalisation.

Every parser (raw articles, configs, command lines, logs) maps what it reads through `canonical_key` and
`normalise_value`, so that `--fp16`, `fp16: true` and `"fp16": {"enabled": true}` all become
`precision = "fp16"`, and `--sequence_parallel_size 4`, `ulysses_sequence_parallel_size=4` and
`ring_attn_size 4` all become `sequence_parallel_size = 4`.
"""

from __future__ import annotations

import math
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


_PEFT_TASK_TYPES = {"causal_lm", "seq_cls", "seq_2_seq_lm", "token_cls", "question_ans", "feature_extraction"}
_DTYPE = {
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "torch.half": "fp16", "16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32", "32": "fp32", "full": "fp32",
    # FP8 training (TransformerEngine, torchao float8, MXFP8 recipes): its GEMMs run in 8 bits beside bf16 weights
    "fp8": "fp8", "float8": "fp8", "mxfp8": "fp8", "torch.float8_e4m3fn": "fp8",
    # FP4 training (NVFP4 / MXFP4 recipes on Blackwell): 4-bit GEMMs beside bf16 weights, like FP8
    "fp4": "fp4", "float4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4",
    "auto": "auto",
}

# What a kernel switch set off or left to its default says (`--flash_attn False`, `flash_attn: auto`): no kernel.
SWITCH_OFF = ("false", "no", "off", "0", "n", "none", "null", "disable", "auto")

FACTS: tuple[FactSpec, ...] = (
    # --- precision -------------------------------------------------------------------------------------
    FactSpec("precision", "dtype", ("mixed_precision", "dtype", "compute_dtype", "amp_dtype", "torch_dtype_compute"),
             "compute precision of the training step (mixed precision / autocast)", _DTYPE),
    FactSpec("weights_dtype", "dtype", ("torch_dtype", "model_dtype", "param_dtype", "model.half"),
             "dtype in which the trainable weights are stored (no fp32 master copy when fp16)", _DTYPE),
    FactSpec("working_dtype", "dtype", ("working_dtype",),
             "the dtype the reporter says works (\"bf16 and fp32 is correct\", \"调整到bf16后work了\")", _DTYPE),
    FactSpec("fp16_loss_scale", "float", ("loss_scale", "initial_scale_power", "fp16_scale_tolerance"),
             "fp16 loss scaling setting"),
    # --- parallelism -----------------------------------------------------------------------------------
    FactSpec("sequence_parallel_size", "int",
             ("sequence_parallel_size", "sp_size", "ulysses_sequence_parallel_size", "ulysses_sp_size",
              "sequence_parallel_degree", "ring_attn_size", "ring_attention_size", "context_parallel_size",
              "cp_size", "context_parallel_degree"),
             "sequence / context parallel degree (Ulysses, ring attention, CP)"),
    # A bare flag or a prose mention ("ring-attn", "序列并行") says SP is on without saying its degree.
    FactSpec("sequence_parallel", "bool",
             ("sequence_parallel", "use_sequence_parallel", "use_ring_attn", "ring_attn", "ulysses",
              "context_parallel"),
             "some sequence / context parallelism is in use (degree unknown or > 1)"),
    FactSpec("zero_stage", "int", ("zero_stage", "zero_optimization.stage", "stage3", "ds_stage"),
             "DeepSpeed ZeRO stage"),
    FactSpec("overlap_comm", "bool", ("overlap_comm", "zero_optimization.overlap_comm"), "DeepSpeed overlap_comm"),
    FactSpec("num_gpus", "int", ("num_gpus", "nproc_per_node", "gpus", "n_gpus", "world_size", "trainer.n_gpus_per_node",
                                 "num_gpus_per_node", "gpus_per_node", "gpu_number", "gpu number", "gpu_count", "num_processes",
                                 "actor_num_gpus_per_node", "n_gpus_per_node", "ngpus_per_node", "ngpus"),
             "GPUs per node"),
    FactSpec("num_nodes", "int", ("num_nodes", "nnodes", "trainer.nnodes", "actor_num_nodes", "n_nodes"), "nodes"),
    # --- lengths ---------------------------------------------------------------------------------------
    FactSpec("max_length", "int",
             ("max_length", "max_len", "cutoff_len", "max_seq_len", "max_seq_length", "model_max_length",
              "seq_length", "max_sequence_length", "data.max_length", "sequence_len", "seq_len", "context_length",
              "block_size"),
             "maximum total sequence length"),
    FactSpec("max_prompt_length", "int", ("max_prompt_length", "max_prompt_len", "prompt_max_len", "data.max_prompt_length",
                                          "max_input_length", "max_source_length"),
             "maximum prompt length"),
    FactSpec("max_completion_length", "int",
             ("max_completion_length", "max_response_length", "max_target_length", "generate_max_len",
              "data.max_response_length", "max_output_length", "max_new_tokens"),
             "maximum completion / response length"),
    FactSpec("truncation_mode", "str", ("truncation_mode",), "which end is kept when truncating"),
    FactSpec("completion_only_loss", "bool", ("completion_only_loss", "train_on_prompt", "mask_prompt"),
             "loss only on completion tokens"),
    # --- algorithm / loss ------------------------------------------------------------------------------
    FactSpec("algorithm", "str", ("rlhf_type", "stage", "algorithm", "trainer_type", "algorithm.adv_estimator",
                                  "adv_estimator", "advantage_estimator"),
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
    FactSpec("kl_coef", "float", ("kl_coef", "kl_loss_coef", "init_kl_coef", "actor_rollout_ref.actor.kl_loss_coef",
                                  "reference_policy_kl_penalty"),
             "KL coefficient"),
    # --- attention / model -----------------------------------------------------------------------------
    FactSpec("attn_implementation", "str",
             ("attn_implementation", "attn_impl", "flash_attn", "use_flash_attn", "flash_attention", "attention"),
             "attention kernel", {"flash_attention_2": "flash_attention_2", "fa2": "flash_attention_2",
                                  "flash_attn": "flash_attention_2", "true": "flash_attention_2",
                                  "sdpa": "sdpa", "eager": "eager", "flash_attention_3": "flash_attention_3",
                                  "fa3": "flash_attention_3",
                                  # LLaMA-Factory's `flash_attn: disabled` runs eager attention; a switch set off
                                  # (`--flash_attn False`) or left to the default (`auto`) says no kernel
                                  "disabled": "eager", **dict.fromkeys(SWITCH_OFF)}),
    FactSpec("shift_attn", "bool", ("shift_attn", "s2_attn", "use_s2_attn"), "LongLoRA shifted sparse attention"),
    FactSpec("model", "str", ("model", "model_name_or_path", "pretrain", "model_type", "model_id",
                              "actor_rollout_ref.model.path", "base_model", "model_name",
                              "pretrained_model_name_or_path", "hf_checkpoint", "actor.path", "model_id_or_path"),
             "model name or path"),
    FactSpec("finetuning_type", "str", ("finetuning_type", "train_type", "sft_type", "tuner_type"),
             "full / lora / qlora"),
    FactSpec("use_peft", "bool", ("use_peft", "use_lora", "lora", "use_llm_lora", "use_backbone_lora"), "PEFT adapters"),
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
              "batch_size_training", "train_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu", "mbs",
              "per_device_batch", "per_device_batch_size"),
             "per-device micro-batch size"),
    FactSpec("gradient_accumulation_steps", "int", ("gradient_accumulation_steps", "grad_accum", "accumulative_counts",
                                                    "grad_accum_steps", "accumulation_steps"),
             "gradient accumulation steps"),
    FactSpec("max_grad_norm", "float", ("max_grad_norm", "gradient_clipping", "grad_clip", "clip_grad"), "clipping"),
    FactSpec("optim", "str", ("optim", "optimizer", "optimizer.type"), "optimizer"),
    FactSpec("gradient_checkpointing", "bool", ("gradient_checkpointing", "grad_checkpoint", "enable_gradient_checkpointing",
                                                "activation_checkpointing", "use_gradient_checkpointing"),
             "activation checkpointing"),
    # --- environment -----------------------------------------------------------------------------------
    FactSpec("framework", "str", ("framework",), "training framework"),
    FactSpec("torch_version", "version", ("torch", "pytorch", "torch_version"), "PyTorch version"),
    FactSpec("deepspeed_version", "version", ("deepspeed", "deepspeed_version"), "DeepSpeed version"),
    FactSpec("transformers_version", "version", ("transformers", "transformers_version"), "transformers version"),
    FactSpec("trl_version", "version", ("trl", "trl_version"), "TRL version"),
    FactSpec("framework_version", "version", ("ms-swift", "swift", "openrlhf", "xtuner", "llamafactory", "verl"),
             "version of the training framework"),
    FactSpec("flash_attn_version", "version", ("flash-attn", "flash_attn_version"), "flash-attn version"),
    FactSpec("vllm_version", "version", ("vllm", "vllm_version"), "vLLM version"),
    FactSpec("peft_version", "version", ("peft", "peft_version"), "PEFT version"),
    FactSpec("gpu", "str", ("gpu", "gpu_name", "device_name"), "GPU model"),
    FactSpec("num_generations", "int", ("num_generations", "n_samples_per_prompt", "group_size",
                                        "actor_rollout_ref.rollout.n", "rollout.n", "rollout_n",
                                        "num_generations_per_prompt", "n_resp_per_prompt"),
             "completions sampled per prompt (GRPO group size)"),
    FactSpec("zero_hpz_partition_size", "int", ("zero_hpz_partition_size", "zero_optimization.zero_hpz_partition_size"),
             "DeepSpeed ZeRO++ hierarchical partition size"),
    FactSpec("gpu_bf16", "bool", ("gpu_bf16",), "whether the GPU supports bf16 (V100/T4/P100: no)"),
    # Added for diagnosis triggers (kb/diagnose): RM padding side, PRM placeholder, verl mini-batch.
    FactSpec("padding_side", "str", ("padding_side", "tokenizer.padding_side"), "tokenizer padding side (left / right)",
             {"left": "left", "right": "right"}),
    FactSpec("placeholder_token", "str", ("placeholder_token",), "PRM step placeholder token"),
    FactSpec("mini_batch_size", "int", ("ppo_mini_batch_size", "mini_batch_size"), "PPO mini-batch size (verl)"),
    # Derived (kb.facts.prose.derive), never read from a config: verl's share of a mini-batch per data-parallel rank.
    FactSpec("per_gpu_mini_batch_size", "int", (),
             "verl: sequences per data-parallel rank in one PPO mini-batch (mini_batch_size * rollout.n / DP ranks)"),
    FactSpec("model_family", "str", ("model_family",), "model family (qwen2, llama, gemma2, internlm2 …)"),
    FactSpec("deepspeed_config", "str", ("deepspeed", "deepspeed_config", "ds_config", "ds_file"),
             "DeepSpeed config file named on the command line"),
)

# Facts read from logs and prose rather than configs (ARCHITECTURE.md, "Facts").
LOG_FACTS: tuple[FactSpec, ...] = (
    FactSpec("nan_metrics", "list", (), "metric names that were nan/inf"),
    FactSpec("zero_metrics", "list", (), "loss-like metrics that collapsed to exactly 0"),
    FactSpec("huge_metrics", "list", (), "metrics above 1e4"),
    FactSpec("spike_metrics", "list", (), "metrics that jumped > 10x before going bad"),
    FactSpec("first_bad_step", "int", (), "step at which the first nan/inf/zero collapse appeared"),
    FactSpec("errors", "list", (), "ids of known error strings found (ERROR_PATTERNS below)"),
    FactSpec("output_collapse", "bool", (), "generated text collapsed (!!!!, token id 0)"),
    FactSpec("pairwise_tie", "bool", (),
             "a pairwise loss that cannot separate the pair: chosen and rejected scored alike, or stuck at 0.693"),
    FactSpec("version_evidence", "str", (),
             "the report ties the failure to a release: another version works, or it began with one"),
    FactSpec("symptom", "list", (),
             "in-scope symptoms seen: nan, inf, zero_loss, zero_grad, huge, collapse, overflow, rollout_mismatch"),
)

# Boolean switches whose *name* carries the value: `--fp16`, `bf16: true`, `"fp16": {"enabled": true}`.
PRECISION_FLAGS: dict[str, tuple[str, str]] = {
    "fp16": ("precision", "fp16"), "bf16": ("precision", "bf16"), "fp32": ("precision", "fp32"),
    "half": ("precision", "fp16"), "use_fp16": ("precision", "fp16"), "use_bf16": ("precision", "bf16"),
    "fp16.enabled": ("precision", "fp16"), "bf16.enabled": ("precision", "bf16"),
    "bfloat16.enabled": ("precision", "bf16"), "amp.enabled": ("precision", "fp16"),
    "fp16_full_eval": ("precision", "fp16"), "pure_bf16": ("precision", "bf16"),
}

# FP8 training switches and the formats they take; FP8 GEMMs run beside bf16 weights, so the run is an FP8 run even
# where `--bf16` is also given (kb.facts.configs lets fp8 replace a bf16 of the same kind).
FP8_SWITCHES = frozenset({"fp8", "fp8_format", "fp8_hybrid", "fp8_e4m3", "fp8_recipe", "fp8_training", "use_fp8",
                          "transformer_engine.fp8", "model.fp8"})
FP8_FORMATS = frozenset({"hybrid", "e4m3", "e5m2", "mxfp8", "delayed", "tensorwise", "blockwise", "current",
                         "rowwise", "te"})
# Activation-checkpointing switches that take a mode rather than a boolean.
RECOMPUTE_MODES = frozenset({"recompute_granularity", "activation_checkpoint.mode", "recompute_method", "ac_mode"})
# The same for FP4 (Megatron's `--fp4-format nvfp4`, TransformerEngine's NVFP4 recipe).
FP4_SWITCHES = frozenset({"fp4", "fp4_format", "fp4_recipe", "fp4_training", "use_fp4", "model.fp4"})
FP4_FORMATS = frozenset({"nvfp4", "mxfp4", "e2m1", "te", "delayed", "blockwise", "current"})

# Lightning / litgpt precision strings -> (compute, weights) dtypes: "-mixed" is autocast over fp32 weights,
# "-true" keeps the weights themselves in that dtype.
LIGHTNING_PRECISION: dict[str, tuple[str, str | None]] = {
    "16-mixed": ("fp16", None), "bf16-mixed": ("bf16", None), "16-true": ("fp16", "fp16"),
    "bf16-true": ("bf16", "bf16"), "32-true": ("fp32", None), "64-true": ("fp32", None),
    "transformer-engine": ("bf16", None),
}


def _clean_key(raw: str) -> str:
    k = raw.strip().strip("-").strip().lower().replace("-", "_")
    return re.sub(r"\s+", "_", k)


_BY_KEY: dict[str, FactSpec] = {f.key: f for f in FACTS + LOG_FACTS}
# What an attention kernel's name looks like, beyond the value table (llm-foundry's `triton`, `flex_attention`,
# `xformers`, `npu_fusion_attention`, `kernels-community/vllm-flash-attn3`).
KERNEL_WORD = re.compile(r"flash|sdpa|eager|attn|attention|triton|xformers|flex|cudnn|mem_?eff|fused|sage|varlen",
                          re.IGNORECASE)
_ALIAS: dict[str, str] = {}
# Every key an alias may stand for, in FACTS order: `--deepspeed 0.14.0` is a version, `--deepspeed ds.json` a file.
_ALIAS_ALL: dict[str, list[str]] = {}
for _spec in FACTS + LOG_FACTS:
    _ALIAS[_spec.key] = _spec.key
    _ALIAS_ALL.setdefault(_spec.key, []).append(_spec.key)
    for _a in {a.lower() for a in _spec.aliases} | {_clean_key(a) for a in _spec.aliases}:
        _ALIAS.setdefault(_a, _spec.key)
        if _spec.key not in _ALIAS_ALL.setdefault(_a, []):
            _ALIAS_ALL[_a].append(_spec.key)
_VERSION = re.compile(r"v?(\d+(?:\.\d+){0,3}(?:[.+\-]?(?:rc|post|dev|a|b)\d*)?(?:\+[\w.]+)?)", re.IGNORECASE)


def spec(key: str) -> FactSpec | None:
    return _BY_KEY.get(key)


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
    """A finite number, or None: `nan`, `inf` and `1e309` are not a setting anyone can run with."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    s = str(v).strip().strip("'\"").replace("_", "")
    if len(s) > 64:
        return None
    try:
        n = float(s)
    except ValueError:
        return None
    return n if math.isfinite(n) else None


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
            # YAML's `true` as a count; a word in a sentence ("a sweep over max_length on pythia") is no number
            return int(value) if isinstance(value, bool) else None
        return int(n)
    if s.kind == "float":
        n = parse_number(value)
        # a learning rate of 0 is a scheduler's logged value late or early in a run ("lr=0, grad_norm=NaN"), no setting
        # nor is 10 or more (`export lr=10`: a script's own code; OpenNMT's logged 1.2 was a real, too high rate)
        return None if key == "learning_rate" and (n == 0 or (n is not None and n >= 10)) else n
    # "attn_implementation flash_attention_2." in a sentence: the full stop ends the sentence, not the value
    text = re.sub(r"(?<=\w)[.,;:。，；：]$", "", str(value).strip().strip("\\'\"`"))  # (`base_model=\"Qwen/...\"` too)
    if key == "model":
        # "model: modelscope上的chatglm3-6b-32k的权重": the name among the words; `LlamaForCausalLM.from_pretrained`
        # is the class that loads it, not the model
        if re.search(r"[\u3000-\u9fff\uff00-\uffef]", text):
            names = [t for t in re.findall(r"[A-Za-z0-9][A-Za-z0-9_./:-]*", text) if re.search(r"[A-Za-z]", t)
                     and re.search(r"[\d/-]", t)]
            text = max(names, key=len) if names else ""
        elif re.search(r"\s", text):
            # "- Model: unsloth/Qwen3.5-4B and unsloth/Qwen3.5-9B (both affected)", "Model: `unsloth/gemma-4-26B-A4B-it`
            # loaded via ...": a hub id among the words; a short name ("Llama 2 7B") stays; a description
            # ("219.33B-param MoE (Cohere2Moe class), 128 experts, ...") names none
            words = [w.strip("`'\"()[],;:") for w in text.split()]
            hub = [w for w in words if re.fullmatch(r"[A-Za-z][\w.-]*/[\w.-]*[A-Za-z0-9]", w)]
            text = hub[0] if hub else text if len(words) <= 4 and re.match(r"[A-Za-z]", text) else ""
        if not text or re.search(r"\.from_pretrained$|^(?:Auto)?\w*For(?:CausalLM|Conditional\w*|Seq\w*)$", text) \
                or re.fullmatch(r"(?:get|load|build|create|init|path_to)_[a-z_]+|[a-z_]*_(?:model|path|name|dir)|"
                                r"model_[a-z_]+|[a-z_]+\.[a-z_.]+|auto|none|null|\W*|"
                                # a variable (`model = model,`), a preposition ("Base Model on ..."), a type annotation
                                # (`model_name: str=...`), "[VRAM] After base model load"
                                r"model|on|in|of|for|with|to|from|and|is|was|the|a|an|as|at|by|which|that|this|it|"
                                r"str|int|float|bool|loa|load|loaded|loading|"
                                r"\d+(?:\.\d+)?[BbMm](?:-?params?)?", text, re.IGNORECASE) \
                or re.search(r"path[_/ -]?to\b|\byour[_-]|^[<{$]", text, re.IGNORECASE):
            return None  # ... and `get_peft_model`, `model_name`, `args.model_name_or_path` are code, not a model;
            # "auto", "e.g." and "/path/to/mlx/model" name none
    if key == "deepspeed_config" and not re.search(r"[./\d]|zero|stage", text, re.IGNORECASE):
        return None  # "the relevant ds_config im using": a word, not a file or a stage
    if key == "gpu":
        # `GPU: NVIDIA GeForce RTX 3060 Laptop GPU | Peak FLOPS (BF16): inf`, `GPU: nVidia A6000 (the Ampere one)`:
        # the model's name, not the rest of the line
        m = GPU_NAME.search(text)
        if m is None and not re.search(r"[A-Za-z\u4e00-\u9fff]", text):
            return None  # "# batch size per gpu: 4": a count, not a card
        return gpu_name(m.group("gpu")) if m else re.split(r"\s+[|(]", text)[0]
    if s.kind == "dtype":
        got = _DTYPE.get(text.lower())
        return None if key == "precision" and got == "auto" else got  # dtype="auto" loads; it says no precision
    if key == "attn_implementation":
        # "attn_impl: triton, loss nan at head dim 8": the kernel is the first word, the rest is the sentence
        first = re.split(r"\s*[,;，；]", text, maxsplit=1)[0]
        if first != text and (first.lower() in s.values or KERNEL_WORD.search(first)):
            text = re.sub(r"(?<=\w)[.,;:。，；：]$", "", first)
        elif text.lower() not in s.values and not KERNEL_WORD.search(text):
            return None  # "with flash attention: training loss wrong": a word after the name, not a kernel
    if s.values:
        return s.values.get(text.lower(), text.lower())
    if key == "algorithm":
        # `stage: 2` in a DeepSpeed block is not an algorithm; unknown words (`reinforce_plus_plus`) are kept.
        known = canonical_algorithm(text)
        return known or (text.lower() if re.fullmatch(r"[A-Za-z][\w+\-]*", text) else None)
    if s.kind == "version":
        m = _VERSION.fullmatch(text)
        return m.group(1) if m else None
    if s.kind == "str" and key in {"algorithm", "loss_type", "finetuning_type", "optim", "lora_task_type",
                                   "truncation_mode"}:
        if key == "lora_task_type":  # PEFT's TaskType (a dataset record's "task_type": "xxx" is none)
            t = re.sub(r"^tasktype\.", "", text.lower())
            return t if t in _PEFT_TASK_TYPES else None
        if key == "optim" and (re.fullmatch(r"[\d.]+", text) or text.lower() in _NOT_AN_OPTIMIZER):
            return None  # GPT-NeoX's timing line "optimizer: 1884.36" is milliseconds; "optimizer is not None"
        return text.lower()
    return text


# Words that follow "optimizer is / was" in prose or code and name no optimizer.
_NOT_AN_OPTIMIZER = frozenset({"not", "none", "null", "nil", "the", "a", "an", "used", "set", "also", "still", "only",
                               "being", "created", "initialized", "initialised", "defined", "wrapped", "same"})


def canonical(raw_key: str, value: Any) -> tuple[str, Any] | None:
    """(canonical key, normalised value) or None when the key is unknown or the value unusable."""
    for dtype, switches, formats in (("fp8", FP8_SWITCHES, FP8_FORMATS), ("fp4", FP4_SWITCHES, FP4_FORMATS)):
        if _clean_key(raw_key) in switches:
            # Megatron / TransformerEngine / NeMo: `--fp8-format hybrid`, `--fp8-hybrid`, `fp8: e4m3`, `--fp4-format
            # nvfp4` (a switch set off, `fp8: null` / `False`, says nothing)
            said = str(value).strip().strip("'\"").lower()
            return ("precision", dtype) if parse_bool(value) is True or said in formats else None
    if _clean_key(raw_key) in RECOMPUTE_MODES:
        # Megatron's `--recompute-granularity full`, torchtitan's `activation_checkpoint.mode: selective`: a mode
        # word switches activation checkpointing on, `none` / `off` off
        said = str(value).strip().strip("'\"").lower()
        if said in ("full", "selective", "op", "layer", "uniform", "block") or parse_bool(value) is True:
            return ("gradient_checkpointing", True)
        return ("gradient_checkpointing", False) if said in ("none", "off", "false", "no") else None
    flag = PRECISION_FLAGS.get(_clean_key(raw_key))
    if flag is not None:
        # `fp16: false` says nothing about what is used; `fp16: auto` leaves it to another file.
        return flag if parse_bool(value) is True else None
    key = canonical_key(raw_key)
    if key is None:
        return None
    ck = _clean_key(raw_key)
    for cand in _ALIAS_ALL.get(ck, [key]) if ck in _ALIAS_ALL else [key]:
        v = normalise_value(cand, value)
        if v is not None:
            return cand, v
    return None


# Framework names and their aliases, as they appear in prose, commands and package lists.
FRAMEWORKS: dict[str, tuple[str, ...]] = {
    "ms-swift": ("ms-swift", "ms_swift", "swift", "modelscope swift"),
    "OpenRLHF": ("openrlhf",),
    "trl": ("trl", "huggingface trl"),
    "xtuner": ("xtuner",),
    # LLaMA-Efficient-Tuning is LLaMA-Factory's name before 2024 (many Chinese reports still use it)
    "LLaMA-Factory": ("llama-factory", "llamafactory", "llama_factory", "llamafactory-cli", "llama-efficient-tuning",
                      "llama efficient tuning", "llama_efficient_tuning"),
    "verl": ("verl", "actor_rollout_ref"),  # its config paths (`actor_rollout_ref.actor.optim.lr=...`) name it
    "DeepSpeed": ("deepspeed",),
    "DeepSpeed-Chat": ("deepspeed-chat", "deepspeedexamples", "deepspeed chat"),
    "unsloth": ("unsloth", "fastlanguagemodel", "fastvisionmodel"),
    "ColossalAI": ("colossalai", "colossal-ai", "colossal ai"),
    "transformers": ("transformers", "hf trainer", "huggingface trainer", "trainingarguments"),  # `TrainingArguments(`
    "pytorch": ("pytorch", "torch"),
    "axolotl": ("axolotl",),
    "Megatron-LM": ("megatron", "megatron-lm"),
    "nemo-rl": ("nemo-rl", "nemo rl"),
    # RL and pre-training frameworks of the case base (named in prose, so an answer can say which one ran)
    "torchtitan": ("torchtitan",),
    "torchtune": ("torchtune",),
    "EasyR1": ("easyr1",),
    "AReaL": ("areal",),
    "SkyRL": ("skyrl",),
    "slime": ("thudm/slime",),
    "PaddleNLP": ("paddlenlp",),
    "MindSpeed-LLM": ("mindspeed-llm", "mindspeed"),
    # NVIDIA's stack and other trainers of the case base, named in raw reports ("Megatron-Bridge", "NeMo
    # Automodel", "transformer_engine", "mlx_lm"). "NeMo" alone is also a model (Mistral-Nemo) and "ROLL" a word:
    # only their qualified spellings name the framework in prose (NAMES_THAT_ARE_WORDS).
    "Megatron-Bridge": ("megatron-bridge", "megatron bridge", "mbridge"),
    "NeMo Automodel": ("nemo automodel", "nemo-automodel"),
    "NeMo": ("nemo", "nvidia nemo", "nemo megatron", "nemo framework", "nemo toolkit", "nemo_toolkit", "nemo 2.0",
             "nemo version", "nemo.collections", "nemo_logging", "nemo_run",
             "nemo2"),
    "TransformerEngine": ("transformerengine", "transformer engine", "transformer-engine"),
    "mlx-lm": ("mlx-lm", "mlx lm"),
    "InternEvo": ("internevo",),
    "llm-foundry": ("llm-foundry", "llm foundry", "llmfoundry"),
    "prime-rl": ("prime-rl", "prime rl"),
    "open-instruct": ("open-instruct", "open instruct"),
    "ROLL": ("roll", "alibaba/roll", "alibaba roll"),
    "trlx": ("trlx",),
    "safe-rlhf": ("safe-rlhf", "safe_rlhf"),
}

# Frameworks' bare names that are also a model or a word: a report's prose does not name the framework by them, and
# the text classifiers do not mask them as tool names.
NAMES_THAT_ARE_WORDS = frozenset({"nemo", "roll"})

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "SFT": ("sft", "supervised fine-tuning", "supervised finetuning", "指令微调", "监督微调"),
    "DPO": ("dpo", "direct preference optimization", "直接偏好优化"),
    "KTO": ("kto", "kahneman-tversky"),
    "SimPO": ("simpo",),
    "IPO": ("ipo",),
    "ORPO": ("orpo",),
    "CPO": ("cpo",),
    "RM": ("reward model", "reward modeling", "reward modelling", "rm", "reward", "奖励模型", "reward_modeling",
           "reward模型"),
    "PPO": ("ppo", "gae"),
    # OpenRLHF's `--advantage_estimator group_norm` is GRPO; DAPO, GSPO, Dr. GRPO and RLOO are the group-relative
    # family (advantages from a prompt's group of samples; TRL's RLOOTrainer is read as GRPO by the callbacks too)
    "GRPO": ("grpo", "group_norm", "dapo", "gspo", "dr grpo", "drgrpo", "rloo"),
    "pretrain": ("pretrain", "pretraining", "pre-training", "continue pretrain", "预训练", "pt"),
}


# Installed packages (`pip list`, `torch==2.3.1`, `ms-swift=v3.1.0`) -> the version fact they fill.
PACKAGES: dict[str, str] = {
    "torch": "torch_version", "pytorch": "torch_version", "deepspeed": "deepspeed_version",
    "transformers": "transformers_version", "trl": "trl_version", "vllm": "vllm_version", "peft": "peft_version",
    "flash-attn": "flash_attn_version", "flash_attn": "flash_attn_version", "flash-attention": "flash_attn_version",
    "ms-swift": "framework_version", "ms_swift": "framework_version", "swift": "framework_version",
    "openrlhf": "framework_version", "xtuner": "framework_version", "llamafactory": "framework_version",
    "llama-factory": "framework_version", "llama_factory": "framework_version", "verl": "framework_version",
    "unsloth": "framework_version", "paddlenlp": "framework_version", "axolotl": "framework_version",
    "torchtune": "framework_version", "colossalai": "framework_version", "slime": "framework_version",
    "trlx": "framework_version",
}


def canonical_package(name: str, version: str) -> tuple[str, str, str | None] | None:
    """(fact key, version, framework implied or None) for an installed package, or None when unknown."""
    n = name.strip().lower()
    key = PACKAGES.get(n)
    m = _VERSION.fullmatch(str(version).strip().strip("'\","))
    if key is None or m is None:
        return None
    return key, m.group(1), (canonical_framework(n) if key == "framework_version" else None)


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


# === Prose labels (added for kb.ingest; owner: raw-document parser) =====================================
# How articles name a config field in running text or bullet lists ("最大长度:8192", "learning rate of 5e-7",
# "梯度累积步数(如32)"). Keys are matched case-insensitively as whole labels; longer labels win, so
# "最大提示长度" is not read as "最大长度". Values are still normalised through `normalise_value`.
PROSE_LABELS: dict[str, str] = {
    # lengths
    "最大序列长度": "max_length", "最大长度": "max_length", "序列最大长度": "max_length", "截断长度": "max_length",
    "上下文长度": "max_length", "max length": "max_length", "maximum length": "max_length",
    "max sequence length": "max_length", "maximum sequence length": "max_length", "sequence length": "max_length",
    "max seq length": "max_length", "max context length": "max_length", "context length": "max_length",
    "seqlen": "max_length", "seq len": "max_length", "seq length": "max_length", "max seqlen": "max_length",
    "最大提示长度": "max_prompt_length", "提示最大长度": "max_prompt_length", "最大prompt长度": "max_prompt_length",
    "max prompt length": "max_prompt_length", "maximum prompt length": "max_prompt_length",
    "最大响应长度": "max_completion_length", "最大生成长度": "max_completion_length",
    "max completion length": "max_completion_length", "max response length": "max_completion_length",
    # parallelism
    "序列并行大小": "sequence_parallel_size", "序列并行度": "sequence_parallel_size",
    "序列并行数": "sequence_parallel_size", "sequence parallel size": "sequence_parallel_size",
    "sequence parallel degree": "sequence_parallel_size", "context parallel size": "sequence_parallel_size",
    "zero stage": "zero_stage", "zero阶段": "zero_stage",
    # optimisation
    "学习率": "learning_rate", "learning rate": "learning_rate",
    "微训练批次大小": "micro_batch_size", "微批次大小": "micro_batch_size", "微批大小": "micro_batch_size",
    "每卡批次大小": "micro_batch_size", "单卡批次大小": "micro_batch_size", "每设备批次大小": "micro_batch_size",
    "批次大小": "micro_batch_size", "批大小": "micro_batch_size", "批量大小": "micro_batch_size",
    "batchsize": "micro_batch_size", "micro batch size": "micro_batch_size",
    "micro-batch size": "micro_batch_size", "per-device batch size": "micro_batch_size",
    "per device batch size": "micro_batch_size", "batch size per device": "micro_batch_size",
    "batch size per gpu": "micro_batch_size", "batch size": "micro_batch_size",
    "梯度累积步数": "gradient_accumulation_steps", "梯度累计步数": "gradient_accumulation_steps",
    "梯度累积": "gradient_accumulation_steps", "gradient accumulation steps": "gradient_accumulation_steps",
    "gradient accumulation": "gradient_accumulation_steps",
    "梯度裁剪阈值": "max_grad_norm", "梯度裁剪": "max_grad_norm", "gradient clipping": "max_grad_norm",
    # precision / model
    "训练精度": "precision", "数值精度": "precision", "精度": "precision", "precision": "precision",
    "混合精度": "precision", "mixed precision": "precision",
    "模型类型": "model", "基座模型": "model", "base model": "model",
    "训练类型": "finetuning_type", "微调类型": "finetuning_type", "微调方式": "finetuning_type",
    "注意力实现": "attn_implementation", "attention implementation": "attn_implementation",
    "gpu数量": "num_gpus", "显卡数量": "num_gpus", "卡数": "num_gpus", "number of gpus": "num_gpus",
}


# === end of prose labels ================================================================================


# === Vocabulary read from text (logs, prose, articles): one table each, used by every extractor ==========
# Words just before a setting that say it is the fix, not the failing run ("changed it to torch_dtype=fp32").
# A setting said in a supposition ("假如用bf16来微调的话", "suppose I train in fp16"): no run had it.
SUPPOSED = re.compile(r"(?:假如|假设|倘若|\bsuppose\b|\bhypothetically\b)[^，,。.]{0,30}$", re.IGNORECASE)
FIX_CUE = re.compile(r"(?:chang(?:e|ed|ing)\b.{0,25}\bto\b|switch(?:ed|ing)? (?:it )?to|instead|replac\w*|set it to|"
                     r"work(?:s|ed)? (?:with|when|after)|fixed (?:it )?(?:by|with)|solved by|改为|改成|换成|换为|"
                     r"调整到|调整为|改用|设置成|试试|就好了|后正常)", re.IGNORECASE)


# Words just after a setting, in the same clause, that say it is what worked ("attn_implementation="eager" made
# training work", "... fixes it", "... 后正常").
WORKED_AFTER = re.compile(r"[^.,;:!?。，；：！？\n]{0,40}?(?:made (?:it|training|the run|the loss|things) (?:work|stable|normal|"
                          r"finite)|fix(?:es|ed) (?:it|this|the (?:issue|problem|nan|loss))|solv(?:es|ed) (?:it|this|the)|"
                          r"works?(?= *(?:fine|now|again|well|normally|[.,;!?]|$))|worked\b|trains? (?:fine|normally)|"
                          r"(?:is|was) fine|恢复正常|就正常|才正常|后正常|正常了|就好了|解决了|没问题了|"
                          # "将max_length改为4096时loss正常", "lr=1e-6 可稳定收敛", "converges stably with lr=1e-6"
                          r"时(?:loss|损失)?(?:就|也)?正常|(?:可以?|能|就)?稳定收敛|收敛正常|正常收敛|"
                          r"converges? (?:stably|fine|normally))", re.IGNORECASE)


def said_as_fix(s: str, start: int, end: int) -> bool:
    """The setting at s[start:end] is what fixed the run, not the failing run's own setting."""
    return bool(FIX_CUE.search(s[max(0, start - 60):start]) or WORKED_AFTER.match(s, end))


def is_limit_name(name: str) -> bool:
    """A bound, not a measurement: `max_grad_norm`, `clip_ratio`, `reward_threshold` may be set to inf on purpose."""
    n = name.lower().strip("'\"")
    return bool(re.match(r"(?:max|min)[_\-]", n)) or any(w in n for w in ("clip", "threshold", "limit", "_cap"))


# Beyond this a loss, gradient norm or advantage is no healthy value (`huge_metrics`), whether a log line or a
# sentence gives it.
HUGE_VALUE = 1e4


def is_grad_norm(name: str) -> bool:
    """`grad_norm`, `actor/grad_norm`, `gradnorm`: a gradient norm (exactly 0 means no gradient reached the weights)."""
    n = name.lower()
    return "grad" in n and "norm" in n


def is_loss_like(name: str) -> bool:
    """`loss`, `nll_loss`, `train/loss`; not `loss_scale`, `kl_coef` or `loss_weight`."""
    n = name.lower()
    return "loss" in n and "scale" not in n and "coef" not in n and "weight" not in n


# Known error strings: (id, pattern, in_scope). Out-of-scope ids (OOM, install) tell diagnosis to abstain.
ERROR_PATTERNS: tuple[tuple[str, re.Pattern[str], bool], ...] = tuple(
    (eid, re.compile(rx, re.IGNORECASE), scope) for eid, rx, scope in (
        # also shortened ("probability tensor contains inf/nan") or cut ("`inf`, `nan` or element < 0")
        ("prob_tensor_invalid", (r"probability tensor contains (?:either )?[`'\"]?inf[`'\"]?(?:, |/| or )[`'\"]?nan|"
                                 r"[`'\"]inf[`'\"], [`'\"]nan[`'\"] or element\s*[<＜]\s*0"), True),
        ("log1p_backward_nan", r"Log1PBackward\d*'? returned nan", True),
        ("nan_in_backward", r"Function '\w+' returned nan values", True),
        ("ds_overflow", (r"OVERFLOW!.{0,40}Skipping step|Grad(?:ient)? overflow|Attempted loss scale|"
                        r"overflow.{0,20}skipping step|Skipping step\. Attempted"), True),
        ("loss_scale_min", r"loss scale already at minimum|Current loss scale.{0,20}minimum|minimum loss scale", True),
        ("untrained_tokens", r"Untrained tokens\b.{0,60}found", True),
        ("labels_all_masked", (r"labels?\b.{0,20}\ball (?:be )?-100|all (?:the )?labels?.{0,40}-100|"
                              r"labels?\s*全(?:部)?(?:为|是|都是)\s*-100|all\(\s*labels\s*==\s*(?:ignore_index|-100)|"
                              r"every label.{0,30}masked|labels? (?:are|were|is) all masked|"
                              r"no (?:supervised|valid|target) tokens|tensor\(\s*\[\s*-100(?:\s*,\s*-100)+|"
                              # "a sample has no non-ignored labels", "no labels other than the ignore index"
                              r"no (?:non[- ]ignored|unmasked) (?:labels?|tokens)|no labels? other than (?:the )?"
                              r"ignore[_ ]index|Could not find response key"), True),
        # FastChat-style preprocessing (FastChat, LLaVA and its descendants) masks a whole sample when its round
        # lengths do not add up, and says so with this warning.
        ("tokenization_mismatch", r"tokenization mismatch(?::?\s*\d+\s*vs\.?\s*\d+)?", True),
        ("cudnn_sdp", r"enable_cudnn_sdp|cudnn[_ ](?:sdp|attention)|_cudnn_attention|cuDNN SDPA", True),
        ("nonfinite_grad_norm", (r"norm of order [\d.]+ for gradients.{0,80}non-finite|grad(?:ient)?s? (?:are|is) "
                                r"(?:nan|inf|non-finite)"), True),
        ("nan_loss_error", (r"loss (?:is|became|=) nan|Loss is NaN|NaN or Inf found in input tensor|"
                           r"nan loss detected|detected nan|nan loss encountered"), True),
        ("softcap_missing", r"soft[-_ ]?capping|softcap", True),
        # A reward function that hands back None / NaN (parse failure, API error) poisons the advantages.
        ("nan_reward", (r"reward\w*(?: func\w*| fn| model)?\W{0,3}.{0,40}\b(?:returns?|returned|returning|gives?|gave|"
                       r"yields?|outputs?)\s+(?:a\s+)?(?:None|nan|NaN|float\(\s*['\"]nan['\"]\s*\))"
                       # "the reward model gave a NaN loss" is a NaN loss of reward-model training, not a NaN reward
                       r"(?!\s*(?:loss(?:es)?|metrics?|grad\w*))|"
                       r"rewards?_per_func\w*.{0,30}\bnan\b|nan (?:in|for) (?:the )?rewards?\b"), True),
        # Attention rows with no key left to attend to (padding) give NaN in softmax / SDPA.
        ("masked_row_nan", (r"(?:fully|entirely|completely)[- ]masked (?:rows?|quer(?:y|ies))|"
                           r"rows? (?:is |are )?(?:fully|completely|entirely) masked|all[- ]masked rows?"), True),
        # "OOM" as a word: bloom-560m and BLOOM are models, not out-of-memory reports.
        # (not Megatron's `max_tokens_to_oom` argument)
        ("cuda_oom", (r"CUDA out of memory|OutOfMemoryError|out of memory|显存不[足够]|显存溢出|显存爆(?:了|掉)|超显存|爆显存|"
                      r"(?<![A-Za-z_])OOM\b"), False),
        ("import_error", r"ModuleNotFoundError|ImportError|No module named|cannot import name", False),
        ("pip_error", (r"Could not find a version that satisfies|ResolutionImpossible|Failed building wheel|"
                      r"subprocess-exited-with-error|pip install.{0,40}(?:fail|error)|dependency conflicts"), False),
        ("nccl_error", (r"NCCL (?:error|WARN|timeout)|Watchdog caught collective operation timeout|NCCL\s*(?:通信)?超时|"
                       r"NCCL operation timed out|watchdog got stuck"), False),
        ("segfault", r"Segmentation fault|core dumped", False),
        # A dtype mismatch stops training with an exception before any step (fp16 trainable weights under fp16
        # autocast, a bf16 module fed fp32 input): a crash to fix, not a divergence.
        ("dtype_crash", (r"Attempting to unscale FP16 gradients|expected scalar type \w+ but found \w+|"
                        r"expected (?:mat1 and mat2|both (?:inputs|vectors)|all arguments) to have the same dtype|"
                        r"Input type \([\w.]+\) and weight type \([\w.]+\) should be the same|"
                        r"Bfloat16 is only supported on GPUs with compute capability"), False),
    )
)
OUT_OF_SCOPE_ERRORS = frozenset(eid for eid, _, scope in ERROR_PATTERNS if not scope)
# What an out-of-scope report looks like, in words (en, zh), for the "not a NaN / divergence problem" answer: the
# out-of-scope error ids above and the case base's out_of_scope_kind values (kb.cases.OUT_OF_SCOPE_KINDS).
OUT_OF_SCOPE_NAMES = {
    "cuda_oom": ("running out of GPU memory", "显存不足"),
    "import_error": ("an import error", "导入错误"),
    "pip_error": ("an install / dependency error", "安装或依赖错误"),
    "nccl_error": ("a communication (NCCL) error or timeout", "通信（NCCL）错误或超时"),
    "segfault": ("a crash (segmentation fault)", "进程崩溃（段错误）"),
    "dtype_crash": ("a dtype-mismatch crash", "数据类型不匹配导致的报错"),
    "oom": ("running out of memory", "内存或显存不足"),
    "install": ("an install / environment problem", "安装或环境问题"),
    "inference": ("an inference / generation problem", "推理或生成问题"),
    "plateau": ("a loss that plateaus or converges slowly", "loss 不降或收敛慢"),
    "data-format": ("a data-format problem", "数据格式问题"),
    "hang": ("a hang", "训练卡住"),
    "crash": ("a crash", "程序报错"),
    "eval-metric": ("an evaluation or logging quirk", "评估或日志统计问题"),
    "other": ("something other than a divergence", "其他非发散问题"),
}

# What a paste must say for an out-of-scope kind read off its nearest reports to describe it too: the nearest
# reports' kind is a guess, shown only when the paste's own words fit it ("grad_norm 偶尔到 1000，loss 正常下降" is
# not "an inference / generation problem" because its neighbours were).
OUT_OF_SCOPE_WORDS = {kind: re.compile(rx, re.IGNORECASE) for kind, rx in (
    ("oom", r"out of memory|\boom\b|显存|内存|memory"),
    ("install", r"install|import|\bpip\b|conda|no module|version conflict|安装|依赖|环境|编译|build"),
    ("inference", r"inferen|generat|predict|decod|\boutputs?\b|\bvllm\b|\bsampl|推理|生成|输出|回答|回复|预测"),
    ("plateau", (r"plateau|converg|not (?:go(?:ing)? )?down|(?:doesn'?t|does not|won'?t|not) (?:decreas|drop|fall)|stuck|"
                r"\bslow|\bflat\b|oscillat|不降|下不去|不下降|降不下|收敛|震荡|波动|居高不下")),
    ("data-format", r"dataset|data ?format|\bjsonl?\b|\bcolumns?\b|\bfields?\b|数据|格式|字段"),
    ("hang", r"\bhangs?\b|\bhung\b|stuck|freez|timeout|卡住|卡死|不动|超时"),
    ("crash", r"error|exception|traceback|crash|fail|abort|报错|崩溃|错误|异常"),
    ("eval-metric", r"\beval|evaluat|metric|accuracy|benchmark|评估|评测|指标|准确率"),
)}

# What a sentence says of a setup that trained ("no NaN", "works", "正常"; not "fine-tuning", "normalization"), and of
# one that went wrong: how a setting the reporter compared with is told from the run's own (kb.facts.prose / statements).
SAID_FINE = (r"\bno (?:nan|inf|problem)\b|\bfine(?![- _]?tun)\b|\bworks?\b|\bworked\b|\bnormal(?!i[sz])\b|"
             r"正常|没问题")
WENT_BAD = re.compile(r"(?<![A-Za-z])(?:nan|inf)(?![A-Za-z])|diverg|explod|spik|grow|collaps|overflow|blow|"
                      r"发散|爆炸|溢出|不降|异常|报错|error|fail|crash", re.IGNORECASE)

# A contrast inside one clause, no comma needed ("fp16 works well but bf16 loss is nan", "fp16 训练正常，但是 bf16 ..."):
# where one setting's or metric's verdict ends and another's begins.
CONTRAST = r"\s(?:but|however|whereas)\s|但是?|可是|然而"

# Words just before a name that deny it is the run's: "it's not a V100", "不是 A100".
DENIED_BEFORE = re.compile(r"(?:\bnot (?:a|an|on|the|on an?)|\bisn'?t (?:a|an)|不是|并非|而不是|并不是)\s*$", re.IGNORECASE)

# Dtype words in prose, and the canonical dtype each names.
DTYPE_WORD = re.compile(r"(?<![A-Za-z0-9_])(fp16|float16|half[- ]precision|半精度|bf16|bfloat16|fp32|float32|"
                         r"full[- ]precision|全精度|单精度|fp8|float8|mxfp8|nvfp4|mxfp4|fp4)(?![A-Za-z0-9_])", re.IGNORECASE)
DTYPE_OF_WORD = {"fp16": "fp16", "float16": "fp16", "half precision": "fp16", "half-precision": "fp16", "半精度": "fp16",
             "bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", "full precision": "fp32",
             "full-precision": "fp32", "全精度": "fp32", "单精度": "fp32", "fp8": "fp8", "float8": "fp8", "mxfp8": "fp8",
             "nvfp4": "fp4", "mxfp4": "fp4", "fp4": "fp4"}

# Model families, most specific first: (family key, pattern).
MODEL_FAMILIES = (
    # (a digit after the version is a size: "Gemma 27B", "Qwen 32B"; "Qwen25" is Qwen2.5)
    ("qwen3.5", r"qwen[-_ ]?3[._]5"), ("qwen2.5", r"qwen[-_ ]?2(?:[._]5|___5|5(?!\d))"), ("qwen3", r"qwen[-_ ]?3(?!\d)"),
    ("qwen2", r"qwen[-_ ]?2(?!\d)"), ("qwen2", r"qwen[-_ ]?1[._]5"),  # Qwen1.5 is the Qwen2 architecture
    ("qwen2.5", r"(?<![a-z])qwq(?![a-z])"),  # QwQ-32B is built on Qwen2.5
    ("qwen", r"qwen"),
    ("llama4", r"llama[-_ ]?4(?![\d])"), ("llama3", r"llama[-_ ]?3(?![\d])"), ("llama2", r"llama[-_ ]?2(?![\d])"),
    ("tinyllama", r"tinyllama"), ("llava", r"llava"), ("olmo", r"(?<![a-z])olmo"), ("mpt", r"(?<![a-z])mpt[-_ ]?\d"),
    ("llama", r"llama"), ("gemma2", r"gemma[-_ ]?2(?!\d|b\b)"), ("gemma3", r"gemma[-_ ]?3(?!\d)"),
    ("gemma4", r"gemma[-_ ]?4(?!\d)"), ("gemma", r"gemma"), ("gpt-oss", r"gpt[-_ ]?oss"),
    ("internlm2", r"internlm[-_ ]?2"), ("internlm", r"internlm"), ("mixtral", r"mixtral"), ("mistral", r"mistral"),
    ("baichuan2", r"baichuan[-_ ]?2"), ("baichuan", r"baichuan"), ("deepseek", r"deepseek"), ("chatglm", r"chatglm"),
    ("glm4", r"glm[-_ ]?4"), ("yi", r"\byi[-_ ]\d"), ("phi", r"\bphi[-_ ]?\d"), ("bloom", r"bloom"),
    ("falcon", r"falcon"), ("gpt2", r"gpt[-_ ]?2"), ("opt", r"\bopt-(?:iml-)?(?:max-)?\d"), ("pythia", r"pythia"),
    # last, so the LLM a name also carries wins ("MiniCPM-Llama3-V-2_5" is Llama 3); Vicuna is a LLaMA fine-tune
    ("minicpm", r"minicpm(?![-_ ]?(?:v|llama|o)(?![a-z]))"), ("llama", r"vicuna"),
)

# Model names as an article writes them -> how a record spells the family (ingest normalises "qwen2_5 7b" to
# "Qwen2.5-7B"); short or common-word families only count with a version or a size ("Yi-34B", "phi-2").
MODEL_NAMES = {
    "tinyllama": "TinyLlama", "codellama": "CodeLlama", "llama": "Llama", "qwen": "Qwen", "internlm": "InternLM",
    "mistral": "Mistral", "mixtral": "Mixtral", "gemma": "Gemma", "baichuan": "Baichuan", "chatglm": "ChatGLM",
    "deepseek": "DeepSeek", "minicpm": "MiniCPM", "olmo": "OLMo", "starcoder": "StarCoder", "vicuna": "Vicuna",
    "pythia": "Pythia", "bloomz": "bloomz", "bloom": "BLOOM", "falcon": "Falcon", "glm": "GLM", "yi": "Yi",
    "phi": "Phi", "opt": "OPT", "gpt2": "GPT-2",
}
# Short or common-word families only count with a version or size ("Yi-34B", "phi-2", "OPT-1.3b").
MODEL_NAMES_NEED_VERSION = {"glm", "yi", "phi", "opt", "bloom", "falcon"}

# GPU names in env dumps and prose; the ones without bf16 support make fp16 the only half precision.
GPU_MODELS = (r"V100|T4|P100|P40|A100|A800|H100|H800|H200|H20|A10G?|A[2456]000|A4500|L40S?|L4|L20|A40|GB[23]00|GH200|"
              r"B[12]00|"
              r"(?i:[ahv]100|[ah]800|h200?)|"  # typed in lower case: "2 a800 GPU", "使用h20卡"
              r"(?:(?i:rtx)|GeForce(?: RTX)?)\s?[2345]0[6789]0(?:\s?Ti)?(?:\s?SUPER)?|(?:Ascend\s?)?910B[A-Za-z0-9]*|MI\s?\d{3}X?|"
              r"TITAN\s?(?:V|RTX|Xp?)\b|GTX\s?1080")
# ASCII boundaries: in "在A100上训练" the name sits between Chinese characters, which `\b` counts as word characters.
# A bare "4090" counts only after a count of cards ("2张4090", "8*4090") or before "显卡" / "GPU": step counters
# and sample counts look the same.
# "8xH100", "4x8H200" put the name right after a count; "2080ti" is a card with or without "RTX".
GPU_NAME = re.compile(rf"(?:(?<![A-Za-z0-9_])|(?<=\d[xX×])|(?<=[xX×*]\d))(?P<gpu>{GPU_MODELS}|"
                      rf"[2345]0[6789]0\s?[Tt][Ii](?![A-Za-z])|"
                      rf"(?:(?<=[张块卡台*×xX])|(?<=[张块卡台*×xX]\s)|(?<=NVIDIA )|(?<=single )|(?<=[Oo]ne )|(?<=[Tt]wo )|"
                      rf"(?<=[Ff]our )|(?<=[Ee]ight ))[2345]0[6789]0(?:\s?Ti|D)?|"
                      rf"[2345]0[6789]0(?:\s?Ti|D)?(?=\s?(?:显卡|GPU)|\s?[*×]\s?\d))s?(?![A-Za-z0-9_])")
# ("8 A100s", "two 4090s": a plural is the card too; a bare "4090" after a count word, "One 4090, axolotl, ...",
# or before a count, "3090*8")
# (A bare "3090" is not enough: step counters and sample counts look the same.)
GPU_WITHOUT_BF16 = re.compile(r"V100|T4|P100|P40|TITAN\s?(?:V|RTX|Xp?)\b|1080|20[6789]0", re.IGNORECASE)


def gpu_name(raw: str) -> str:
    """One spelling per card: "a800" -> "A800", "Ascend910B2C" -> "910B2C", a bare "4090" after a count of cards ->
    "RTX 4090"."""
    name = re.sub(r"^Ascend ?", "", re.sub(r"\s+", " ", raw.strip()))  # "Ascend910B2C" -> "910B2C"
    name = re.sub(r"^MI (?=\d)", "MI", name)  # "8 MI 250 GPUs"
    name = re.sub(r"^(?:NVIDIA )?GeForce (?=RTX)", "", name)  # "NVIDIA GeForce RTX 4090" (an env block) -> "RTX 4090"
    name = re.sub(r"^rtx ?(?=\d)", "RTX ", name, flags=re.IGNORECASE)  # "RTX3090", "rtx3090" -> "RTX 3090"
    if re.fullmatch(r"[ahv]\d{3}|h20", name):
        return name.upper()
    m = re.fullmatch(r"([2345]0[6789]0)(?: ?(ti|Ti|TI|tI)|(D))?", name)  # "2080ti" -> "RTX 2080 Ti"
    if m:
        return f"RTX {m.group(1)}" + (" Ti" if m.group(2) else "D" if m.group(3) else "")
    return name


# The question that settles a fact, in both languages (differential diagnosis asks the 1-3 that separate the
# candidates most); `options` are the answers that matter.
QUESTIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "precision": ("Do you train in fp16 or bf16 (mixed precision)?", "训练用的是 fp16 还是 bf16（混合精度）？",
                  ("fp16", "bf16", "fp32")),
    "weights_dtype": ("In which dtype are the trainable weights loaded (torch_dtype)?",
                      "可训练权重以什么 dtype 加载（torch_dtype）？", ("float16", "bfloat16", "float32")),
    "sequence_parallel_size": ("Does it still happen with sequence_parallel_size 1 (no sequence/context parallelism)?",
                               "把 sequence_parallel_size 设为 1（关闭序列并行）还会出现吗？", ("1", "2", "4", "8")),
    "sequence_parallel": ("Is sequence / context parallelism (Ulysses, ring attention) on?",
                          "是否开启了序列并行 / 上下文并行（Ulysses、ring attention）？", ("true", "false")),
    "attn_implementation": ("Which attention implementation runs (eager, sdpa, flash_attention_2)?",
                            "用的是哪种 attention 实现（eager、sdpa、flash_attention_2）？",
                            ("eager", "sdpa", "flash_attention_2")),
    "zero_stage": ("Which DeepSpeed ZeRO stage do you use?", "DeepSpeed ZeRO 用的是哪个 stage？", ("0", "1", "2", "3")),
    "overlap_comm": ("Is DeepSpeed overlap_comm on?", "DeepSpeed 的 overlap_comm 是否开启？", ("true", "false")),
    "loss_type": ("Which loss_type (sigmoid, ipo, simpo, ...)?", "loss_type 是什么（sigmoid、ipo、simpo……）？",
                  ("sigmoid", "ipo", "simpo")),
    "max_prompt_length": ("What are max_prompt_length and max_length?", "max_prompt_length 和 max_length 分别是多少？", ()),
    "max_length": ("What is max_length (cutoff_len)?", "max_length（cutoff_len）是多少？", ()),
    "learning_rate": ("What learning rate, and does a 10x lower one still diverge?",
                      "学习率是多少？降低 10 倍后还会发散吗？", ()),
    "vanilla_loss": ("Is --vanilla_loss on?", "是否开启了 --vanilla_loss？", ("true", "false")),
    "kl_estimator": ("Which KL estimator (k1, k3 / low_var_kl)?", "KL 估计器是哪种（k1、k3 / low_var_kl）？",
                     ("k1", "k3")),
    "use_kl_loss": ("Is the KL term used as a loss (use_kl_loss)?", "是否把 KL 作为 loss（use_kl_loss）？", ("true", "false")),
    "num_generations": ("How many completions per prompt (num_generations / rollout.n)?",
                        "每个 prompt 采样几个回答（num_generations / rollout.n）？", ()),
    "framework_version": ("Which version of the training framework, and does the previous release work?",
                          "训练框架是哪个版本？回退到上一个版本是否正常？", ()),
    "deepspeed_version": ("Which DeepSpeed version?", "DeepSpeed 是哪个版本？", ()),
    "torch_version": ("Which torch version?", "torch 是哪个版本？", ()),
    "flash_attn_version": ("Which flash-attn version?", "flash-attn 是哪个版本？", ()),
    "gpu": ("Which GPU (V100/T4 have no bf16)?", "用的是什么 GPU（V100/T4 不支持 bf16）？", ()),
    "rpo_alpha": ("Is an NLL term on (rpo_alpha > 0)?", "是否加了 NLL 项（rpo_alpha > 0）？", ()),
    "padding_side": ("Which padding side does the tokenizer use?", "tokenizer 的 padding_side 是左还是右？",
                     ("left", "right")),
    "micro_batch_size": ("What is the per-device micro-batch size?", "每张卡的 micro batch size 是多少？", ()),
    "completion_only_loss": ("Is the loss computed on completions only?", "是否只在回答部分计算 loss？", ("true", "false")),
    "algorithm": ("Which algorithm (SFT, DPO, KTO, GRPO, ...)?", "用的是什么算法（SFT、DPO、KTO、GRPO……）？", ()),
    "use_peft": ("Do you train LoRA adapters or the full model?", "是 LoRA 还是全参训练？", ("true", "false")),
    # Asked when kb finds no divergence in a paste and calls it out of scope (kb.diagnose.engine): many first posts
    # show the metric only in a screenshot. No answer (or "none") leaves that verdict.
    "symptom": ("Did a training metric (loss, grad_norm, reward) go NaN or inf, drop to exactly 0, or blow up?",
                "训练指标（loss、grad_norm、reward）是否变成了 NaN / inf、恰好降到 0，或者暴涨发散？",
                ("nan", "inf", "zero_loss", "collapse", "none")),
}
# How an answer to the symptom question may be worded -> the symptom the fact layer reads from a paste (None: no
# symptom, the out-of-scope verdict stands).
SYMPTOM_ANSWERS: dict[str, str | None] = {
    "nan": "nan", "inf": "inf", "infinity": "inf", "zero_loss": "zero_loss", "zero": "zero_loss", "0": "zero_loss",
    "collapse": "collapse", "spike": "collapse", "diverge": "collapse", "divergence": "collapse",
    "explode": "collapse", "overflow": "overflow", "zero_grad": "zero_grad", "huge": "huge",
    "rollout_mismatch": "rollout_mismatch", "none": None, "no": None, "false": None,
}
