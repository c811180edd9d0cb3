"""Build hook: copies the curated corpus (incidents/, cases/) into the wheel as kb/_corpus/ package data."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CORPUS = ("incidents", "cases")


class BuildPyWithCorpus(build_py):
    """The corpus lives at the top of the checkout (where people edit it); an installed kb finds it here."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own folders
        for name in CORPUS:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, Path(self.build_lib) / "kb" / "_corpus" / name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithCorpus})
