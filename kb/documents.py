"""Curated incident documents (`incidents/<id>/incident.md`): YAML front matter + bilingual prose <-> Incident."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from kb.errors import InputError, ValidationFailed
from kb.facts.boundary import too_deep
from kb.records import Bilingual, Incident

# libyaml's loader is ~10x faster than the pure-Python one; loading the corpus is on the CLI's cold path.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_FRONT = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?)\r?\n---[ \t]*\r?\n?(.*)\Z", re.DOTALL)
_LANG_HEADING = re.compile(r"^##\s+(English|中文|Chinese|EN|ZH)\s*$", re.MULTILINE | re.IGNORECASE)


def split_body(body: str) -> Bilingual:
    """Split the prose into its `## English` and `## 中文` sections."""
    marks = list(_LANG_HEADING.finditer(body))
    if not marks:
        return Bilingual(en=body.strip())
    out = {"en": "", "zh": ""}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        lang = "zh" if m.group(1).lower() in {"中文", "chinese", "zh"} else "en"
        out[lang] = (out[lang] + "\n" + body[m.end():end]).strip()
    return Bilingual(**out)


def parse_incident_md(text: str, *, source: str = "<text>") -> Incident:
    """Parse a curated document; raises InputError (not a document) or ValidationFailed (schema)."""
    m = _FRONT.match(text)
    if not m:
        raise InputError(f"{source}: no YAML front matter (a curated document starts with '---')")
    if too_deep(m.group(1)):
        raise InputError(f"{source}: front matter nested deeper than KB_MAX_NESTING")
    try:
        data = yaml.load(m.group(1), Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        raise InputError(f"{source}: malformed YAML front matter{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise InputError(f"{source}: front matter must be a mapping of fields")
    data.pop("body", None)
    data["body"] = split_body(m.group(2)).model_dump()
    try:
        return Incident.model_validate(data)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:8])
        raise ValidationFailed(f"{source}: {errs}") from None


def dump_incident_md(inc: Incident) -> str:
    """Render an Incident as a curated document (round-trips through parse_incident_md)."""
    data = inc.model_dump(mode="json", exclude={"body"})
    front = yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=110)
    parts = ["---", front.rstrip(), "---"]
    if inc.body.en:
        parts += ["## English", inc.body.en.strip(), ""]
    if inc.body.zh:
        parts += ["## 中文", inc.body.zh.strip(), ""]
    return "\n".join(parts) + "\n"


@dataclass
class LoadProblem:
    path: str
    message: str


def load_incidents(directory: Path) -> tuple[list[Incident], list[LoadProblem]]:
    """Every `*/incident.md` under `directory`; problems are collected, not raised, so one bad file
    never hides the rest."""
    records: list[Incident] = []
    problems: list[LoadProblem] = []
    if not directory.is_dir():
        return records, [LoadProblem(str(directory), "incidents directory does not exist")]
    for path in sorted(directory.glob("*/incident.md")):
        try:
            inc = parse_incident_md(path.read_text(encoding="utf-8"), source=str(path))
        except (InputError, ValidationFailed, UnicodeDecodeError) as e:
            problems.append(LoadProblem(str(path), str(e)))
            continue
        if inc.id != path.parent.name:
            problems.append(LoadProblem(str(path), f"id {inc.id!r} differs from its folder name {path.parent.name!r}"))
            continue
        records.append(inc)
    return records, problems
