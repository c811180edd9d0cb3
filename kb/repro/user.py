"""A user's settings for `kb repro`: canonical facts from a config file, a facts JSON or `--set key=value`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kb.canonical import canonical
from kb.errors import InputError, NotFound


def _read(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise NotFound(f"no such file: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {p}: {e}") from None


def facts_from_text(text: str, source: str = "config") -> dict[str, Any]:
    """Canonical key -> value from a config / command line / log, read by the fact layer."""
    from kb.facts import extract_facts

    return extract_facts(text, source=source).values()


def facts_from_config(path: str | Path) -> dict[str, Any]:
    return facts_from_text(_read(path), source=str(path))


def facts_from_json(path: str | Path) -> dict[str, Any]:
    """Facts JSON: canonical key -> value, or the output of `kb diagnose --json` (its `facts`)."""
    try:
        data = json.loads(_read(path))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("facts"), dict):
        data = data["facts"]
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object of facts")
    return {k: (f["value"] if isinstance(f, dict) and "value" in f else f) for k, f in data.items()}


def facts_from_pairs(pairs: list[str]) -> dict[str, Any]:
    """`--set max_length=2048 --set fp16=true` -> canonical facts (unknown keys kept as written)."""
    facts: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise InputError(f"--set expects key=value, got {pair!r}")
        key, value = (x.strip() for x in pair.split("=", 1))
        kv = canonical(key, value)
        if kv is None:
            try:
                facts[key] = json.loads(value)
            except json.JSONDecodeError:
                facts[key] = value
        else:
            facts[kv[0]] = kv[1]
    return facts
