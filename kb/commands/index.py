"""`kb index`: build (or rebuild) the hybrid index from the curated incidents and ingested records."""

from __future__ import annotations

from kb.commands._common import build_with_progress, echo, lang_of, open_kb, print_json, warn
from kb.commands._i18n import t


def register(sub) -> None:
    p = sub.add_parser("index", help="build the BM25 + FAISS index")
    p.add_argument("--force", action="store_true", help="rebuild even when the index is current")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    show = not (args.quiet or args.json) and sys.stderr.isatty()
    kb = open_kb(args, progress=False)
    lang = lang_of(args)
    b = build_with_progress(kb, lang, force=args.force) if show else kb.build_index(force=args.force)
    info = {**b.meta, "path": str(b.path), "problems": kb.load_problems}
    if args.json:
        print_json(info)
    elif not args.quiet:
        echo(t("m.indexed", lang, records=b.meta["n_records"], rows=b.meta["n_rows"], model=b.meta["model"],
               kind=b.meta["vector_index"], path=b.path))
        for p in kb.load_problems:
            warn(f"{t('l.warning', lang)}: {p}")
    return 1 if kb.load_problems else 0
