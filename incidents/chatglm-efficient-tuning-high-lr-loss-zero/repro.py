"""Repro check: a too-large step drives a tiny transformer to NaN and the HF Trainer's NaN filter then logs loss 0.0; a small step logs a finite, falling loss."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, hf_logged_loss, num
from kb.repro.tiny import tiny_causal_lm, token_batch


class LossZeroAfterDivergenceCheck(ReproCheck):
    """Faulty: SGD step 500 (NaN, logged as 0.0); fixed: step 0.5."""


    def failed(self, evidence: dict[str, Any]) -> bool:
        return super().failed(evidence) or evidence.get("logged_loss") == 0.0

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        lr = float(settings.get("learning_rate") or 500.0) / (1000.0 if fixed else 1.0)
        model = tiny_causal_lm("llama", device=device, vocab_size=64, hidden_size=32, intermediate_size=64)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        ids, losses = token_batch(64, (4, 16), seed=1, device=device), []
        for _ in range(12):
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(num(loss))
        return {"lr": lr, "first_loss": losses[0], "loss": losses[-1], "logged_loss": hf_logged_loss(losses[8:])}


def main() -> int:
    return cli_main(LossZeroAfterDivergenceCheck)


if __name__ == "__main__":
    raise SystemExit(main())
