"""Trouble detection over the metrics a loop already logs, and the shared act-on-trouble path of all three
integrations (collect facts -> optional probe -> diagnose -> print / write / stop / post)."""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kb.integrations.collect import Collected, clean_record, diagnose_collected, environment, versions

if TYPE_CHECKING:
    from kb.diagnose.models import Diagnosis
    from kb.kb import KnowledgeBase

_SKIP = {"epoch", "learning_rate", "lr", "step", "global_step", "total_flos", "train_runtime", "num_tokens",
         "train_samples_per_second", "train_steps_per_second", "train_loss"}
MIN_LOSS_SCALE = 1.0  # DeepSpeed's default min_loss_scale; GradScaler never goes below it in practice either


def _is_watched(name: str) -> bool:
    n = name.lower()
    return "loss" in n and "scale" not in n or "grad_norm" in n


@dataclass
class Trouble:
    step: int | None
    reason: str
    nonfinite: bool  # a NaN / inf (stop_on_nan acts on these, and on exact-zero collapses)


class Monitor:
    """Keeps the last `keep` records and fires once on: a non-finite metric (loss, grad norm, KL, rewards ...),
    a loss or grad norm at exactly 0.0 after non-zero values, a jump by `jump`x over the recent median, the loss
    scale at its minimum, or rewards that are all equal."""

    def __init__(self, keep: int = 20, jump: float = 100.0) -> None:
        self.records: deque[dict[str, Any]] = deque(maxlen=keep)
        self.jump = jump
        self._nonzero: set[str] = set()
        self._recent: dict[str, deque[float]] = {}
        self._kinds: dict[str, int] = {}
        self.fired: Trouble | None = None

    def observe(self, step: int | None, metrics: dict[str, Any]) -> Trouble | None:
        # A warning (jump, equal rewards) may be followed by one decisive NaN / zero collapse; then silence.
        if self.fired is not None and self.fired.nonfinite:
            return None
        rec = clean_record(step, metrics)
        if not rec:
            return None
        self.records.append(rec)
        kinds = self._kinds
        for k, v in rec.items():
            kind = kinds.get(k)
            if kind is None:
                kind = kinds[k] = _kind(k)
            if kind == _IGNORED:
                continue
            t = self._check(k, kind, v, step)
            if t is not None and (self.fired is None or t.nonfinite):
                self.fired = t
                return t
        return None

    def _check(self, k: str, kind: int, v: float, step: int | None) -> Trouble | None:
        if math.isfinite(v) and kind == _OTHER:
            return None
        at = f" at step {step}" if step is not None else ""
        if not math.isfinite(v):
            return Trouble(step, f"{k} is {v}{at}", True)
        if kind == _SCALE:
            return Trouble(step, f"loss scale at its minimum ({v:g}){at}", True) if v <= MIN_LOSS_SCALE else None
        if kind == _REWARD_STD:
            return Trouble(step, f"rewards all equal ({k} = {v:g}){at}", False) if v == 0.0 else None
        if kind == _ZERO_STD_FRAC:
            return Trouble(step, f"rewards all equal ({k} = {v:g}){at}", False) if v >= 1.0 else None
        if kind != _WATCHED:
            return None
        if v == 0.0:
            if k in self._nonzero:
                return Trouble(step, f"{k} dropped to exactly 0.0 after non-zero values{at}", True)
        else:
            self._nonzero.add(k)
        hist = self._recent.get(k)
        if hist is None:
            hist = self._recent[k] = deque(maxlen=8)
        # min <= median: the cheap test filters nearly every healthy step before the sort.
        if hist and v > 1.0 and v > self.jump * min(hist):
            med = sorted(hist)[len(hist) // 2]
            if med > 0 and v > self.jump * med:
                hist.append(v)
                return Trouble(step, f"{k} jumped from ~{med:.3g} to {v:.3g} ({v / med:.0f}x){at}", False)
        hist.append(abs(v))
        return None


_IGNORED, _WATCHED, _SCALE, _REWARD_STD, _ZERO_STD_FRAC, _OTHER = range(6)


def _kind(name: str) -> int:
    """What a metric name is watched for, decided once per name."""
    n = name.lower()
    if name in _SKIP or n.startswith("eval_") and n != "eval_loss":
        return _IGNORED
    if n in ("loss_scale", "scale", "grad_scale", "scaler/scale"):
        return _SCALE
    if n.endswith("reward_std"):
        return _REWARD_STD
    if n.endswith("frac_reward_zero_std"):
        return _ZERO_STD_FRAC
    return _WATCHED if _is_watched(name) else _OTHER


class Session:
    """What the three integrations share: options, the monitor, and the act-on-trouble path."""

    def __init__(self, output_dir: str | Path | None = None, stop_on_nan: bool = False, webhook: str | None = None,
                 probe: bool = False, kb: KnowledgeBase | None = None, records: int = 20, jump: float = 100.0,
                 print_report: bool = True, source: str = "running trainer") -> None:
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.stop_on_nan = stop_on_nan
        self.webhook = webhook
        self.probe = probe
        self._kb = kb
        self.monitor = Monitor(keep=records, jump=jump)
        self.print_report = print_report
        self.source = source
        self.diagnosis: Diagnosis | None = None
        self.collected: Collected | None = None
        self.report_path: Path | None = None

    @property
    def kb(self) -> KnowledgeBase:
        if self._kb is None:
            from kb.kb import KnowledgeBase

            self._kb = KnowledgeBase.open()
        return self._kb

    def should_stop(self, trouble: Trouble) -> bool:
        return self.stop_on_nan and trouble.nonfinite

    def handle(self, trouble: Trouble, fill: Callable[[Collected], None],
               probe: Callable[[Collected], None] | None = None) -> Diagnosis | None:
        """Collect (the integration's `fill` adds what its loop knows), probe if asked, diagnose, act. Any failure
        here is reported and swallowed: a diagnosis helper must never be what kills a training run."""
        from kb.integrations import report

        c = Collected(trigger=trouble.reason, source=self.source)
        try:
            fill(c)
            versions(c)
            if "gpu" not in c.facts:
                environment(c)
            c.records = list(self.monitor.records)
            if self.probe and probe is not None:
                try:
                    probe(c)
                except Exception as e:  # noqa: BLE001 - the probe re-runs user code; its failure must not hide the diagnosis
                    c.add("findings", f"# probe failed: {type(e).__name__}: {e}", "probe")
            self.collected = c
            diag = diagnose_collected(self.kb, c)
        except Exception as e:  # noqa: BLE001 - a diagnosis helper must never be what kills a training run
            print(f"kb: could not diagnose ({type(e).__name__}: {e})", file=sys.stderr)
            return None
        self.diagnosis = diag
        if self.print_report:
            print(report.format_report(diag, c), file=sys.stderr)
        if self.output_dir is not None:
            self.report_path = report.write_json(diag, self.output_dir)
        if self.webhook:
            try:
                report.post_webhook(self.webhook, diag, c)
            except Exception as e:  # noqa: BLE001 - a chat outage must not stop training
                print(f"kb: webhook post failed ({type(e).__name__}: {e})", file=sys.stderr)
        return diag
