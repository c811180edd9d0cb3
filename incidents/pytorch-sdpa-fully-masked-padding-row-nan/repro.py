"""Repro check: with padding, the attention rows of padded query positions are masked out entirely; a softmax over a
row that is all -inf is 0/0 = NaN (PyTorch's SDPA before 2.5, and any hand-written attention). The NaN hidden state of
a padded position then reaches every real token in the next layer as 0 * NaN, so the loss is NaN even though padded
labels are ignored. An additive mask of finfo(dtype).min (never -inf), or torch >= 2.5's safe softmax in the SDPA math
path, keeps every row finite."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num

VOCAB, HID, SEQ = 32, 16, 8
PAD = 3  # padded positions at the end of the second sample


def version_tuple(text: str) -> tuple[int, int]:
    parts = (str(text).split("+")[0].split(".") + ["0", "0"])[:2]
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


class TwoLayerAttention(torch.nn.Module):
    """Embedding -> two single-head attention blocks with residuals -> vocabulary head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HID)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(HID, 3 * HID) for _ in range(2))
        self.head = torch.nn.Linear(HID, VOCAB)

    def forward(self, ids: torch.Tensor, allowed: torch.Tensor, safe: bool) -> torch.Tensor:
        h = self.embed(ids)
        for proj in self.qkv:
            q, k, v = proj(h).chunk(3, dim=-1)
            scores = q @ k.transpose(-1, -2) / HID**0.5
            if safe:  # the OLMo fix: a finite bias in the compute dtype, never -inf
                scores = scores + (~allowed).to(scores.dtype) * torch.finfo(scores.dtype).min
            else:  # a boolean mask turned into -inf, softmax as SDPA's math path did before torch 2.5
                scores = scores.masked_fill(~allowed, float("-inf"))
            h = h + torch.softmax(scores, dim=-1) @ v
        return self.head(h)


def batch(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two samples, the second right-padded; its padded query rows may attend to nothing (query and key padding)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, SEQ), generator=g)
    keep = torch.ones(2, SEQ, dtype=torch.bool)
    keep[1, SEQ - PAD:] = False
    ids[~keep] = 0
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    allowed = causal & keep[:, None, :] & keep[:, :, None]  # padded queries see nothing: an all-False row
    labels = ids.masked_fill(~keep, -100)
    return ids.to(device), allowed.to(device), labels.to(device)


class SdpaFullyMaskedRow(ReproCheck):
    """A padded two-sample batch through two attention layers: -inf mask (faulty) vs finfo.min bias (fixed)."""

    frameworks = ("torch",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        torch.manual_seed(0)
        model = TwoLayerAttention().to(device)
        ids, allowed, labels = batch(device)
        logits = model(ids, allowed, safe=fixed)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
        loss.backward()
        # What this torch build's own SDPA returns for the same all-False row (0 on torch >= 2.5's math path).
        q = torch.randn(1, 1, SEQ, HID, device=device)
        sdpa = F.scaled_dot_product_attention(q, q, q, attn_mask=allowed[1:2, None])
        return {"fully_masked_rows": int((~allowed.any(-1)).sum()),
                "nan_logit_rows_real_tokens": int(logits.detach()[labels != -100].isnan().any(-1).sum()),
                "loss": num(loss), "grad_norm": grad_norm(model.parameters()),
                "this_torch_sdpa_nan_rows": int(sdpa.isnan().any(-1).sum())}


def main() -> int:
    return cli_main(SdpaFullyMaskedRow)


if __name__ == "__main__":
    raise SystemExit(main())
