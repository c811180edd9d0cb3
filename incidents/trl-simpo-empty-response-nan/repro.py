"""Repro check: SimPO with max_prompt_length >= max_length truncates long samples to an empty response; the
length-averaged log-prob is then 0/0 = NaN. Leaving room for the response keeps the loss finite."""

from __future__ import annotations

import math
import tempfile
from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, grad_norm, import_framework, is_bad, num
from kb.repro.tiny import (
    TinyLM,
    quiet,
    scaled,
    tiny_causal_lm,
    tiny_tokenizer,
    tiny_words,
    token_logps,
    trainer_args,
)

LENGTH_NORMALISED = {"simpo", "ipo"}  # loss types that divide summed log-probs by the response length


def truncate(prompt: list[int], response: list[int], max_length: int, max_prompt_length: int) -> list[int]:
    """TRL's CPO/SimPO tokenize_row order: cut the prompt to max_prompt_length, then the response to
    max_length - max_prompt_length when the pair is still too long. Returns the kept response."""
    if len(prompt) + len(response) > max_length:
        prompt = prompt[-max_prompt_length:]  # truncation_mode keep_end
        if len(prompt) + len(response) > max_length:
            response = response[: max(0, max_length - max_prompt_length)]
    return response


class SimPOEmptyResponse(ReproCheck):
    """SimPO loss on a batch holding one sample longer than max_length (TRL CPOTrainer, loss_type simpo)."""

    frameworks = ("trl",)

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        if "loss_type" not in s and str(facts.get("algorithm", "")).lower() == "simpo":
            s["loss_type"] = "simpo"
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        ml, mpl = int(settings["max_length"]), int(settings["max_prompt_length"])
        ml, mpl = scaled(ml, 128, ml), scaled(mpl, 128, ml)  # same ratio, CPU-sized
        if fixed and mpl >= ml:
            mpl = ml // 2  # the fix: leave room for the response
        beta, gamma = float(settings.get("beta", 2.0)), 0.5
        model = TinyLM().to(device)
        g = torch.Generator().manual_seed(0)

        def rand(n: int) -> list[int]:
            return torch.randint(2, 64, (n,), generator=g).tolist()

        # One sample that fits and one whose prompt alone is longer than max_length.
        samples = [(rand(ml // 4), rand(ml // 4), rand(ml // 4)), (rand(ml + 8), rand(ml // 4), rand(ml // 4))]
        avg, kept = [], []
        for prompt, chosen, rejected in samples:
            for response in (chosen, rejected):
                resp = truncate(prompt, response, ml, mpl)
                kept.append(len(resp))
                p = prompt[-mpl:] if len(prompt) + len(response) > ml else prompt
                ids = torch.tensor(p + resp, device=device)
                labels = torch.tensor([-100] * len(p) + resp, device=device)
                lp = token_logps(model(ids[:-1]), labels[1:])
                n = (labels[1:] != -100).sum()
                avg.append(lp.sum() / n)  # SimPO: length-averaged log-prob; n == 0 -> 0/0
        chosen_avg, rejected_avg = torch.stack(avg[0::2]), torch.stack(avg[1::2])
        loss = -F.logsigmoid(beta * (chosen_avg - rejected_avg) - gamma).mean()
        loss.backward()
        return {"max_length": ml, "max_prompt_length": mpl, "min_response_tokens": min(kept),
                "loss": num(loss), "grad_norm": grad_norm(model.parameters())}

    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        """The same batch through TRL's own CPOTrainer (loss_type simpo): its tokenize_row truncation, collator,
        concatenated_forward and cpo_loss on a tiny Llama, faulty and fixed."""
        trl = import_framework("trl")
        try:
            from trl.experimental.cpo import CPOConfig, CPOTrainer  # trl >= 0.25 moved CPO to experimental
        except ImportError:
            from trl import CPOConfig, CPOTrainer
        from datasets import Dataset

        ml, mpl = int(settings["max_length"]), int(settings["max_prompt_length"])
        ml, mpl = scaled(ml, 48, ml), scaled(mpl, 48, ml)
        has_mpl = "max_prompt_length" in CPOConfig.__dataclass_fields__
        rows = [{"prompt": tiny_words(ml // 4, 1), "chosen": tiny_words(6, 2), "rejected": tiny_words(6, 3)},
                {"prompt": tiny_words(ml + 8, 4), "chosen": tiny_words(6, 5), "rejected": tiny_words(6, 6)}]
        out: dict[str, Any] = {"trl": trl.__version__, "max_length": ml,
                               "max_prompt_length": mpl if has_mpl else "absent (prompts are not truncated)"}
        with tempfile.TemporaryDirectory() as tmp:
            for run in ("faulty", "fixed"):
                kept, cfg_mpl = rows, mpl
                if run == "fixed":  # the fix: leave room for the response (or drop prompts that fill max_length)
                    if has_mpl and mpl >= ml:
                        cfg_mpl = ml // 2
                    elif not has_mpl:
                        kept = [r for r in rows if len(r["prompt"].split()) < ml - 1]
                args = trainer_args(CPOConfig, tmp, device, loss_type="simpo", cpo_alpha=0.0, beta=2.0,
                                    simpo_gamma=0.5, max_length=ml, max_prompt_length=cfg_mpl,
                                    per_device_train_batch_size=len(kept))
                torch.manual_seed(0)
                trainer = quiet(CPOTrainer(model=tiny_causal_lm("llama", seed=0, device=device), args=args,
                                           train_dataset=Dataset.from_list(kept), processing_class=tiny_tokenizer()))
                batch = next(iter(trainer.get_train_dataloader()))
                loss, metrics = trainer.get_batch_loss_metrics(trainer.model, batch, train_eval="train")
                loss.backward()
                responses = [(batch[k] != -100).sum(-1).min() for k in ("chosen_labels", "rejected_labels")]
                out[f"{run}_min_response_tokens"] = int(min(responses))
                out[f"{run}_loss"] = num(loss)
                out[f"{run}_grad_norm"] = grad_norm(trainer.model.parameters())
                out[f"{run}_logps_chosen"] = float(metrics.get("logps/chosen", math.nan))
        out["affected"] = int(is_bad(out["faulty_loss"]))
        out["fix_works"] = int(not is_bad(out["fixed_loss"]))
        return out


def main() -> int:
    return cli_main(SimPOEmptyResponse)


if __name__ == "__main__":
    raise SystemExit(main())
