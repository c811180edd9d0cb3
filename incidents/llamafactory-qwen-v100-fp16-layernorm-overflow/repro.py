"""Repro check: in fp16 a large residual stream overflows to inf and the RMSNorm that follows turns it into NaN logits and loss; the same path upcast to fp32 stays finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num
from kb.repro.tiny import token_batch


class Fp16NormOverflowCheck(ReproCheck):
    """Faulty: residual add + RMSNorm in fp16; fixed: the same path upcast to fp32 (--upcast_layernorm / bf16)."""

    watch = ("loss", "max_abs_hidden")

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch.float32 if fixed or settings.get("precision") != "fp16" else torch.float16
        d, vocab = 32, 50
        emb = torch.randn(4, 8, d, device=device) * 0.02
        update = torch.randn(4, 8, d, device=device) * 0.02
        emb[..., 3] = 3.5e4  # an outlier hidden channel
        update[..., 3] = 3.5e4  # a block output of the same sign on it
        head = torch.randn(d, vocab, device=device) * 0.1
        h = emb.to(dtype) + update.to(dtype)  # 7e4 > fp16 max 65504 -> inf
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        logits = normed.float() @ head
        labels = token_batch(vocab, (4, 8), seed=2, low=0, device=device)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), labels.view(-1))
        return {"max_abs_hidden": num(h.float().abs().max()), "loss": num(loss)}


def main() -> int:
    return cli_main(Fp16NormOverflowCheck)


if __name__ == "__main__":
    raise SystemExit(main())
