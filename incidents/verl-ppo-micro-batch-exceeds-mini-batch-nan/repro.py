"""Repro check: verl's gradient_accumulation = mini // micro is 0 when the micro-batch exceeds the per-GPU
mini-batch, and each micro-batch loss is divided by it (inf -> NaN grad_norm); a micro-batch that divides the
per-GPU mini-batch keeps it finite.

`ppo_mini_batch_size` and `rollout_n` have no canonical fact; pass them with --settings to use your own, otherwise
the reported 8 and 2 are used."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num

REPORTED_MINI_BATCH, REPORTED_ROLLOUT_N = 8, 2  # actor.ppo_mini_batch_size and rollout.n of the report


def per_gpu_mini(settings: dict[str, Any]) -> int:
    """verl's normalisation: ppo_mini_batch_size * rollout.n // (n_gpus * nnodes // ulysses_sp_size)."""
    mini = int(settings.get("ppo_mini_batch_size", REPORTED_MINI_BATCH))
    n = int(settings.get("rollout_n", REPORTED_ROLLOUT_N))
    dp = int(settings.get("num_gpus") or 1) * int(settings.get("num_nodes") or 1) \
        // max(1, int(settings.get("sequence_parallel_size") or 1))
    return mini * n // max(1, dp)


def update(device: str, mini: int, micro: int) -> dict[str, Any]:
    """One actor update over a per-GPU mini-batch split into micro-batches, verl style."""
    torch.manual_seed(0)
    grad_accum = mini // micro
    actor = torch.nn.Linear(6, 4).to(device)
    x = torch.randn(mini, 6, device=device)
    actions = torch.randint(0, 4, (mini,), device=device)
    adv = torch.randn(mini, device=device)
    loss = torch.zeros((), device=device)
    for chunk in torch.arange(mini, device=device).split(micro):
        logp = actor(x[chunk]).log_softmax(-1).gather(-1, actions[chunk, None]).squeeze(-1)
        loss = -(adv[chunk] * logp).mean() / grad_accum  # a python int 0: tensor / 0 -> inf
        loss.backward()
    g = torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
    return {"gradient_accumulation": grad_accum, "loss": num(loss), "grad_norm": num(g)}


class VerlMicroExceedsMini(ReproCheck):
    """Actor update with ppo_micro_batch_size_per_gpu against the per-GPU mini-batch at num_gpus ranks."""

    frameworks = ("verl",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        micro, mini = int(settings["micro_batch_size"]), per_gpu_mini(settings)
        if mini < 1:
            return {"per_gpu_mini_batch": mini, "micro_batch": micro,
                    "error": "the per-GPU mini-batch is 0: more data-parallel ranks than samples per update"}
        # The same micro-batch on one GPU, where the mini-batch is not split across ranks: the report's control.
        one_gpu = update(device, per_gpu_mini({**settings, "num_gpus": 1, "num_nodes": 1}), micro)
        if fixed and (mini < micro or mini % micro):
            micro = max(d for d in range(1, mini + 1) if mini % d == 0 and d <= micro)  # a divisor of the mini-batch
        return {"per_gpu_mini_batch": mini, "micro_batch": micro, **update(device, mini, micro),
                "grad_norm_on_1_gpu": one_gpu["grad_norm"]}


def main() -> int:
    return cli_main(VerlMicroExceedsMini)


if __name__ == "__main__":
    raise SystemExit(main())
