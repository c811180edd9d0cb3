"""`KBCallback` for the HF `Trainer` and the TRL trainers built on it: watches the logged metrics, and at the
first sign of trouble diagnoses the run from what the trainer knows."""

from __future__ import annotations

import inspect
from collections import deque
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback

from kb.integrations.collect import Collected, derive_precision, model_facts, trainer_args
from kb.integrations.monitor import Session


def _find_trainer() -> Trainer | None:
    """The Trainer whose loop is calling us: callbacks are not handed the trainer, but its method is on the stack
    (looked up once, at train begin)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            obj = frame.f_locals.get("self")
            if isinstance(obj, Trainer):
                return obj
            frame = frame.f_back
    finally:
        del frame
    return None


class KBCallback(TrainerCallback):
    """Costs one dict scan per log call until a logged loss / grad norm / KL / reward goes bad; then collects the
    run's facts, diagnoses, prints the report and writes `<output_dir>/kb-diagnosis.json`.

    stop_on_nan: stop training on a NaN / inf / exact-zero collapse. webhook: a Slack, Feishu or DingTalk
    incoming-webhook URL. probe: keep references to the last micro-batches and, on trouble, re-run them with
    hooks (tensor-level evidence). kb: a KnowledgeBase (default: `KnowledgeBase.open()`)."""

    def __init__(self, stop_on_nan: bool = False, webhook: str | None = None, probe: bool = False,
                 output_dir: str | Path | None = None, kb: Any = None, records: int = 20, jump: float = 100.0,
                 print_report: bool = True) -> None:
        self.session = Session(output_dir=output_dir, stop_on_nan=stop_on_nan, webhook=webhook, probe=probe, kb=kb,
                               records=records, jump=jump, print_report=print_report)
        self.trainer: Trainer | None = None
        self._batches: deque[Any] = deque(maxlen=16)
        self._model: Any = None
        self._tokenizer: Any = None

    @property
    def diagnosis(self):
        return self.session.diagnosis

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._model = model
        self._tokenizer = processing_class or kwargs.get("tokenizer")
        if self.session.output_dir is None:
            self.session.output_dir = Path(args.output_dir)
        self.trainer = self.trainer or _find_trainer()
        if self.session.probe and self.trainer is not None:
            self._batches = deque(maxlen=max(1, args.gradient_accumulation_steps * max(1, int(args.logging_steps))))
            self._wrap_compute_loss(self.trainer)

    def _wrap_compute_loss(self, trainer: Trainer) -> None:
        # Only a reference per micro-batch is kept (the tensors the step holds anyway), no copy, no sync.
        inner = trainer.compute_loss
        keep = self._batches

        def compute_loss(model, inputs, *a, **kw):
            keep.append(inputs)
            return inner(model, inputs, *a, **kw)

        trainer.compute_loss = compute_loss
        self._inner_compute_loss = inner

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:  # logged metrics are already reduced across ranks
            return
        trouble = self.session.monitor.observe(state.global_step, logs)
        if trouble is None:
            return
        self.session.handle(trouble, lambda c: self._fill(c, args, state), self._probe)
        if self.session.should_stop(trouble):
            control.should_training_stop = True

    def _fill(self, c: Collected, args: Any, state: Any) -> None:
        trainer_args(c, args, type(self.trainer).__name__ if self.trainer is not None else "")
        if self.trainer is not None:
            mod = type(self.trainer).__module__
            c.set("framework", "trl" if mod.startswith("trl") else "transformers",
                  f"trainer class {mod}.{type(self.trainer).__name__}")
        model = self._model if self._model is not None else getattr(self.trainer, "model", None)
        model_facts(c, model, self._tokenizer)
        derive_precision(c)
        c.set("world_size", int(args.world_size), f"TrainingArguments.world_size = {args.world_size}")

    def _probe(self, c: Collected) -> None:
        from kb.integrations.probe import probe

        trainer = self.trainer
        if trainer is None:
            c.add("findings", "# probe skipped: the Trainer was not found", "probe")
            return
        model = trainer.model
        ctx = getattr(trainer, "compute_loss_context_manager", None)
        probe(c, model, list(self._batches), lambda b: self._inner_compute_loss(model, b),
              tokenizer=self._tokenizer, rank=int(trainer.args.process_index), context=ctx)
