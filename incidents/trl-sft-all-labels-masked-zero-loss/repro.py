"""Repro check: completion-only SFT with max_length shorter than the prompt truncates away every completion token;
the batch's mean cross-entropy over zero labels is NaN, which SFTTrainer replaced by a zero (logged loss 0.0).
A max_length that leaves room for the completion gives a finite, non-zero loss (TRL PR #6320 instead drops the
fully-masked examples)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM, scaled

IGNORE = -100


class CompletionOnlyTruncation(ReproCheck):
    """A batch of prompt-completion samples truncated to max_length with completion_only_loss."""

    # The report sweeps max_length 128 -> 16 over ~35-token prompts; 16 is the failing end.
    watch = ("raw_loss", "grad_norm")
    frameworks = ("trl",)
    prompt_len = 35

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        ml = int(settings["max_length"])
        ml = scaled(ml, 128, max(ml, self.prompt_len))
        if fixed and ml <= self.prompt_len:
            ml = self.prompt_len + 8  # the fix: max_length above the prompt lengths
        n = max(1, min(int(settings.get("micro_batch_size") or 8), 8))
        g = torch.Generator().manual_seed(0)
        rows = []
        for _ in range(n):
            prompt = torch.randint(2, 64, (self.prompt_len,), generator=g).tolist()
            completion = torch.randint(2, 64, (6,), generator=g).tolist()
            ids = (prompt + completion)[:ml]
            labels = ([IGNORE] * len(prompt) + completion)[:ml]  # completion_only_loss, then truncation
            rows.append((ids, labels))
        model = TinyLM().to(device)
        ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(r[0]) for r in rows], batch_first=True).to(device)
        labels = torch.nn.utils.rnn.pad_sequence([torch.tensor(r[1]) for r in rows], batch_first=True,
                                                 padding_value=IGNORE).to(device)
        logits = model(ids[:, :-1])
        raw = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=IGNORE)
        supervised = int((labels[:, 1:] != IGNORE).sum())
        # SFTTrainer's fully-masked path: a zero that keeps the graph connected, so the log shows 0.0.
        used = logits.sum() * 0 if supervised == 0 else raw
        used.backward()
        return {"max_length": ml, "supervised_tokens": supervised, "raw_loss": num(raw), "logged_loss": num(used),
                "grad_norm": grad_norm(model.parameters())}


def main() -> int:
    return cli_main(CompletionOnlyTruncation)


if __name__ == "__main__":
    raise SystemExit(main())
