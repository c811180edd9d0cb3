"""`kb.watch(model, optimizer)` for a plain PyTorch loop: a context manager with a per-step call that reads the
numbers the loop already computes, and diagnoses at the first sign of trouble."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kb.integrations.collect import Collected, derive_precision, model_facts
from kb.integrations.monitor import Session


class Watch:
    """Call `w.step(loss=..., grad_norm=..., batch=batch)` once per optimizer step; it returns True when training
    should stop (stop_on_nan and a NaN / inf / zero collapse). Floats cost nothing; a tensor is read with one
    `.item()`, so pass the values you already log (or set `every`)."""

    def __init__(self, model: Any, optimizer: Any = None, output_dir: str | Path | None = None,
                 stop_on_nan: bool = False, webhook: str | None = None, probe: bool = False,
                 loss_fn: Callable[[Any, Any], Any] | None = None, scaler: Any = None, precision: str | None = None,
                 tokenizer: Any = None, kb: Any = None, every: int = 1, records: int = 20, jump: float = 100.0,
                 print_report: bool = True) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.loss_fn, self.precision, self.tokenizer = loss_fn, precision, tokenizer
        self.every = max(1, int(every))
        self.session = Session(output_dir=output_dir, stop_on_nan=stop_on_nan, webhook=webhook, probe=probe, kb=kb,
                               records=records, jump=jump, print_report=print_report)
        self._batches: deque[Any] = deque(maxlen=1)
        self._n = 0
        self.stopped = False

    @property
    def diagnosis(self):
        return self.session.diagnosis

    def __enter__(self) -> Watch:  # noqa: PYI034 - py310 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self._batches.clear()

    def step(self, step: int | None = None, batch: Any = None, **metrics: Any) -> bool:
        self._n += 1
        step = self._n if step is None else step
        if self.session.probe and batch is not None:
            self._batches.append(batch)
        if self._n % self.every:
            return False
        if self.scaler is not None and self.scaler.is_enabled():
            metrics["loss_scale"] = self.scaler.get_scale()
        trouble = self.session.monitor.observe(step, metrics)
        if trouble is None:
            return False
        self.session.handle(trouble, self._fill, self._probe)
        if self.session.should_stop(trouble):
            self.stopped = True
        return self.stopped

    def _fill(self, c: Collected) -> None:
        if self.precision:
            c.update_config({"precision": self.precision}, "kb.watch(precision=...)")
        elif self.scaler is not None and self.scaler.is_enabled():
            c.set("precision", "fp16", "a GradScaler is in use (fp16 autocast)")
        else:
            c.set("precision", "fp32", "kb.watch: no scaler, no precision given (no mixed precision)")
        opt = self.optimizer
        if opt is not None:
            c.set("optim", type(opt).__name__.lower(), f"optimizer {type(opt).__name__}")
            group = opt.param_groups[0]
            c.set("learning_rate", float(group["lr"]), f"optimizer param_groups[0]['lr'] = {group['lr']}")
            if "eps" in group:
                c.set("adam_eps", float(group["eps"]), f"optimizer eps = {group['eps']}")
        model_facts(c, self.model, self.tokenizer)
        derive_precision(c)

    def _probe(self, c: Collected) -> None:
        from kb.integrations.probe import probe

        def run(b: Any) -> Any:
            if self.loss_fn is not None:
                return self.loss_fn(self.model, b)
            return self.model(**b) if isinstance(b, dict) else self.model(b)

        probe(c, self.model, list(self._batches), run, tokenizer=self.tokenizer)


def watch(model: Any, optimizer: Any = None, **kwargs: Any) -> Watch:
    """`with kb.watch(model, optimizer, output_dir="out") as w: ... w.step(loss=loss.item(), batch=batch)`."""
    return Watch(model, optimizer, **kwargs)
