"""Repro check (arithmetic on CPU, defect on multi-GPU): a ZeRO-2 style bucketed gradient all-reduce whose queued
reduction reads a bucket after its memory was handed to the next allocation; the bytes now hold int64 labels (-100 for
padding), which read as fp32 are NaN, so grad_norm is NaN and the update ruins the weights. Waiting for the reduction
before the bucket is released (overlap_comm false / the pre-0.12.4 path) keeps every number finite.

Four data-parallel ranks are simulated in one process; the real race needs several GPUs running DeepSpeed ZeRO-2, so
this check shows the arithmetic of a corrupted reduction, not DeepSpeed's code."""

from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num

WORLD = 4  # simulated data-parallel ranks
BUCKET = 96  # gradient elements per reduction bucket (reduce_bucket_size, CPU-sized)
FIRST_BAD = (0, 12, 4)  # the regression the reporter bisected: 0.12.3 fine, 0.12.4 and later corrupt
LABEL_PAD = -100  # what the next micro-batch's labels hold at padded positions


def version_tuple(text: str) -> tuple[int, ...] | None:
    """"0.13.5" -> (0, 13, 5); None when the text holds no version."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text).strip())
    return tuple(int(g or 0) for g in m.groups()) if m else None


def make_model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)


def rank_batches(device: str, micro_batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(micro_batch, 16, generator=g).to(device), torch.randint(0, 4, (micro_batch,), generator=g).to(device))
            for _ in range(WORLD)]


def flat_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def bucketed_allreduce(rank_grads: list[torch.Tensor], next_labels: torch.Tensor, racy: bool) -> torch.Tensor:
    """Average the ranks' gradients bucket by bucket through one staging buffer, as ZeRO-1/2 reduce_ipg_grads does.

    Each bucket is copied into the staging buffer and its reduction queued (overlap_comm). `racy`: the buffer is
    released before the queued reduction ran and its bytes are reused by the next allocation - the next micro-batch's
    int64 labels. Otherwise the queued reduction finishes before the buffer is reused."""
    n = rank_grads[0].numel()
    staging = torch.empty(WORLD * BUCKET * 4, dtype=torch.uint8, device=rank_grads[0].device)  # raw bytes
    out = torch.empty(n, device=rank_grads[0].device)
    queued = []
    for start in range(0, n, BUCKET):
        stop = min(start + BUCKET, n)
        if not racy:  # wait for the previous reduction before refilling the buffer
            for op in queued:
                op()
            queued.clear()
        view = staging.view(torch.float32).view(WORLD, BUCKET)
        view[:, : stop - start] = torch.stack([g[start:stop] for g in rank_grads])
        queued.append(lambda s=start, e=stop: out.__setitem__(
            slice(s, e), staging.view(torch.float32).view(WORLD, BUCKET)[:, : e - s].mean(0)))
        if racy:
            # The bucket went back to the allocator while its reduction was still queued; the next tensor allocated
            # there is the next micro-batch's labels. Real int64 values overwrite the bytes the reduction will read.
            ints = staging.view(torch.int64)
            k = min(ints.numel(), next_labels.numel())
            ints[:k] = next_labels.flatten()[:k]
    for op in queued:
        op()
    return out


class Zero2CorruptedReduction(ReproCheck):
    """Four simulated ranks, one SGD step: bucket reused before its queued reduction ran (faulty) vs waited for (fixed)."""

    frameworks = ("deepspeed",)
    watch = ("grad_norm", "loss_after_step")

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        for key in ("use_multi_rank_bucket_allreduce",):  # not canonical, but --settings may carry it
            if key in facts:
                s[key] = facts[key]
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        racy = not fixed and self.triggers(settings)[0] is not False
        micro = max(2, min(int(settings.get("micro_batch_size") or 8), 32))
        model = make_model(device)
        batches = rank_batches(device, micro)
        grads = [flat_grads(model, x, y) for x, y in batches]
        reference = torch.stack(grads).mean(0)  # what an uncorrupted all-reduce returns
        next_labels = torch.full((WORLD * BUCKET,), LABEL_PAD, dtype=torch.int64, device=device)
        next_labels[: micro] = torch.randint(0, 4, (micro,), generator=torch.Generator().manual_seed(2)).to(device)
        reduced = bucketed_allreduce(grads, next_labels, racy)
        # Hand the reduced gradient back to the parameters and take one step (lr scaled up so one step shows).
        offset = 0
        for p in model.parameters():
            p.grad = reduced[offset: offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        gn = grad_norm(model.parameters())
        with torch.no_grad():
            lr = max(float(settings.get("learning_rate") or 2e-5), 1e-3)
            for p in model.parameters():
                p -= lr * p.grad
            loss_after = sum(F.cross_entropy(model(x), y) for x, y in batches) / WORLD
        bad = int((~reduced.isfinite()).sum())
        return {"ranks": WORLD, "bucket_elements": BUCKET, "racy_reduction": racy, "non_finite_grad_elements": bad,
                "reference_grad_norm": num(reference.norm()), "grad_norm": gn, "loss_after_step": num(loss_after),
                "max_abs_grad_error": num((reduced - reference).abs().nan_to_num(math.inf).max()),
                "simulated": "4 ranks in one process; the real defect needs multi-GPU DeepSpeed ZeRO-2"}


def main() -> int:
    return cli_main(Zero2CorruptedReduction)


if __name__ == "__main__":
    raise SystemExit(main())
