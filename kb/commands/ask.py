"""`kb ask QUESTION`: ranked incidents with evidence and fix for a short question."""

from __future__ import annotations

from kb.commands._common import (
    EXIT_NOTHING,
    EXIT_OK,
    add_filters,
    echo,
    echo_questions,
    filters_of,
    lang_of,
    open_kb,
    print_json,
    show,
    table,
)
from kb.commands._daemon import answer
from kb.commands._i18n import t


def register(sub) -> None:
    p = sub.add_parser("ask", help="answer a short question (English or Chinese)",
                       description="Exit 0: incidents found; 1: abstained (nothing fits well) or nothing matches; "
                                   "2: bad input (e.g. an unknown --framework, with a suggestion).")
    p.add_argument("question", nargs="+", help="the question, e.g. \"DPO NLL loss nan\"")
    p.add_argument("-k", type=int, default=5, help="how many incidents to show (default 5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_filters(p)
    p.set_defaults(func=run)


def localise(kb, items, lang: str, detected: str) -> None:
    """With --lang other than the question's, take titles and fixes from the record in that language."""
    if lang == detected:
        return
    for r in items:
        inc = kb.records.get(getattr(r, "id", None) or getattr(r, "incident_id", ""))
        if inc is None:
            continue
        _set(r, "title", getattr(inc.title, lang) or r.title)
        if r.fix:
            _set(r, "fix", getattr(inc.fix.summary, lang) or r.fix)


def _set(item, field: str, value: str) -> None:
    """Items are pydantic models in process, dicts from the answer daemon."""
    if isinstance(item, dict):
        item[field] = value
    else:
        setattr(item, field, value)


def run(args) -> int:
    q, k = " ".join(args.question), max(1, min(args.k, 50))
    f = filters_of(args, open_kb(args, progress=False) if any(
        getattr(args, x, None) for x in ("framework", "algorithm", "category")) else None, lang_of(args))
    res = answer(args, "ask", lambda: {"question": q, "k": k, "filters": f}, lambda: open_kb(args).ask(q, k=k, filters=f))
    lang = lang_of(args, res.lang)
    if lang != res.lang:
        localise(open_kb(args, progress=False), res.results, lang, res.lang)
    code = EXIT_NOTHING if res.abstained or not res.results else EXIT_OK
    if args.json:
        print_json(res)
        return code
    if not res.results:
        echo(t("m.no_match", lang) + (f" ({res.reason})" if res.reason else ""))
        return code
    if res.abstained:
        echo(t("m.abstain_ask", lang) + f" ({res.reason})\n", style="yellow")
    rows = [[str(i), r.id, r.title, r.framework, r.algorithm, r.category, f"{r.score:.2f}"]
            for i, r in enumerate(res.results, 1)]
    show(table(["#", t("h.id", lang), t("h.title", lang), t("h.framework", lang), t("h.algorithm", lang),
                t("h.category", lang), t("h.score", lang)], rows, wide=[2], optional=[4, 3]))
    for i, r in enumerate(res.results, 1):
        echo(f"\n{i}. {r.id or r.title}", style="bold")
        for e in r.evidence:
            echo(f"   {t('l.evidence', lang)}: {e}")
        if r.fix:
            echo(f"   {t('l.fix', lang)}: {r.fix}", style="green")
        if r.repro:
            echo(f"   {t('l.repro', lang)}: {r.repro}", style="cyan")
    questions = getattr(res, "questions", None) or []  # a daemon started by an older kb has none
    if questions:
        echo("\n" + t("m.unsure_ask", lang), style="bold")
        echo_questions(questions, f"kb diagnose --question {q!r}")
    return code
