"""The library's limits in one settings object (env prefix KB_); the HTTP layer's settings extend it."""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Limits(BaseSettings):
    """What one input may cost. `KB_DIAGNOSE_MAX_LINES=5000 kb diagnose big.log` sets `diagnose_max_lines`."""

    model_config = SettingsConfigDict(env_prefix="KB_", extra="ignore", frozen=False)

    # Past these a paste is sampled (head, salient middle, tail), not refused; 10x the bytes is refused.
    diagnose_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    diagnose_max_lines: int = Field(default=20_000, ge=1)
    # Patterns run per line: a longer line keeps its head and tail (a minified 5 MB JSON line would dominate).
    max_line_chars: int = Field(default=8_000, ge=200)
    # JSON / YAML nested deeper than this is not walked (recursion and quadratic flattening otherwise).
    max_nesting: int = Field(default=64, ge=4)
    # One article for `kb ingest`.
    ingest_max_bytes: int = Field(default=5 * 1024 * 1024, ge=1)


def limits() -> Limits:
    """The limits in force: built once per distinct set of KB_* limit variables in the environment."""
    return _limits(tuple(os.environ.get(f"KB_{name.upper()}") for name in Limits.model_fields))


@lru_cache(maxsize=8)
def _limits(env: tuple[str | None, ...]) -> Limits:
    return Limits()
