"""Repro check: chat-template tokens whose embedding / lm_head rows were never trained (max |w| ~ 1e-23) stay
unlearnable under LoRA with frozen embeddings (their logit is pinned at 0, the model cannot emit <|eot_id|>);
resetting the rows to the mean of trained rows and training embed_tokens / lm_head fixes it.

This shows the mechanism unsloth's untrained-token check guards against; the NaN itself needs low-precision kernels
on a real checkpoint and is not reproduced here."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kb.repro.harness import ReproCheck, cli_main, num

VOCAB, HID = 48, 16
UNTRAINED = (40, 41, 42)  # play <|start_header_id|>, <|end_header_id|>, <|eot_id|>
EOT = 42
STEPS, LR = 60, 5e-2
LEARNED = 0.5  # cross-entropy of <|eot_id|> at the answer's end below which the model has learned to stop


class TinyLoraLM(torch.nn.Module):
    """Embedding -> RMSNorm -> LoRA-adapted projection -> lm_head (enough to show row-level trainability)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HID)
        self.proj = torch.nn.Linear(HID, HID)
        self.lora_a = torch.nn.Parameter(torch.randn(4, HID) * 0.01)
        self.lora_b = torch.nn.Parameter(torch.zeros(HID, 4))
        self.lm_head = torch.nn.Linear(HID, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        h = self.proj(h) + h @ self.lora_a.T @ self.lora_b.T
        return self.lm_head(torch.tanh(h))


def base_model(device: str) -> TinyLoraLM:
    """What the base checkpoint ships: untrained rows of ~1e-23 in embed_tokens, zeros in lm_head."""
    torch.manual_seed(0)
    m = TinyLoraLM().to(device)
    with torch.no_grad():
        m.embed.weight[list(UNTRAINED)] = 1e-23
        m.lm_head.weight[list(UNTRAINED)] = 0.0
    return m


def untrained_ids(m: TinyLoraLM, ids: torch.Tensor) -> list[int]:
    """unsloth's test: tokens of the batch whose embedding row has max |w| <= 1e-16."""
    rows = m.embed.weight.detach().abs().amax(-1) <= 1e-16
    return sorted({int(t) for t in ids.flatten() if rows[t]})


class UntrainedTemplateTokens(ReproCheck):
    """60 AdamW steps on two Llama-3-templated samples: LoRA only vs mean-initialised, trained embed/lm_head."""

    watch = ("eot_loss",)
    frameworks = ("unsloth", "peft")

    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        s = super().settings_from_facts(facts)
        if facts.get("errors"):
            s["errors"] = list(facts["errors"])  # unsloth's own untrained-token error settles the question
        return s

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # 60 steps of 16-wide matmuls: thread hand-offs cost more than they save
        try:
            return self._train(settings, device, fixed)
        finally:
            torch.set_num_threads(threads)

    def _train(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Any]:
        m = base_model(device)
        ids = torch.tensor([[40, 5, 41, 7, 8, 9, 42], [40, 6, 41, 10, 11, 12, 42]], device=device)
        found = untrained_ids(m, ids)
        full = settings.get("use_peft") is False
        train_rows = fixed or full or bool(settings.get("trainable_embeddings"))
        for w in (m.embed.weight, m.lm_head.weight, m.proj.weight, m.proj.bias):
            w.requires_grad_(full)  # LoRA: base weights, embed_tokens and lm_head frozen
        params = [m.lora_a, m.lora_b] + ([m.proj.weight, m.proj.bias] if full else [])
        if fixed:  # reset the untrained rows to the mean of the trained ones
            with torch.no_grad():
                trained = [i for i in range(VOCAB) if i not in UNTRAINED]
                m.embed.weight[list(UNTRAINED)] = m.embed.weight[trained].mean(0)
                m.lm_head.weight[list(UNTRAINED)] = m.lm_head.weight[trained].mean(0)
        if train_rows:
            m.embed.weight.requires_grad_(True)
            m.lm_head.weight.requires_grad_(True)
            params += [m.embed.weight, m.lm_head.weight]
        opt = torch.optim.AdamW(params, lr=LR)
        eot_row_grad = 0.0
        for _ in range(STEPS):
            loss = F.cross_entropy(m(ids[:, :-1]).reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            if m.lm_head.weight.grad is not None:
                eot_row_grad = float(m.lm_head.weight.grad[EOT].norm())
            opt.step()
        with torch.no_grad():
            logits = m(ids[:, :-1])
            eot_loss = F.cross_entropy(logits[:, -1], ids[:, -1])  # can the model emit <|eot_id|>?
            eot_logit = logits[:, -1, EOT].abs().max()
        return {"untrained_tokens_in_batch": len(found), "untrained_token_ids": " ".join(map(str, found)),
                "loss": num(loss), "eot_loss": num(eot_loss), "eot_logit_abs_max": num(eot_logit),
                "eot_row_grad_norm": eot_row_grad}

    def failed(self, evidence: dict[str, Any]) -> bool:
        """Non-finite as usual, or <|eot_id|> still not learned after training."""
        eot = evidence.get("eot_loss")
        return super().failed(evidence) or (isinstance(eot, float) and eot >= LEARNED)


def main() -> int:
    return cli_main(UntrainedTemplateTokens)


if __name__ == "__main__":
    raise SystemExit(main())
