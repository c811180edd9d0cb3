"""`kb cases`: browse the case base of real reports (cases/*.yaml) — list with filters, show one, or count."""

from __future__ import annotations

from kb.commands._common import echo, open_kb, print_json, show, table
from kb.errors import NotFound


def register(sub) -> None:
    p = sub.add_parser("cases", help="browse the case base of real reports with a confirmed root cause")
    p.add_argument("id", nargs="?", help="show one case")
    p.add_argument("--framework", help="only this framework (case-insensitive)")
    p.add_argument("--category", help="only this root-cause category (out-of-scope for out-of-scope reports)")
    p.add_argument("--scope", choices=["in", "out"], help="in scope (a divergence) or out of scope")
    # Not --lang: that global flag picks the output language.
    p.add_argument("--report-lang", choices=["zh", "en"], help="language of the report")
    p.add_argument("--stats", action="store_true", help="counts by language, scope, framework and category")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from kb.cases import summary

    kb = open_kb(args, progress=False)
    cases = kb.cases
    if args.id:
        found = [c for c in cases if c.id == args.id]
        if not found:
            import difflib

            near = difflib.get_close_matches(args.id, [c.id for c in cases], n=3)
            raise NotFound(f"no case {args.id!r}" + (f"; did you mean {', '.join(near)}?" if near else ""))
        c = found[0]
        if args.json:
            print_json(c.model_dump())
            return 0
        print(f"{c.id}  [{c.lang}] {c.scope}  {c.category}{' (framework defect)' if c.framework_defect else ''}")
        print(f"  {c.title}\n  {c.url}\n  framework: {c.framework.name} {c.framework.version}".rstrip())
        print(f"  model: {c.model}  algorithm: {c.algorithm}  precision: {c.precision}  parallelism: {c.parallelism}")
        print(f"  observed: {c.observed}\n  confirmed: {c.confirmation} — {c.confirmed_by}\n  fix: {c.fix}")
        if c.incident:
            print(f"  incident: {c.incident} (kb show {c.incident})")
        if c.report.text():
            print("  report:\n" + "\n".join("    " + line for line in c.report.text().splitlines()[:20]))
        return 0
    sel = [c for c in cases
           if (not args.framework or c.framework.name.lower() == args.framework.lower())
           and (not args.category or c.category == args.category)
           and (not args.scope or c.scope == args.scope) and (not args.report_lang or c.lang == args.report_lang)]
    if args.stats:
        data = summary(sel)
        if args.json:
            print_json(data)
        else:
            for key, value in data.items():
                print(f"{key}: {value}")
        return 0
    if args.json:
        print_json([c.model_dump() for c in sel])
        return 0
    rows = [[c.id, c.lang, c.scope, c.category, c.framework.name, c.title] for c in sel]
    show(table(["id", "lang", "scope", "category", "framework", "title"], rows, wide=[5], optional=[4, 2]))
    echo(f"{len(sel)} case(s)")
    return 0 if sel else 1
