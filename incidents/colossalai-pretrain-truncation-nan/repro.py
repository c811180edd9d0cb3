"""Repro check: Colossal-LLaMA-2's pretraining tokenizer masks the source with -100 and then keeps the first
max_length tokens; a source at least max_length long leaves only masked labels and the batch's mean cross-entropy is
0/0 = NaN. Truncating the source from the left so the target survives keeps the loss finite."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num
from kb.repro.tiny import TinyLM, scaled

IGNORE = -100


def tokenize_pretrain(source: list[int], target: list[int], max_length: int, keep_target: bool) -> tuple[list, list]:
    """supervised_tokenize_pretrain: <bos> source target <eos>, source labels -100, then truncation."""
    bos, eos = 1, 1
    src = [bos] + source
    if keep_target and len(src) + len(target) + 1 > max_length:  # the fix: cut the source, keep the target
        room = max(1, max_length - len(target) - 1)
        src = [bos] + src[1:][-(room - 1):] if room > 1 else [bos]
    ids = src + target + [eos]
    labels = [IGNORE] * len(src) + target + [eos]
    return ids[:max_length], labels[:max_length]  # the reported lines: keep the head


class SourceLongerThanMaxLength(ReproCheck):
    """A micro-batch holding one sample whose source (context) is longer than max_length."""

    frameworks = ("colossalai",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        ml = int(settings.get("max_length") or 4096)
        ml = scaled(ml, 64, ml)
        g = torch.Generator().manual_seed(0)
        source = torch.randint(2, 64, (ml + 10,), generator=g).tolist()
        target = torch.randint(2, 64, (ml // 4,), generator=g).tolist()
        ids, labels = tokenize_pretrain(source, target, ml, keep_target=fixed)
        model = TinyLM().to(device)
        ids_t, labels_t = torch.tensor(ids, device=device), torch.tensor(labels, device=device)
        loss = F.cross_entropy(model(ids_t[:-1]), labels_t[1:], ignore_index=IGNORE)
        loss.backward()
        return {"max_length": ml, "supervised_tokens": int((labels_t[1:] != IGNORE).sum()), "loss": num(loss),
                "grad_norm": grad_norm(model.parameters())}


def main() -> int:
    return cli_main(SourceLongerThanMaxLength)


if __name__ == "__main__":
    raise SystemExit(main())
