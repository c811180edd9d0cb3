"""`kb diagnose [FILE ...|-]`: diagnose a pasted log / config / command line / question."""

from __future__ import annotations

import sys
from pathlib import Path

from kb.commands._common import (
    EXIT_GATE,
    EXIT_NOTHING,
    EXIT_OK,
    echo,
    echo_questions,
    lang_of,
    open_kb,
    print_json,
    show,
    table,
    warn,
)
from kb.commands._daemon import answer, diagnose_params
from kb.commands._i18n import t
from kb.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("diagnose", help="diagnose a log, config, command line or question (files or stdin)",
                       description="Exit 0: diagnosed; 1: abstained (no confident diagnosis); 2: bad input. "
                                   "With --fail-on P: exit 4 when the best diagnosis has confidence >= P, else 0 "
                                   "(a pre-flight gate for CI: kb diagnose --config run.yaml --fail-on 0.8).")
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
    p.add_argument("--fail-on", type=float, metavar="CONFIDENCE",
                   help="exit 4 when the input matches a known failure at or above this confidence (0-1)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def answers(pairs: list[str]) -> dict[str, str]:
    """`--answer precision=bf16 --answer sequence_parallel_size=1` -> the answers handed to the diagnosis."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--answer takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def read_input(path: str) -> str:
    """A file or stdin as text; the size caps and binary check happen at the fact layer's boundary."""
    from kb.facts import check_text, read_text_file
    from kb.settings import limits

    if path == "-":
        return check_text(sys.stdin.buffer.read(10 * limits().diagnose_max_bytes + 1), path)
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path} is a directory; give a log, config or text file (or '-' for stdin)")
    if not p.is_file():
        raise InputError(f"no such file: {path}")
    return read_text_file(path)


def run(args) -> int:
    if args.fail_on is not None and not 0.0 <= args.fail_on <= 1.0:
        raise InputError(f"--fail-on takes a confidence between 0 and 1, got {args.fail_on}")
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
    said = answers(args.answer)
    if not given and not said and not any(t.strip() for t in [*texts, log or "", config or "", args.question or ""]):
        raise InputError("empty input: give a log, config or text file, '-' with text on stdin, or --question")
    kb = open_kb(args)
    return kb.diagnose(log=log, config=config, question=args.question, text="\n".join(texts) if texts else None,
                       k=max(1, min(args.k, 20)), mode=args.mode, facts=given or None,
                       answers=said or None)


def _print(args, res) -> int:
    # `res` is the library's Diagnosis or, from the answer daemon, the same fields as a dict.
    lang = lang_of(args, res.lang)
    if lang != res.lang:
        from kb.commands.ask import localise

        localise(open_kb(args, progress=False), res.diagnoses, lang, res.lang)
    code = EXIT_NOTHING if res.abstained or not res.diagnoses else EXIT_OK
    if args.fail_on is not None:
        code = _gate(args, res)
    if args.json:
        print_json(res)
        return code
    for w in res.warnings:
        warn(f"{t('l.warning', lang)}: {w}")
    if res.abstained:
        echo(t("m.abstain_diag", lang) + res.reason, style="yellow")
        if res.diagnoses:
            echo(t("m.closest", lang))
    rows = [[str(i), d.category, f"{d.confidence:.2f}", d.incident_id, d.title]
            for i, d in enumerate(res.diagnoses, 1)]
    if rows:
        show(table(["#", t("h.category", lang), t("h.conf", lang), t("h.incident", lang), t("h.title", lang)], rows,
                   wide=[4]))
    if res.track_record:
        r = res.track_record
        echo(t("m.track_record", lang, band=r.band, pct=r.percent, reports=r.reports, of=r.of))
    for i, d in enumerate(res.diagnoses, 1):
        echo(f"\n{i}. {d.category} ({d.confidence:.2f}) — {d.incident_id or d.title}", style="bold")
        if d.decided_by:
            echo(f"   {t('l.decided_by', lang)}: {d.decided_by}")
        for e in d.evidence[:8]:
            where = f"{e.source}:{e.line}" if e.line else e.kind
            echo(f"   [{where}] {e.detail}")
        if d.fix:
            echo(f"   {t('l.fix', lang)}: {d.fix}", style="green")
        if d.repro:
            echo(f"   {t('l.repro', lang)}: {d.repro}", style="cyan")
    if res.bisect:
        echo("\n" + t("m.bisect", lang), style="bold")
        for n, step in enumerate(res.bisect, 1):
            echo(f"   {n}. {step}")
    if res.differential and res.route != "mechanism":
        echo("\n" + t("m.candidates", lang) + ", ".join(f"{c.category} {c.probability:.2f}" for c in res.differential))
    echo_questions(res.questions, "kb diagnose ...")
    if res.similar_reports:
        # The nearest reports are listed either way; when none shares the answer's cause, the header says so.
        echo("\n" + (t("m.seen_in", lang, n=res.seen_in) if res.seen_in else t("m.similar_other", lang)))
        for r in res.similar_reports[:3]:
            echo(f"   {r.category}: {r.title} — {r.url}")
    shown = {k: v["value"] for k, v in res.facts.items()}
    if shown:
        echo(f"\n{t('l.facts', lang)}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    if args.fail_on is not None:
        _gate_message(args, res, lang, code)
    return code


def _best(res):
    return None if res.abstained or not res.diagnoses else res.diagnoses[0]


def _gate(args, res) -> int:
    best = _best(res)
    return EXIT_GATE if best is not None and best.confidence >= args.fail_on else EXIT_OK


def _gate_message(args, res, lang: str, code: int) -> None:
    best = _best(res)
    what = args.config or args.log or ", ".join(args.files) or "input"
    if code == EXIT_GATE:
        warn(t("m.gate_hit", lang, what=what, category=best.category, incident=best.incident_id,
               conf=best.confidence, threshold=args.fail_on))
    else:
        shown = f"{best.category} {best.confidence:.2f}" if best else "-"
        echo(t("m.gate_ok", lang, threshold=args.fail_on, best=shown))
