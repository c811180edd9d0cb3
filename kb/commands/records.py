"""`kb show`, `kb list`, `kb stats`, `kb validate`, `kb schema`: reading and checking records."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kb.commands._common import add_filters, filters_of, open_kb, print_json, table


def register(sub) -> None:
    p = sub.add_parser("show", help="the whole record of one incident, both languages")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=show)

    p = sub.add_parser("list", help="list incidents")
    add_filters(p)
    p.add_argument("--json", action="store_true", help="full records as JSON")
    p.set_defaults(func=list_)

    p = sub.add_parser("stats", help="counts by framework, category, language")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=stats)

    p = sub.add_parser("validate", help="check every incident document and case against the schema and taxonomy")
    p.add_argument("paths", nargs="*", help="documents (default: every incidents/*/incident.md)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=validate)

    p = sub.add_parser("schema", help="print (or --write) the JSON Schema of an incident record")
    p.add_argument("--write", action="store_true", help="write kb/schema/incident.schema.json")
    p.set_defaults(func=schema)


def show(args) -> int:
    kb = open_kb(args)
    inc = kb.get(args.id)
    if args.json:
        print_json(inc)
        return 0
    print(f"# {inc.id}\n")
    print(f"{inc.title.en}\n{inc.title.zh}\n")
    print(table(["field", "value"], [
        ["framework", (f"{inc.framework.name} reported {', '.join(inc.framework.reported_versions) or '-'}; "
                       f"affected {inc.framework.affected_versions or '?'}; "
                       f"fixed {inc.framework.fixed_versions or '?'}")],
        ["model / algorithm", f"{inc.model} / {inc.algorithm}"],
        ["precision / parallelism", f"{inc.precision} / {inc.parallelism}"],
        ["category / status", f"{inc.root_cause.category} / {inc.root_cause.status}"],
        ["config", ", ".join(f"{k}={v}" for k, v in inc.config.items())],
        ["repro", kb.repro_command(inc) or "-"],
        ["language / origin", f"{inc.lang.value} / {inc.origin}"],
    ], max_col=100))
    for lang, label in (("en", "English"), ("zh", "中文")):
        print(f"\n## {label}\n")
        print(getattr(inc.summary, lang))
        print(f"\nRoot cause: {getattr(inc.root_cause.explanation, lang)}")
        print(f"Fix: {getattr(inc.fix.summary, lang)}")
        for s in inc.fix.steps:
            print(f"  - {getattr(s, lang)}")
        body = getattr(inc.body, lang)
        if body:
            print("\n" + body)
    print("\nSources:")
    for s in inc.sources:
        print(f"  - {s.url or s.file}")
    return 0


def list_(args) -> int:
    kb = open_kb(args)
    recs = kb.list(**filters_of(args))
    if args.json:
        print_json([r.model_dump(mode="json") for r in recs])
        return 0
    print(table(["id", "framework", "algorithm", "category", "lang", "status"],
                [[r.id, r.framework.name, r.algorithm, r.root_cause.category, r.lang.value, r.root_cause.status]
                 for r in recs]))
    print(f"\n{len(recs)} incident(s)")
    return 0


def stats(args) -> int:
    kb = open_kb(args)
    s = kb.stats()
    if args.json:
        print_json(s)
        return 0
    print(f"{s['records']} incidents, {s['with_repro']} with a repro check\n")
    for key, title in (("by_category", "category"), ("by_framework", "framework"), ("by_language", "language"),
                       ("by_algorithm", "algorithm"), ("by_status", "status")):
        print(table([title, "incidents"], [[k, str(v)] for k, v in s[key].items()]))
        print()
    if s["index"]:
        print(f"index: {s['index']}")
    return 0


_REGEX_FIELDS = ("pattern",)


def validate(args) -> int:
    """Schema + taxonomy + regex + id/folder checks; exit 1 when any document fails."""
    from kb.documents import lint_front_matter, parse_incident_md
    from kb.errors import KBError
    from kb.taxonomy import categories

    kb = open_kb(args, progress=False)
    paths = [Path(p) for p in args.paths] or sorted(kb.incidents_dir.glob("*/incident.md"))
    cats = categories()
    report = []
    for path in paths:
        errs: list[str] = []
        try:
            text = path.read_text(encoding="utf-8")
            inc = parse_incident_md(text, source=str(path))
        except (KBError, OSError, UnicodeDecodeError) as e:
            report.append({"path": str(path), "ok": False, "errors": [str(e)]})
            continue
        errs += [e.split(": ", 1)[1] for e in lint_front_matter(text, source=str(path))]
        if inc.root_cause.category not in cats:
            errs.append(f"unknown category {inc.root_cause.category!r}")
        if path.name == "incident.md" and inc.id != path.parent.name:
            errs.append(f"id {inc.id!r} differs from folder {path.parent.name!r}")
        for sig in inc.symptoms.signatures:
            try:
                re.compile(sig.pattern)
            except re.error as e:
                errs.append(f"signature {sig.pattern!r}: {e}")
        for t in inc.triggers:
            for c in t.all + t.any + t.none:
                if c.op == "regex":
                    try:
                        re.compile(str(c.value))
                    except re.error as e:
                        errs.append(f"trigger {t.id}: {e}")
        if not inc.sources:
            errs.append("no sources")
        if not (inc.title.en and inc.title.zh):
            errs.append("title needs both en and zh")
        if inc.repro.path and not (path.parent / inc.repro.path).is_file():
            errs.append(f"repro file {inc.repro.path} missing")
        report.append({"path": str(path), "id": inc.id, "ok": not errs, "errors": errs})
    if not args.paths:  # the case base is validated with the incidents (schema, thread, incident ids)
        from kb.cases import load_cases

        cases, problems = load_cases(kb.cases_dir, kb.records.keys())
        report += [{"path": c.id, "id": c.id, "ok": True, "errors": []} for c in cases]
        report += [{"path": p.path, "ok": False, "errors": [p.message]} for p in problems]
    bad = [r for r in report if not r["ok"]]
    if args.json:
        print_json({"checked": len(report), "failed": len(bad), "documents": report})
    else:
        for r in bad:
            for e in r["errors"]:
                print(f"{r['path']}: {e}")
        print(f"{len(report)} document(s) checked, {len(bad)} failed")
    return 1 if bad else 0


def schema(args) -> int:
    from kb.records import Incident

    s = Incident.model_json_schema()
    if args.write:
        out = Path(__file__).resolve().parent.parent / "schema" / "incident.schema.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(s, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(out)
    else:
        print(json.dumps(s, indent=2, ensure_ascii=False))
    return 0
