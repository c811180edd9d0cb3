"""Facts a running trainer (or a run folder) knows, in the canonical keys of kb.canonical, and the one call
that hands them to the diagnosis engine (`diagnose_collected`)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kb.canonical import canonical, canonical_algorithm, spec
from kb.facts.configs import flatten

if TYPE_CHECKING:
    from kb.diagnose.models import Diagnosis
    from kb.kb import KnowledgeBase

# Distribution name -> fact key; accelerate and lightning have no canonical key (yet), so they get their own.
PACKAGES = {"torch": "torch_version", "transformers": "transformers_version", "trl": "trl_version",
            "peft": "peft_version", "deepspeed": "deepspeed_version", "accelerate": "accelerate_version",
            "flash-attn": "flash_attn_version", "lightning": "lightning_version"}
# Trainer class name -> canonical algorithm (the loss the trainer optimises).
TRAINER_ALGORITHMS = {"SFTTrainer": "SFT", "DPOTrainer": "DPO", "KTOTrainer": "KTO", "CPOTrainer": "CPO",
                      "ORPOTrainer": "ORPO", "RewardTrainer": "RM", "GRPOTrainer": "GRPO", "PPOTrainer": "PPO",
                      "RLOOTrainer": "GRPO", "OnlineDPOTrainer": "DPO"}
# TrainingArguments fields whose names look like canonical aliases but mean something else.
_SKIP_ARGS = {"eval_batch_size", "per_device_eval_batch_size", "logging_dir", "output_dir", "hub_model_id",
              "run_name", "eval_strategy", "report_to", "model_init_kwargs", "ref_model_init_kwargs",
              "per_gpu_train_batch_size", "per_gpu_eval_batch_size", "dataset_text_field", "seed", "data_seed"}


@dataclass
class Collected:
    """What the running trainer knows when something went wrong: canonical facts, each with a detail string
    saying where it was read, and the last log records (each a dict holding its `step`)."""

    facts: dict[str, tuple[Any, str]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    trigger: str = ""
    source: str = "running trainer"
    log_text: str = ""  # raw log lines a run folder left (framework console logs), passed to the engine as is

    def set(self, key: str, value: Any, detail: str) -> None:
        if value is None or value == "" or value == []:
            return
        self.facts[key] = (value, detail)

    def add(self, key: str, value: Any, detail: str) -> None:
        """Append to a list-valued fact (errors, nan_metrics); the detail of each item is kept."""
        old, old_detail = self.facts.get(key, ([], ""))
        if value in old:
            return
        self.facts[key] = ([*old, value], f"{old_detail}; {detail}" if old_detail else detail)

    def value(self, key: str, default: Any = None) -> Any:
        return self.facts[key][0] if key in self.facts else default

    def update_config(self, items: dict[str, Any] | list[tuple[str, Any]], where: str) -> None:
        """Map raw keys (TrainingArguments fields, DeepSpeed JSON paths, YAML keys) to canonical facts; a fact
        already set is kept (what is read first, from the trainer itself, wins over files)."""
        pairs = items.items() if isinstance(items, dict) else items
        for raw, v in pairs:
            if raw in _SKIP_ARGS or v is None or isinstance(v, (dict, list, tuple)):
                continue
            got = canonical(str(raw), v)
            if got is None or got[0] in self.facts:
                continue
            key, val = got
            self.set(key, val, f"{where} {raw}={v!r}")


# ---------------------------------------------------------------- facts from objects
def versions(c: Collected) -> None:
    for dist, key in PACKAGES.items():
        try:
            ver = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        c.set(key, ver, f"installed {dist}=={ver}")


def environment(c: Collected, world_size: int | None = None) -> None:
    """GPU name and bf16 support (or "cpu"), world size."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        c.set("gpu", name, f"torch.cuda.get_device_name() = {name}")
        c.set("gpu_bf16", bool(torch.cuda.is_bf16_supported()), "torch.cuda.is_bf16_supported()")
    else:
        c.set("gpu", "cpu", "torch.cuda.is_available() is False: training on CPU")
    if world_size is None and torch.distributed.is_available() and torch.distributed.is_initialized():
        world_size = torch.distributed.get_world_size()
    ws = int(world_size or os.environ.get("WORLD_SIZE") or 1)
    c.set("world_size", ws, f"world size {ws}")




def deepspeed_config(c: Collected, cfg: dict[str, Any] | None, where: str) -> None:
    if not cfg:
        return
    flat = [(k, v) for k, v in flatten(cfg, keep_lists=True) if v != "auto"]
    c.update_config(flat, f"DeepSpeed config ({where})")
    for k, v in flat:
        if k in ("fp16.enabled", "bf16.enabled") and v is True:
            c.set("precision", k.split(".")[0], f"DeepSpeed config ({where}) {k}=true")


def trainer_args(c: Collected, args: Any, trainer_cls: str = "", where: str = "") -> None:
    """HF TrainingArguments / TRL configs (the object or its dict): precision, learning rate, batch sizes, lengths,
    loss type and its parameters, DeepSpeed config, parallel degrees."""
    if args is None:
        return
    d = args if isinstance(args, dict) else args.to_dict() if hasattr(args, "to_dict") else dict(vars(args))
    where = where or type(args).__name__
    if d.get("bf16"):
        c.set("precision", "bf16", f"{where} bf16=True")
    elif d.get("fp16"):
        c.set("precision", "fp16", f"{where} fp16=True")
    else:
        c.set("precision", "fp32", f"{where} fp16=False, bf16=False (no mixed precision)")
    optim = d.get("optim")
    if optim is not None:
        c.set("optim", str(getattr(optim, "value", optim)), f"{where} optim={optim}")
    loss_type = d.get("loss_type")
    if isinstance(loss_type, (list, tuple)) and loss_type:  # TRL DPO accepts a list of losses
        c.set("loss_type", str(loss_type[0]).lower(), f"{where} loss_type={loss_type}")
    c.update_config({k: v for k, v in d.items() if k not in ("fp16", "bf16", "optim", "deepspeed")}, where)
    algo = TRAINER_ALGORITHMS.get(trainer_cls)
    lt = c.value("loss_type")
    if algo in ("CPO", "DPO") and isinstance(lt, str) and canonical_algorithm(lt) in ("SimPO", "IPO"):
        algo = canonical_algorithm(lt)
    if algo:
        c.set("algorithm", algo, f"trainer class {trainer_cls}")
    ds = getattr(args, "hf_deepspeed_config", None)
    ds_cfg = getattr(ds, "config", None) if ds is not None else None
    if ds_cfg is None and isinstance(d.get("deepspeed"), dict):
        ds_cfg = d["deepspeed"]
    elif ds_cfg is None and isinstance(d.get("deepspeed"), str) and os.path.isfile(d["deepspeed"]):
        try:
            with open(d["deepspeed"], encoding="utf-8") as fh:
                ds_cfg = json.load(fh)
        except (OSError, ValueError):
            ds_cfg = None
    deepspeed_config(c, ds_cfg, where)
    pc = getattr(args, "parallelism_config", None)
    for attr, key in (("sp_size", "sequence_parallel_size"), ("cp_size", "sequence_parallel_size"),
                      ("tp_size", "tensor_parallel_size")):
        v = getattr(pc, attr, None)
        if isinstance(v, int) and v > 1:
            c.set(key, v, f"{where} parallelism_config.{attr}={v}")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def model_facts(c: Collected, model: Any, tokenizer: Any = None) -> None:
    """Trainable parameter dtypes, attention implementation, embedding rows vs tokenizer size, adapter config."""
    if model is None:
        return
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            dt = _dtype_name(p.dtype)
            counts[dt] += 1
            example.setdefault(dt, name)
    if counts:
        dt, n = counts.most_common(1)[0]
        total = sum(counts.values())
        canon = canonical("weights_dtype", dt)
        if canon:
            c.set("weights_dtype", canon[1], f"{n} of {total} trainable tensors stored in {dt} "
                  f"(e.g. {example[dt]} dtype {dt}, trainable)")
        if "float16" in counts and dt != "float16":  # a few fp16 trainable tensors (a score head) are enough
            c.set("weights_dtype", "fp16", f"{counts['float16']} of {total} trainable tensors stored in float16 "
                  f"(e.g. {example['float16']} dtype float16, trainable)")
        c.set("trainable_param_dtypes", dict(counts), "dtypes of the trainable parameters: " +
              ", ".join(f"{k} x{v}" for k, v in counts.items()))
    cfg = getattr(model, "config", None)
    attn = getattr(cfg, "_attn_implementation", None) if cfg is not None else None
    if attn:
        c.set("attn_implementation", attn, f"model.config._attn_implementation = {attn}")
    if cfg is not None:
        mt = getattr(cfg, "model_type", None)
        c.set("model_family", mt, f"model.config.model_type = {mt}")
        name = getattr(cfg, "_name_or_path", "") or ""
        c.set("model", name, f"model.config._name_or_path = {name}")
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(getattr(emb, "weight", None), "shape", [None])[0]
    if rows is not None:
        c.set("embedding_rows", int(rows), f"input embedding matrix has {rows} rows")
    if tokenizer is not None and hasattr(tokenizer, "__len__"):
        n = len(tokenizer)
        c.set("tokenizer_size", n, f"len(tokenizer) = {n}")
        if rows is not None and n > rows:
            c.set("embedding_rows_short", True, f"tokenizer has {n} tokens but the embedding only {rows} rows")
    peft_cfg = getattr(model, "peft_config", None)
    if not (isinstance(peft_cfg, dict) and peft_cfg) and counts:
        n_all = sum(1 for _ in model.parameters())
        if sum(counts.values()) == n_all:
            c.set("finetuning_type", "full", f"no adapter; all {n_all} parameter tensors are trainable")
    if isinstance(peft_cfg, dict) and peft_cfg:
        adapter = next(iter(peft_cfg.values()))
        c.set("use_peft", True, f"model.peft_config: {type(adapter).__name__}")
        adapter_config(c, adapter.to_dict() if hasattr(adapter, "to_dict") else dict(vars(adapter)), "model.peft_config")


def derive_precision(c: Collected) -> None:
    """Without mixed precision the step computes in the weights' own dtype: fp16 weights mean fp16 compute."""
    prec, w = c.facts.get("precision"), c.value("weights_dtype")
    if prec is not None and prec[0] == "fp32" and "no mixed precision" in prec[1] and w in ("fp16", "bf16"):
        c.set("precision", w, f"{prec[1]}, so the step computes in the weights' dtype {w}")


def adapter_config(c: Collected, cfg: dict[str, Any], where: str) -> None:
    ptype = str(cfg.get("peft_type") or "")
    ptype = str(getattr(cfg.get("peft_type"), "value", ptype)).lower()
    c.set("use_peft", True, f"{where} peft_type={ptype or '?'}")
    if ptype:
        c.set("finetuning_type", "lora" if "lora" in ptype else ptype, f"{where} peft_type={ptype}")
    tt = cfg.get("task_type")
    if tt:
        c.set("lora_task_type", str(getattr(tt, "value", tt)).lower(), f"{where} task_type={tt}")
    saved = cfg.get("modules_to_save") or []
    if any("embed" in str(m) or "lm_head" in str(m) for m in saved):
        c.set("trainable_embeddings", True, f"{where} modules_to_save={saved}")


# ---------------------------------------------------------------- log records
def clean_record(step: int | None, metrics: dict[str, Any]) -> dict[str, Any]:
    """A log record as plain floats (a one-element tensor is read once), with its step."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        t = type(v)
        if t is float:
            out[k] = v
        elif t is int:
            out[k] = float(v)
        elif t is not bool and hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
            v = v.item()
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = float(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):  # numpy scalars, float subclasses
            out[k] = float(v)
    if step is not None:
        out["step"] = int(step)
    return out


# ---------------------------------------------------------------- rendering for the current engine
def _fmt(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return repr(v)
    return f"{v:.6g}" if isinstance(v, float) else str(v)


_IN_USE = {
    "trl_version": lambda c: c.value("framework") == "trl",
    "peft_version": lambda c: bool(c.value("use_peft")),
    "deepspeed_version": lambda c: c.value("zero_stage") is not None,
    "lightning_version": lambda c: False,
}


def render(collected: Collected) -> str:
    """The collected facts as text the engine reads today: a YAML block of canonical settings, `name==version`
    lines, finding lines (probe, error ids) and the log records as HF-style dict lines with their step."""
    settings, versions_, notes = [], [], []
    ver_names = {v: k for k, v in PACKAGES.items()}
    for key, (value, detail) in collected.facts.items():
        s = spec(key)
        if key in ver_names:
            # The engine reads `trl==x` as "the run uses TRL": only packages the run uses are rendered.
            if key not in _IN_USE or _IN_USE[key](collected):
                versions_.append(f"{ver_names[key]}=={value}")
        elif s is not None and s.kind != "list" and key not in ("first_bad_step", "output_collapse", "pairwise_tie",
                                                                  "symptom"):
            v = str(value).lower() if isinstance(value, bool) else value
            # The detail rides along as a YAML comment, so the engine's line evidence shows where it was read.
            note = " ".join(str(detail).replace("#", "").split())[:160]
            settings.append(f"  {key}: {v}  # {note}" if note else f"  {key}: {v}")
    for line in collected.facts.get("findings", ([], ""))[0]:
        notes.append(str(line))
    # The trigger's words ("loss is nan") are not rendered: the engine would read them as an error message.
    out = [f"# kb: facts from the {collected.source}"]
    if settings:
        out += ["settings:", *settings]
    out += versions_
    out += notes
    out += log_lines(collected)
    return "\n".join(out) + "\n"


def log_lines(collected: Collected) -> list[str]:
    """The log records as HF-style dict lines with their step, then any raw log text of the run."""
    lines = []
    for r in collected.records:
        body = ", ".join(f"'{k}': {_fmt(v)}" for k, v in r.items() if k != "step")
        step = r.get("step")
        lines.append("{" + body + (f", 'step': {int(step)}" if step is not None else "") + "}")
    if collected.log_text:
        lines.append(collected.log_text.rstrip("\n"))
    return lines


def engine_inputs(collected: Collected) -> tuple[dict[str, tuple[object, str]], str, str]:
    """(facts as data, log lines, finding sentences): what the diagnosis engine takes from a run.

    The facts go in as data (kind "trainer": they outrank anything read from text, and their evidence says where
    they came from); the log records go in as log lines, so metrics, the first bad step and error strings are
    read as in any paste."""
    ver_names = {v: k for k, v in PACKAGES.items()}
    facts: dict[str, tuple[object, str]] = {}
    for key, (value, detail) in collected.facts.items():
        if key == "findings" or (key in ver_names and key in _IN_USE and not _IN_USE[key](collected)):
            continue  # findings are sentences (text below); an unused package's version says nothing
        note = " ".join(str(detail).split())[:200]
        facts[key] = (value, f"{note} (from the running trainer)" if note else "from the running trainer")
    findings = "\n".join(str(x) for x in collected.facts.get("findings", ([], ""))[0])
    return facts, "\n".join(log_lines(collected)), findings


def diagnose_collected(kb: KnowledgeBase, collected: Collected) -> Diagnosis:
    """The one call into the diagnosis engine for run-time facts (see engine_inputs)."""
    facts, log, findings = engine_inputs(collected)
    return kb.diagnose(log=log or None, text=findings or None, facts=facts)
