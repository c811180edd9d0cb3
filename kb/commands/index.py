"""`kb index`: build (or rebuild) the hybrid index from the curated incidents and ingested records."""

from __future__ import annotations

from kb.commands._common import open_kb, print_json


def register(sub) -> None:
    p = sub.add_parser("index", help="build the BM25 + FAISS index")
    p.add_argument("--force", action="store_true", help="rebuild even when the index is current")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    kb = open_kb(args)
    b = kb.build_index(force=args.force)
    info = {**b.meta, "path": str(b.path), "problems": kb.load_problems}
    if args.json:
        print_json(info)
    elif not args.quiet:
        print(f"indexed {b.meta['n_records']} records ({b.meta['n_rows']} rows) with {b.meta['model']} "
              f"[{b.meta['vector_index']}] -> {b.path}")
        for p in kb.load_problems:
            print(f"warning: {p}")
    return 1 if kb.load_problems else 0
