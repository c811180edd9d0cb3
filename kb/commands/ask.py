"""`kb ask QUESTION`: ranked incidents with evidence and fix for a short question."""

from __future__ import annotations

from kb.commands._common import add_filters, filters_of, open_kb, print_json, table
from kb.commands._daemon import answer


def register(sub) -> None:
    p = sub.add_parser("ask", help="answer a short question (English or Chinese)")
    p.add_argument("question", nargs="+", help="the question, e.g. \"DPO NLL loss nan\"")
    p.add_argument("-k", type=int, default=5, help="how many incidents to show (default 5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_filters(p)
    p.set_defaults(func=run)


def run(args) -> int:
    q, k, f = " ".join(args.question), max(1, min(args.k, 50)), filters_of(args)
    res = answer(args, "ask", lambda: {"question": q, "k": k, "filters": f}, lambda: open_kb(args).ask(q, k=k, filters=f))
    if args.json:
        print_json(res)
        return 0
    if not res.results:
        print("No incident matches." + (f" ({res.reason})" if res.reason else ""))
        return 0
    if res.abstained:
        print(("没有足够匹配的事件，以下为最接近的候选：" if res.lang == "zh" else
               "Nothing in the knowledge base fits well; closest candidates:") + f" ({res.reason})\n")
    rows = [[str(i), r.id, r.title, r.framework, r.algorithm, r.category, f"{r.score:.2f}"]
            for i, r in enumerate(res.results, 1)]
    print(table(["#", "id", "title", "framework", "algorithm", "category", "score"], rows, max_col=48))
    fix_label, ev_label = ("修复", "证据") if res.lang == "zh" else ("fix", "evidence")
    for i, r in enumerate(res.results, 1):
        print(f"\n{i}. {r.id}")
        for e in r.evidence:
            print(f"   {ev_label}: {e}")
        if r.fix:
            print(f"   {fix_label}: {r.fix}")
        if r.repro:
            print(f"   repro: {r.repro}")
    return 0
