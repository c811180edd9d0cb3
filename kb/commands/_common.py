"""Helpers shared by CLI commands: opening the knowledge base, rich tables and progress, language, suggestions."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

from kb.commands._i18n import env_lang, t
from kb.errors import InputError, NotFound

# Exit codes, documented in `kb --help` and the README.
EXIT_OK, EXIT_NOTHING, EXIT_BAD_INPUT, EXIT_UNKNOWN_ID, EXIT_GATE = 0, 1, 2, 3, 4


def _console(stderr: bool = False):
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # The reader left (`kb ask ... | head`). rich would exit 1, which reads as "abstained"; silence the
            # stream as rich does and let the CLI end with 0, as it does for any BrokenPipeError.
            self.quiet = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
            raise BrokenPipeError

    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    # On a terminal rich follows its width; piped, use $COLUMNS or a wide default so rows do not wrap at 80.
    width = None if tty else shutil.get_terminal_size((160, 24)).columns
    # Colour only on a terminal, and never with NO_COLOR (https://no-color.org) or TERM=dumb.
    no_color = bool(os.environ.get("NO_COLOR")) or os.environ.get("TERM") == "dumb"
    return _Console(file=stream, width=width, no_color=no_color, highlight=False, soft_wrap=False,
                   force_terminal=tty if not no_color else None, emoji=False)


_OUT = None
_ERR = None


def out():
    global _OUT
    if _OUT is None or _OUT.file is not sys.stdout:
        _OUT = _console()
    return _OUT


def err():
    global _ERR
    if _ERR is None or _ERR.file is not sys.stderr:
        _ERR = _console(stderr=True)
    return _ERR


def echo(text: str = "", style: str | None = None) -> None:
    """Plain text on stdout (markup off: incident text may contain brackets)."""
    out().print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def warn(text: str) -> None:
    err().print(text, style="yellow", markup=False, highlight=False, soft_wrap=True)


def lang_of(args, detected: str | None = None) -> str:
    """--lang when given; else the input's language (ask, diagnose); else KB_LANG / the locale."""
    chosen = getattr(args, "lang", None)
    if chosen:
        return chosen
    return detected if detected in ("en", "zh") else env_lang()


def open_kb(args, progress: bool | None = None):
    """The knowledge base from the global flags; builds a stale index here with a progress bar that moves."""
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=args.data_dir, incidents_dir=args.incidents_dir, model=args.model,
                            progress=False)
    quiet = getattr(args, "quiet", False) or getattr(args, "json", False)
    show = (not quiet and sys.stderr.isatty()) if progress is None else progress
    kb.progress = show  # commands that ingest read it
    if show and not kb.index_is_current():
        build_with_progress(kb, lang_of(args))
    return kb


def build_with_progress(kb, lang: str, force: bool = False):
    with progress_bar(t("m.indexing", lang), unit="rows") as update:
        return kb.build_index(force=force, progress=update)


@contextmanager
def progress_bar(label: str, unit: str = "", total: int | None = None):
    """A rich progress bar on stderr; yields update(done, total). Time elapsed keeps it moving between steps."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn(unit), TimeElapsedColumn(), console=err(), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, total_: int | None = None, description: str | None = None) -> None:
            bar.update(task, completed=done, total=total_ if total_ is not None else bar.tasks[0].total,
                       description=description or label)

        yield update


def table(headers: list[str], rows: Iterable[list[Any]], *, wide: Iterable[int] = (), optional: Iterable[int] = (),
          title: str | None = None):
    """A rich table that fits the console width. Ids, numbers and keys keep their full text; the `wide`
    columns (titles) share what is left and end in an ellipsis, so each row stays on one line. On a narrow
    terminal the `optional` columns are dropped, in the order given, before anything is cut."""
    from rich import box
    from rich.cells import cell_len
    from rich.table import Table

    rows = [[str(c) for c in r] for r in rows]
    keep = list(range(len(headers)))
    wide = [i for i in wide]
    need = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def fixed(cols: list[int]) -> int:
        # Each gap between columns: one padding space either side of a one-space divider.
        return sum(need[i] for i in cols if i not in wide) + 3 * (len(cols) - 1) + 2

    width = out().width
    for i in optional:
        if fixed(keep) + 32 * max(len(wide), 1) <= width:  # a title needs ~30 cells to be recognisable
            break
        keep.remove(i)
    room = max(12 * max(len(wide), 1), width - fixed(keep))
    tab = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold", title=title)
    for i in keep:
        if i in wide:
            tab.add_column(headers[i], overflow="ellipsis", no_wrap=True, max_width=max(12, room // len(wide)))
        else:
            tab.add_column(headers[i], overflow="fold")
    for r in rows:
        tab.add_row(*[r[i] for i in keep])
    return tab


def echo_questions(questions, command: str) -> None:
    """The differential questions, each with the command line that answers it (`command` ends before `--answer`)."""
    for q in questions:
        echo(f"   ? {q.worded()}  → {command} --answer {q.fact}=<value>", style="cyan")


def show(renderable) -> None:
    out().print(renderable)


def add_filters(p) -> None:
    p.add_argument("--framework", help="only incidents of this framework (e.g. trl, ms-swift)")
    p.add_argument("--algorithm", help="only this algorithm (e.g. DPO, KTO, SFT)")
    p.add_argument("--category", help="only this root-cause category key")


def suggest(value: str, known: Iterable[str], n: int = 3) -> list[str]:
    known = list(known)
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(value.lower(), list(by_lower), n=n, cutoff=0.55)
    return [by_lower[c] for c in close]


def _known_filter_values(kb, what: str) -> list[str]:
    get = {"framework": lambda r: r.framework.name, "algorithm": lambda r: r.algorithm,
           "category": lambda r: r.root_cause.category}[what]
    return sorted({get(r) for r in kb.records.values() if get(r)})


def filters_of(args, kb=None, lang: str = "en") -> dict[str, str]:
    """The filter flags; with `kb`, an unknown value is bad input (exit 2) with a did-you-mean."""
    chosen = {k: v for k in ("framework", "algorithm", "category") if (v := getattr(args, k, None))}
    if kb is None:
        return chosen
    for what, value in chosen.items():
        known = _known_filter_values(kb, what)
        if value.lower() in {k.lower() for k in known}:
            continue
        if what == "category":
            from kb.taxonomy import categories

            if value in categories():
                continue  # a real category with no incident yet: an empty answer, not a typo
        msg = t("m.unknown_value", lang, what=t(f"w.{what}", lang), value=value)
        close = suggest(value, known)
        msg += "; " + (t("m.did_you_mean", lang, options=", ".join(close)) if close
                       else t("m.known_values", lang, values=", ".join(known)))
        raise InputError(msg)
    return chosen


def get_incident(kb, incident_id: str, lang: str = "en"):
    """kb.get with a did-you-mean on unknown ids (exit 3)."""
    if incident_id in kb.records:
        return kb.get(incident_id)
    close = suggest(incident_id, kb.records)
    msg = t("m.unknown_value", lang, what=t("w.incident", lang), value=incident_id)
    if close:
        msg += "; " + t("m.did_you_mean", lang, options=", ".join(close))
    raise NotFound(msg)


def print_json(obj: Any) -> None:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump(mode="json")
    print(json.dumps(obj, ensure_ascii=False, indent=2))
