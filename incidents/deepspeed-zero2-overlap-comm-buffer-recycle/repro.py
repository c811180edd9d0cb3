"""Repro check (GPU only): a buffer still read by queued work on the reduction stream, freed without record_stream,
is recycled by the caching allocator and overwritten; record_stream (DeepSpeed PR #7965) or overlap_comm off fixes it."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, Skip, cli_main, is_bad

N = 1 << 22  # gradient-bucket elements
RUNS = 3  # timing-dependent: each case runs a few times


def busy(x: torch.Tensor, iters: int = 40) -> torch.Tensor:
    """Keep the reduction stream busy, as a queued collective would."""
    for _ in range(iters):
        x = torch.tanh(x @ x)
    return x


def reduced_sum(device: str, overlap: bool, record: bool) -> float:
    """Queue an "all-reduce and copy" of a bucket on the reduction stream, drop the bucket, allocate the next tensor.

    overlap=False runs the reduction on the compute stream (DeepSpeed without overlap_comm); record=True calls
    record_stream on the bucket first (the fix), so its block is not handed out before the reduction finished."""
    cur = torch.cuda.current_stream()
    reduction = torch.cuda.Stream() if overlap else cur
    work = torch.randn(2048, 2048, device=device) / 64
    grads = torch.ones(N, device=device)  # the bucket handed to the reduction stream
    torch.cuda.synchronize()
    reduction.wait_stream(cur)
    with torch.cuda.stream(reduction):
        busy(work)
        reduced = grads * 0.5  # the queued all-reduce-and-copy still reading `grads`
    if record and overlap:
        grads.record_stream(reduction)
    del grads
    fresh = torch.full((N,), float("nan"), device=device)  # the next allocation on the compute stream
    torch.cuda.synchronize()
    del fresh
    return float(reduced.sum())


class ZeroOverlapBufferRecycle(ReproCheck):
    """Bucket reduced on a side stream, freed on the compute stream, block reused by the next allocation."""

    watch = ("reduced_sum",)
    frameworks = ("deepspeed",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        if not device.startswith("cuda"):
            raise Skip("GPU-only effect: needs the CUDA caching allocator and two streams; CPU frees and reuses memory "
                       "in program order, so a CPU run cannot show it (run with --device cuda)")
        overlap = settings.get("overlap_comm") is not False and settings.get("zero_stage") in (1, 2, None)
        expected = N * 0.5
        sums = [reduced_sum(device, overlap, record=fixed) for _ in range(RUNS)]
        bad = [s for s in sums if is_bad(s) or s != expected]
        return {"runs": RUNS, "bad_runs": len(bad), "reduced_sum": bad[0] if bad else sums[-1], "expected": expected}

    def failed(self, evidence: dict[str, Any]) -> bool:
        return bool(evidence.get("bad_runs")) or super().failed(evidence)


def main() -> int:
    return cli_main(ZeroOverlapBufferRecycle)


if __name__ == "__main__":
    raise SystemExit(main())
