"""`KBCallback` for Lightning: watches the step loss and the metrics the module already logs, and at the first
sign of trouble diagnoses the run from what the Trainer and the LightningModule know."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older standalone package name
    from pytorch_lightning.callbacks import Callback

from kb.canonical import LIGHTNING_PRECISION
from kb.integrations.collect import Collected, deepspeed_config, derive_precision, model_facts
from kb.integrations.monitor import Session


class KBCallback(Callback):
    """Reads the step's loss and `trainer.callback_metrics` every `log_every_n_steps` steps (when Lightning logs
    anyway); on trouble collects facts, diagnoses, prints, writes `<output_dir>/kb-diagnosis.json` (default:
    the trainer's log dir), optionally stops (`stop_on_nan`), posts to a webhook, and probes (`probe=True`)."""

    def __init__(self, stop_on_nan: bool = False, webhook: str | None = None, probe: bool = False,
                 output_dir: str | Path | None = None, kb: Any = None, records: int = 20, jump: float = 100.0,
                 print_report: bool = True, tokenizer: Any = None) -> None:
        self.session = Session(output_dir=output_dir, stop_on_nan=stop_on_nan, webhook=webhook, probe=probe, kb=kb,
                               records=records, jump=jump, print_report=print_report)
        self.tokenizer = tokenizer
        self._batches: deque[Any] = deque(maxlen=1)

    @property
    def diagnosis(self):
        return self.session.diagnosis

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.session.output_dir is None:
            self.session.output_dir = Path(trainer.log_dir or trainer.default_root_dir)
        self._batches = deque(maxlen=max(1, int(trainer.accumulate_grad_batches)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.session.probe:
            self._batches.append(batch)  # a reference only
        if not trainer.is_global_zero:
            return
        every = max(1, int(trainer.log_every_n_steps or 1))
        if trainer.global_step % every and trainer.global_step > 1:
            return
        metrics: dict[str, Any] = dict(trainer.callback_metrics)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            metrics["loss"] = loss
        trouble = self.session.monitor.observe(trainer.global_step, metrics)
        if trouble is None:
            return
        self.session.handle(trouble, lambda c: self._fill(c, trainer, pl_module),
                            lambda c: self._probe(c, pl_module))
        if self.session.should_stop(trouble):
            trainer.should_stop = True

    def _fill(self, c: Collected, trainer: Any, pl_module: Any) -> None:
        prec = str(getattr(trainer, "precision", "32-true"))
        compute, weights = LIGHTNING_PRECISION.get(prec, (None, None))
        if compute:
            how = "no mixed precision" if compute == "fp32" else "Lightning precision"
            c.set("precision", compute, f"Trainer(precision={prec!r}): {how}")
        if weights:
            c.set("weights_dtype", weights, f"Trainer(precision={prec!r}) stores the weights in {weights}")
        opts = trainer.optimizers or []
        if opts:
            opt = opts[0]
            c.set("optim", type(opt).__name__.lower(), f"optimizer {type(opt).__name__}")
            lr = opt.param_groups[0].get("lr")
            c.set("learning_rate", float(lr), f"optimizer param_groups[0]['lr'] = {lr}")
        acc = int(trainer.accumulate_grad_batches)
        c.set("gradient_accumulation_steps", acc, f"Trainer(accumulate_grad_batches={acc})")
        if trainer.gradient_clip_val:
            c.set("max_grad_norm", float(trainer.gradient_clip_val), f"Trainer(gradient_clip_val={trainer.gradient_clip_val})")
        c.set("world_size", int(trainer.world_size), f"trainer.world_size = {trainer.world_size}")
        ds = getattr(trainer.strategy, "config", None)
        if isinstance(ds, dict):
            deepspeed_config(c, ds, type(trainer.strategy).__name__)
        inner = getattr(pl_module, "model", None)
        model_facts(c, inner if hasattr(inner, "named_parameters") else pl_module, self.tokenizer)
        derive_precision(c)

    def _probe(self, c: Collected, pl_module: Any) -> None:
        from kb.integrations.probe import probe

        def loss_fn(b: Any) -> Any:
            return pl_module.training_step(b, 0)

        model = getattr(pl_module, "model", None)
        probe(c, model if hasattr(model, "named_parameters") else pl_module, list(self._batches), loss_fn,
              tokenizer=self.tokenizer, rank=int(getattr(pl_module, "global_rank", 0)))
