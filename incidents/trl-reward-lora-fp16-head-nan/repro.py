"""Repro check: a reward model loaded with torch_dtype half trains its `score` head as fp16 parameters; plain
(non-fused) AdamW on fp16 parameters rounds eps 1e-8 to 0 and underflows second moments, so step 1 writes inf
into the head and from step 2 the loss and grad_norm are NaN. fp32 trainable weights with autocast stay finite."""

from __future__ import annotations

import math
import tempfile
from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, import_framework, is_bad, num
from kb.repro.tiny import quiet, tiny_seq_cls, tiny_tokenizer, tiny_words, torch_dtype, trainer_args


def _pairs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(2, 128, (4, 12), generator=g).to(device), torch.randint(2, 128, (4, 12), generator=g).to(device))


def _train(model: torch.nn.Module, params: list[torch.nn.Parameter], optim: str, device: str, amp: bool) -> dict:
    """Three pairwise reward-loss steps; returns per-step loss / grad_norm and the head's max |w| after step 1."""
    opt = torch.optim.AdamW(params, lr=1e-5, **({"fused": True} if optim.endswith("fused") else {"foreach": False}))
    chosen, rejected = _pairs(device)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    out: dict[str, Any] = {}
    for step in (1, 2, 3):
        with torch.autocast(dev_type, dtype=torch.float16, enabled=amp):
            margin = model(chosen).logits.squeeze(-1).float() - model(rejected).logits.squeeze(-1).float()
            loss = -F.logsigmoid(margin).mean()
        opt.zero_grad()
        loss.backward()
        out[f"loss_step{step}"], out[f"grad_norm_step{step}"] = num(loss), grad_norm(params)
        opt.step()
        if step == 1:
            out["head_max_abs_after_step1"] = max(float(p.detach().float().abs().max()) for p in params)
    out["loss"], out["grad_norm"] = out["loss_step2"], out["grad_norm_step2"]
    return out


class RewardHeadFp16AdamW(ReproCheck):
    """A tiny Qwen2 sequence classifier (reward model): frozen backbone, trainable `score` head."""

    frameworks = ("peft", "trl")

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        if facts.get("optim"):
            s["optim"] = facts["optim"]
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch.float32 if fixed else torch_dtype(settings.get("weights_dtype"))
        model = tiny_seq_cls("qwen2", seed=0, dtype=dtype, device=device)
        model.requires_grad_(False)
        model.score.requires_grad_(True)
        out = _train(model, list(model.score.parameters()), str(settings.get("optim") or "adamw_torch"), device,
                     amp=dtype == torch.float32)
        return {"head_dtype": str(model.score.weight.dtype).replace("torch.", ""), **out}

    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        """TRL's RewardTrainer with a PEFT LoRA SEQ_CLS config on a tiny Qwen2 classifier, three logged steps: loaded
        in fp16 with the reported optimizer (faulty), and loaded in fp32 (fixed); plus which dtypes PEFT trains."""
        trl = import_framework("trl")
        peft = import_framework("peft")
        from datasets import Dataset

        optim = str(settings.get("optim") or "adamw_torch")  # the reporter's era: transformers' default was non-fused
        rows = [{"chosen": tiny_words(10, 2 * i), "rejected": tiny_words(9, 2 * i + 1)} for i in range(6)]
        out: dict[str, Any] = {"trl": trl.__version__, "peft": peft.__version__, "optim": optim}
        with tempfile.TemporaryDirectory() as tmp:
            for run, dtype in (("faulty", torch_dtype(settings.get("weights_dtype"))), ("fixed", torch.float32)):
                args = trainer_args(trl.RewardConfig, tmp, device, max_steps=3, learning_rate=1e-5, optim=optim,
                                    per_device_train_batch_size=2, max_length=64)
                lora = peft.LoraConfig(task_type=str(settings.get("lora_task_type") or "SEQ_CLS").upper(), r=4,
                                       lora_alpha=8, target_modules=["q_proj", "v_proj"])
                trainer = quiet(trl.RewardTrainer(model=tiny_seq_cls("qwen2", seed=0, dtype=dtype, device=device),
                                                  args=args, train_dataset=Dataset.from_list(rows),
                                                  processing_class=tiny_tokenizer(), peft_config=lora))
                trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
                for part in ("score", "lora_"):
                    out[f"{run}_{part.strip('_')}_dtype"] = next(
                        (str(p.dtype).replace("torch.", "") for n, p in trained.items() if part in n), "?")
                trainer.train()
                logs = [h for h in trainer.state.log_history if "loss" in h]
                for i, h in enumerate(logs, start=1):
                    out[f"{run}_loss_step{i}"] = float(h["loss"])
                    out[f"{run}_grad_norm_step{i}"] = float(h.get("grad_norm", math.nan))
                out[f"{run}_score_finite"] = int(all(bool(p.isfinite().all()) for n, p in trained.items()
                                                     if "score" in n))
        bad = [k for k in out if k.startswith("faulty_grad_norm") and is_bad(out[k])]
        out["affected"] = int(bool(bad) or not out["faulty_score_finite"])
        out["fix_works"] = int(out["fixed_score_finite"] == 1 and not any(
            is_bad(out[k]) for k in out if k.startswith("fixed_grad_norm")))
        return out


def main() -> int:
    return cli_main(RewardHeadFp16AdamW)


if __name__ == "__main__":
    raise SystemExit(main())
