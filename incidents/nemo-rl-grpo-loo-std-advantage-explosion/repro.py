"""Repro check: GRPO leave-one-out advantages divided by a zero (or fp32-residue) peer std explode to 1e6 / 1e3; a
std floor of 1e-3 that keeps the raw advantage for such groups keeps them O(1)."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num

EXPLODED = 100.0  # |advantage| above this cannot come from rewards in [0, 1] normalised by a sane std
STD_FLOOR = 1e-3  # NeMo-RL PR #4158
BINARY = [1.0, 0.0, 0.0, 0.0]  # sparse 0/1 rewards: the peers of the winner have std exactly 0
RESIDUE = [0.95] + [0.35] * 7  # equal peers whose fp32 E[x^2] - E[x]^2 leaves a ~1e-4 std residue
ADVANTAGE_METRICS = ("advantages", "advantages/max", "advantages/min")


def loo_stats(rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out mean and unbiased std per sample, via fp32 E[x^2] - E[x]^2 as the estimator did.

    The peer sums are accumulated one peer at a time (elementwise ops, fixed order) rather than by a matmul: a BLAS
    kernel may reorder or fuse the sum and round the residue to exactly 0 on one machine and not on another."""
    k = rewards.numel()
    peer = 1.0 - torch.eye(k, dtype=torch.float32, device=rewards.device)  # column j: which rows have j as a peer
    total = torch.zeros(k, dtype=torch.float32, device=rewards.device)
    total_sq = torch.zeros_like(total)
    for j in range(k):
        total = total + peer[:, j] * rewards[j]
        total_sq = total_sq + peer[:, j] * (rewards[j] * rewards[j])
    n = k - 1
    mean = total / n
    var = (total_sq / n - mean * mean).clamp(min=0) * n / (n - 1)
    return mean, var.sqrt()


def advantages(rewards: torch.Tensor, std_floor: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    baseline, std = loo_stats(rewards)
    adv = rewards - baseline
    if std_floor is None:  # the faulty guard: always divide by std + 1e-6
        return adv / (std + 1e-6), std
    return torch.where(std >= std_floor, adv / (std + 1e-6), adv), std  # (near-)zero spread keeps the raw advantage


def policy_grad_norm(adv: torch.Tensor) -> float:
    """Gradient norm of one REINFORCE step on a tiny policy weighted by these advantages."""
    logits = torch.zeros(adv.numel(), 4, requires_grad=True)
    actions = torch.arange(adv.numel()) % 4
    logp = logits.log_softmax(-1).gather(-1, actions[:, None]).squeeze(-1)
    (-(adv.detach().cpu() * logp).mean()).backward()
    return float(logits.grad.norm())


class LeaveOneOutStd(ReproCheck):
    """Leave-one-out normalised advantages of two GRPO groups: 0/1 rewards and 0.95 among seven 0.35s."""

    watch = ("exact_zero_max_abs_advantage", "residue_max_abs_advantage", "exact_zero_grad_norm", "residue_grad_norm")
    frameworks = ("nemo-rl",)

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        if facts.get("huge_metrics"):
            s["huge_metrics"] = list(facts["huge_metrics"])  # logged advantages above 1e4 are this failure's mark
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        floor = STD_FLOOR if fixed else None
        out: dict[str, Any] = {}
        for name, rewards in (("exact_zero", BINARY), ("residue", RESIDUE)):
            adv, std = advantages(torch.tensor(rewards, dtype=torch.float32, device=device), floor)
            out[f"{name}_min_peer_std"] = num(std.min())
            out[f"{name}_max_abs_advantage"] = num(adv.abs().max())
            out[f"{name}_grad_norm"] = policy_grad_norm(adv)
        return out

    def failed(self, evidence: dict[str, Any]) -> bool:
        """NaN / inf as usual, and also a finite advantage too large to come from a sane normalisation."""
        adv = (evidence.get("exact_zero_max_abs_advantage"), evidence.get("residue_max_abs_advantage"))
        return super().failed(evidence) or any(isinstance(a, float) and a >= EXPLODED for a in adv)

def main() -> int:
    return cli_main(LeaveOneOutStd)


if __name__ == "__main__":
    raise SystemExit(main())
