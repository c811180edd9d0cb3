"""`kb diagnose [FILE ...|-]`: diagnose a pasted log / config / command line / question."""

from __future__ import annotations

import sys
from pathlib import Path

from kb.commands._common import open_kb, print_json, table
from kb.commands._daemon import answer, diagnose_params
from kb.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("diagnose", help="diagnose a log, config, command line or question (files or stdin)")
    p.add_argument("files", nargs="*", help="files with logs / configs / commands / prose; '-' reads stdin")
    p.add_argument("--log", help="a training log file")
    p.add_argument("--config", help="a config file (YAML, JSON, DeepSpeed JSON, key=value, command line)")
    p.add_argument("--question", help="the question or description in your own words")
    p.add_argument("-k", type=int, default=3, help="how many categories to show (default 3)")
    p.add_argument("--mode", default="full", choices=["bm25", "dense", "hybrid", "full"],
                   help="ranking signals (ablation); default full = hybrid retrieval + triggers + signatures")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def read_input(path: str) -> str:
    """A file or stdin as text; the size caps and binary check happen in kb.diagnose.facts.check_text."""
    from kb.diagnose.facts import _limits, check_text

    max_bytes, _ = _limits()
    if path == "-":
        data = sys.stdin.buffer.read(10 * max_bytes + 1)
    else:
        p = Path(path)
        if p.is_dir():
            raise InputError(f"{path} is a directory; give a log, config or text file (or '-' for stdin)")
        if not p.is_file():
            raise InputError(f"no such file: {path}")
        try:
            with p.open("rb") as fh:
                data = fh.read(10 * max_bytes + 1)
        except OSError as e:
            raise InputError(f"cannot read {path}: {e.strerror}") from None
    return check_text(data, path)


def run(args) -> int:
    res = answer(args, "diagnose", lambda: diagnose_params(args), lambda: _diagnose_here(args))
    return _print(args, res)


def _diagnose_here(args):
    from kb.diagnose.engine import diagnose

    texts = [read_input(f) for f in args.files]
    if not args.files and not (args.log or args.config or args.question) and not sys.stdin.isatty():
        texts = [read_input("-")]
    log = read_input(args.log) if args.log else None
    config = read_input(args.config) if args.config else None
    if not any(t.strip() for t in [*texts, log or "", config or "", args.question or ""]):
        raise InputError("empty input: give a log, config or text file, '-' with text on stdin, or --question")
    kb = open_kb(args)
    res = diagnose(kb, log=log, config=config, question=args.question, text="\n".join(texts) if texts else None,
                   k=max(1, min(args.k, 20)), mode=args.mode)
    return res


def _print(args, res) -> int:
    if args.json:
        print_json(res)
        return 0
    zh = res.lang == "zh"
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if res.abstained:
        print(("无法给出可靠诊断：" if zh else "No confident diagnosis: ") + res.reason)
        if res.diagnoses:
            print("最接近的候选：" if zh else "Closest candidates:")
    rows = [[str(i), d.category, f"{d.confidence:.2f}", d.incident_id, d.title]
            for i, d in enumerate(res.diagnoses, 1)]
    if rows:
        print(table(["#", "category", "conf", "incident", "title"], rows, max_col=56))
    for i, d in enumerate(res.diagnoses, 1):
        print(f"\n{i}. {d.category} ({d.confidence:.2f}) — {d.incident_id}")
        if d.decided_by:
            print(f"   {'判定依据' if zh else 'decided by'}: {d.decided_by}")
        for e in d.evidence[:8]:
            where = f"{e.source}:{e.line}" if e.line else e.kind
            print(f"   [{where}] {e.detail}")
        if d.fix:
            print(f"   {'修复' if zh else 'fix'}: {d.fix}")
        if d.repro:
            print(f"   repro: {d.repro}")
    shown = {k: v["value"] for k, v in res.facts.items()}
    if shown:
        print("\nfacts: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    return 0
