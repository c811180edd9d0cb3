"""Repro check: Gemma-2 soft-caps attention logits (softcap * tanh(s / softcap)). flash-attn 2.6.1 applied the cap in
its forward kernel only; a backward that recomputes the probabilities from the raw logits with the forward's
(capped) log-sum-exp overflows wherever raw logits exceed the cap, giving inf/NaN gradients. Differentiating
through the cap (eager attention, or flash-attn >= 2.6.2) keeps them finite. This models the kernel's arithmetic
in PyTorch; the real kernel is CUDA-only."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num

SOFTCAP = 50.0  # Gemma-2 attn_logit_softcapping


class CappedForwardUncappedBackward(torch.autograd.Function):
    """softmax(softcap(QK^T)) V forward; backward recomputes P from the raw logits (the missing soft-cap backward)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q @ k.transpose(-1, -2)
        capped = SOFTCAP * torch.tanh(s / SOFTCAP)
        lse = torch.logsumexp(capped, dim=-1, keepdim=True)
        out = torch.exp(capped - lse) @ v
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        p = torch.exp(q @ k.transpose(-1, -2) - lse)  # raw logits: no soft-cap in the backward
        dv = p.transpose(-1, -2) @ grad_out
        dp = grad_out @ v.transpose(-1, -2)
        ds = p * (dp - (grad_out * out).sum(-1, keepdim=True))
        return ds @ k, ds.transpose(-1, -2) @ q, dv


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = SOFTCAP * torch.tanh(q @ k.transpose(-1, -2) / SOFTCAP)
    return torch.softmax(s, dim=-1) @ v


class GemmaSoftcapBackward(ReproCheck):
    """One attention head whose raw logits reach a few hundred (beyond the cap of 50): gradient of q, k, v."""

    watch = ("grad_norm",)
    frameworks = ("flash-attn",)

    def dtype(self, settings: dict[str, Any]) -> str:
        return "fp32"  # the overflow is exp() of (raw - capped) logits; fp32 shows it, bf16 only sooner

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 16, 32, generator=g).to(device) for _ in range(3))
        q = (q * 4.0).requires_grad_(True)  # logits up to a few hundred, as unscaled outlier heads produce
        k, v = (k * 4.0).requires_grad_(True), v.requires_grad_(True)
        out = eager(q, k, v) if fixed else CappedForwardUncappedBackward.apply(q, k, v)
        out.square().mean().backward()
        grads = torch.cat([t.grad.flatten() for t in (q, k, v)])
        return {"max_raw_logit": num((q @ k.transpose(-1, -2)).abs().max()), "loss": num(out.square().mean()),
                "grad_norm": num(grads.norm())}


def main() -> int:
    return cli_main(GemmaSoftcapBackward)


if __name__ == "__main__":
    raise SystemExit(main())
