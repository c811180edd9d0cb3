"""Where things live: the curated incidents folder, the data dir (index + store) and ../shared."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent


def incidents_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("KB_INCIDENTS_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return _corpus("incidents")


def _corpus(name: str) -> Path:
    """The checkout's folder, or the copy a built wheel carries in kb/_corpus/ (see setup.py)."""
    local = REPO_ROOT / name
    return local if local.is_dir() else PACKAGE_DIR / "_corpus" / name


def cases_dir(explicit: str | os.PathLike | None = None, incidents: Path | None = None) -> Path:
    """The case base: explicit, else KB_CASES_DIR, else `cases/` beside the incidents folder."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("KB_CASES_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return (incidents or incidents_dir()).parent / "cases"


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("KB_DATA_DIR")
    if env:
        return Path(env).expanduser().resolve()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("kb-nan")) / "data"


def shared_dir() -> Path | None:
    env = os.environ.get("KB_SHARED_DIR")
    p = Path(env) if env else REPO_ROOT.parent / "shared"
    return p if p.is_dir() else None
