"""Repro check: FastChat-style conversation preprocessing (FastChat's train scripts and the LLaVA family built on
them) counts each round's tokens on its own and, when the total disagrees with the tokenized conversation, masks
the whole sample ("WARNING: tokenization mismatch: X vs. Y. (ignored)"). With a conversation template that does
not fit the tokenizer every sample disagrees, every label is -100, each step's cross-entropy is 0/0 = NaN and the
HF Trainer logs 0.0. A template that fits the tokenizer leaves the answers supervised and the loss finite."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, hf_logged_loss, num
from kb.repro.tiny import TinyLM

IGNORE = -100
BOS, SEP = 1, 2


def encode(piece: list[int], adds_bos: bool) -> list[int]:
    """A toy tokenizer call on one piece of text: a BOS in front or not, as the real tokenizer does."""
    return ([BOS] if adds_bos else []) + piece


def preprocess(rounds: list[tuple[list[int], list[int]]], tokenizer_adds_bos: bool,
               template_expects_bos: bool) -> tuple[list[int], list[int], bool]:
    """One conversation -> (input ids, labels, mismatched). The round lengths are measured by tokenizing each round
    again and subtracting the BOS the template code expects the tokenizer to add; the instruction part of each
    round is masked; a total that disagrees with the real length masks the whole sample."""
    ids = [BOS] + [t for instr, answer in rounds for t in (*instr, *answer, SEP)]
    labels = list(ids)
    labels[0] = IGNORE
    cur = 1
    drop = 1 if template_expects_bos else 0
    for instr, answer in rounds:
        round_len = len(encode([*instr, *answer, SEP], tokenizer_adds_bos)) - drop
        instr_len = len(encode(instr, tokenizer_adds_bos)) - drop
        labels[cur:cur + instr_len] = [IGNORE] * instr_len
        cur += round_len
    mismatched = cur != len(ids)
    if mismatched:
        labels = [IGNORE] * len(ids)
    return ids, labels, mismatched


class TemplateTokenizerMismatch(ReproCheck):
    """Micro-batches of two-round conversations preprocessed with a template that expects a BOS on every piece,
    for a tokenizer that adds none (the fix: the template that fits the tokenizer)."""

    watch = ("raw_loss",)
    frameworks = ("transformers",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        n = max(1, min(int(settings.get("micro_batch_size") or 2), 8))
        steps = 4
        g = torch.Generator().manual_seed(0)
        model = TinyLM().to(device)
        losses, mismatched, supervised, gnorm = [], 0, 0, float("nan")
        for step in range(steps):
            rows = []
            for _ in range(n):
                rounds = [(torch.randint(3, 64, (7,), generator=g).tolist(),
                           torch.randint(3, 64, (5,), generator=g).tolist()) for _ in range(2)]
                ids, labels, bad = preprocess(rounds, tokenizer_adds_bos=False, template_expects_bos=not fixed)
                rows.append((ids, labels))
                mismatched += bad
            ids = torch.tensor([r[0] for r in rows], device=device)
            labels = torch.tensor([r[1] for r in rows], device=device)
            logits = model(ids[:, :-1])
            target = labels[:, 1:]
            supervised += int((target != IGNORE).sum())
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=IGNORE)
            if step == 0:
                loss.backward()
                gnorm = grad_norm(model.parameters())
            losses.append(num(loss))
        return {"samples": steps * n, "mismatched_samples": mismatched, "supervised_tokens": supervised,
                "raw_loss": losses[0], "logged_loss": hf_logged_loss(losses), "grad_norm": gnorm}


def main() -> int:
    return cli_main(TemplateTokenizerMismatch)


if __name__ == "__main__":
    raise SystemExit(main())
