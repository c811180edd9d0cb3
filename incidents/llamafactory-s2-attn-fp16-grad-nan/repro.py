"""Repro check: LLaMA-Factory's S2-Attn shift-back joined the two head halves with torch.cat and no dim, stacking
them on the batch axis; the following reshape succeeds but scrambles positions, so each output position carries
features of later tokens (a causal leak the model can copy). Concatenating on dim=2 keeps attention causal.
The fp16 NaN gradients of the report are not reproduced here; the check measures the layout defect itself."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, num


def shift_attention(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, heads: int, group: int,
                    cat_dim: int | None) -> torch.Tensor:
    """LongLoRA S2-Attn forward (longlora.py): shift half the heads, causal attention per group, shift back."""
    bsz, q_len, hidden = x.shape
    hd = hidden // heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(bsz, q_len, heads, hd).transpose(1, 2)  # (b, h, q, d)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)

    def shift(t: torch.Tensor) -> torch.Tensor:
        t = torch.cat((t[:, : heads // 2], t[:, heads // 2 :].roll(-group // 2, dims=2)), dim=1)
        n = q_len // group
        return t.transpose(1, 2).reshape(bsz * n, group, heads, hd).transpose(1, 2)

    q, k, v = shift(q), shift(k), shift(v)
    mask = torch.ones(group, group, dtype=torch.bool, device=x.device).tril()
    att = (q @ k.transpose(-1, -2) / hd**0.5).masked_fill(~mask, float("-inf")).softmax(-1)
    out = (att @ v).transpose(1, 2).reshape(bsz, q_len, heads, hd)  # (b, q, h, d)
    first, rolled = out[:, :, : heads // 2], out[:, :, heads // 2 :].roll(group // 2, dims=1)
    out = torch.cat((first, rolled)) if cat_dim is None else torch.cat((first, rolled), dim=cat_dim)
    return out.reshape(bsz, q_len, hidden)


class ShiftBackConcat(ReproCheck):
    """Gradient of output position t with respect to inputs at positions > t (must be 0 for causal attention)."""

    watch = ()
    frameworks = ("llamafactory",)

    def failed(self, evidence: dict[str, Any]) -> bool:
        return bool(evidence.get("error")) or float(evidence.get("future_leak", 0.0)) > 1e-6

    def dtype(self, settings: dict[str, Any]) -> str:
        return "fp32"  # the layout defect is dtype-independent; fp32 keeps the measurement exact

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        heads, hidden, q_len, group = 4, 32, 16, 4
        g = torch.Generator().manual_seed(0)
        w = [torch.randn(hidden, hidden, generator=g).to(device) / hidden**0.5 for _ in range(3)]
        x = torch.randn(1, q_len, hidden, generator=g).to(device).requires_grad_(True)
        out = shift_attention(x, *w, heads=heads, group=group, cat_dim=2 if fixed else None)
        t = 2
        out[0, t].sum().backward()
        leak = x.grad[0, t + 1 :].abs().max()
        return {"position": t, "future_leak": num(leak), "own_position_grad": num(x.grad[0, t].abs().max())}


def main() -> int:
    return cli_main(ShiftBackConcat)


if __name__ == "__main__":
    raise SystemExit(main())
