"""Repro check: fp16 training overflows once activations pass 65504: the loss turns NaN (GradScaler only skips
steps, it cannot repair a forward overflow) and sampling raises `probability tensor contains either inf, nan or
element < 0`. The same weights in bf16 stay finite."""

from __future__ import annotations

from typing import Any

import torch

from kb.repro.harness import ReproCheck, Skip, cli_main, num
from kb.repro.tiny import tiny_causal_lm, torch_dtype

GROWTH = 200.0  # first-MLP weights x200: its output peaks near 1e5 in fp32, past fp16's 65504


class Fp16ActivationOverflow(ReproCheck):
    """A tiny Llama-architecture model (InternLM2 is Llama-like) whose activations grew in training, run in autocast."""

    watch = ("loss",)
    frameworks = ("xtuner",)

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        if "precision" not in s and facts.get("weights_dtype") in ("fp16", "bf16", "fp32"):
            s["precision"] = facts["weights_dtype"]
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        dtype = torch.bfloat16 if fixed else torch_dtype(settings.get("precision"))
        model = tiny_causal_lm("llama", seed=0, device=device)
        mlp = model.model.layers[0].mlp
        with torch.no_grad():
            for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                lin.weight.mul_(GROWTH)  # weights that grew during training
        peak: list[float] = []
        hook = mlp.register_forward_hook(lambda _m, _i, out: peak.append(float(out.detach().float().abs().max())))
        ids = torch.randint(2, 128, (2, 16), generator=torch.Generator().manual_seed(0)).to(device)
        amp = dtype != torch.float32
        dev_type = "cuda" if device.startswith("cuda") else "cpu"
        scaler = torch.amp.GradScaler(dev_type, init_scale=2.0**16, enabled=dtype == torch.float16)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
        losses, skipped = [], 0
        for _ in range(2):  # mixed-precision steps as XTuner's AMP runs them
            with torch.autocast(dev_type, dtype=dtype, enabled=amp):
                loss = model(ids, labels=ids).loss
            opt.zero_grad()
            scaler.scale(loss).backward()
            before = scaler.get_scale() if scaler.is_enabled() else 1.0
            scaler.step(opt)
            scaler.update()
            skipped += int(scaler.is_enabled() and scaler.get_scale() < before)  # inf grads: step skipped
            losses.append(num(loss))
        hook.remove()
        error = ""
        with torch.no_grad(), torch.autocast(dev_type, dtype=dtype, enabled=amp):
            if dev_type == "cuda":
                # CUDA's sampler meets a NaN distribution with a device-side assert that ends the process's CUDA
                # context (seen on an H100, torch 2.11), so the first sampled token's distribution is checked here
                # as the sampler would check it.
                probs = model(ids[:, :4]).logits[:, -1].float().softmax(-1)
                if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
                    error = "probability tensor contains either `inf`, `nan` or element < 0"
            else:
                try:  # what XTuner's EvaluateChatHook does between iterations
                    model.generate(ids[:, :4], do_sample=True, max_new_tokens=4, pad_token_id=0)
                except RuntimeError as e:
                    error = str(e).splitlines()[0]
        return {"dtype": str(dtype).replace("torch.", ""), "peak_mlp_activation": max(peak),
                "loss": losses[-1], "first_loss": losses[0], "skipped_steps": skipped, "error": error}

    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        if not device.startswith("cuda"):
            raise Skip("`xtuner train` needs CUDA (xtuner 0.2.0's AMP wrapper refuses to run on CPU)")
        try:
            import xtuner  # noqa: F401
        except ImportError:
            raise Skip("xtuner is not installed") from None
        raise Skip("xtuner is installed, but an `xtuner train` run is not automated here")


def main() -> int:
    return cli_main(Fp16ActivationOverflow)


if __name__ == "__main__":
    raise SystemExit(main())
