"""Repro check: ORPO log-odds via log1p(-exp(logp)) go NaN when a bf16 sequence log-prob rounds to 0; fp32 log-probs
with a stable log1mexp stay finite."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, import_framework, is_bad, num
from kb.repro.tiny import torch_dtype

VOCAB, SEQ, MARGIN = 32, 4, 12.0  # a confident policy: the labelled token's logit is 12 above the rest
LOW_PRECISION = {"bf16", "fp16"}  # log_softmax near 12 has a spacing (0.06 / 0.008) far above the true 1e-4 gap


def confident_logits(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits where the labelled token wins by MARGIN (row 0 chosen, row 1 rejected and slightly less sure)."""
    labels = torch.randint(0, VOCAB, (2, SEQ), device=device)
    base = torch.zeros(2, SEQ, VOCAB, device=device)
    base.scatter_(-1, labels.unsqueeze(-1), MARGIN)
    base[1] -= 0.5 * F.one_hot(labels[1], VOCAB).float()
    return base.to(dtype).requires_grad_(True), labels


def seq_logps(logits: torch.Tensor, labels: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """Summed per-token log-probs, with log_softmax run in `compute_dtype` (the model's dtype before the fix)."""
    return logits.to(compute_dtype).log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).sum(-1)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """Stable log(1 - exp(x)) for x < 0 (split at -ln 2)."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


class ORPOBf16LogOdds(ReproCheck):
    """ORPO odds-ratio term on confident logits: model-dtype log-probs + log1p(-exp) vs fp32 + log1mexp."""

    watch = ("log_odds", "loss", "grad_norm")
    frameworks = ("trl",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch_dtype(settings.get("precision"))
        torch.manual_seed(0)
        logits, labels = confident_logits(device, dtype)
        if fixed:  # fp32 log-probs, kept strictly below 0, and a log(1 - exp) that does not cancel
            lp = seq_logps(logits, labels, torch.float32).clamp(max=-1e-6)
            chosen, rejected = lp[0], lp[1]
            log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
        else:  # the old odds_ratio_loss: log-probs in the model dtype, naive log1p(-exp(x))
            lp = seq_logps(logits, labels, dtype)
            chosen, rejected = lp[0], lp[1]
            log_odds = (chosen - rejected) - (torch.log1p(-torch.exp(chosen)) - torch.log1p(-torch.exp(rejected)))
        loss = -F.logsigmoid(log_odds.float())
        loss.backward()
        return {"chosen_logp": num(chosen), "rejected_logp": num(rejected), "log_odds": num(log_odds),
                "loss": num(loss), "grad_norm": num(logits.grad.float().norm())}

    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        """The same confident logits through TRL's own ORPO code: `ORPOTrainer.get_batch_logps` (log-probs in the
        logits' dtype) and `ORPOTrainer.odds_ratio_loss` (the odds-ratio term), then backward. Building a whole
        ORPOTrainer adds nothing here: the NaN lives in these two functions."""
        trl = import_framework("trl")
        try:
            from trl.experimental.orpo import ORPOTrainer  # trl >= 0.25 moved ORPO to experimental
        except ImportError:
            from trl import ORPOTrainer
        dtype = torch_dtype(settings.get("precision"))
        torch.manual_seed(0)
        logits, labels = confident_logits(device, dtype)
        # get_batch_logps drops the first label (next-token shift): prepend one so every labelled token is scored.
        shifted = torch.cat([torch.full_like(labels[:, :1], -100), labels], dim=1)
        padded = torch.cat([logits, logits[:, -1:]], dim=1)
        lp = ORPOTrainer.get_batch_logps(padded, shifted)
        owner = SimpleNamespace(beta=0.1, accelerator=SimpleNamespace(device=torch.device(device)))
        losses, _, _, _, log_odds = ORPOTrainer.odds_ratio_loss(owner, lp[:1], lp[1:])
        loss = -losses.mean()
        loss.backward()
        out = {"trl": trl.__version__, "chosen_logp": num(lp[0]), "rejected_logp": num(lp[1]),
               "log_odds": num(log_odds), "loss": num(loss), "grad_norm": num(logits.grad.float().norm())}
        out["affected"] = int(any(is_bad(out[k]) for k in ("log_odds", "loss", "grad_norm")))
        return out


def main() -> int:
    return cli_main(ORPOBf16LogOdds)


if __name__ == "__main__":
    raise SystemExit(main())
