"""Shared fixtures: where ../shared is, and a throwaway data dir per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _shared() -> Path | None:
    env = os.environ.get("KB_SHARED_DIR")
    p = Path(env) if env else REPO.parent / "shared"
    return p if p.is_dir() else None


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    p = _shared()
    if p is None:
        pytest.skip("../shared is absent (set KB_SHARED_DIR): seed articles and eval set unavailable")
    return p
