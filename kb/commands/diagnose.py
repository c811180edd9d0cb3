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
    p.add_argument("--run-dir", help="a run's output_dir: trainer_state.json, args, config.json, DeepSpeed config, logs")
    p.add_argument("-k", type=int, default=3, help="how many categories to show (default 3)")
    p.add_argument("--mode", default="full", choices=["bm25", "dense", "hybrid", "full"],
                   help="ranking signals (ablation); default full = hybrid retrieval + triggers + signatures")
    p.add_argument("--answer", action="append", default=[], metavar="KEY=VALUE",
                   help="answer a differential question (a fact, e.g. precision=bf16); repeatable; re-ranks")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def answers(pairs: list[str]) -> dict[str, str]:
    """`--answer precision=bf16 --answer sequence_parallel_size=1` -> facts handed to the diagnosis."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--answer takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def read_input(path: str) -> str:
    """A file or stdin as text; the size caps and binary check happen at the fact layer's boundary."""
    from kb.facts import check_text
    from kb.settings import limits

    max_bytes = limits().diagnose_max_bytes
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
    texts = [read_input(f) for f in args.files]
    given: dict = {}
    run_log = ""
    if getattr(args, "run_dir", None):
        from kb.integrations.collect import engine_inputs
        from kb.runs import read_run_dir

        run_facts, run_log, findings = engine_inputs(read_run_dir(args.run_dir))
        given.update(run_facts)
        texts += [findings] if findings else []
    if not texts and not run_log and not (args.log or args.config or args.question) and not sys.stdin.isatty():
        texts = [read_input("-")]
    log = read_input(args.log) if args.log else None
    log = "\n".join(x for x in (run_log, log) if x) or None
    config = read_input(args.config) if args.config else None
    given.update(answers(args.answer))
    if not given and not any(t.strip() for t in [*texts, log or "", config or "", args.question or ""]):
        raise InputError("empty input: give a log, config or text file, '-' with text on stdin, or --question")
    kb = open_kb(args)
    return kb.diagnose(log=log, config=config, question=args.question, text="\n".join(texts) if texts else None,
                       k=max(1, min(args.k, 20)), mode=args.mode, facts=given or None)


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
    if res.bisect:
        print("\n" + ("排查顺序（逐项关闭或回退）：" if zh else "bisect plan (switch off or roll back, in order):"))
        for n, step in enumerate(res.bisect, 1):
            print(f"   {n}. {step}")
    if res.differential and res.route != "mechanism":
        print("\n" + ("候选：" if zh else "candidates: ")
              + ", ".join(f"{c.category} {c.probability:.2f}" for c in res.differential))
    for q in res.questions:
        opts = f" ({' / '.join(q.options)})" if q.options else ""
        print(f"   ? {q.question}{opts}  → kb diagnose ... --answer {q.fact}=<value>")
    if res.similar_reports:
        print("\n" + (f"在 {res.seen_in} 个相似的真实报告中见过：" if zh else f"seen in {res.seen_in} similar real report(s):"))
        for r in res.similar_reports[:3]:
            print(f"   {r.category}: {r.title} — {r.url}")
    shown = {k: v["value"] for k, v in res.facts.items()}
    if shown:
        print("\nfacts: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    return 0
