"""Repro check: DPO + RPO NLL term under sequence parallelism; a shard holding only prompt tokens takes a mean
cross-entropy over zero labels (0/0 = NaN). Reducing by the global label count keeps the NLL finite."""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, Skip, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM

FIXED_IN = (3, 4, 1)  # ms-swift PR #4085 gathers the loss across sequence-parallel ranks first


def _version(text: Any) -> tuple[int, ...] | None:
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""))
    return tuple(int(x or 0) for x in m.groups()) if m else None


class DPOSequenceParallelNLL(ReproCheck):
    """One chosen/rejected pair cut into sequence_parallel_size shards; per-shard NLL mean vs global-count sum."""

    watch = ("nll_loss", "loss")  # cross_entropy over zero labels back-propagates zeros: grad_norm stays finite
    frameworks = ("ms-swift",)

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        if facts.get("framework_version") and facts.get("framework") in (None, "ms-swift"):
            s["framework_version"] = facts["framework_version"]  # versions >= 3.4.1 carry the fix
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        sp, alpha, beta = int(settings["sequence_parallel_size"]), float(settings["rpo_alpha"]), float(settings["beta"])
        shard = 8
        length = shard * max(sp, 1) + 1  # +1: the next-token shift leaves sp * shard label positions
        n_prompt = int(length * 0.8)  # a long prompt and a short response, as in RFT-sampled DPO data
        policy = TinyLM().to(device)
        ref = copy.deepcopy(policy).requires_grad_(False)
        g = torch.Generator().manual_seed(0)
        pair = [torch.randint(2, 64, (length,), generator=g).to(device) for _ in range(2)]  # chosen, rejected

        def shards(model: torch.nn.Module, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
            labels = ids.clone()
            labels[:n_prompt] = -100
            logits, labels = model(ids[:-1]), labels[1:]
            return list(zip(logits.chunk(sp), labels.chunk(sp)))  # what each sequence-parallel rank holds

        def logp_sum(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
            return sum(-F.cross_entropy(lg, lb, ignore_index=-100, reduction="sum") for lg, lb in parts)

        chosen, rejected = shards(policy, pair[0]), shards(policy, pair[1])
        with torch.no_grad():
            ref_margin = logp_sum(shards(ref, pair[0])) - logp_sum(shards(ref, pair[1]))
        dpo = -F.logsigmoid(beta * (logp_sum(chosen) - logp_sum(rejected) - ref_margin))  # sums: finite
        if fixed:  # sum over every rank's labels, divide by the global count (at least 1)
            total = sum(F.cross_entropy(lg, lb, ignore_index=-100, reduction="sum") for lg, lb in chosen)
            nll = total / max(1, sum(int((lb != -100).sum()) for _, lb in chosen))
        else:  # each rank's mean cross-entropy, then averaged across ranks (what the logged nll_loss shows)
            nll = torch.stack([F.cross_entropy(lg, lb, ignore_index=-100) for lg, lb in chosen]).mean()
        loss = dpo + alpha * nll
        loss.backward()
        return {"sequence_parallel_size": sp, "label_less_shards": sum(int((lb != -100).sum() == 0) for _, lb in chosen),
                "dpo_loss": num(dpo), "nll_loss": num(nll), "loss": num(loss), "grad_norm": grad_norm(policy.parameters())}

    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        try:
            import swift  # noqa: F401
        except ImportError:
            raise Skip("ms-swift is not installed (a run needs `swift rlhf` on sequence_parallel_size ranks; "
                       "3.1-3.4.0 affected, fixed in 3.4.1)") from None
        raise Skip("ms-swift is installed, but its run needs torch.distributed with sequence_parallel_size ranks "
                   "and is not automated here")


def main() -> int:
    return cli_main(DPOSequenceParallelNLL)


if __name__ == "__main__":
    raise SystemExit(main())
