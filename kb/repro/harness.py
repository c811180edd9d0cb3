"""Repro-check harness: one interface (`ReproCheck`) and one verdict (`Verdict`) for every incidents/<id>/repro.py.

A check reproduces an incident's mechanism with real PyTorch arithmetic twice on the same inputs, once as the
incident ran (`fixed=False`) and once with the fix applied (`fixed=True`), and says whether a user's settings
trigger the mechanism. `evaluate()` turns that into a `Verdict`; `cli_main()` gives every check the same
command line (`python incidents/<id>/repro.py --device cpu --json`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, field_serializer, field_validator

from kb.records import Incident

# Exit codes shared by a check's own CLI and `kb repro`.
EXIT_CONFIRMED = 0  # reproduced with the fault, finite with the fix (and the user's settings do not rule it out)
EXIT_NOT_CONFIRMED = 1
EXIT_ERROR = 2

Number = float | int | bool | str | None

_NONFINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
              "-infinity": -math.inf}


def _decode(v: Any) -> Any:
    """JSON strings "nan"/"inf"/"-inf" back to floats, recursively (the JSON form cannot carry NaN)."""
    if isinstance(v, str) and v.strip().lower() in _NONFINITE:
        return _NONFINITE[v.strip().lower()]
    if isinstance(v, dict):
        return {k: _decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


def _encode(v: Any) -> Any:
    """Non-finite floats as "nan"/"inf"/"-inf" so the verdict stays strict JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    return v


class Verdict(BaseModel):
    """What one check run showed. `evidence` holds numbers per run: faulty / fixed / user / framework."""

    incident_id: str
    reproduced: bool = False  # the faulty run shows the failure (NaN / inf / collapse / error)
    fixed: bool = False  # the same inputs with the fix applied stay finite
    device: str = "cpu"
    dtype: str = "fp32"
    torch: str = ""
    framework_versions: dict[str, str] = Field(default_factory=dict)
    evidence: dict[str, dict[str, Number]] = Field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)  # the settings the check ran with
    # Do the settings in effect (the user's when given, else the reported ones) trigger the mechanism?
    # None: cannot tell from settings alone (e.g. depends on how batches are composed).
    user_settings_trigger: bool | None = None
    gpu_only_effect: bool = False  # the effect needs a GPU kernel; a CPU run shows only the arithmetic
    error: str | None = None  # set when the check could not run (exception, timeout, bad input)

    @field_validator("evidence", "settings", mode="before")
    @classmethod
    def _nonfinite_in(cls, v: Any) -> Any:
        return _decode(v)

    @field_serializer("evidence", "settings")
    def _nonfinite_out(self, v: dict[str, Any]) -> Any:
        return _encode(v)

    @property
    def confirmed(self) -> bool:
        """The diagnosis holds: mechanism reproduced, fix works, and the settings in effect do not rule it out."""
        return self.error is None and self.reproduced and self.fixed and self.user_settings_trigger is not False

    @property
    def cpu_only_skip(self) -> bool:
        """A GPU-only effect run on a CPU: nothing was reproduced, by design."""
        return self.gpu_only_effect and self.device == "cpu" and not self.reproduced and self.error is None

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return EXIT_ERROR
        return EXIT_CONFIRMED if self.confirmed else EXIT_NOT_CONFIRMED

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False, indent=indent)


class Skip(Exception):
    """Raised by a check (usually its framework level) when it cannot run here; the message goes into notes."""


def import_framework(name: str):
    """Import a framework for a framework-level check, or raise Skip saying it is absent. Quiets the noise such
    frameworks print on import (TRL's experimental-API warning, transformers' advisory warnings), which would
    otherwise interleave with the verdict on stderr."""
    import importlib
    import os
    import warnings

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a framework-level check never reaches a hub
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    for noisy in (name, "transformers", "accelerate", "datasets"):
        warnings.filterwarnings("ignore", module=rf"{noisy}(\..*)?")
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise Skip(f"{name} is not installed ({e.name or e}); `pip install -e '.[frameworks]'` adds it") from None
    import transformers

    transformers.logging.set_verbosity_error()
    return module


def is_bad(x: Any) -> bool:
    """True for NaN / inf (floats or tensors with any non-finite element)."""
    if hasattr(x, "isfinite"):
        return not bool(x.isfinite().all())
    return isinstance(x, float) and not math.isfinite(x)


def num(x: Any) -> float:
    """A python float from a tensor / number (NaN stays NaN)."""
    return float(x.detach().float().item()) if hasattr(x, "detach") else float(x)


def hf_logged_loss(step_losses: list[float]) -> float:
    """Loss the HF Trainer logs for one window: with logging_nan_inf_filter (its default) a NaN/inf step adds the
    running mean instead of itself, so a window of only NaN steps is logged as 0.0."""
    tr_loss = 0.0
    for n, loss in enumerate(step_losses, start=1):
        tr_loss = tr_loss + tr_loss / n if not math.isfinite(loss) else tr_loss + loss
    return tr_loss / max(len(step_losses), 1)


class ReproCheck:
    """Base class of a repro check. Subclass it in incidents/<id>/repro.py and end the file with
    `main = lambda: cli_main(MyCheck)` (see docs/REPRO.md).

    The incident record (incident.md beside repro.py) is the single source of the check's id, its default
    settings (`config:` updated by `repro.settings:`, the toy-size overrides), its GPU-only flag
    (`repro.gpu_only`) and whether a user's settings trigger the mechanism (the record's `triggers:`, evaluated
    by kb.conditions). A check implements only the mechanism: `run` (faulty and fixed), and optionally
    `run_framework`.

    Class attributes a check may set:
      watch            evidence keys that must be finite for a run to count as healthy
      frameworks       distributions whose versions the verdict reports ("trl", "peft", ...)
    """

    watch: ClassVar[tuple[str, ...]] = ("loss", "grad_norm")
    frameworks: ClassVar[tuple[str, ...]] = ()
    record: ClassVar[Incident | None] = None  # set by load_check / cli_main from the incident folder

    @property
    def incident_id(self) -> str:
        return self.record.id if self.record is not None else ""

    @property
    def defaults(self) -> dict[str, Any]:
        if self.record is None:
            return {}
        known = {"algorithm": self.record.algorithm} if self.record.algorithm not in ("", "unknown") else {}
        return {**known, **self.record.config, **self.record.repro.settings}

    @property
    def gpu_only_effect(self) -> bool:
        return bool(self.record is not None and self.record.repro.gpu_only)

    # -- what a check implements ----------------------------------------------------------------------------
    def settings_from_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        """The user's canonical facts -> this check's settings: every key the record's defaults or triggers use."""
        keys = set(self.defaults)
        if self.record is not None:
            keys |= {c.fact for t in self.record.triggers for c in (*t.all, *t.any, *t.none)}
        return {k: facts[k] for k in keys if facts.get(k) is not None}

    def triggers(self, settings: dict[str, Any]) -> tuple[bool | None, str]:
        """(do these settings trigger the mechanism, why): the record's triggers over the settings as facts.
        None when the settings alone cannot tell."""
        from kb.conditions import decide
        from kb.facts import facts_from_mapping
        from kb.facts.prose import derive

        facts = facts_from_mapping(settings, source="settings")
        derive([], facts, "settings")
        return decide(self.record.triggers if self.record is not None else [], facts)

    def run(self, settings: dict[str, Any], device: str, fixed: bool) -> dict[str, Number]:
        """Run the mechanism once; return numbers (loss, grad_norm, ...). Non-finite values are the evidence."""
        raise NotImplementedError

    def run_framework(self, settings: dict[str, Any], device: str) -> dict[str, Number]:
        """Optional: the same failure through the real framework code. Raise Skip(reason) when unavailable."""
        raise Skip("no framework-level check")

    # -- overridable judgements ------------------------------------------------------------------------------
    def failed(self, evidence: dict[str, Number]) -> bool:
        """Does one run's evidence show the failure? Default: a watched number is NaN / inf, or `error` is set."""
        if evidence.get("error"):
            return True
        return any(is_bad(evidence[k]) for k in self.watch if isinstance(evidence.get(k), float))

    def dtype(self, settings: dict[str, Any]) -> str:
        """The precision the faulty run uses, for the verdict (compute precision, else the weights' dtype)."""
        return str(settings.get("precision") or settings.get("weights_dtype") or "fp32")


def grad_norm(params) -> float:
    """Global L2 norm of the gradients of `params` (NaN when any gradient is NaN / inf)."""
    import torch

    grads = [p.grad.detach().float().flatten() for p in params if p.grad is not None]
    return float(torch.cat(grads).norm()) if grads else 0.0


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise Skip(f"device {device!r} requested but torch {torch.__version__} sees no CUDA GPU")
    return device


def versions(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = "absent"
    return out


def _clean(evidence: dict[str, Any]) -> dict[str, Number]:
    """Tensors -> floats, anything odd -> str, so a check may return loosely typed numbers."""
    out: dict[str, Number] = {}
    for k, v in evidence.items():
        if hasattr(v, "detach"):
            out[k] = num(v)
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
        else:
            out[k] = str(v)
    return out


def _where(e: BaseException) -> str:
    """file:line where an exception was raised, for a one-line error."""
    tb = traceback.extract_tb(e.__traceback__)
    return f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"


def evaluate(check: ReproCheck, device: str = "auto", user_settings: dict[str, Any] | None = None,
             framework: bool = True) -> Verdict:
    """Run a check: faulty and fixed at the reported settings, the user's settings when given, the framework level
    when importable. Never raises for a failing check; exceptions become `Verdict.error`."""
    import torch

    t0 = time.perf_counter()
    notes: list[str] = []
    v = Verdict(incident_id=check.incident_id, torch=torch.__version__,
                framework_versions=versions(("transformers", *check.frameworks)),
                gpu_only_effect=check.gpu_only_effect)
    try:
        v.device = dev = resolve_device(device)
        reported = dict(check.defaults)
        settings = {**reported, **(user_settings or {})}
        v.settings, v.dtype = settings, check.dtype(settings)
        torch.manual_seed(0)
        faulty = _clean(check.run(reported, dev, fixed=False))
        torch.manual_seed(0)
        fixed = _clean(check.run(reported, dev, fixed=True))
        v.evidence = {"faulty": faulty, "fixed": fixed}
        v.reproduced, v.fixed = check.failed(faulty), not check.failed(fixed)
        trig, why = check.triggers(settings)
        v.user_settings_trigger = trig
        who = "your settings" if user_settings else "the reported settings"
        notes.append(f"{who}: {'trigger' if trig else 'do not trigger' if trig is False else 'may trigger'} "
                     f"the mechanism - {why}")
        if user_settings:
            torch.manual_seed(0)
            user = _clean(check.run(settings, dev, fixed=False))
            v.evidence["user"] = user
            bad = check.failed(user)
            if trig is not None and bad != trig:
                # The run replays the faulty code path only; the rule may also weigh versions or data.
                notes.append(f"the faulty code path at your settings was {'non-finite' if bad else 'finite'}; "
                             f"the verdict follows the settings rule above")
        if check.gpu_only_effect and dev == "cpu":
            notes.append("GPU-only effect: this CPU run shows the arithmetic, not the GPU kernel's behaviour")
        if framework:
            try:
                v.evidence["framework"] = fw = _clean(check.run_framework(settings, dev))
                if "affected" in fw:  # checks that run the real trainer say whether this version still fails
                    names = ", ".join(f"{n} {v.framework_versions.get(n, '?')}" for n in check.frameworks)
                    notes.append(f"framework level ({names}): {'still AFFECTED' if fw['affected'] else 'not affected'}"
                                 + ("" if "fix_works" not in fw else
                                    f"; the fix {'works' if fw['fix_works'] else 'does NOT work'} there"))
            except Skip as e:
                notes.append(f"framework level skipped: {e}")
            except Exception as e:  # noqa: BLE001 - a framework API change must not hide the mechanism's verdict
                notes.append(f"framework level failed: {type(e).__name__}: {e} ({_where(e)})")
        else:
            notes.append("framework level skipped: disabled (--no-framework)")
        if not v.reproduced:
            notes.append("the faulty run stayed finite: the mechanism was NOT reproduced")
        if not v.fixed:
            notes.append("the fixed run is not finite: the fix was NOT confirmed")
    except Skip as e:
        if check.gpu_only_effect and v.device == "cpu":  # say so, without calling it an error or a reproduction
            v.reproduced = v.fixed = False
            notes.append(f"not reproducible on CPU: {e}")
        else:
            v.error = str(e)
    except Exception as e:  # noqa: BLE001 - a broken check reports, it does not crash the runner
        v.error = f"{type(e).__name__}: {e} ({_where(e)})"
    v.notes = notes
    v.seconds = round(time.perf_counter() - t0, 3)
    return v


def _facts_from_arg(text: str) -> dict[str, Any]:
    """Facts given as a JSON object or a path to one: canonical key -> value, or `kb diagnose --json` output
    (`{"facts": {key: {"value": ...}}}`)."""
    p = Path(text)
    raw = p.read_text(encoding="utf-8") if not text.lstrip().startswith("{") and p.is_file() else text
    data = json.loads(raw)
    if isinstance(data, dict) and isinstance(data.get("facts"), dict):
        data = data["facts"]
    if not isinstance(data, dict):
        raise TypeError("facts must be a JSON object: canonical key -> value")
    return {k: (f["value"] if isinstance(f, dict) and "value" in f else f) for k, f in data.items()}


def summary(v: Verdict) -> str:
    head = f"{v.incident_id}: {'CONFIRMED' if v.confirmed else 'NOT CONFIRMED'}"
    lines = [f"{head}  (reproduced={v.reproduced} fixed={v.fixed} user_settings_trigger={v.user_settings_trigger})",
             f"  device={v.device} dtype={v.dtype} torch={v.torch} seconds={v.seconds}"]
    for run, ev in v.evidence.items():
        lines.append(f"  {run}: " + ", ".join(f"{k}={x}" for k, x in ev.items()))
    lines += [f"  - {n}" for n in v.notes]
    if v.error:
        lines.append(f"  error: {v.error}")
    return "\n".join(lines)


def load_record(check_file: str | Path) -> Incident | None:
    """The incident record in the folder of a repro.py (incident.md beside it); None when there is none."""
    from kb.documents import parse_incident_md

    md = Path(check_file).resolve().parent / "incident.md"
    if not md.is_file():
        return None
    return parse_incident_md(md.read_text(encoding="utf-8"), source=str(md))


def bind(check_cls: type[ReproCheck], check_file: str | Path | None = None) -> type[ReproCheck]:
    """`check_cls` with its incident record attached (idempotent); the file defaults to the class's module."""
    if check_cls.record is None:
        if check_file is None:
            module = sys.modules.get(check_cls.__module__)
            check_file = getattr(module, "__file__", None)
        if check_file:
            check_cls.record = load_record(check_file)
    return check_cls


def load_check(path: str | Path) -> type[ReproCheck]:
    """The ReproCheck subclass defined in a repro.py file (imported under a private module name), bound to the
    incident.md beside it."""
    import importlib.util

    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"kb_repro_check_{path.parent.name.replace('-', '_')}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = [c for c in vars(module).values()
             if isinstance(c, type) and issubclass(c, ReproCheck) and c is not ReproCheck
             and c.__module__ == module.__name__]
    if not found:
        raise ImportError(f"{path} defines no ReproCheck subclass")
    return bind(found[0], path)


def cli_main(check_cls: type[ReproCheck], argv: list[str] | None = None) -> int:
    """Standalone command line of one check; prints a verdict and returns its exit code (0 / 1 / 2)."""
    bind(check_cls)
    name = check_cls.record.id if check_cls.record is not None else check_cls.__name__
    p = argparse.ArgumentParser(prog=f"repro {name}", description=(check_cls.__doc__ or "").strip())
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (auto: CUDA when present)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.add_argument("--settings", help="JSON object of settings overriding the reported ones (canonical keys)")
    p.add_argument("--facts", help="JSON object or file of canonical facts (e.g. `kb diagnose --json` output)")
    p.add_argument("--no-framework", action="store_true", help="skip the framework-level check")
    a = p.parse_args(argv)
    check = check_cls()
    try:
        user: dict[str, Any] = {}
        if a.facts:
            user.update(check.settings_from_facts(_facts_from_arg(a.facts)))
        if a.settings:
            extra = json.loads(a.settings)
            if not isinstance(extra, dict):
                raise ValueError("--settings must be a JSON object")
            user.update(extra)
    except (OSError, ValueError, TypeError) as e:
        v = Verdict(incident_id=check.incident_id, error=f"bad input: {e}")
    else:
        v = evaluate(check, a.device, user or None, framework=not a.no_framework)
    try:
        print(v.to_json() if a.json else summary(v))
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader left; the exit code still carries the verdict
        sys.stderr.close()
    return v.exit_code
