"""Repro check: fp16 mixed precision on a model with outlier activations beyond 65504 (as Baichuan2-13B has) makes
the forward overflow to inf/NaN on every step; the HF Trainer logs those NaN losses as 0. The same weights in bf16
(fp32's exponent range) give a finite loss and gradients."""

from __future__ import annotations

import math
from typing import Any

import torch

from kb.repro.harness import ReproCheck, cli_main, grad_norm, hf_logged_loss, num
from kb.repro.tiny import tiny_causal_lm, token_batch, torch_dtype


class FP16OutlierOverflow(ReproCheck):
    """Tiny Llama whose first MLP writes one residual channel at ~1e5 (a massive activation), frozen base in the
    compute dtype plus a trainable fp32 LoRA-style adapter on the LM head, 2 steps."""

    watch = ("loss",)
    frameworks = ("llamafactory",)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dt = torch.bfloat16 if fixed else torch_dtype(settings.get("precision"))
        model = tiny_causal_lm("llama", device=device)
        ids = token_batch(128, (2, 32), seed=0, device=device)
        with torch.no_grad():  # one residual channel of ~1e5, the kind of outlier large LLMs develop in a few dims
            mlp_out = model.model.layers[0].mlp(model.model.layers[0].post_attention_layernorm(
                model.model.embed_tokens(ids)))
            model.model.layers[0].mlp.down_proj.weight[5].mul_(1e5 / float(mlp_out[..., 5].abs().max()))
        model.to(dt).requires_grad_(False)
        adapter = torch.nn.Linear(64, 128, bias=False, device=device)  # trainable, fp32 (LoRA-like)
        torch.nn.init.zeros_(adapter.weight)
        opt = torch.optim.AdamW(adapter.parameters(), lr=float(settings.get("learning_rate") or 5e-5))
        losses, peak = [], 0.0
        for _ in range(2):
            out = model(input_ids=ids, output_hidden_states=True)
            h = out.hidden_states[1].float().abs().nan_to_num(nan=math.inf)  # inf/NaN count as overflow
            peak = max(peak, num(h.max()))
            logits = out.logits.float() + adapter(out.hidden_states[-1].float())
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            norm = grad_norm(adapter.parameters())
            if math.isfinite(norm):  # AMP's loss scaler skips non-finite steps
                opt.step()
            losses.append(num(loss))
        return {"compute_dtype": str(dt).replace("torch.", ""), "max_abs_activation": peak, "loss": losses[-1],
                "logged_loss": hf_logged_loss(losses), "grad_norm": norm}


def main() -> int:
    return cli_main(FP16OutlierOverflow)


if __name__ == "__main__":
    raise SystemExit(main())
