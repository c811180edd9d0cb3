"""Repro check: training (bf16 autocast on CUDA) of a tiny transformer with too large a step surges and then goes NaN (vanishes from a loss plot); a smaller step trains normally."""

from __future__ import annotations

import math
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num
from kb.repro.tiny import tiny_causal_lm, token_batch


class Bf16LrSurgeCheck(ReproCheck):
    """Faulty: SGD step 50 under bf16 autocast; fixed: step 0.5. Shows the lr reading of a disputed incident."""


    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        lr = float(settings.get("learning_rate") or 50.0) / (100.0 if fixed else 1.0)
        model = tiny_causal_lm("llama", device=device, vocab_size=64, hidden_size=32, intermediate_size=64)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        ids, losses = token_batch(64, (4, 16), seed=1, device=device), []
        for _ in range(8):
            # bf16 autocast on CUDA as reported; on CPU it only slows the run (the divergence does not depend on it)
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.float().backward()
            opt.step()
            losses.append(num(loss))
        plotted = [v for v in losses if math.isfinite(v)]
        return {"lr": lr, "first_loss": losses[0], "peak_loss": max(plotted), "points_plotted": len(plotted),
                "loss": losses[-1]}


def main() -> int:
    return cli_main(Bf16LrSurgeCheck)


if __name__ == "__main__":
    raise SystemExit(main())
