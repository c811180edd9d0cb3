"""The tensor probe on real tensors: the first non-finite module and an fp16 activation reaching the dtype's
maximum, supervised tokens per micro-batch, empty responses after truncation, untrained embedding rows."""

from __future__ import annotations

import torch

from kb.integrations.collect import Collected
from kb.integrations.probe import probe
from kb.repro.tiny import tiny_causal_lm, tiny_tokenizer, token_batch


class Blowup(torch.nn.Module):
    """Three fp16 layers; the second multiplies by 1e3 so its output passes 65504 and becomes inf."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8, bias=False).half() for _ in range(3))
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                layer.weight.copy_(torch.eye(8) * (1e3 if i == 1 else 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_first_nonfinite_module_and_fp16_maximum():
    model = Blowup()
    c = Collected()
    probe(c, model, [torch.full((2, 8), 100.0, dtype=torch.float16)], lambda b: model(b).float().sum())
    assert c.value("first_nonfinite_module") == "layers.1"
    act = c.value("max_activation")
    assert act["dtype"] == "float16" and act["value"] == 65504.0 and act["module"].startswith("layers.")
    assert c.value("activation_overflow") is True
    assert any("reached 65504 in float16" in f for f in c.value("findings"))
    assert c.value("nonfinite_params") is None  # the weights themselves are fine
    assert all(p.grad is None for p in model.parameters())  # the probe leaves no gradients behind


def test_supervised_tokens_and_untrained_embedding_rows():
    model = tiny_causal_lm("llama")
    with torch.no_grad():
        model.get_input_embeddings().weight[100:104] = 0.0  # rows never trained (a template's new tokens)
    ids = token_batch(128, (2, 12), seed=1)
    ids[0, 3] = 101
    ok = {"input_ids": ids, "labels": ids.clone()}
    masked = {"input_ids": ids, "labels": torch.full_like(ids, -100)}
    c = Collected(records=[{"loss": float("nan"), "step": 9}])
    probe(c, model, [ok, masked], lambda b: model(**b), tokenizer=tiny_tokenizer())
    assert c.value("supervised_tokens") == [22, 0] and c.value("zero_supervised_microbatches") == [2]
    assert set(c.value("errors")) == {"labels_all_masked", "untrained_tokens"}
    assert c.value("untrained_token_ids") == [100, 101, 102, 103]
    assert any("micro-batch 2 of step 9 on rank 0 has 0 supervised tokens" in f for f in c.value("findings"))
    assert any("Untrained tokens [101] found" in f for f in c.value("findings"))


def test_empty_response_after_truncation():
    lab = torch.tensor([[-100] * 6 + [5, 6], [-100] * 8])
    batch = {"chosen_labels": lab, "rejected_labels": lab, "prompt_input_ids": torch.ones(2, 9, dtype=torch.long),
             "prompt_attention_mask": torch.ones(2, 9, dtype=torch.long)}
    c = Collected()
    c.set("max_length", 8, "CPOConfig max_length=8")
    probe(c, torch.nn.Linear(1, 1), [batch], lambda b: None)
    assert c.value("min_response_tokens") == 0 and c.value("longest_prompt_tokens") == 9
    assert c.value("prompt_exceeds_max_length") is True
