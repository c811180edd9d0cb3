"""Repro check: TRL's IPO loss averages each completion's log-probs over its length; a sample whose prompt fills
max_length keeps zero completion tokens, so the average is 0/0 = NaN. Flooring the length at 1 (or leaving room
for the completion) keeps the IPO loss finite; the sigmoid loss on the same batch sums and stays finite."""

from __future__ import annotations

import tempfile
from typing import Any

import torch

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

LENGTH_AVERAGED = {"ipo", "simpo", "sigmoid_norm"}


class IPOEmptyCompletion(ReproCheck):
    """IPO on a batch with one normal pair and one pair whose prompt alone reaches max_length."""

    # The thread gives no lengths; a prompt budget equal to max_length is the configuration that empties completions.
    frameworks = ("trl",)

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        if "loss_type" not in s and str(facts.get("algorithm", "")).lower() == "ipo":
            s["loss_type"] = "ipo"
        if facts.get("average_log_prob"):
            s["average_log_prob"] = True
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        ml = int(settings["max_length"])
        mpl = int(settings.get("max_prompt_length") or ml)
        ml, mpl = scaled(ml, 96, ml), scaled(mpl, 96, ml)
        beta = float(settings.get("beta") or 0.1)
        policy, ref = TinyLM().to(device), TinyLM().to(device)
        ref.requires_grad_(False)
        g = torch.Generator().manual_seed(0)

        def rand(n: int) -> list[int]:
            return torch.randint(2, 64, (n,), generator=g).tolist()

        pairs = [(rand(ml // 4), rand(ml // 4), rand(ml // 4)), (rand(ml + 4), rand(ml // 4), rand(ml // 4))]
        scores: dict[str, list[torch.Tensor]] = {"pc": [], "pr": [], "rc": [], "rr": []}
        kept = []
        for prompt, chosen, rejected in pairs:
            p = prompt[-mpl:]  # prompt budget (keep_end)
            for key, resp in (("c", chosen), ("r", rejected)):
                seq = (p + resp)[:ml]  # then the pair is cut to max_length from the end (keep_start)
                labels = torch.tensor([-100] * len(p) + resp, device=device)[: len(seq)]
                ids = torch.tensor(seq, device=device)
                n = (labels[1:] != -100).sum()
                kept.append(int(n))
                denom = n.clamp(min=1) if fixed else n  # the fix: floor the length at 1
                for model, tag in ((policy, "p"), (ref, "r")):
                    lp = token_logps(model(ids[:-1]), labels[1:]).sum()
                    scores[tag + key].append(lp / denom)
        pc, pr, rc, rr = (torch.stack(scores[k]) for k in ("pc", "pr", "rc", "rr"))
        logits = (pc - pr) - (rc - rr)
        loss = ((logits - 1 / (2 * beta)) ** 2).mean()  # IPO
        loss.backward()
        return {"max_length": ml, "max_prompt_length": mpl, "min_completion_tokens": min(kept),
                "logps_chosen": num(pc.detach().mean()), "loss": num(loss), "grad_norm": grad_norm(policy.parameters())}


    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Any]:
        """The same kind of batch through TRL's own DPOTrainer with loss_type ipo on a tiny Llama: does this version
        still turn a prompt that fills max_length into a NaN loss? (Newer releases drop such samples and floor the
        length at 1.)"""
        trl = import_framework("trl")
        from datasets import Dataset

        ml = scaled(int(settings["max_length"]), 48, int(settings["max_length"]))
        mpl = scaled(int(settings.get("max_prompt_length") or settings["max_length"]), 48, int(settings["max_length"]))
        rows = [{"prompt": tiny_words(ml // 4, 1), "chosen": tiny_words(6, 2), "rejected": tiny_words(6, 3)},
                {"prompt": tiny_words(ml + 8, 4), "chosen": tiny_words(6, 5), "rejected": tiny_words(6, 6)}]
        with tempfile.TemporaryDirectory() as tmp:
            args = trainer_args(trl.DPOConfig, tmp, device, loss_type="ipo", beta=float(settings.get("beta") or 0.1),
                                max_length=ml, max_prompt_length=mpl, per_device_train_batch_size=2)
            torch.manual_seed(0)
            trainer = quiet(trl.DPOTrainer(model=tiny_causal_lm("llama", seed=0, device=device),
                                           ref_model=tiny_causal_lm("llama", seed=1, device=device), args=args,
                                           train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer()))
            batch = next(iter(trainer.get_train_dataloader()))
            loss = trainer.compute_loss(trainer.model, batch)
            loss.backward()
            out = {"trl": trl.__version__, "max_length": ml, "rows_given": len(rows),
                   "rows_trained": len(trainer.train_dataset), "loss": num(loss),
                   "grad_norm": grad_norm(trainer.model.parameters())}
        out["affected"] = int(is_bad(out["loss"]) or is_bad(out["grad_norm"]))
        return out


def main() -> int:
    return cli_main(IPOEmptyCompletion)


if __name__ == "__main__":
    raise SystemExit(main())
