"""Repro check: Gemma-2 soft-caps attention logits (softcap * tanh(s / softcap)). flash-attn 2.6.1 applied the cap in
its forward kernel only; a backward that recomputes the probabilities from the raw logits with the forward's
(capped) log-sum-exp overflows wherever raw logits exceed the cap, giving inf/NaN gradients. Differentiating
through the cap (eager attention, or flash-attn >= 2.6.2) keeps them finite. This models the kernel's arithmetic
in PyTorch; the real kernel is CUDA-only."""

from __future__ import annotations

from typing import Any, ClassVar

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

    incident_id = "transformers-gemma2-flash-attn-nan"
    defaults: ClassVar[dict[str, Any]] = {"model_family": "gemma2", "attn_implementation": "flash_attention_2",
                                          "flash_attn_version": "2.6.1", "precision": "bf16"}
    watch = ("grad_norm",)
    gpu_only_effect = True
    frameworks = ("flash-attn",)

    def dtype(self, settings: dict[str, Any]) -> str:
        return "fp32"  # the overflow is exp() of (raw - capped) logits; fp32 shows it, bf16 only sooner

    def triggers(self, settings: dict[str, Any]) -> tuple[bool | None, str]:
        impl = str(settings.get("attn_implementation") or "")
        fam = str(settings.get("model_family") or "")
        if impl and impl != "flash_attention_2":
            return False, f"attn_implementation {impl}: the soft-cap is differentiated by PyTorch"
        if fam and fam not in ("gemma2", "gemma-2"):
            return False, f"model family {fam} has no attention soft-capping"
        ver = str(settings.get("flash_attn_version") or "")
        parts = tuple(int(x) for x in ver.split(".")[:3] if x.isdigit())
        if parts and parts >= (2, 6, 2):
            return False, f"flash-attn {ver} implements the soft-cap backward"
        if parts:
            return True, f"flash-attn {ver} < 2.6.2 with Gemma-2: soft-capping is not supported in the backward pass"
        return None, "flash-attn version unknown"

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
