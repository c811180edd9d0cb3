"""Repro check: verl's low_var_kl (k3) estimator exponentiates an unclamped log-ratio; exp overflows to inf, the final
clamp keeps the forward finite but its zero gradient times the infinite derivative is NaN. Clamping the log-ratio
before exp (verl PR #1779) keeps the gradients finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM

EXP_SAFE = {"k1", "k2", "abs", "kl", "mse"}  # estimators without an exponential


def low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor, clamp_ratio: bool) -> torch.Tensor:
    """verl core_algos.kl_penalty('low_var_kl'): before PR #1779 without the first clamp."""
    kl = ref_logp - logp
    if clamp_ratio:
        kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    return torch.clamp(ratio - kl - 1, min=-10, max=10)


class LowVarKLOverflow(ReproCheck):
    """k3 KL loss on a rollout in which the policy gives one sampled token a log-prob far below the reference's."""

    watch = ("kl_loss", "grad_norm")
    frameworks = ("verl",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        coef = float(settings.get("kl_coef") or 0.001)
        model = TinyLM().to(device)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(2, 64, (2, 17), generator=g).to(device)
        logits = model(ids[:, :-1])
        # The policy has drifted: token id 0 (decoded "!" by the reported tokenizer) is now ~e^-150 less likely
        # than the reference model thinks; the rollout sampled it once.
        drift = torch.zeros(64, device=device)
        drift[0] = -150.0
        targets = ids[:, 1:].clone()
        targets[0, 3] = 0
        logp = (logits + drift).float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            ref_logp = logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        kld = low_var_kl(logp, ref_logp, clamp_ratio=fixed)
        kl_loss = kld.mean()
        (coef * kl_loss).backward()
        return {"max_log_ratio": num((ref_logp - logp).max()), "kl_loss": num(kl_loss),
                "grad_norm": grad_norm(model.parameters())}


def main() -> int:
    return cli_main(LowVarKLOverflow)


if __name__ == "__main__":
    raise SystemExit(main())
