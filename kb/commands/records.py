"""`kb show`, `kb list`, `kb stats`, `kb validate`, `kb schema`: reading and checking records."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kb.commands._common import (
    EXIT_NOTHING,
    EXIT_OK,
    add_filters,
    echo,
    filters_of,
    get_incident,
    lang_of,
    open_kb,
    print_json,
    table,
)
from kb.commands._common import show as show_
from kb.commands._i18n import t


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
    lang = lang_of(args)
    inc = get_incident(kb, args.id, lang)
    if args.json:
        print_json(inc)
        return EXIT_OK
    echo(f"# {inc.id}\n", style="bold")
    echo(f"{inc.title.en}\n{inc.title.zh}\n")
    fw = inc.framework
    show_(table([t("h.field", lang), t("h.value", lang)], [
        [t("h.framework", lang), (f"{fw.name}; {t('l.reported', lang)} {', '.join(fw.reported_versions) or '-'}; "
                                  f"{t('l.affected', lang)} {fw.affected_versions or '?'}; "
                                  f"{t('l.fixed_in', lang)} {fw.fixed_versions or '?'}")],
        [t("l.model_algorithm", lang), f"{inc.model} / {inc.algorithm}"],
        [t("l.precision_parallelism", lang), f"{inc.precision} / {inc.parallelism}"],
        [t("l.category_status", lang), f"{inc.root_cause.category} / {inc.root_cause.status}"],
        [t("l.config", lang), ", ".join(f"{k}={v}" for k, v in inc.config.items())],
        [t("l.repro", lang), kb.repro_command(inc) or "-"],
        [t("l.language_origin", lang), f"{inc.lang.value} / {inc.origin}"],
    ], wide=[1]))
    # Both languages, the chosen one first: the record is bilingual by design.
    for code in (lang, "zh" if lang == "en" else "en"):
        echo(f"\n## {'English' if code == 'en' else '中文'}\n", style="bold")
        echo(getattr(inc.summary, code))
        echo(f"\n{t('l.root_cause', code)}: {getattr(inc.root_cause.explanation, code)}")
        echo(f"{t('l.fix', code)}: {getattr(inc.fix.summary, code)}", style="green")
        for s in inc.fix.steps:
            echo(f"  - {getattr(s, code)}")
        body = getattr(inc.body, code)
        if body:
            echo("\n" + body)
    echo(f"\n{t('l.sources', lang)}:")
    for s in inc.sources:
        if s.url:
            echo(f"  - {s.url}")
    return EXIT_OK


def list_(args) -> int:
    kb = open_kb(args)
    lang = lang_of(args)
    recs = kb.list(**filters_of(args, kb, lang))
    if args.json:
        print_json([r.model_dump(mode="json") for r in recs])
        return EXIT_OK if recs else EXIT_NOTHING
    show_(table([t("h.id", lang), t("h.framework", lang), t("h.algorithm", lang), t("h.category", lang),
                 t("h.lang", lang), t("h.status", lang)],
                [[r.id, r.framework.name, r.algorithm, r.root_cause.category, r.lang.value, r.root_cause.status]
                 for r in recs], optional=[4, 5, 2]))
    echo("\n" + t("m.n_incidents", lang, n=len(recs)))
    return EXIT_OK if recs else EXIT_NOTHING


def stats(args) -> int:
    kb = open_kb(args)
    lang = lang_of(args)
    s = kb.stats()
    if args.json:
        print_json(s)
        return EXIT_OK
    echo(t("m.stats_head", lang, records=s["records"], repro=s["with_repro"]) + "\n", style="bold")
    for key, head in (("by_category", "h.category"), ("by_framework", "h.framework"),
                      ("by_language", "h.language"), ("by_algorithm", "h.algorithm"), ("by_status", "h.status")):
        show_(table([t(head, lang), t("h.incidents", lang)], [[k, str(v)] for k, v in s[key].items()]))
        echo()
    if s["index"]:
        echo(t("m.index", lang, info=s["index"]))
    return EXIT_OK


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
        for trig in inc.triggers:
            for c in trig.all + trig.any + trig.none:
                if c.op == "regex":
                    try:
                        re.compile(str(c.value))
                    except re.error as e:
                        errs.append(f"trigger {trig.id}: {e}")
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
        lang = lang_of(args)
        for r in bad:
            for e in r["errors"]:
                echo(f"{r['path']}: {e}", style="red")
        echo(t("m.checked", lang, n=len(report), bad=len(bad)))
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
