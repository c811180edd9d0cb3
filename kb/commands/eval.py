"""`kb eval FILE.jsonl`: diagnosis accuracy (top-1/top-3, MRR, abstention) per language and kind, per mode."""

from __future__ import annotations

from pathlib import Path

from kb.commands._common import open_kb, print_json


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate diagnosis on a labelled JSONL set (query, expected_category)")
    p.add_argument("file", nargs="*", help="JSONL with query, expected_category (null = should abstain), lang, kind, "
                   "source_url; several files are pooled (not needed with --cv)")
    p.add_argument("--cv", action="store_true",
                   help="out-of-fold numbers on the case base (cases/): the learned ranker with folds grouped by "
                        "thread and leave-one-framework-out, beside rules only and plain hybrid retrieval")
    p.add_argument("--folds", type=int, default=5, help="with --cv: number of folds (default 5)")
    p.add_argument("--draws", type=int, default=10,
                   help="with --cv: fold assignments the grouped scheme is averaged over (1-100, default 10)")
    p.add_argument("--texts", metavar="DIR",
                   help="with --cv: also answer each case that DIR holds a <case id>.txt of from that text (e.g. "
                        "its thread's opening post as the reporter wrote it), out of fold, beside the same cases "
                        "as written")
    p.add_argument("--fit", action="store_true",
                   help="with --cv: then fit the ranker on every case and write kb/diagnose/learned.json")
    p.add_argument("--holdout", action="store_true",
                   help="also answer each query without the incidents citing its source_url (unless kind is "
                        "known-issue) and report both numbers")
    p.add_argument("--no-holdout-fit", dest="holdout_fit", action="store_false",
                   help="with --calibrate: fit on features computed with every incident available")
    p.add_argument("--mode", default="full", choices=["bm25", "dense", "hybrid", "full", "all"],
                   help="bm25 | dense | hybrid retrieval alone, full = hybrid + triggers + signatures; all = each")
    p.add_argument("--calibrate", action="store_true",
                   help="refit the confidence calibration on FILE(s) (held-out features) and write "
                        "kb/diagnose/calibration.json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from kb.diagnose.evaluate import calibrate, evaluate, format_report, load_eval_set, pooled_rows
    from kb.errors import InputError

    if args.cv:
        from kb.diagnose.evaluate import cross_validate, fit_case_ranker, format_cv, load_case_texts

        texts = load_case_texts(args.texts) if args.texts else None
        kb = open_kb(args)
        report = cross_validate(kb, folds=max(2, args.folds), draws=max(1, min(args.draws, 100)), texts=texts)
        if args.fit:
            report["fit"] = fit_case_ranker(kb, report=report)
        print_json(report) if args.json else print(format_cv(report) + (f"\nfitted: {report['fit']}"
                                                                       if args.fit else ""))
        return 0
    if not args.file:
        raise InputError("give a JSONL eval file, or --cv for the case base")
    rows = pooled_rows(args.file) if len(args.file) > 1 else load_eval_set(args.file[0])
    kb = open_kb(args)
    if args.calibrate:
        data = calibrate(kb, rows, holdout=args.holdout_fit, sources=[Path(f).name for f in args.file])
        print_json(data) if args.json else print(f"calibration written: {data}")
        return 0
    modes = ["bm25", "dense", "hybrid", "full"] if args.mode == "all" else [args.mode]
    reports = [evaluate(kb, rows, mode=m) for m in modes]
    if args.holdout:
        reports += [evaluate(kb, rows, mode=m, holdout=True) for m in modes]
    if args.json:
        print_json(reports[0] if len(reports) == 1 else {"file": [str(Path(f)) for f in args.file], "modes": reports})
        return 0
    print("\n\n".join(format_report(r) for r in reports))
    return 0
