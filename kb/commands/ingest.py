"""`kb ingest PATH...`: curated documents and raw articles (text, markdown, HTML; zh or en) into records."""

from __future__ import annotations

from pathlib import Path

from kb.commands._common import lang_of, open_kb, print_json, progress_bar, show, table, warn
from kb.commands._i18n import t


def register(sub) -> None:
    p = sub.add_parser("ingest", help="parse documents into records (idempotent)")
    p.add_argument("paths", nargs="+", help="files or folders")
    p.add_argument("--allow-duplicate", action="store_true", help="add even when a near-duplicate exists")
    p.add_argument("--no-index", action="store_true", help="do not rebuild the index afterwards")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _expand(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.rglob("*") if x.is_file() and x.suffix.lower() in
                          {".md", ".txt", ".html", ".htm", ".markdown"})
        else:
            out.append(p)
    return out


def run(args) -> int:
    kb = open_kb(args)
    files = _expand(args.paths)
    lang = lang_of(args)
    if kb.progress and len(files) > 1:
        with progress_bar(t("m.ingesting", lang), total=len(files)) as update:
            done = [0]

            def step(_o) -> None:
                done[0] += 1
                update(done[0])

            outcomes = kb.ingest(files, allow_duplicate=args.allow_duplicate, on_result=step)
    else:
        outcomes = kb.ingest(files, allow_duplicate=args.allow_duplicate)
    if not args.no_index and any(o.status in {"created", "updated"} for o in outcomes):
        kb.build_index()
    if args.json:
        print_json([o.model_dump() for o in outcomes])
    elif not args.quiet:
        show(table([t("h.path", lang), t("h.id", lang), t("h.status", lang), t("h.category", lang)],
                   [[o.path, o.id, o.status, o.category] for o in outcomes], wide=[0]))
        for o in outcomes:
            for w in o.warnings:
                warn(f"{t('l.warning', lang)}: {o.path}: {w}")
            if o.error:
                warn(f"{t('l.error', lang)}: {o.path}: {o.error}")
    return 2 if any(o.status == "error" for o in outcomes) else 0
