"""Repro check: a pairwise reward-model loss that finds each answer's end at the first PAD token averages over an
empty slice (NaN) on left-padded batches; ending answers where the attention mask ends keeps it finite."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num

PAD = 3
LENGTH = 10  # padded batch length
LEFT_PADDING_MODELS = ("bloom",)  # tokenizers that ship with padding_side = "left"


def pad(seq: list[int], length: int, side: str) -> list[int]:
    fill = [PAD] * (length - len(seq))
    return fill + seq if side == "left" else seq + fill


def padding_side(settings: dict[str, Any]) -> str | None:
    """The tokenizer's padding side: `padding_side` when given (not a canonical fact), else from the model name."""
    side = settings.get("padding_side")
    if side in ("left", "right"):
        return str(side)
    model = str(settings.get("model") or "").lower()
    if any(m in model for m in LEFT_PADDING_MODELS):
        return "left"
    return None


def pair_loss(chosen: torch.Tensor, rejected: torch.Tensor, rc: torch.Tensor, rr: torch.Tensor,
              end_from_mask: bool) -> torch.Tensor:
    """DeepSpeed-Chat step-2 loss: mean -logsigmoid(chosen - rejected score) over [first differing token, end)."""
    seq_len = chosen.size(-1)
    total = rc.new_zeros(())
    for c_id, r_id, c_rw, r_rw in zip(chosen, rejected, rc, rr):
        if end_from_mask:  # the fix: the answer ends after the last non-PAD token (seq_len when left-padded)
            end = max(int((c_id != PAD).nonzero()[-1]), int((r_id != PAD).nonzero()[-1])) + 1
        else:  # the original: the first PAD marks the end (right padding assumed)
            c_pads, r_pads = (c_id == PAD).nonzero(), (r_id == PAD).nonzero()
            end = max(int(c_pads[0]) if len(c_pads) else seq_len, int(r_pads[0]) if len(r_pads) else seq_len)
        diverge = int((c_id != r_id).nonzero()[0])
        total = total + (-F.logsigmoid(c_rw[diverge:end] - r_rw[diverge:end]).mean())  # empty slice -> NaN
    return total / chosen.size(0)


class RewardModelLeftPadding(ReproCheck):
    """Two chosen/rejected pairs scored by a tiny per-token value head, padded on the tokenizer's side."""

    frameworks = ("deepspeed",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        side = padding_side(settings) or "right"

        def case(side: str, end_from_mask: bool) -> tuple[torch.Tensor, float]:
            torch.manual_seed(0)
            prompt = [10, 11, 12, 13]
            chosen = [prompt + [20, 21, 22], prompt + [24, 25]]
            rejected = [prompt + [30, 31], prompt + [34, 35, 36]]
            c = torch.tensor([pad(s, LENGTH, side) for s in chosen], device=device)
            r = torch.tensor([pad(s, LENGTH, side) for s in rejected], device=device)
            head = torch.nn.Linear(8, 1).to(device)
            emb = torch.nn.Embedding(64, 8).to(device)
            rc, rr = head(emb(c)).squeeze(-1), head(emb(r)).squeeze(-1)  # per-token scores of a value head
            loss = pair_loss(c, r, rc, rr, end_from_mask)
            loss.backward()
            return loss, grad_norm(head.parameters())

        loss, g = case(side, end_from_mask=fixed)
        control, _ = case("right", end_from_mask=fixed)  # the same code on right padding (OPT) for comparison
        return {"padding_side": side, "loss": num(loss), "grad_norm": g, "loss_right_padded": num(control)}


def main() -> int:
    return cli_main(RewardModelLeftPadding)


if __name__ == "__main__":
    raise SystemExit(main())
