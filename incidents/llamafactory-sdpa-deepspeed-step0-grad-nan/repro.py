"""Repro check (GPU only): the first backward pass through fused SDPA backends versus the math backend in bf16; a CPU run cannot show the kernel defect."""

from __future__ import annotations

import math
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main


def _attn_grad_norm(device: str, backends: list[Any] | None) -> float:
    torch.manual_seed(0)
    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    q, k, v = (torch.randn(2, 8, 128, 64, device=device, dtype=dt, requires_grad=True) for _ in range(3))
    if backends:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backends):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.float().square().mean().backward()
    return float(torch.sqrt(sum(t.grad.float().square().sum() for t in (q, k, v))))


class SdpaBackendCheck(ReproCheck):
    """Faulty: whichever fused SDPA backend this GPU picks (flash / efficient / cuDNN); fixed: the math backend."""

    watch = ("grad_norm",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        if not device.startswith("cuda"):
            return {"grad_norm": _attn_grad_norm(device, None), "backend": "cpu (math)"}
        from torch.nn.attention import SDPBackend

        if fixed:
            return {"grad_norm": _attn_grad_norm(device, [SDPBackend.MATH]), "backend": "MATH"}
        worst: dict[str, Any] = {"grad_norm": 0.0, "backend": "none available"}
        for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
            b = getattr(SDPBackend, name, None)
            try:
                gn = _attn_grad_norm(device, [b]) if b is not None else None
            except RuntimeError:  # backend not available for this GPU / shape
                continue
            if gn is not None and (not math.isfinite(gn) or worst["backend"] == "none available"):
                worst = {"grad_norm": gn, "backend": name}
        return worst


def main() -> int:
    return cli_main(SdpaBackendCheck)


if __name__ == "__main__":
    raise SystemExit(main())
