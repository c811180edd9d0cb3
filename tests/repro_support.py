"""Helpers the repro-check test files share: load the check of incidents/<id>/repro.py, run its verdict on CPU.

Imported as `from repro_support import ...`: tests/ has no __init__.py, so pytest's default (prepend) import mode
puts tests/ on sys.path before it imports a test file, and this module is found next to the tests that use it.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kb.repro.harness import ReproCheck, Verdict, evaluate, load_check

INCIDENTS = Path(__file__).resolve().parent.parent / "incidents"


@cache
def check(incident_id: str) -> ReproCheck:
    """The ReproCheck defined in incidents/<id>/repro.py, instantiated once per test session."""
    path = INCIDENTS / incident_id / "repro.py"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return load_check(path)()


@cache
def verdict(incident_id: str, device: str = "cpu", **user: Any) -> Verdict:
    """The check run in-process at the mechanism level only (the framework levels have their own tests); `user` are
    user settings."""
    return evaluate(check(incident_id), device, user or None, framework=False)


def nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
