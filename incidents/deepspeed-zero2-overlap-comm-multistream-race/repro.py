"""Repro check (GPU only): a reduction stream that waits only on the current stream reads a gradient bucket another
stream is still filling; waiting on every producer stream (DeepSpeed PR #8080) or overlap_comm off fixes it."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, Skip, cli_main, is_bad

N = 1 << 22  # bucket elements (16 MiB of fp32), large enough that the reduction outlasts nothing by luck
RUNS = 3  # a race: one clean run proves nothing, so each case runs a few times


def busy(x: torch.Tensor, iters: int = 40) -> torch.Tensor:
    """Keep a stream busy for milliseconds (stands in for compiled backward kernels)."""
    for _ in range(iters):
        x = torch.tanh(x @ x)
    return x


def bucket_sum(device: str, overlap: bool, wait_all: bool) -> float:
    """Fill half the IPG bucket on a producer stream and half on the current stream, then reduce it.

    overlap=False reduces on the current stream (DeepSpeed without overlap_comm); wait_all=True makes the reduction
    stream wait on the producer stream too (the fix)."""
    cur = torch.cuda.current_stream()
    producer, reduction = torch.cuda.Stream(), torch.cuda.Stream()
    bucket = torch.full((N,), float("nan"), device=device)  # stands in for the uninitialised IPG bucket
    g1, g2 = torch.ones(N // 2, device=device), torch.ones(N // 2, device=device)
    work = torch.randn(2048, 2048, device=device) / 64
    torch.cuda.synchronize()
    producer.wait_stream(cur)
    with torch.cuda.stream(producer):  # a gradient hook running on another autograd stream
        busy(work)
        bucket[: N // 2].copy_(g1)
    bucket[N // 2:].copy_(g2)  # the hook on the current stream
    if not overlap:
        cur.wait_stream(producer)  # backward finishes (all hooks) before the reduction on the compute stream
        total = bucket.sum()
    else:
        reduction.wait_stream(cur)
        if wait_all:
            reduction.wait_stream(producer)
        with torch.cuda.stream(reduction):
            total = bucket.sum()
    torch.cuda.synchronize()
    return float(total)


class ZeroOverlapMultiStreamRace(ReproCheck):
    """IPG bucket filled on two streams and reduced on a third (ZeRO-1/2 overlap_comm + compiled backward)."""

    watch = ("bucket_sum",)
    frameworks = ("deepspeed",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        if not device.startswith("cuda"):
            raise Skip("GPU-only effect: a CUDA stream-ordering race; CPU ops run in order on one stream, so a CPU run "
                       "cannot show it (run with --device cuda)")
        overlap = settings.get("overlap_comm") is not False and settings.get("zero_stage") in (1, 2, None)
        sums = [bucket_sum(device, overlap, wait_all=fixed) for _ in range(RUNS)]
        bad = [s for s in sums if is_bad(s) or s != N]
        return {"runs": RUNS, "bad_runs": len(bad), "bucket_sum": bad[0] if bad else sums[-1], "expected": float(N)}

    def failed(self, evidence: dict[str, Any]) -> bool:
        return bool(evidence.get("bad_runs")) or super().failed(evidence)


def main() -> int:
    return cli_main(ZeroOverlapMultiStreamRace)


if __name__ == "__main__":
    raise SystemExit(main())
