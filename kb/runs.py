"""Reading what a finished or crashed run left in its output folder (HF/TRL trainer_state.json, training
arguments, config.json, adapter_config.json, DeepSpeed configs, ms-swift / LLaMA-Factory / verl / OpenRLHF
logs) into the same collected facts the live callbacks produce."""

from __future__ import annotations

import json
import pickletools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kb.errors import InputError
from kb.facts.configs import flatten
from kb.integrations.collect import (
    Collected,
    adapter_config,
    deepspeed_config,
    derive_precision,
    diagnose_collected,
    trainer_args,
)
from kb.integrations.monitor import Monitor

if TYPE_CHECKING:
    from kb.diagnose.models import Diagnosis
    from kb.kb import KnowledgeBase

MAX_FILE = 20_000_000  # bytes read from any one file; logs are read from their tail
LOG_TAIL_LINES = 400
ARG_FILES = ("training_args.json", "args.json", "training_args.yaml", "train_args.yaml", "sft_args.json",
             ".hydra/config.yaml", "config.yaml")
# Globals a training_args.bin pickle may name for us to unpickle it: argument dataclasses and their enums.
SAFE_PICKLE_MODULES = ("transformers.", "trl.", "peft.", "accelerate.", "enum", "builtins", "collections",
                       "datetime", "torch.")
SAFE_BUILTINS = {"set", "frozenset", "dict", "list", "tuple"}


def _read_text(p: Path, tail: bool = False) -> str:
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            if size > MAX_FILE:
                fh.seek(size - MAX_FILE if tail else 0)
            data = fh.read(MAX_FILE)
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror}") from None
    return data.decode("utf-8", errors="replace")


def _json(p: Path) -> Any:
    try:
        return json.loads(_read_text(p))
    except ValueError:
        return None


def _pickle_globals(data: bytes) -> set[str] | None:
    """Every `module.name` a pickle would import, read statically; None when the stream cannot be parsed."""
    names: set[str] = set()
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(str(arg))
            elif op.name in ("GLOBAL", "INST"):
                names.add(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL":
                if len(strings) < 2:
                    return None
                names.add(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # noqa: BLE001 - any malformed stream is simply not loaded
        return None
    return names


def _is_safe(name: str) -> bool:
    if name.startswith("builtins."):
        return name.split(".", 1)[1] in SAFE_BUILTINS
    if name.startswith("torch."):
        return name in ("torch.float16", "torch.bfloat16", "torch.float32", "torch.device", "torch.dtype")
    return name.startswith(SAFE_PICKLE_MODULES)


def load_training_args_bin(p: Path) -> tuple[dict[str, Any] | None, str]:
    """The HF Trainer's training_args.bin, unpickled only when every class it names is an argument dataclass or
    enum of transformers / TRL / PEFT / accelerate (read statically first); else (None, why not)."""
    import torch

    data = p.read_bytes()[:MAX_FILE]
    if data[:2] == b"PK":  # torch's zip format: the pickle is data.pkl inside
        import io
        import zipfile

        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                pkl = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
                raw = z.read(pkl) if pkl else b""
        except zipfile.BadZipFile:
            return None, f"{p.name} is not a readable torch file"
    else:
        raw = data
    names = _pickle_globals(raw)
    if names is None:
        return None, f"{p.name} not read: its pickle could not be checked"
    unsafe = sorted(n for n in names if not _is_safe(n))
    if unsafe:
        return None, f"{p.name} not read: it would import {', '.join(unsafe[:3])}"
    try:
        obj = torch.load(p, weights_only=False, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - a version mismatch (a class renamed) only loses this one file
        return None, f"{p.name} not read: {type(e).__name__}: {e}"
    d = obj.to_dict() if hasattr(obj, "to_dict") else vars(obj) if hasattr(obj, "__dict__") else None
    return (d if isinstance(d, dict) else None), ""




def _jsonl_records(p: Path) -> list[dict[str, Any]]:
    """ms-swift logging.jsonl / LLaMA-Factory trainer_log.jsonl -> metric dicts with their step."""
    out = []
    for line in _read_text(p, tail=True).splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        step = d.get("step", d.get("current_steps"))
        gs = d.get("global_step/max_steps") or d.get("global_step")
        if step is None and isinstance(gs, str) and "/" in gs:
            step = gs.split("/")[0]
        rec = {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        try:
            rec["step"] = int(step) if step is not None else len(out) + 1
        except ValueError:
            rec["step"] = len(out) + 1
        out.append(rec)
    return out


def _history(root: Path) -> tuple[list[dict[str, Any]], str]:
    """trainer_state.json's log_history: the folder's own, else the newest checkpoint's."""
    cands = [root / "trainer_state.json"]
    ckpts = sorted(root.glob("checkpoint-*/trainer_state.json"),
                   key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0), reverse=True)
    for p in cands + ckpts:
        if p.is_file():
            d = _json(p)
            if isinstance(d, dict) and isinstance(d.get("log_history"), list):
                return [r for r in d["log_history"] if isinstance(r, dict)], str(p.relative_to(root))
    return [], ""


_FRAMEWORK_HINTS = (("verl", re.compile(r"\bactor/(?:pg_loss|kl_loss|entropy)|critic/|\bverl\b")),
                    ("OpenRLHF", re.compile(r"openrlhf|\bpolicy_loss\b.*\bkl\b|\bkto_loss\b", re.IGNORECASE)),
                    ("ms-swift", re.compile(r"\bswift\b|global_step/max_steps")),
                    ("LLaMA-Factory", re.compile(r"llamafactory|llama-factory")))


def read_run_dir(path: str | Path, records: int = 20) -> Collected:
    root = Path(path)
    if not root.is_dir():
        raise InputError(f"{path} is not a directory; give the run's output_dir")
    c = Collected(source="run folder")
    read: list[str] = []
    # --- arguments ------------------------------------------------------------------------------------------
    for name in ARG_FILES:
        p = root / name
        if p.is_file():
            text = _read_text(p)
            try:
                d = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            except (ValueError, yaml.YAMLError):
                continue
            if isinstance(d, dict):
                c.update_config(flatten(d, keep_lists=True), name)
                for k in ("fp16", "bf16"):
                    if d.get(k) is True:
                        c.set("precision", k, f"{name} {k}=true")
                read.append(name)
    for p in [root / "training_args.bin", *sorted(root.glob("checkpoint-*/training_args.bin"))]:
        if p.is_file() and not any(r.startswith(("training_args", "args.json")) for r in read):
            d, why = load_training_args_bin(p)
            if d is not None:
                trainer_args(c, d, where=str(p.relative_to(root)))
                read.append(str(p.relative_to(root)))
            else:
                c.add("findings", f"# {why}", "run folder")
            break
    # --- model, adapter, DeepSpeed --------------------------------------------------------------------------
    ckpts = sorted(root.glob("checkpoint-*/"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0), reverse=True)
    dirs = [root, *ckpts[:1]]
    cfg_path = next((d / "config.json" for d in dirs if (d / "config.json").is_file()), None)
    cfg = _json(cfg_path) if cfg_path is not None else None
    if isinstance(cfg, dict):
        dt = cfg.get("dtype") or cfg.get("torch_dtype")
        if dt:
            c.update_config({"weights_dtype": dt}, "config.json (dtype of the saved weights)")
        if cfg.get("model_type"):
            c.set("model_family", cfg["model_type"], f"config.json model_type={cfg['model_type']}")
        if cfg.get("vocab_size"):
            c.set("embedding_rows", int(cfg["vocab_size"]), f"config.json vocab_size={cfg['vocab_size']}")
        attn = cfg.get("_attn_implementation") or cfg.get("attn_implementation")
        if attn:
            c.set("attn_implementation", attn, f"config.json attn_implementation={attn}")
        read.append(str(cfg_path.relative_to(root)))
    ad = next((d / "adapter_config.json" for d in dirs if (d / "adapter_config.json").is_file()), None)
    if ad is not None and isinstance(d := _json(ad), dict):
        adapter_config(c, d, str(ad.relative_to(root)))
        read.append(str(ad.relative_to(root)))
    derive_precision(c)
    for p in sorted(root.glob("*.json")) + sorted(root.glob("*/*.json"))[:50]:
        if p.name in ("trainer_state.json", "config.json", "adapter_config.json") or p.stat().st_size > 1_000_000:
            continue
        d = _json(p)
        if isinstance(d, dict) and "zero_optimization" in d:
            deepspeed_config(c, d, str(p.relative_to(root)))
            read.append(str(p.relative_to(root)))
            break
    tok = root / "tokenizer.json"
    if tok.is_file() and tok.stat().st_size < MAX_FILE and isinstance(d := _json(tok), dict):
        vocab = (d.get("model") or {}).get("vocab")
        n = (len(vocab) if isinstance(vocab, (dict, list)) else 0) + len(d.get("added_tokens") or [])
        if n:
            c.set("tokenizer_size", n, f"tokenizer.json holds {n} tokens")
    # --- logs -------------------------------------------------------------------------------------------------
    hist, where = _history(root)
    fw = None
    if not hist:
        for name, framework in (("logging.jsonl", "ms-swift"), ("trainer_log.jsonl", "LLaMA-Factory")):
            if (root / name).is_file():
                hist, where, fw = _jsonl_records(root / name), name, framework
                break
    else:
        hist = [{**r, "step": r.get("step")} for r in hist]
    if fw:
        c.set("framework", fw, f"{where} (the {fw} log file)")
    if hist:
        mon = Monitor(keep=records)
        for r in hist:
            t = mon.observe(r.get("step"), {k: v for k, v in r.items() if k != "step"})
            if t is not None and t.nonfinite:
                break
        c.records = list(mon.records)
        c.trigger = mon.fired.reason if mon.fired else ""
        read.append(where)
    logs = [p for p in sorted(root.glob("*.log")) + sorted(root.glob("*.txt")) + sorted(root.glob("logs/*.log"))
            if p.is_file()][:5]
    tails = []
    for p in logs:
        lines = _read_text(p, tail=True).splitlines()[-LOG_TAIL_LINES:]
        tails.append("\n".join(lines))
        read.append(str(p.relative_to(root)))
        if fw is None:
            text = "\n".join(lines)
            for framework, rx in _FRAMEWORK_HINTS:
                if rx.search(text):
                    fw = framework
                    c.set("framework", framework, f"{p.name}: log lines in {framework}'s format")
                    break
    c.log_text = "\n".join(tails)
    if not read:
        raise InputError(f"{path} holds none of trainer_state.json, training arguments, config.json, "
                         "adapter_config.json, a DeepSpeed config or a *.log / *.jsonl log")
    c.set("run_files", read, "files read from the run folder: " + ", ".join(read))
    return c


def diagnose_run_dir(kb: KnowledgeBase, path: str | Path) -> Diagnosis:
    return diagnose_collected(kb, read_run_dir(path))
