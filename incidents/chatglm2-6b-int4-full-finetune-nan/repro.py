"""Repro check: AdamW on fp16 weights puts NaN into them on the first update even at lr 5e-7 (eps underflows, zero-gradient rows get 0/0); fp32 master weights stay finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, num


class Fp16WeightsTinyLrCheck(ReproCheck):
    """Faulty: fp16 embedding + head updated by AdamW at lr 5e-7; fixed: the same in fp32."""


    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch.float32 if fixed or settings.get("weights_dtype") != "fp16" else torch.float16
        emb = torch.nn.Embedding(100, 16).to(device, dtype)  # non-quantised tensors of an int4 checkpoint are fp16
        head = torch.nn.Linear(16, 100, bias=False).to(device, dtype)
        params = list(emb.parameters()) + list(head.parameters())
        opt = torch.optim.AdamW(params, lr=float(settings.get("learning_rate") or 5e-7), foreach=False)
        ids = torch.tensor([[3, 7, 11, 19, 23, 29]], device=device)  # unused token rows get exactly zero gradient
        losses, gn = [], None
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(head(emb(ids[:, :-1])).float().view(-1, 100), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            gn = grad_norm(params) if gn is None else gn
            opt.step()
            losses.append(num(loss))
        return {"first_loss": losses[0], "loss": losses[1], "grad_norm": gn,
                "nan_embedding_rows": int(torch.isnan(emb.weight).any(-1).sum())}


def main() -> int:
    return cli_main(Fp16WeightsTinyLrCheck)


if __name__ == "__main__":
    raise SystemExit(main())
