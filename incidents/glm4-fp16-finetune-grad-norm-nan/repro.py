"""Repro check: a block with a GLM-style massive-activation channel overflows under fp16 autocast (inf -> NaN loss and grad_norm); bf16 autocast keeps it finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num
from kb.repro.tiny import token_batch


class MassiveActivationFp16Check(ReproCheck):
    """Faulty: fp16 autocast over a channel driven to ~1e5; fixed: bf16 autocast."""

    watch = ("loss", "grad_norm", "max_abs_activation")

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch.bfloat16 if fixed or settings.get("precision") != "fp16" else torch.float16
        d, vocab = 32, 40
        w_in = (torch.randn(d, d, device=device) * 0.1).requires_grad_(True)
        w_out = (torch.randn(d, vocab, device=device) * 0.1).requires_grad_(True)
        with torch.no_grad():
            w_in[5, 5] = 400.0  # a channel the bf16-trained model drives to ~1e5
        x = torch.randn(4, 8, d, device=device) * 0.5
        x[..., 5] = 250.0
        labels = token_batch(vocab, (4, 8), seed=2, low=0, device=device)
        with torch.autocast(device.split(":")[0], dtype=dtype):
            h = x @ w_in  # 250 * 400 = 1e5 > 65504
            hn = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)
            logits = hn @ w_out
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))
        loss.backward()
        gn = float(torch.sqrt(w_in.grad.float().square().sum() + w_out.grad.float().square().sum()))
        return {"max_abs_activation": num(h.float().abs().max()), "loss": num(loss), "grad_norm": gn}


def main() -> int:
    return cli_main(MassiveActivationFp16Check)


if __name__ == "__main__":
    raise SystemExit(main())
