"""Repro check: OpenRLHF's vanilla KTO loss takes the KL reference as a mean over each class of the micro-batch;
a micro-batch without desirable (or undesirable) samples averages over nothing -> NaN. The default KTO loss
skips an empty class and stays finite. Not Qwen2-specific."""

from __future__ import annotations

import copy
from typing import Any

import torch

from kb.repro.harness import ReproCheck, Skip, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM


def vanilla_kto(pc: torch.Tensor, pr: torch.Tensor, rc: torch.Tensor, rr: torch.Tensor, beta: float) -> torch.Tensor:
    """OpenRLHF <= 0.3.3 VanillaKTOLoss: per-class mean log-ratio as the KL reference (empty class -> NaN)."""
    chosen_kl = (pc - rc).mean().clamp(min=0)
    rejected_kl = (pr - rr).mean().clamp(min=0)
    losses = torch.cat((1 - torch.sigmoid(beta * ((pc - rc) - rejected_kl)),
                        1 - torch.sigmoid(beta * (chosen_kl - (pr - rr)))))
    return losses.mean()


def default_kto(pc: torch.Tensor, pr: torch.Tensor, rc: torch.Tensor, rr: torch.Tensor, kl: torch.Tensor,
                beta: float) -> torch.Tensor:
    """OpenRLHF's default KTOLoss: KL from mismatched completions of the whole batch; an empty class adds nothing."""
    kl = kl.mean().detach().clamp(min=0)
    parts = [1 - torch.sigmoid(beta * ((pc - rc) - kl))] if pc.numel() else []
    parts += [1 - torch.sigmoid(beta * (kl - (pr - rr)))] if pr.numel() else []
    return torch.cat(parts).mean()


class VanillaKTOOneSidedBatch(ReproCheck):
    """KTO loss on micro-batches of micro_batch_size unpaired samples: one-sided vs alternating composition."""

    watch = ("loss", "grad_norm")
    frameworks = ("openrlhf",)

    def _batch_loss(self, policy: torch.nn.Module, ref: torch.nn.Module, seqs: list[torch.Tensor],
                    desirable: list[bool], beta: float, vanilla: bool) -> torch.Tensor:
        def logp(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
            lp = model(ids[:-1]).log_softmax(-1).gather(-1, ids[1:, None]).squeeze(-1)
            return lp[4:].sum()  # response tokens after a 4-token prompt

        pol = torch.stack([logp(policy, s) for s in seqs])
        with torch.no_grad():
            rf = torch.stack([logp(ref, s) for s in seqs])
        d = torch.tensor(desirable, device=pol.device)
        if not vanilla:
            return default_kto(pol[d], pol[~d], rf[d], rf[~d], (pol - rf).roll(1), beta)
        return vanilla_kto(pol[d], pol[~d], rf[d], rf[~d], beta)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        mb, beta = max(1, int(settings["micro_batch_size"])), float(settings["beta"])
        vanilla = bool(settings.get("vanilla_loss")) and not fixed  # the fix: the default KTO loss
        policy = TinyLM().to(device)
        ref = copy.deepcopy(policy).requires_grad_(False)
        with torch.no_grad():  # a policy one SFT step away from its reference, so log-ratios are non-zero
            for p in policy.parameters():
                p.add_(0.05 * torch.randn_like(p))
        g = torch.Generator().manual_seed(0)
        seqs = [torch.randint(2, 64, (24,), generator=g).to(device) for _ in range(mb)]
        # The failing case: a micro-batch where every sample is desirable (unbalanced data, micro-batch 1).
        loss = self._batch_loss(policy, ref, seqs, [True] * mb, beta, vanilla)
        loss.backward()
        # What OpenRLHF's alternating sampler gives at this micro-batch size: classes interleaved.
        with torch.no_grad():
            alternating = self._batch_loss(policy, ref, seqs, [i % 2 == 0 for i in range(mb)], beta, vanilla)
        return {"micro_batch_size": mb, "loss": num(loss), "grad_norm": grad_norm(policy.parameters()),
                "loss_alternating_sampler": num(alternating)}

    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        raise Skip("no OpenRLHF release can run this here: vanilla_loss exists only up to v0.3.3 (removed in v0.3.4, "
                   "KTO removed in v0.9.6) and current openrlhf needs a flash-attn CUDA build; the loss functions "
                   "above follow v0.3.3's VanillaKTOLoss / KTOLoss")


def main() -> int:
    return cli_main(VanillaKTOOneSidedBatch)


if __name__ == "__main__":
    raise SystemExit(main())
