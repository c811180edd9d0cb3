"""Repro check: a LLaVA-style model (vision encoder -> projector -> language model) trained with one learning rate;
the unfrozen vision encoder, whose inputs and curvature are larger than the LLM's, diverges to NaN at the LLM's
rate. Giving the vision encoder a 100x smaller rate (mmengine paramwise_cfg lr_mult) trains normally."""

from __future__ import annotations

import math
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num


class TinyLLaVA(torch.nn.Module):
    """Patch features -> 2-layer vision MLP -> projector -> pooled LM head over a small vocabulary."""

    def __init__(self, patch: int = 48, width: int = 32, vocab: int = 32) -> None:
        super().__init__()
        self.visual_encoder = torch.nn.Sequential(torch.nn.Linear(patch, width), torch.nn.GELU(),
                                                  torch.nn.Linear(width, width))
        self.projector = torch.nn.Linear(width, width)
        self.llm = torch.nn.Linear(width, vocab)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.llm(self.projector(self.visual_encoder(patches)).mean(1))


class VisionLearningRate(ReproCheck):
    """SGD with momentum at the LLM learning rate for every module vs. a 0.01 lr_mult on visual_encoder."""

    watch = ("loss",)
    frameworks = ("xtuner",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        lr = float(settings.get("learning_rate") or 0.1)
        model = TinyLLaVA().to(device)
        groups = [{"params": model.visual_encoder.parameters(), "lr": lr * (0.01 if fixed else 1.0)},
                  {"params": list(model.projector.parameters()) + list(model.llm.parameters()), "lr": lr}]
        opt = torch.optim.SGD(groups, lr=lr, momentum=0.9)
        g = torch.Generator().manual_seed(0)
        patches = (torch.randn(8, 16, 48, generator=g) * 20.0).to(device)  # un-normalised pixel patches
        targets = torch.randint(0, 32, (8,), generator=g).to(device)
        losses = []
        for _ in range(12):
            loss = torch.nn.functional.cross_entropy(model(patches), targets)
            losses.append(num(loss))
            if not math.isfinite(losses[-1]):
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
        finite = [v for v in losses if math.isfinite(v)]
        return {"lr_llm": lr, "lr_vision": lr * (0.01 if fixed else 1.0), "first_loss": losses[0],
                "peak_loss": max(finite) if finite else float("nan"), "loss": losses[-1]}


def main() -> int:
    return cli_main(VisionLearningRate)


if __name__ == "__main__":
    raise SystemExit(main())
