"""Repro check: an fp32 tiny transformer trained with too large a step shows loss far above its start, then NaN; a 100x smaller step trains normally."""

from __future__ import annotations

import math
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num
from kb.repro.tiny import tiny_causal_lm, token_batch


class HighLrCheck(ReproCheck):
    """Faulty: SGD-momentum step 20 (spike then NaN); fixed: step 0.2."""


    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        lr = float(settings.get("learning_rate") or 20.0) / (100.0 if fixed else 1.0)
        model = tiny_causal_lm("llama", device=device, vocab_size=64, hidden_size=32, intermediate_size=64)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        ids, losses = token_batch(64, (4, 16), seed=1, device=device), []
        for _ in range(12):
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(num(loss))
        finite = [v for v in losses if math.isfinite(v)]
        return {"lr": lr, "first_loss": losses[0], "peak_loss": max(finite), "loss": losses[-1]}


def main() -> int:
    return cli_main(HighLrCheck)


if __name__ == "__main__":
    raise SystemExit(main())
