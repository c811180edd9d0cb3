"""Repro check: eager attention in fp16 computes Q @ K^T first and scales afterwards; with the large query/key
outliers of Qwen2 the raw dot product passes the fp16 maximum (65504), becomes inf, and softmax turns the row into NaN.
Scaling the query before the product (what SDPA / FlashAttention-2 do) or computing the scores in bf16 / fp32 stays
finite on the same inputs."""

from __future__ import annotations

import math
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num
from kb.repro.tiny import torch_dtype

HEAD_DIM, SEQ = 128, 8
OUTLIER = 160.0  # size of a few query/key channels; 4 * 160 * 160 = 102400 > 65504, /sqrt(128) = 9051 fits fp16
FUSED = {"sdpa", "flash_attention_2", "flash_attention_3"}


def qkv(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and keys with four shared outlier channels (as Qwen2's q/k biases produce), plain values."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, SEQ, HEAD_DIM, generator=g)
    k = torch.randn(1, 1, SEQ, HEAD_DIM, generator=g)
    q[..., :4] += OUTLIER
    k[..., :4] += OUTLIER
    v = torch.randn(1, 1, SEQ, HEAD_DIM, generator=g)
    return (t.to(device=device, dtype=dtype).requires_grad_(True) for t in (q, k, v))


def causal_mask(device: str) -> torch.Tensor:
    return torch.ones(SEQ, SEQ, dtype=torch.bool, device=device).tril()


class Fp16EagerQkOverflow(ReproCheck):
    """One attention head on outlier q/k: fp16 eager (matmul then scale) vs query pre-scaled as in SDPA / FA2."""

    watch = ("max_abs_score", "attn_out_abs_max", "loss", "grad_norm")
    frameworks = ("transformers",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch_dtype(settings.get("precision") or "fp16")
        q, k, v = qkv(device, dtype)
        scale = 1.0 / math.sqrt(HEAD_DIM)
        if fixed:  # fused-kernel order: scale the query first, so the product is already divided by sqrt(d)
            scores = (q * scale) @ k.transpose(-1, -2)
        else:  # eager order: raw product in the model dtype, then divide
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
        raw_max = scores.detach().float()[..., causal_mask(device)].abs().max()  # over the positions attended to
        scores = scores.masked_fill(~causal_mask(device), torch.finfo(dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        out = probs @ v
        loss = out.float().pow(2).mean()
        loss.backward()
        grads = torch.cat([t.grad.float().flatten() for t in (q, k, v)])
        return {"dtype": str(dtype).removeprefix("torch."), "max_abs_score": num(raw_max),
                "nan_attention_rows": int(probs.isnan().any(-1).sum()), "attn_out_abs_max": num(out.detach().float().abs().max()),
                "loss": num(loss), "grad_norm": num(grads.norm())}


def main() -> int:
    return cli_main(Fp16EagerQkOverflow)


if __name__ == "__main__":
    raise SystemExit(main())
