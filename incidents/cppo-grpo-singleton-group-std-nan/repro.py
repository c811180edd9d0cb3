"""Repro check: GRPO advantages normalised by the unbiased std of a one-element group are NaN (loss and grads NaN); groups of two stay finite."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num


class SingletonGroupStdCheck(ReproCheck):
    """Faulty: four prompts with one completion each; fixed: the same prompts with two completions each."""

    watch = ("reward_std", "loss", "grad_norm")

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        group = max(2, int(settings.get("num_generations") or 1)) if fixed else int(settings.get("num_generations") or 1)
        prompts = 4
        rewards = torch.rand(prompts * group, generator=torch.Generator().manual_seed(5)).to(device)
        logits = torch.randn(rewards.numel(), 6, device=device, requires_grad=True)
        actions = torch.arange(rewards.numel(), device=device) % 6
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            grouped = rewards.view(-1, group)
            std = grouped.std(dim=1, keepdim=True)  # unbiased (n - 1), as the trainer computes it
        adv = ((grouped - grouped.mean(dim=1, keepdim=True)) / (std + 1e-4)).view(-1)
        logp = logits.log_softmax(-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        loss = -(adv * logp).mean()
        loss.backward()
        warned = next((str(w.message)[:60] for w in caught if "degrees of freedom" in str(w.message)), "")
        return {"group_size": group, "reward_std": num(std.mean()), "loss": num(loss),
                "grad_norm": float(logits.grad.norm()), "warning": warned}


def main() -> int:
    return cli_main(SingletonGroupStdCheck)


if __name__ == "__main__":
    raise SystemExit(main())
