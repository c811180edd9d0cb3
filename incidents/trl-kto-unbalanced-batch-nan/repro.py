"""Repro check: KTO statistics averaged per class inside a micro-batch; with imbalanced data and small micro-batches
some micro-batch holds no desirable example, and the mean over that empty side is NaN while the loss gradient of the
other side stays finite. Skipping empty-side statistics (TRL PR #1476 and the April 2024 fixes) keeps them finite."""

from __future__ import annotations

import math
import tempfile
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, import_framework, num
from kb.repro.tiny import TinyLM, quiet, tiny_causal_lm, tiny_tokenizer, tiny_words, token_logps, trainer_args


def side_mean(x: torch.Tensor, guarded: bool) -> torch.Tensor:
    """Per-class statistic over a micro-batch; guarded: an empty side is left out (reported as 0 here)."""
    if guarded and x.numel() == 0:
        return x.new_zeros(())
    return x.mean()  # mean of an empty tensor is NaN


class KTOEmptySide(ReproCheck):
    """Micro-batches drawn from 2k desirable / 10k undesirable examples; per-side rewards and KTO loss."""

    # The back-propagated loss concatenates both sides and stays finite here; how the reporter's logged loss became
    # NaN is not established, so the check judges the per-side statistics.
    watch = ("rewards_chosen", "rewards_rejected", "logps_chosen")
    frameworks = ("trl",)
    desirable_fraction = 2 / 12  # the reporter's test: 2k desirable vs 10k undesirable

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        n = max(1, int(settings.get("micro_batch_size") or 2))
        beta = float(settings.get("beta") or 0.1)
        policy, ref = TinyLM().to(device), TinyLM().to(device)
        ref.requires_grad_(False)
        g = torch.Generator().manual_seed(0)
        # The sampler's draw for this micro-batch: with 1 desirable in 6, an all-undesirable draw is common.
        labels = (torch.rand(n, generator=g) < self.desirable_fraction).tolist()  # True = desirable
        ids = torch.randint(2, 64, (n, 17), generator=g).to(device)
        tgt = ids[:, 1:].clone()
        tgt[:, :8] = -100  # prompt tokens
        pol = token_logps(policy(ids[:, :-1]), tgt).sum(-1)
        with torch.no_grad():
            refl = token_logps(ref(ids[:, :-1]), tgt).sum(-1)
        kl = torch.zeros((), device=device)  # the batch KL estimate (clamped at 0) as logged: kl 0.0
        desirable = torch.tensor(labels, device=device)
        chosen_r, rejected_r = beta * (pol - refl)[desirable], beta * (pol - refl)[~desirable]
        chosen_l = 1 - torch.sigmoid(chosen_r - kl)
        rejected_l = 1 - torch.sigmoid(kl - rejected_r)
        loss = torch.cat([chosen_l, rejected_l]).mean()  # what is back-propagated
        loss.backward()
        return {"desirable_in_batch": int(desirable.sum()), "rewards_chosen": num(side_mean(chosen_r.detach(), fixed)),
                "rewards_rejected": num(side_mean(rejected_r.detach(), fixed)),
                "logps_chosen": num(side_mean(pol.detach()[desirable], fixed)), "loss": num(loss),
                "grad_norm": grad_norm(policy.parameters())}


    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        """TRL's own KTOTrainer for two steps on micro-batches that hold only undesirable examples (the imbalanced
        case): are the logged loss and per-side statistics still NaN in this version?"""
        trl = import_framework("trl")
        from datasets import Dataset

        n = max(2, int(settings.get("micro_batch_size") or 2))  # KTO's KL term needs a batch of at least 2
        rows = [{"prompt": tiny_words(6, 10 + i), "completion": tiny_words(5, 50 + i), "label": False}
                for i in range(2 * n)]
        with tempfile.TemporaryDirectory() as tmp:
            args = trainer_args(trl.KTOConfig, tmp, device, max_steps=2, per_device_train_batch_size=n,
                                beta=float(settings.get("beta") or 0.1), max_length=32, learning_rate=1e-5)
            torch.manual_seed(0)
            trainer = quiet(trl.KTOTrainer(model=tiny_causal_lm("llama", seed=0, device=device),
                                           ref_model=tiny_causal_lm("llama", seed=0, device=device), args=args,
                                           train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer()))
            trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
        keys = sorted({k for h in logs for k in h if k.startswith(("rewards/", "logps/")) or k in ("loss", "grad_norm")})
        out: dict[str, Any] = {"trl": trl.__version__, "micro_batch_size": n, "desirable_in_batches": 0,
                               "logged_steps": len(logs)}
        for k in keys:
            out[f"last_{k}"] = float(logs[-1].get(k, math.nan)) if logs else math.nan
        bad = [k for h in logs for k, x in h.items() if k in keys and isinstance(x, float) and not math.isfinite(x)]
        out["nan_logged_values"] = len(bad)
        out["affected"] = int(bool(bad))
        return out


def main() -> int:
    return cli_main(KTOEmptySide)


if __name__ == "__main__":
    raise SystemExit(main())
