"""Benchmark the per-step cost of the training integrations while nothing goes wrong.

Usage: python scripts/bench_callback.py [--steps 200] [--repeats 5] [--json OUT]

1. A real HF Trainer on a tiny Llama (2 layers, 64 wide, CPU), logging every step (the worst case for a
   callback that reads the logs), timed without a callback, with KBCallback() and with KBCallback(probe=True);
   runs alternate so that load on a shared machine hits all three alike; the median per-step time is reported.
2. The bare cost of one call: Monitor.observe on a typical HF log dict, and kb.watch's step() with floats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ask import machine


def timed_callback(**kw):
    """KBCallback whose on_log accumulates the time spent inside it (the direct, noise-free overhead)."""
    from kb.integrations.transformers import KBCallback

    class Timed(KBCallback):
        spent = 0.0
        calls = 0

        def on_log(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return super().on_log(*a, **k)
            finally:
                Timed.spent += time.perf_counter() - t0
                Timed.calls += 1

    return Timed(**kw)


def trainer_steps(variant: str, steps: int) -> float:
    """Seconds per optimizer step of one Trainer run (wall time of train() / steps)."""
    import torch
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from kb.repro.tiny import quiet, tiny_causal_lm, token_batch

    rows = [{"input_ids": (ids := token_batch(128, (24,), seed=i).tolist()), "labels": ids, "attention_mask": [1] * 24}
            for i in range(64)]
    callbacks = {"none": [], "KBCallback": [timed_callback(print_report=False)],
                 "KBCallback(probe=True)": [timed_callback(probe=True, print_report=False)]}[variant]
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, report_to=[], save_strategy="no", logging_steps=1,
                                 per_device_train_batch_size=2, use_cpu=True, max_steps=steps, disable_tqdm=True,
                                 seed=0, learning_rate=5e-5)
        torch.manual_seed(0)
        trainer = quiet(Trainer(model=tiny_causal_lm("llama"), args=args, train_dataset=Dataset.from_list(rows),
                                callbacks=callbacks))
        t0 = time.perf_counter()
        trainer.train()
        dt = time.perf_counter() - t0
    if callbacks and callbacks[0].diagnosis is not None:
        raise SystemExit("the healthy benchmark run triggered a diagnosis")
    if callbacks:
        IN_CALLBACK.append(type(callbacks[0]).spent / max(1, type(callbacks[0]).calls))
    return dt / steps


IN_CALLBACK: list[float] = []


def micro(n: int = 200_000) -> dict[str, float]:
    import torch

    import kb
    from kb.integrations.monitor import Monitor

    rec = {"loss": 2.3456, "grad_norm": 1.234, "learning_rate": 4.9e-05, "epoch": 0.12}
    m = Monitor()
    t0 = time.perf_counter()
    for i in range(n):
        m.observe(i, rec)
    observe = (time.perf_counter() - t0) / n
    w = kb.watch(torch.nn.Linear(2, 2), print_report=False)
    t0 = time.perf_counter()
    for _ in range(n):
        w.step(loss=2.3456, grad_norm=1.234)
    step = (time.perf_counter() - t0) / n
    return {"monitor_observe_us": observe * 1e6, "watch_step_us": step * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here as JSON")
    a = ap.parse_args()
    import torch
    import transformers

    torch.set_num_threads(1)  # one thread: steadier numbers on a shared machine
    variants = ("none", "KBCallback", "KBCallback(probe=True)")
    trainer_steps("none", 10)  # warm-up (imports, first allocations)
    runs: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(a.repeats):
        for v in variants:
            runs[v].append(trainer_steps(v, a.steps))
    med = {v: statistics.median(x) for v, x in runs.items()}
    out = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "transformers": transformers.__version__, "steps": a.steps, "repeats": a.repeats,
           "ms_per_step": {v: round(x * 1e3, 3) for v, x in med.items()},
           "overhead_ms_per_step": {v: round((med[v] - med["none"]) * 1e3, 3) for v in variants[1:]},
           "overhead_pct": {v: round(100 * (med[v] / med["none"] - 1), 2) for v in variants[1:]},
           "in_on_log_us_per_call_median": round(statistics.median(IN_CALLBACK) * 1e6, 2),
           "spread_ms_per_step": {v: [round(min(x) * 1e3, 3), round(max(x) * 1e3, 3)] for v, x in runs.items()},
           **{k: round(v, 3) for k, v in micro().items()}}
    print(json.dumps(out, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
