"""Repro check: OpenRLHF's PRM loss keeps only positions whose input id equals the placeholder token id; when the
placeholder string is tokenized into a different id in the data (a leading space, a merge with its neighbour), no
position matches and cross-entropy averages over nothing: 0/0 = NaN. A placeholder that tokenizes to one id wherever
it appears (a dedicated special token) keeps the loss finite."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM

VOCAB = 64
PLACEHOLDER_ALONE = 40  # the id the code looked up: the placeholder tokenized on its own ("ки")
PLACEHOLDER_IN_TEXT = 41  # the id the data actually holds: the placeholder after a space (" ки")
REWARD_TOKENS = (50, 51)  # "+" and "-"


def prm_loss(ids: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, placeholder_id: int) -> torch.Tensor:
    """OpenRLHF PRMLoss with hard labels: select placeholder positions, restrict logits to the reward tokens,
    map each reward token to its class index, mean cross-entropy."""
    mask = ids == placeholder_id
    sel_logits = logits[mask][..., list(REWARD_TOKENS)]
    sel_labels = labels[mask]
    for i, tok in enumerate(REWARD_TOKENS):
        sel_labels = torch.where(sel_labels == tok, i, sel_labels)
    return F.cross_entropy(sel_logits, sel_labels, ignore_index=-100)


def step_batch(placeholder_in_text: int, steps: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two solutions of `steps` steps each: step tokens, then the placeholder whose label is "+" or "-"."""
    g = torch.Generator().manual_seed(0)
    rows, labs = [], []
    for _ in range(2):
        ids, lab = [], []
        for _ in range(steps):
            body = torch.randint(2, 30, (5,), generator=g).tolist()
            ids += body + [placeholder_in_text]
            lab += [-100] * 5 + [REWARD_TOKENS[int(torch.randint(0, 2, (1,), generator=g))]]
        rows.append(ids)
        labs.append(lab)
    return torch.tensor(rows, device=device), torch.tensor(labs, device=device)


class PrmPlaceholderMismatch(ReproCheck):
    """PRM loss on two 3-step solutions: placeholder id looked up alone vs the id the data holds (faulty) or a
    placeholder that tokenizes to one id everywhere (fixed)."""

    frameworks = ("openrlhf",)

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        for key in ("placeholder_token", "placeholder_matches"):  # not canonical; --settings may carry them
            if key in facts:
                s[key] = facts[key]
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        mismatch = settings.get("placeholder_matches") is not True and not fixed
        in_text = PLACEHOLDER_IN_TEXT if mismatch else PLACEHOLDER_ALONE
        ids, labels = step_batch(in_text, steps=3, device=device)
        model = TinyLM(vocab=VOCAB).to(device)
        # Next-token setup as in OpenRLHF: logits at position t score the token at t (labels already aligned).
        logits = model(ids)
        loss = prm_loss(ids, logits, labels, PLACEHOLDER_ALONE)
        loss.backward()
        return {"placeholder_id_looked_up": PLACEHOLDER_ALONE, "placeholder_id_in_data": in_text,
                "supervised_positions": int((ids == PLACEHOLDER_ALONE).sum()),
                "loss": num(loss), "grad_norm": grad_norm(model.parameters())}


def main() -> int:
    return cli_main(PrmPlaceholderMismatch)


if __name__ == "__main__":
    raise SystemExit(main())
