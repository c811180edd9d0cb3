"""Repro check: GDPO normalises each reward function within its group with plain mean/std, so one NaN (None) reward
makes every advantage of the batch NaN; nanmean/nanstd plus nan_to_num keep them finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num

K = 4  # generations per prompt
PROMPTS, FUNCS = 2, 2  # 2 prompts x K generations, 2 reward functions; one reward of one function is None


def nanstd(x: torch.Tensor, dim: int) -> torch.Tensor:
    m = torch.nanmean(x, dim=dim, keepdim=True)
    n = (~torch.isnan(x)).sum(dim=dim, keepdim=True).clamp(min=2)
    return (torch.nansum((x - m) ** 2, dim=dim, keepdim=True) / (n - 1)).sqrt()


def gdpo_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, nan_aware: bool) -> torch.Tensor:
    """Per-function group normalisation, weighted sum, then batch-wide normalisation (scale_rewards='gdpo')."""
    parts = []
    for i in range(rewards_per_func.shape[1]):
        r = rewards_per_func[:, i].view(-1, K)
        if nan_aware:  # the fix
            norm = torch.nan_to_num((r - torch.nanmean(r, 1, keepdim=True)) / (nanstd(r, 1) + 1e-8), nan=0.0)
        else:
            norm = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-8)
        parts.append(weights[i] * norm.reshape(-1))
    summed = torch.stack(parts).sum(0)
    return (summed - summed.mean()) / (summed.std() + 1e-8)


class GDPONaNReward(ReproCheck):
    """GDPO advantages of 8 samples x 2 reward functions with one NaN reward, then one policy-gradient step."""

    frameworks = ("ms-swift",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        torch.manual_seed(0)
        rewards = torch.rand(PROMPTS * K, FUNCS, device=device)
        rewards[5, 1] = float("nan")  # one reward function returned None for one sample
        adv = gdpo_advantages(rewards, torch.ones(FUNCS, device=device), nan_aware=fixed)
        policy = torch.nn.Linear(3, 5).to(device)
        x = torch.randn(PROMPTS * K, 3, device=device)
        actions = torch.randint(0, 5, (PROMPTS * K,), device=device)
        logp = policy(x).log_softmax(-1).gather(-1, actions[:, None]).squeeze(-1)
        loss = -(adv.detach() * logp).mean()
        loss.backward()
        return {"nan_rewards": int(torch.isnan(rewards).sum()), "nan_advantages": int(torch.isnan(adv).sum()),
                "advantages": adv.numel(), "loss": num(loss), "grad_norm": grad_norm(policy.parameters())}


def main() -> int:
    return cli_main(GDPONaNReward)


if __name__ == "__main__":
    raise SystemExit(main())
