"""Repro check: OpenRLHF ring-attention SFT took a mean cross-entropy on each ring shard; a shard with only
IGNORE_INDEX labels gives 0/0 = NaN and the all-reduce spreads it. PR #583's guard (logits.mean() * 0 for an
all-ignored shard) keeps the loss finite."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM

IGNORE = -100


def shard_loss(logits: torch.Tensor, labels: torch.Tensor, guarded: bool) -> torch.Tensor:
    """GPTLMLoss on one ring rank's slice: mean CE, or (PR #583) a graph-connected zero when nothing is labelled."""
    if guarded and bool((labels == IGNORE).all()):
        return logits.mean() * 0
    return F.cross_entropy(logits, labels, ignore_index=IGNORE)


class RingShardAllIgnored(ReproCheck):
    """One SFT sample with a long masked prompt, cut into ring_attn_size shards; per-shard loss summed (all-reduce)."""

    watch = ("loss", "grad_norm")
    frameworks = ("openrlhf",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        sp = max(1, int(settings.get("sequence_parallel_size") or 4))
        shard = 8
        length = shard * sp + 1  # the next-token shift leaves sp * shard label positions
        n_prompt = int(length * 0.7)  # long instruction, short answer
        model = TinyLM().to(device)
        ids = torch.randint(2, 64, (length,), generator=torch.Generator().manual_seed(0)).to(device)
        labels = ids.clone()
        labels[:n_prompt] = IGNORE
        logits, labels = model(ids[:-1]), labels[1:]
        parts = list(zip(logits.chunk(sp), labels.chunk(sp)))  # what each ring rank holds
        losses = [shard_loss(lg, lb, guarded=fixed) for lg, lb in parts]
        loss = torch.stack(losses).sum() / sp  # dist.all_reduce(SUM) then / ring size
        loss.backward()
        empty = sum(int(bool((lb == IGNORE).all())) for _, lb in parts)
        return {"ring_size": sp, "empty_shards": empty, "loss": num(loss), "grad_norm": grad_norm(model.parameters())}


def main() -> int:
    return cli_main(RingShardAllIgnored)


if __name__ == "__main__":
    raise SystemExit(main())
