"""The built wheel, installed outside the checkout: it carries the corpus and answers ask / diagnose."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SKIP = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv",
                               ".kb-data", ".kb_data", ".pytest_cache", ".ruff_cache", "bench-results")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, repo_root) -> Path:
    # Build from a copy so a stale build/ in the checkout can never leak into the wheel.
    src = tmp_path_factory.mktemp("src") / "kb-src"
    shutil.copytree(repo_root, src, ignore=_SKIP)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("kb_nan-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv outside the checkout; system site-packages only to avoid downloading dependencies."""
    root = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root)], check=True, timeout=300)
    if sys.prefix != sys.base_prefix:
        # The suite itself runs in a venv: --system-site-packages reaches only the base interpreter's packages,
        # not the ones installed next to this suite. Plain path lines put them on sys.path without running
        # their .pth files, so an editable kb from the checkout stays out of reach.
        code = "import sysconfig; print(sysconfig.get_path('purelib'))"
        purelib = subprocess.run([str(root / "bin" / "python"), "-c", code],
                                 capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        parent = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
        (Path(purelib) / "_kb_suite_site.pth").write_text("".join(f"{d}\n" for d in parent))
    # --force-reinstall: a kb-nan already visible through the system site-packages (an editable checkout)
    # must not count as "already satisfied".
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
           str(wheel)]
    r = subprocess.run(pip, capture_output=True, text=True, timeout=300, check=False, cwd=root,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr[-3000:]
    return root


def test_wheel_carries_the_corpus_and_engine_data(wheel, repo_root):
    names = set(zipfile.ZipFile(wheel).namelist())
    ids = [p.parent.name for p in (repo_root / "incidents").glob("*/incident.md")]
    assert ids
    for i in ids:
        assert f"kb/_corpus/incidents/{i}/incident.md" in names
        if (repo_root / "incidents" / i / "repro.py").is_file():
            assert f"kb/_corpus/incidents/{i}/repro.py" in names
    for c in (repo_root / "cases").glob("*"):
        assert f"kb/_corpus/cases/{c.name}" in names
    assert "kb/diagnose/calibration.json" in names
    assert "kb/schema/incident.schema.json" in names
    assert any(n.startswith("kb/data/") for n in names)
    assert "api/static/index.html" in names


def test_core_requirements_are_light(wheel):
    """torch / transformers / sentence-transformers only behind extras: never replaces a user's torch."""
    meta = zipfile.ZipFile(wheel).read(next(n for n in zipfile.ZipFile(wheel).namelist()
                                            if n.endswith(".dist-info/METADATA"))).decode()
    reqs = Parser().parsestr(meta).get_all("Requires-Dist") or []
    core = [r for r in reqs if "extra ==" not in r]
    heavy = {"torch", "transformers", "sentence-transformers"}
    assert not [r for r in core if r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip() in heavy]
    assert any(r.startswith("torch") and "extra == \"repro\"" in r for r in reqs)


def _kb(venv: Path, tmp_path: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "KB_INCIDENTS_DIR", "KB_SHARED_DIR"}}
    env.update(KB_DATA_DIR=str(tmp_path / "data"), NO_COLOR="1")
    return subprocess.run([str(venv / "bin" / "kb"), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, input=stdin, timeout=600, check=False)


def test_installed_wheel_asks_and_diagnoses_outside_the_checkout(venv, tmp_path, repo_root):
    py = str(venv / "bin" / "python")
    code = "import kb, kb.paths, sys; print(kb.__file__); print(kb.paths.incidents_dir()); print(sys.path)"
    where = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.split("\n")
    assert where[0].startswith(str(venv)), where
    assert where[1].startswith(str(venv)) and where[1].endswith("kb/_corpus/incidents"), where
    assert str(repo_root) not in ast.literal_eval(where[2])  # the checkout is not on sys.path

    # The installed kb answers exactly as the checkout does: same corpus, same calibration and ranker data.
    from kb.kb import KnowledgeBase

    here = KnowledgeBase.open(data_dir=tmp_path / "here", incidents_dir=repo_root / "incidents")
    r = _kb(venv, tmp_path, "ask", "--json", "DPO NLL loss nan")
    assert r.returncode in (0, 1), r.stderr[-2000:]
    out = json.loads(r.stdout)
    want = here.ask("DPO NLL loss nan")
    assert out["results"] and [x["id"] for x in out["results"]] == [x.id for x in want.results]
    assert len(out["results"]) == 5 and out["abstained"] == want.abstained

    log = "{'loss': nan, 'grad_norm': nan, 'rewards/chosen': nan, 'epoch': 0.01}\n"
    cfg = "rlhf_type: dpo\nrpo_alpha: 1.0\nsequence_parallel_size: 4\n"
    (tmp_path / "run.yaml").write_text(cfg)
    r = _kb(venv, tmp_path, "diagnose", "--json", "--config", "run.yaml", "-", stdin=log)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    res = json.loads(r.stdout)
    want = here.diagnose(config=cfg, text=log)  # the CLI hands stdin over as `text`
    assert (res["abstained"], res["route"]) == (want.abstained, want.route)
    assert [(d["category"], d["confidence"]) for d in res["diagnoses"]] == [(d.category, d.confidence)
                                                                           for d in want.diagnoses]
    assert res["differential"] == [c.model_dump(mode="json") for c in want.differential]

    # The installed engine never imports torch for ask / diagnose.
    code = ("import sys; from kb.kb import KnowledgeBase; kb = KnowledgeBase.open(); kb.ask('DPO loss nan'); "
            "kb.diagnose(text='loss: nan\\nfp16: true'); print('torch' in sys.modules, 'transformers' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "KB_INCIDENTS_DIR"}}
    env["KB_DATA_DIR"] = str(tmp_path / "data")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
                       check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "False"]
