"""Repro check: model.half() makes the trainable weights fp16 and AdamW updates them in fp16 (no fp32 master copy):
Adam's epsilon and squared gradients do not fit fp16, the first update writes inf/NaN into the weights and every
later loss is NaN (logged as 0.0 by the HF Trainer). fp32 weights with fp16 mixed precision train normally."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, hf_logged_loss, num
from kb.repro.tiny import tiny_causal_lm, token_batch


class HalfWeightsAdamW(ReproCheck):
    """A tiny Llama trained 2 steps with AdamW: weights fp16 (.half()) vs fp32 weights under fp16 autocast."""

    watch = ("loss", "grad_norm")

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        lr = float(settings.get("learning_rate") or 2e-5)
        half = not fixed and settings.get("weights_dtype") == "fp16"
        model = tiny_causal_lm("llama", dtype=torch.float16 if half else torch.float32, device=device)
        # Plain (non-fused, non-foreach) AdamW: the per-parameter update the HF Trainer's adamw_torch ran.
        opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False, fused=False)
        ids = token_batch(128, (2, 32), seed=0, device=device)
        losses, norms = [], []
        for _ in range(2):  # step 1 is finite; the update it makes breaks step 2
            with torch.autocast(device_type=device.split(":")[0], dtype=torch.float16, enabled=not half):
                loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.float().backward()
            norms.append(grad_norm(model.parameters()))
            opt.step()
            losses.append(num(loss))
        return {"weights_dtype": "fp16" if half else "fp32", "step1_loss": losses[0], "loss": losses[-1],
                "logged_loss": hf_logged_loss(losses[1:]), "grad_norm": norms[-1]}


def main() -> int:
    return cli_main(HalfWeightsAdamW)


if __name__ == "__main__":
    raise SystemExit(main())
