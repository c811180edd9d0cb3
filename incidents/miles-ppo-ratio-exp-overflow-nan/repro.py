"""Repro check: an unbounded PPO ratio exp(log_ratio) overflows to inf on a token whose trainer and rollout
log-probs disagree by 120 nats, and inf x 0 advantage makes the loss NaN; clamping the fp32 log-ratio to [-20, 20]
before exp (miles PR #1363) keeps it finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import torch_dtype

GAP = 120.0  # nats between the trainer's and the rollout engine's log-prob of one token
CLAMP = 20.0
RL = {"ppo", "grpo", "rloo", "reinforce++", "dapo", "gspo"}


class PPORatioOverflow(ReproCheck):
    """Clipped PPO surrogate + k3 KL on 5 tokens, one of them 120 nats off its rollout log-prob with advantage 0."""

    watch = ("loss", "grad_norm")  # max_ratio may be huge yet finite with the fix
    frameworks = ("miles",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch_dtype(settings.get("precision"))
        kl_coef = float(settings.get("kl_coef") or 0.0) if settings.get("kl_estimator", "k3") == "k3" else 0.0
        torch.manual_seed(0)
        policy = torch.nn.Linear(4, 6).to(device)
        x = torch.randn(5, 4, device=device)
        tokens = torch.randint(0, 6, (5,), device=device)
        logp = policy(x).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
        old_logp = logp.detach().clone()
        old_logp[2] -= GAP  # the rollout engine scored token 2 far less likely (train/rollout mismatch)
        adv = torch.tensor([0.5, -0.3, 0.0, 0.2, 0.0], device=device)  # token 2 sits in a zero-advantage group
        log_ratio = (logp - old_logp).to(dtype)
        if fixed:
            log_ratio = log_ratio.float().clamp(-CLAMP, CLAMP)
        ratio = torch.exp(log_ratio).float()
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))  # clipped surrogate, loss form
        k3 = torch.exp(-log_ratio).float() - 1 + log_ratio.float()  # low_var_kl estimator
        loss = pg.mean() + kl_coef * k3.clamp(max=10).mean()
        loss.backward()
        return {"log_ratio_max": num(log_ratio.max()), "max_ratio": num(ratio.max()), "loss": num(loss),
                "grad_norm": grad_norm(policy.parameters())}


def main() -> int:
    return cli_main(PPORatioOverflow)


if __name__ == "__main__":
    raise SystemExit(main())
