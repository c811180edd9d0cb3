"""The opt-in tensor probe: re-runs the failing micro-batches with forward/backward hooks and turns what it
sees (non-finite modules, activations against the dtype's maximum, supervised tokens, response lengths,
untrained embedding rows, trainable dtypes) into facts."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from kb.integrations.collect import Collected

IGNORE = -100
NEAR_MAX = 0.5  # an fp16 activation above half the dtype's maximum is one doubling away from inf


def _tensors(x: Any) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)
    elif hasattr(x, "to_tuple"):  # transformers ModelOutput
        yield from _tensors(x.to_tuple())


def batch_findings(c: Collected, batches: list[Any], rank: int = 0) -> None:
    """Supervised tokens per micro-batch (labels != -100 after the causal shift) and, for preference batches,
    response lengths after truncation; read from the batches alone, no model call."""
    last = c.records[-1].get("step") if c.records else None
    of = f" of step {last}" if last is not None else ""
    per_batch: list[int] = []
    min_resp: tuple[int, str] | None = None
    for i, b in enumerate(batches, 1):
        if not isinstance(b, dict):
            continue
        if isinstance(b.get("labels"), torch.Tensor) and b["labels"].dim() == 2:
            n = int((b["labels"][:, 1:] != IGNORE).sum())
            per_batch.append(n)
            if n == 0:
                c.add("zero_supervised_microbatches", i, f"micro-batch {i}{of} (rank {rank})")
                c.add("errors", "labels_all_masked", f"micro-batch {i}{of} (rank {rank}) has 0 supervised tokens")
                c.add("findings", f"micro-batch {i}{of} on rank {rank} has 0 supervised tokens: no supervised tokens, "
                      f"every label is -100 ({tuple(b['labels'].shape)} labels)", "probe")
        for key in ("chosen_labels", "rejected_labels", "completion_labels"):
            lab = b.get(key)
            if isinstance(lab, torch.Tensor) and lab.dim() == 2:
                lens = (lab != IGNORE).sum(-1)
                m = int(lens.min())
                if min_resp is None or m < min_resp[0]:
                    min_resp = (m, f"micro-batch {i}{of} {key.split('_')[0]} row {int(lens.argmin())}")
        prompt = b.get("prompt_input_ids")
        if isinstance(prompt, torch.Tensor):
            mask = b.get("prompt_attention_mask")
            plen = int((mask.sum(-1) if isinstance(mask, torch.Tensor) else torch.tensor([prompt.shape[-1]])).max())
            if plen > c.value("longest_prompt_tokens", -1):
                c.set("longest_prompt_tokens", plen, f"longest prompt in micro-batch {i}: {plen} tokens")
    if per_batch:
        c.set("supervised_tokens", per_batch, f"supervised tokens per micro-batch on rank {rank}: {per_batch}")
    if min_resp is not None:
        c.set("min_response_tokens", min_resp[0], f"shortest response after truncation: {min_resp[0]} tokens "
              f"({min_resp[1]})")
        if min_resp[0] == 0:
            ml = c.value("max_length")
            c.add("findings", f"empty response after truncation: {min_resp[1]} keeps 0 response tokens"
                  + (f" (max_length {ml})" if ml else "") + "; its length-normalised log-prob is 0/0", "probe")
            lp, ml = c.value("longest_prompt_tokens"), c.value("max_length")
            if lp is not None and ml is not None and lp >= ml:
                c.set("prompt_exceeds_max_length", True, f"a prompt of {lp} tokens fills max_length {ml}")
                c.add("findings", f"the longest prompt ({lp} tokens) fills max_length {ml}", "probe")


def dtype_findings(c: Collected, model: torch.nn.Module) -> None:
    nonfinite = [n for n, p in model.named_parameters() if not torch.isfinite(p.detach()).all()]
    if nonfinite:
        c.set("nonfinite_params", nonfinite[:20], f"{len(nonfinite)} parameter tensors hold nan/inf "
              f"(first: {nonfinite[0]}): the optimizer step already wrote non-finite weights")
        c.add("findings", f"{len(nonfinite)} parameter tensors are non-finite after the update "
              f"(first: {nonfinite[0]})", "probe")


def embedding_findings(c: Collected, model: torch.nn.Module, tokenizer: Any, batches: list[Any]) -> None:
    """Token ids whose embedding rows look untrained (norm far below the typical row), and whether the
    failing batch uses them."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    w = getattr(emb, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return
    with torch.no_grad():
        norms = w.detach().float().norm(dim=-1)
        finite = norms[torch.isfinite(norms)]
        if finite.numel() == 0:
            return
        med = float(finite.median())
        limit = len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else w.shape[0]
        ids = [i for i in torch.nonzero(norms[:limit] <= 1e-3 * med).flatten().tolist()
               if i != getattr(tokenizer, "pad_token_id", None)]
    if not ids:
        return
    used: set[int] = set()
    for b in batches:
        t = b.get("input_ids") if isinstance(b, dict) else None
        if isinstance(t, torch.Tensor):
            used |= set(t.flatten().tolist()) & set(ids)
    c.set("untrained_token_ids", ids[:50], f"{len(ids)} embedding rows with norm <= 1e-3 x median ({med:.3g})")
    if used:
        c.add("errors", "untrained_tokens", f"untrained token ids used in the failing batch: {sorted(used)[:10]}")
        c.add("findings", f"Untrained tokens {sorted(used)[:10]} found in the failing batch (embedding rows with "
              f"near-zero norm)", "probe")


class _Hooks:
    def __init__(self, model: torch.nn.Module) -> None:
        self.first_fwd: str | None = None
        self.first_bwd: str | None = None
        self.peak: dict[str, tuple[float, torch.dtype]] = {}
        self.handles: list[Any] = []
        for name, mod in model.named_modules():
            if not name:
                continue
            self.handles.append(mod.register_forward_hook(self._fwd(name)))
            self.handles.append(mod.register_full_backward_hook(self._bwd(name)))

    def _fwd(self, name: str) -> Callable:
        def hook(_mod: Any, _inp: Any, out: Any) -> None:
            for t in _tensors(out):
                if not t.is_floating_point():
                    continue
                d = t.detach()
                finite = torch.isfinite(d)
                if self.first_fwd is None and not bool(finite.all()):
                    self.first_fwd = name
                vals = d.abs().masked_fill(~finite, 0)
                peak = float(vals.max()) if vals.numel() else 0.0
                if bool(torch.isinf(d).any()) and d.dtype in (torch.float16, torch.bfloat16):
                    peak = float(torch.finfo(d.dtype).max)  # inf in a half dtype: it overflowed past the max
                old = self.peak.get(name)
                if old is None or peak > old[0]:
                    self.peak[name] = (peak, d.dtype)
        return hook

    def _bwd(self, name: str) -> Callable:
        def hook(_mod: Any, grad_in: Any, grad_out: Any) -> None:
            if self.first_bwd is None and any(not bool(torch.isfinite(g).all()) for g in _tensors(grad_out)):
                self.first_bwd = name
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _layer(name: str) -> str:
    """`model.layers.23.self_attn.o_proj` -> `model.layers.23`: the per-layer bucket of the peak table."""
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return name


def hooked_rerun(c: Collected, model: torch.nn.Module, batches: list[Any], loss_fn: Callable[[Any], Any],
                 context: Callable[[], Any] | None = None) -> None:
    """Forward and backward of each micro-batch with hooks; gradients are zeroed afterwards."""
    hooks = _Hooks(model)
    losses: list[float] = []
    quiet = warnings.catch_warnings()  # torch warns about hooks on modules that return ModelOutput dicts
    quiet.__enter__()
    warnings.simplefilter("ignore", UserWarning)
    try:
        for b in batches:
            with context() if context is not None else contextlib.nullcontext():
                out = loss_fn(b)
            loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", out)
            if isinstance(loss, tuple):
                loss = loss[0]
            if not isinstance(loss, torch.Tensor):
                continue
            losses.append(float(loss.detach().float()))
            if loss.requires_grad:
                loss.backward()
    finally:
        quiet.__exit__(None, None, None)
        hooks.remove()
        model.zero_grad(set_to_none=True)
    if losses:
        c.set("probe_losses", losses, f"losses of the re-run micro-batches: {losses}")
    # After an update that wrote NaN weights, the re-run shows the update's result, not where it started.
    after = " (weights already non-finite)" if c.value("nonfinite_params") else ""
    if hooks.first_fwd:
        c.set("first_nonfinite_module", hooks.first_fwd, f"first module whose output is non-finite: {hooks.first_fwd}")
        c.add("findings", f"first module whose output is non-finite: {hooks.first_fwd}{after}", "probe")
    if hooks.first_bwd:
        c.set("first_nonfinite_grad_module", hooks.first_bwd,
              f"first module (in backward order) whose gradient is non-finite: {hooks.first_bwd}")
        c.add("findings", f"first module whose gradient is non-finite (backward order): {hooks.first_bwd}{after}",
              "probe")
    per_layer: dict[str, tuple[float, str, torch.dtype]] = {}
    for name, (peak, dt) in hooks.peak.items():
        key = _layer(name)
        if key not in per_layer or peak > per_layer[key][0]:
            per_layer[key] = (peak, name, dt)
    if per_layer:
        c.set("max_activation_per_layer", {k: v[0] for k, v in per_layer.items()},
              "largest |activation| per layer in the re-run")
        peak, name, dt = max(per_layer.values(), key=lambda v: v[0] / float(torch.finfo(v[2]).max))
        dmax = float(torch.finfo(dt).max)
        c.set("max_activation", {"module": name, "value": peak, "dtype": str(dt).replace("torch.", ""),
                                 "dtype_max": dmax},
              f"{name} output reached {peak:.6g} in {str(dt).replace('torch.', '')} (max {dmax:.6g})")
        if dt in (torch.float16, torch.bfloat16) and peak >= NEAR_MAX * dmax:
            c.set("activation_overflow", True, f"{name} output reached {peak:.6g} of {dmax:.6g}")
            c.add("findings", f"{name} output reached {peak:.6g} in {str(dt).replace('torch.', '')} "
                  f"(dtype max {dmax:.6g}): activation overflow", "probe")


def probe(c: Collected, model: torch.nn.Module, batches: list[Any], loss_fn: Callable[[Any], Any],
          tokenizer: Any = None, rank: int = 0, context: Callable[[], Any] | None = None) -> None:
    """All probe findings for the last micro-batches, as facts of `c` (findings also as report lines)."""
    batches = [b for b in batches if b is not None]
    c.add("findings", f"# probe: re-ran {len(batches)} micro-batch(es) with hooks on rank {rank}", "probe")
    batch_findings(c, batches, rank)
    dtype_findings(c, model)
    embedding_findings(c, model, tokenizer, batches)
    if batches and math.isfinite(len(batches)):
        hooked_rerun(c, model, batches, loss_fn, context)
