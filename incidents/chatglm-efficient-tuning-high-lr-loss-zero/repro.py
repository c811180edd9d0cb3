"""Repro check: a too-large step drives a tiny transformer to NaN and the HF Trainer's NaN filter then logs loss 0.0; a small step logs a finite, falling loss."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from kb.repro.harness import ReproCheck, cli_main, num


def hf_logged_loss(step_losses: list[float]) -> float:
    """Loss the HF Trainer logs for one window: with logging_nan_inf_filter a NaN/inf step adds the running mean."""
    tr_loss = 0.0
    for n, loss in enumerate(step_losses, start=1):
        tr_loss = tr_loss + tr_loss / n if not math.isfinite(loss) else tr_loss + loss
    return tr_loss / max(len(step_losses), 1)

def _tiny_llama():
    from kb.repro.tiny import tiny_causal_lm

    return tiny_causal_lm("llama", vocab_size=64, hidden_size=32, intermediate_size=64)


def _batch() -> torch.Tensor:
    return torch.randint(2, 64, (4, 16), generator=torch.Generator().manual_seed(1))



class LossZeroAfterDivergenceCheck(ReproCheck):
    """Faulty: SGD step 500 (NaN, logged as 0.0); fixed: step 0.5."""

    incident_id = "chatglm-efficient-tuning-high-lr-loss-zero"
    defaults: ClassVar[dict[str, Any]] = {"learning_rate": 500.0}

    def triggers(self, settings: dict[str, Any]) -> tuple[bool | None, str]:
        return None, "whether a learning rate is too large depends on the model; the run shows the collapse"

    def failed(self, evidence: dict[str, Any]) -> bool:
        return super().failed(evidence) or evidence.get("logged_loss") == 0.0

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        lr = float(settings.get("learning_rate") or 500.0) / (1000.0 if fixed else 1.0)
        model = _tiny_llama().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        ids, losses = _batch().to(device), []
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
