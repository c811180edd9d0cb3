"""Repro check (GPU only): the backward of scaled_dot_product_attention through the cuDNN backend versus the
memory-efficient backend on the same inputs. The inputs are a known cuDNN-failing case (every logit of a row very
negative, L % 128 == 64, explicit boolean mask); the 2.5.0 regression of the report had no public minimal repro,
so a CUDA run shows the backend class of failure, not necessarily that exact bug. On CPU the check does not run
(exit 2): there is no cuDNN kernel to exercise."""

from __future__ import annotations

import math
from typing import Any

import torch

from kb.repro.harness import ReproCheck, Skip, cli_main


def _grad_q_nonfinite(device: str, backend: Any | None) -> tuple[int, float]:
    """Run SDPA forward + backward; (number of non-finite grad_q entries, grad norm)."""
    L, D = 704, 64
    dt = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, L, D, generator=g) * 0.1
    k = torch.randn(1, 1, L, D, generator=g) * 0.1
    v = torch.randn(1, 1, L, D, generator=g)
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(D)  # every logit ~ -120: each row's log-sum-exp below -88.7
    q, k, v = (t.to(device=device, dtype=dt).requires_grad_(True) for t in (q, k, v))
    mask = torch.ones(L, L, dtype=torch.bool, device=device).tril()[None, None]
    if backend is not None:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([backend]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(torch.ones_like(out))
    grads = torch.cat([t.grad.float().flatten() for t in (q, k, v)])
    return int((~torch.isfinite(q.grad)).sum()), float(grads.norm())


class CudnnSdpaBackward(ReproCheck):
    """Faulty: SDPBackend.CUDNN_ATTENTION (what torch 2.5.0 chose first on H100); fixed: EFFICIENT_ATTENTION."""

    watch = ("grad_norm",)

    def failed(self, evidence: dict[str, Any]) -> bool:
        return super().failed(evidence) or int(evidence.get("grad_q_nonfinite") or 0) > 0

    def dtype(self, settings: dict[str, Any]) -> str:
        return "bf16"

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        if not device.startswith("cuda"):
            raise Skip("GPU-only effect: the cuDNN SDPA backend is a CUDA kernel (SM80+; default on SM90 in torch "
                       "2.5.0); a CPU run only has the math kernel. Run with --device cuda")
        from torch.nn.attention import SDPBackend

        name = "EFFICIENT_ATTENTION" if fixed else "CUDNN_ATTENTION"
        try:
            bad, gn = _grad_q_nonfinite(device, getattr(SDPBackend, name))
        except RuntimeError as e:  # backend unavailable for this GPU / cuDNN build
            return {"backend": name, "grad_q_nonfinite": 0, "grad_norm": 0.0, "unavailable": str(e)[:200]}
        return {"backend": name, "grad_q_nonfinite": bad, "grad_norm": gn}


def main() -> int:
    return cli_main(CudnnSdpaBackward)


if __name__ == "__main__":
    raise SystemExit(main())
