"""Repro check: DeepSpeed fp16 dynamic loss scaling halves the scale on every step whose gradients are non-finite and
raises "Current loss scale already at minimum" at the floor. A reward model whose fp16 forward overflows (an outlier
activation beyond 65504) gives non-finite gradients every step and hits the floor; the same weights in bf16 need no
loss scaler and train with a finite pairwise loss."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import torch_dtype

MIN_SCALE_ERROR = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."


class DynamicLossScaler:
    """DeepSpeed's fp16 DynamicLossScaler update rule (initial 2**16, hysteresis 2, min 1, raise at the floor)."""

    def __init__(self, init_scale: float = 2.0**16, hysteresis: int = 2, min_scale: float = 1.0) -> None:
        self.cur_scale, self.min_scale, self.hysteresis = init_scale, min_scale, hysteresis
        self.cur_hysteresis = hysteresis

    def update(self, overflow: bool) -> None:
        if not overflow:
            return
        if self.cur_hysteresis == 1:
            if self.cur_scale == self.min_scale:
                raise RuntimeError(MIN_SCALE_ERROR)
            self.cur_scale = max(self.cur_scale / 2, self.min_scale)
        else:
            self.cur_hysteresis -= 1


class TinyRewardModel(torch.nn.Module):
    """Embedding -> MLP with one outlier channel -> mean-pooled scalar score."""

    def __init__(self, vocab: int = 64, hidden: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.mlp = torch.nn.Linear(hidden, hidden)
        self.score = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            self.mlp.bias[3] = 9e4  # a residual channel at ~1e5, beyond fp16's 65504

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.mlp(h)
        return self.score(h / 1e4).mean(dim=(-1, -2))


class LossScaleFloor(ReproCheck):
    """Pairwise reward loss (chosen vs rejected) trained with DeepSpeed's fp16 loss-scaling rule, up to 40 steps."""

    watch = ("loss",)
    frameworks = ("deepspeed",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dt = torch.bfloat16 if fixed else torch_dtype(settings.get("precision"))
        lr = float(settings.get("learning_rate") or 1e-10)
        model = TinyRewardModel().to(device=device, dtype=dt)
        master = [p.detach().float().clone().requires_grad_(False) for p in model.parameters()]  # fp32 master
        scaler = DynamicLossScaler() if dt == torch.float16 else None
        g = torch.Generator().manual_seed(0)
        chosen, rejected = (torch.randint(2, 64, (8, 24), generator=g).to(device) for _ in range(2))
        error, steps, overflows, loss = "", 0, 0, torch.tensor(0.0)
        for steps in range(1, 41):
            loss = -F.logsigmoid(model(chosen).float() - model(rejected).float()).mean()
            model.zero_grad()
            (loss * (scaler.cur_scale if scaler else 1.0)).backward()
            overflow = not math.isfinite(grad_norm(model.parameters()))
            overflows += int(overflow)
            if scaler is not None:
                try:
                    scaler.update(overflow)
                except RuntimeError as e:
                    error = str(e)
                    break
            if not overflow:  # the optimizer step on the fp32 master weights, copied back
                with torch.no_grad():
                    for p, m in zip(model.parameters(), master):
                        m -= lr * p.grad.float() / (scaler.cur_scale if scaler else 1.0)
                        p.copy_(m.to(dt))
        return {"dtype": str(dt).replace("torch.", ""), "steps": steps, "overflow_steps": overflows,
                "loss_scale": scaler.cur_scale if scaler else 1.0, "loss": num(loss), "error": error}


def main() -> int:
    return cli_main(LossScaleFloor)


if __name__ == "__main__":
    raise SystemExit(main())
