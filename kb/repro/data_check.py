"""Counts, on a user's own JSONL data and tokenizer, the samples that end with an empty response or leave a
sequence-parallel shard without labels at their max_length / max_prompt_length / sequence_parallel_size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from kb.errors import InputError, NotFound

PROMPT_KEYS = ("prompt", "query", "question", "instruction", "input")
RESPONSE_KEYS = ("chosen", "rejected", "completion", "response", "output", "answer")
MAX_EXAMPLES = 10


class DataReport(BaseModel):
    """What the data check found; `*_lines` are 1-based JSONL line numbers of the first offending samples."""

    samples: int = 0
    skipped: int = 0  # lines that were not a usable sample
    max_length: int
    max_prompt_length: int | None = None
    sequence_parallel_size: int = 1
    empty_response: int = 0
    empty_response_lines: list[int] = Field(default_factory=list)
    label_less_shard: int = 0
    label_less_shard_lines: list[int] = Field(default_factory=list)
    longest_prompt_tokens: int = 0

    @property
    def triggered(self) -> bool:
        return bool(self.empty_response or self.label_less_shard)


def _text(v: Any) -> str:
    if isinstance(v, list):  # conversational fields: [{"role": ..., "content": ...}]
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in v)
    return "" if v is None else str(v)


def split_sample(row: dict[str, Any]) -> tuple[str, list[str]] | None:
    """(prompt, responses) of one sample in a common JSONL layout: prompt/chosen/rejected, prompt/completion,
    instruction/input/output, query/response, or chat `messages` (last assistant turn = the response)."""
    if isinstance(row.get("messages") or row.get("conversations"), list):
        msgs = row.get("messages") or row.get("conversations")
        if not msgs:
            return None
        *head, last = msgs
        return _text(head), [_text([last])]
    prompt = "\n".join(_text(row[k]) for k in PROMPT_KEYS if row.get(k))
    responses = [_text(row[k]) for k in RESPONSE_KEYS if k in row and row[k] is not None]
    return (prompt, responses) if responses else None


def response_tokens(n_prompt: int, n_response: int, max_length: int, max_prompt_length: int | None) -> int:
    """Response tokens left after truncation: the prompt is cut to max_prompt_length when the pair is too long,
    then the response to max_length - max_prompt_length (TRL's DPO/CPO order); without max_prompt_length the
    prompt is kept and the response fills what is left."""
    if n_prompt + n_response <= max_length:
        return n_response
    if max_prompt_length is None:
        return max(0, min(n_response, max_length - n_prompt))
    n_prompt = min(n_prompt, max_prompt_length)
    if n_prompt + n_response <= max_length:
        return n_response
    return max(0, min(n_response, max_length - max_prompt_length))


def has_label_less_shard(n_prompt: int, n_response: int, max_length: int, sp: int) -> bool:
    """Cut the (truncated) sequence into `sp` equal shards (padded to a multiple of sp): does a shard hold
    no response token? Prompt positions and padding carry no labels."""
    if sp <= 1:
        return False
    total = min(n_prompt + n_response, max_length)
    first_label = min(n_prompt, total)
    shard = -(-total // sp)  # ceil
    return any(not (start < total and start + shard > first_label)
               for start in range(0, shard * sp, shard))


def load_tokenizer(path: str | Path):
    """A local tokenizer folder (no downloads)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise NotFound(f"no tokenizer at {path}: {e}") from None


def check_data(data: str | Path, tokenizer: str | Path | Any, max_length: int, max_prompt_length: int | None = None,
               sequence_parallel_size: int | None = 1, limit: int | None = None) -> DataReport:
    """Tokenize each JSONL sample and count those whose response is empty after truncation, and (for
    sequence_parallel_size > 1) those that leave a shard without labels."""
    path = Path(data)
    if not path.is_file():
        raise NotFound(f"no such data file: {path}")
    if not max_length or max_length <= 0:
        raise InputError("the data check needs max_length (from --config or --set max_length=N)")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    sp = int(sequence_parallel_size or 1)
    rep = DataReport(max_length=int(max_length), max_prompt_length=max_prompt_length, sequence_parallel_size=sp)

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0

    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and rep.samples >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                parts = split_sample(row) if isinstance(row, dict) else None
            except json.JSONDecodeError:
                parts = None
            if parts is None:
                rep.skipped += 1
                continue
            prompt, responses = parts
            n_prompt = count(prompt)
            rep.samples += 1
            rep.longest_prompt_tokens = max(rep.longest_prompt_tokens, n_prompt)
            lens = [count(r) for r in responses]
            if any(response_tokens(n_prompt, n, max_length, max_prompt_length) == 0 for n in lens):
                rep.empty_response += 1
                if len(rep.empty_response_lines) < MAX_EXAMPLES:
                    rep.empty_response_lines.append(lineno)
            if any(has_label_less_shard(n_prompt, n, max_length, sp) for n in lens):
                rep.label_less_shard += 1
                if len(rep.label_less_shard_lines) < MAX_EXAMPLES:
                    rep.label_less_shard_lines.append(lineno)
    if rep.samples == 0:
        raise InputError(f"{path}: no usable samples (expected JSONL with prompt/chosen/rejected, prompt/completion, "
                         "instruction/output, query/response or messages)")
    return rep
