"""Repro check: KTO statistics averaged per class inside a micro-batch; with imbalanced data and small micro-batches
some micro-batch holds no desirable example, and the mean over that empty side is NaN while the loss gradient of the
other side stays finite. Skipping empty-side statistics (TRL PR #1476 and the April 2024 fixes) keeps them finite."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM, token_logps


def side_mean(x: torch.Tensor, guarded: bool) -> torch.Tensor:
    """Per-class statistic over a micro-batch; guarded: an empty side is left out (reported as 0 here)."""
    if guarded and x.numel() == 0:
        return x.new_zeros(())
    return x.mean()  # mean of an empty tensor is NaN


class KTOEmptySide(ReproCheck):
    """Micro-batches drawn from 2k desirable / 10k undesirable examples; per-side rewards and KTO loss."""

    incident_id = "trl-kto-unbalanced-batch-nan"
    defaults: ClassVar[dict[str, Any]] = {"algorithm": "KTO", "micro_batch_size": 2, "beta": 0.1}
    # The back-propagated loss concatenates both sides and stays finite here; how the reporter's logged loss became
    # NaN is not established, so the check judges the per-side statistics.
    watch = ("rewards_chosen", "rewards_rejected", "logps_chosen")
    frameworks = ("trl",)
    desirable_fraction = 2 / 12  # the reporter's test: 2k desirable vs 10k undesirable

    def triggers(self, settings: dict[str, Any]) -> tuple[bool | None, str]:
        n = settings.get("micro_batch_size")
        if n is None:
            return None, "per-device batch size unknown"
        d = self.desirable_fraction
        p_missing = d ** int(n) + (1 - d) ** int(n)
        if p_missing >= 0.01:
            return True, (f"micro-batch {n} at a {d:.0%} desirable share lacks one class with probability "
                          f"{p_missing:.1%} per step")
        return False, f"micro-batch {n}: a class is missing with probability {p_missing:.2%} per step"

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


def main() -> int:
    return cli_main(KTOEmptySide)


if __name__ == "__main__":
    raise SystemExit(main())
