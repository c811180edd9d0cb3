"""Repro checks: the harness every incidents/<id>/repro.py builds on, and the runner behind `kb repro`."""

from kb.repro.harness import ReproCheck, Skip, Verdict, cli_main, evaluate

__all__ = ["ReproCheck", "Skip", "Verdict", "cli_main", "evaluate"]
