"""Repro check: a bucketed gradient all-reduce that reads its shared buffer after release (overlap race) gives NaN grads, NaN weights and a logged loss of 0.0; waiting before reuse stays finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, hf_logged_loss

WORLD = 4  # simulated data-parallel ranks
BAD_DS = ("0.12.4", "0.12.5", "0.12.6", "0.13.", "0.14.0", "0.14.1", "0.14.2")


def _rank_grads(model: torch.nn.Module, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
    grads = []
    for x, y in zip(xs, ys):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return grads


def _allreduce_buckets(rank_grads: list[torch.Tensor], race: bool) -> torch.Tensor:
    """Average gradients bucket by bucket through one shared communication buffer, as ZeRO-1/2 does."""
    n = rank_grads[0].numel()
    buf = torch.zeros(WORLD, n - n // 2, device=rank_grads[0].device)
    out = torch.empty(n, device=rank_grads[0].device)
    pending = []
    for s, e in [(0, n // 2), (n // 2, n)]:
        if not race:  # correct: the previous reduction completes before the buffer is refilled
            for op in pending:
                op()
            pending.clear()
        buf[:, : e - s] = torch.stack([g[s:e] for g in rank_grads])
        pending.append(lambda s=s, e=e: out.__setitem__(slice(s, e), buf[:, : e - s].mean(0)))
    if race:  # the buffer went back to the allocator before the queued reductions read it
        buf.fill_(float("nan"))
    for op in pending:
        op()
    return out


class BucketRaceCheck(ReproCheck):
    """Four simulated ranks reduce gradients through a recycled bucket buffer (faulty) or wait for it (fixed)."""

    frameworks = ("deepspeed",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        first_gn, losses = None, []
        for _ in range(5):
            xs = [torch.randn(4, 8, generator=g).to(device) for _ in range(WORLD)]
            ys = [x.sum(-1, keepdim=True) * 0.1 for x in xs]
            with torch.no_grad():
                losses.append(float(sum(torch.nn.functional.mse_loss(model(x), y) for x, y in zip(xs, ys)) / WORLD))
            flat = _allreduce_buckets(_rank_grads(model, xs, ys), race=not fixed)
            i = 0
            for p in model.parameters():
                p.grad = flat[i:i + p.numel()].view_as(p).clone()
                i += p.numel()
            first_gn = grad_norm(model.parameters()) if first_gn is None else first_gn
            opt.step()
        return {"grad_norm": first_gn, "first_loss": losses[0], "loss": losses[-1],
                "logged_loss_after_first_step": hf_logged_loss(losses[1:])}


def main() -> int:
    return cli_main(BucketRaceCheck)


if __name__ == "__main__":
    raise SystemExit(main())
