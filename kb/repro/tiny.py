"""Tiny, randomly initialised models and loss helpers shared by repro checks (no downloads, CPU-fast)."""

from __future__ import annotations

from typing import Any

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def torch_dtype(name: str | None) -> torch.dtype:
    """Canonical precision name (kb.canonical: fp16 / bf16 / fp32) -> torch dtype; unknown -> fp32."""
    return DTYPES.get(str(name or "fp32"), torch.float32)


def tiny_config(arch: str = "qwen2", **overrides: Any):
    """A transformers config for a 2-layer, 64-wide model of the given architecture (qwen2 | llama)."""
    import transformers

    kw: dict[str, Any] = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 1024,
                          "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1}
    kw.update(overrides)
    cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[arch]
    return cls(**kw)


def tiny_causal_lm(arch: str = "qwen2", seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu",
                   **overrides: Any):
    """A randomly initialised causal LM built from `tiny_config` (transformers.AutoModelForCausalLM.from_config)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), dtype=dtype)
    return model.to(device)


def tiny_seq_cls(arch: str = "qwen2", seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 num_labels: int = 1, **overrides: Any):
    """A randomly initialised sequence classifier (a reward model: backbone + `score` head)."""
    import transformers

    torch.manual_seed(seed)
    cfg = tiny_config(arch, num_labels=num_labels, **overrides)
    return transformers.AutoModelForSequenceClassification.from_config(cfg, dtype=dtype).to(device)


def token_batch(vocab: int, shape: tuple[int, ...], seed: int, low: int = 2, device: str = "cpu") -> torch.Tensor:
    """Random token ids in [low, vocab) from a private generator seeded with `seed` (the global RNG is untouched).
    `low` defaults to 2 so that batches avoid `tiny_config`'s pad (0) and bos/eos (1) ids; use 0 for labels."""
    return torch.randint(low, vocab, shape, generator=torch.Generator().manual_seed(seed)).to(device)


class TinyLM(torch.nn.Module):
    """Embedding -> MLP -> vocabulary logits: enough to produce real per-token log-probs and gradients fast,
    for mechanisms that live in the loss rather than in the transformer."""

    def __init__(self, vocab: int = 64, hidden: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU())
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(ids)))


def token_logps(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token log-prob of `labels` under next-token `logits` (already aligned); 0 where the label is ignored."""
    mask = labels != ignore_index
    safe = labels.masked_fill(~mask, 0)
    lp = logits.float().log_softmax(-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return lp * mask


def scaled(length: int, limit: int, longest: int) -> int:
    """Scale a length so that the longest of a check's lengths becomes at most `limit`, keeping ratios and
    equalities (max_prompt_length == max_length stays equal): checks run user lengths like 8192 in seconds."""
    if longest <= limit:
        return int(length)
    return max(1, round(length * limit / longest))


# -- helpers for framework-level checks (real trainer code on a tiny model) ----------------------------------------

TINY_PAD, TINY_EOS, TINY_UNK = "[PAD]", "</s>", "[UNK]"


def tiny_tokenizer(vocab: int = 128):
    """A word-level fast tokenizer built in memory whose ids match `tiny_config`: pad 0, bos/eos 1, unk 2, and one
    token per word `w0`, `w1`, ... up to `vocab`. Text for it is made with `tiny_words`. No files, no downloads."""
    import tokenizers
    import transformers

    words = [TINY_PAD, TINY_EOS, TINY_UNK] + [f"w{i}" for i in range(vocab - 3)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=TINY_UNK))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=TINY_UNK, pad_token=TINY_PAD,
                                                eos_token=TINY_EOS, bos_token=TINY_EOS)


def tiny_words(n: int, seed: int, vocab: int = 128) -> str:
    """`n` random words of `tiny_tokenizer` (exactly n tokens once tokenised), reproducible from `seed`."""
    ids = torch.randint(0, vocab - 3, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return " ".join(f"w{i}" for i in ids)


def supported_kwargs(cls: type, **kwargs: Any) -> dict[str, Any]:
    """The subset of `kwargs` that a (dataclass) config class of the installed framework version accepts:
    framework-level checks run across releases whose config fields come and go (e.g. TRL's max_prompt_length)."""
    fields = getattr(cls, "__dataclass_fields__", None)
    if fields is None:
        import inspect

        fields = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in fields}


def trainer_args(cls: type, out_dir: str, device: str, **kwargs: Any):
    """A TrainingArguments subclass (TRL's configs) for a few quiet steps on `device`: no reporting, no saving, no
    dataloader workers; keys this version does not know are dropped (see `supported_kwargs`)."""
    base = {"output_dir": out_dir, "report_to": [], "save_strategy": "no", "logging_steps": 1,
            "per_device_train_batch_size": 2, "dataloader_num_workers": 0, "disable_tqdm": True,
            "use_cpu": not device.startswith("cuda"), "seed": 0, "remove_unused_columns": False}
    return cls(**supported_kwargs(cls, **{**base, **kwargs}))


def quiet(trainer):
    """Drop a Trainer's console callbacks (its log printer and progress bar) so a check's stdout stays one verdict;
    the numbers are read from `trainer.state.log_history` instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer
