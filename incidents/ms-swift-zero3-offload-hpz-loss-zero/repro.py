"""Repro check: a ZeRO++ hpZ-style secondary parameter copy read before its copy completes feeds NaN weights to backward; loss turns NaN and is logged as 0.0. Waiting for the copy stays finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, hf_logged_loss, num

WORLD = 4  # ranks holding primary shards


class HpzSecondaryRaceCheck(ReproCheck):
    """Faulty: backward gathers from the node-local secondary copy before it is written; fixed: after the copy."""

    frameworks = ("deepspeed",)

    def failed(self, evidence: dict[str, Any]) -> bool:
        return super().failed(evidence) or evidence.get("logged_loss") == 0.0

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        w = torch.randn(16, device=device) * 0.1
        shards = list(w.chunk(WORLD))
        g = torch.Generator().manual_seed(3)
        true_w = torch.randn(16, generator=g).to(device)
        losses = []
        for _ in range(6):
            x = torch.randn(32, 16, generator=g).to(device)
            y = x @ true_w
            full = torch.cat(shards)  # forward all-gather from the primary partitions
            losses.append(num(torch.nn.functional.mse_loss(x @ full, y)))
            secondary = torch.full_like(full, float("nan"))  # freshly allocated node-local buffer
            if fixed:
                secondary.copy_(full)  # the copy completes before backward reads the buffer
            wb = secondary.clone().requires_grad_(True)
            torch.nn.functional.mse_loss(x @ wb, y).backward()
            shards = list((full - 0.05 * wb.grad).chunk(WORLD))
        return {"first_loss": losses[0], "loss": losses[-1], "logged_loss": hf_logged_loss(losses[1:])}


def main() -> int:
    return cli_main(HpzSecondaryRaceCheck)


if __name__ == "__main__":
    raise SystemExit(main())
