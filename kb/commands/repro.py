"""`kb repro`: run an incident's repro check (on the reported settings or the user's), or all of them."""

from __future__ import annotations

import json
from typing import Any

from kb.errors import InputError


def register(subparsers) -> None:
    p = subparsers.add_parser("repro", help="run repro checks: does the mechanism reproduce, do my settings trigger it",
                              description="Run incidents/<id>/repro.py in a subprocess and print its verdict. "
                                          "Exit 0: confirmed, 1: not confirmed, 2: error or timeout, 3: unknown id.")
    p.add_argument("incident_id", nargs="?", help="incident id (folder name under incidents/)")
    p.add_argument("--all", action="store_true", help="run every check and print a table")
    p.add_argument("--list", action="store_true", help="list the incidents that have a repro check")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: CUDA when present")
    p.add_argument("--config", help="your training config / command line / log: run with your settings")
    p.add_argument("--facts", help="facts JSON (canonical key -> value, or `kb diagnose --json` output)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="one setting (canonical key or any alias, e.g. --set max_length=2048); repeatable")
    p.add_argument("--data", help="your JSONL data: count samples with an empty response / label-less SP shard")
    p.add_argument("--tokenizer", help="local tokenizer folder for --data (no downloads)")
    p.add_argument("--limit", type=int, help="--data: check at most this many samples")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per check (default 180)")
    p.add_argument("--jobs", type=int, default=1,
                   help="--all: checks run at once, each in its own process (default 1; on a GPU machine most of "
                        "a check's time is its process importing torch and starting CUDA)")
    p.add_argument("--no-framework", action="store_true", help="skip framework-level checks (trl, peft, ...)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _user_facts(args) -> dict[str, Any]:
    from kb.repro import user

    facts: dict[str, Any] = {}
    if args.config:
        facts.update(user.facts_from_config(args.config))
    if args.facts:
        facts.update(user.facts_from_json(args.facts))
    facts.update(user.facts_from_pairs(args.set))
    return facts


def _evidence_line(ev: dict[str, Any], keys: tuple[str, ...] = ("loss", "nll_loss", "grad_norm")) -> str:
    return " ".join(f"{k}={_fmt(ev[k])}" for k in keys if k in ev) or "-"


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _framework_cell(v) -> str:
    """What the framework level said: 'affected' / 'not affected' with the versions, 'ran', or '-' (skipped)."""
    fw = v.evidence.get("framework")
    if not fw:
        return "-"
    names = " ".join(f"{k} {fw[k]}" for k in ("trl", "peft", "deepspeed", "transformers") if k in fw)
    if "affected" not in fw:
        return f"ran {names}".strip()
    return f"{names}: {'affected' if fw['affected'] else 'not affected'}".strip(": ")


def _table(verdicts, lang: str):
    from kb.commands._common import table
    from kb.commands._i18n import t

    rows = []
    for v in verdicts:
        state = t("s.error" if v.error else "s.needs_gpu" if v.cpu_only_skip
                  else "s.confirmed" if v.confirmed else "s.not_confirmed", lang)
        trig = {True: t("s.yes", lang), False: t("s.no", lang), None: "?"}[v.user_settings_trigger]
        rows.append([v.incident_id, state, str(v.reproduced), str(v.fixed), trig, v.device,
                     _evidence_line(v.evidence.get("faulty", {})), _evidence_line(v.evidence.get("fixed", {})),
                     _framework_cell(v), f"{v.seconds:.1f}", v.error or (v.notes[-1] if v.cpu_only_skip else "")])
    heads = ["h.incident", "h.verdict", "h.reproduced", "h.fixed", "h.trigger", "h.device", "h.faulty_run",
             "h.fixed_run", "h.framework_level", "h.seconds", "h.note"]
    return table([t(h, lang) for h in heads], rows, wide=[10], optional=[5, 8, 7, 6, 2, 3])


def _run_all(args, lang: str):
    """Every check, one subprocess each (`--jobs` at once, as runner.run_all), with a progress bar that counts the
    finished ones and names the last."""
    import sys

    from kb.commands._common import progress_bar
    from kb.commands._i18n import t
    from kb.repro import runner

    opts = {"timeout": args.timeout, "framework": not args.no_framework, "jobs": args.jobs}
    if args.quiet or args.json or not sys.stderr.isatty():
        return runner.run_all(args.incidents_dir, args.device, **opts)
    total = len(runner.list_checks(args.incidents_dir))
    done: list[str] = []
    with progress_bar(t("m.repro_all", lang), total=total) as update:
        def finished(v) -> None:
            done.append(v.incident_id)
            update(len(done), total, description=f"{t('m.repro_all', lang)}: {v.incident_id}")

        return runner.run_all(args.incidents_dir, args.device, on_done=finished, **opts)


def run(args) -> int:
    from kb.repro import runner

    if args.list:
        ids = runner.list_checks(args.incidents_dir)
        print(json.dumps(ids) if args.json else "\n".join(ids))
        return 0
    from kb.commands._common import lang_of, show

    lang = lang_of(args)
    if args.all:
        _need_torch()
        verdicts = _run_all(args, lang)
        if args.json:
            print(json.dumps([v.model_dump(mode="json") for v in verdicts], ensure_ascii=False, indent=2))
        else:
            show(_table(verdicts, lang))
        if any(v.error for v in verdicts):
            return 2
        return 0 if all(v.reproduced and v.fixed for v in verdicts if not v.cpu_only_skip) else 1
    if not args.incident_id:
        raise InputError("give an incident id, --all or --list")
    known = runner.list_checks(args.incidents_dir)
    if args.incident_id not in known:
        from kb.commands._common import suggest
        from kb.commands._i18n import t
        from kb.errors import NotFound

        close = suggest(args.incident_id, known)
        raise NotFound(t("m.unknown_value", lang, what=t("w.incident", lang), value=args.incident_id)
                       + ("; " + t("m.did_you_mean", lang, options=", ".join(close)) if close else ""))
    _need_torch()
    facts = _user_facts(args)
    report = None
    if args.data:
        report = _data_report(args, facts)
    verdict = runner.run_check(args.incident_id, args.incidents_dir, args.device, facts=facts or None,
                               timeout=args.timeout, framework=not args.no_framework)
    if report is not None and report.triggered:
        verdict.notes.append(f"your data: {report.empty_response} samples with an empty response, "
                             f"{report.label_less_shard} with a label-less shard")
        if verdict.user_settings_trigger is None:  # settings could not tell; the data can
            verdict.user_settings_trigger = True
    if args.json:
        out = verdict.model_dump(mode="json")
        if report is not None:
            out["data"] = report.model_dump()
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        from kb.repro.harness import summary

        print(summary(verdict))
        if report is not None:
            print(_data_summary(report))
    return verdict.exit_code


def _need_torch() -> None:
    """Checks run real PyTorch; torch is an extra so that installing kb never touches a training stack's."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError, AttributeError):  # hidden or half-installed
        found = False
    if not found:
        raise InputError("repro checks run PyTorch, which is not installed: install your torch first "
                         "(pip install torch==2.13.0 is the CPU build), then pip install 'kb-nan[repro]'")


def _data_report(args, facts: dict[str, Any]):
    from kb.repro.data_check import check_data

    if not args.tokenizer:
        raise InputError("--data needs --tokenizer PATH (a local tokenizer folder)")
    if not facts.get("max_length"):
        raise InputError("--data needs max_length: give --config or --set max_length=N")
    return check_data(args.data, args.tokenizer, int(facts["max_length"]), facts.get("max_prompt_length"),
                      facts.get("sequence_parallel_size") or 1, limit=args.limit)


def _data_summary(r) -> str:
    head = (f"data: {r.samples} samples (max_length {r.max_length}, max_prompt_length {r.max_prompt_length}, "
            f"sequence_parallel_size {r.sequence_parallel_size}; longest prompt {r.longest_prompt_tokens} tokens)")
    lines = [head,
             f"  empty response after truncation: {r.empty_response}"
             + (f" (lines {r.empty_response_lines})" if r.empty_response_lines else "")]
    if r.sequence_parallel_size > 1:
        lines.append(f"  a shard without labels: {r.label_less_shard}"
                     + (f" (lines {r.label_less_shard_lines})" if r.label_less_shard_lines else ""))
    return "\n".join(lines)
