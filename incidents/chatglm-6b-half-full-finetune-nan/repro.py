"""Repro check: full fine-tuning of a tiny .half() transformer with AdamW gives a finite step-1 loss and NaN from step 2 (eps underflow, 0/0); fp32 master weights stay finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import tiny_causal_lm, token_batch


class HalfWeightsAdamCheck(ReproCheck):
    """Faulty: model.half() + AdamW (weights and moments fp16); fixed: fp32 weights with bf16 autocast."""


    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        model = tiny_causal_lm("llama", device=device, vocab_size=64, hidden_size=32, intermediate_size=64)
        half = not fixed and settings.get("weights_dtype") == "fp16"
        if half:
            model = model.half()
        opt = torch.optim.AdamW(model.parameters(), lr=float(settings.get("learning_rate") or 1e-5), foreach=False)
        ids, losses, gn = token_batch(64, (4, 16), seed=1, device=device), [], None
        for _ in range(3):
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=not half):
                loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.float().backward()
            gn = grad_norm(model.parameters()) if gn is None else gn
            opt.step()
            losses.append(num(loss))
        return {"first_loss": losses[0], "loss": losses[1], "grad_norm": gn,
                "params_with_nan": sum(int(torch.isnan(p).any()) for p in model.parameters())}


def main() -> int:
    return cli_main(HalfWeightsAdamCheck)


if __name__ == "__main__":
    raise SystemExit(main())
