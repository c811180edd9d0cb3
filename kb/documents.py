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
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
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
        data = yaml.load(m.group(1), Loader=YAML_LOADER)
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


# A value that ends on one of these words (or an open bracket) was cut, not finished.
_DANGLING = re.compile(r"(?:[(\[{（【:,;/\-–]|\b(?:a|an|the|of|to|with|and|or|by|for|from|via|PR|than))\s*\Z",
                       re.IGNORECASE)
_PAIRS = ("()", "[]", "（）", "【】", "{}")
# Fields that hold sentences; identifiers, versions and regexes are not prose.
_PROSE_KEYS = {"en", "zh", "title", "summary", "explanation", "notes", "observed", "fix", "note", "mechanism"}


def lint_front_matter(text: str, *, source: str = "<text>") -> list[str]:
    """Damage the YAML parser accepts silently: a plain value cut by ` #...` (YAML reads it as a comment),
    or prose that ends mid-phrase or with an unclosed bracket. One message per problem, with its line."""
    m = _FRONT.match(text)
    if not m:
        return []
    front = m.group(1)
    lines = front.split("\n")
    problems: list[str] = []
    try:
        events = list(yaml.parse(front, Loader=YAML_LOADER))
    except yaml.YAMLError:
        return []  # parse_incident_md reports malformed YAML with its own message
    key: str | None = None
    stack: list[list[bool]] = []  # one frame per open collection: [is_mapping, expecting_a_key]
    for ev in events:
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if stack and stack[-1][0] and not stack[-1][1]:
                stack[-1][1] = True  # this collection is the value of the pending key
            stack.append([isinstance(ev, yaml.MappingStartEvent), True])
            continue
        if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            stack.pop()
            continue
        if not isinstance(ev, yaml.ScalarEvent):
            continue
        if stack and stack[-1][0]:
            if stack[-1][1]:
                key, stack[-1][1] = ev.value, False
                continue
            stack[-1][1] = True
        line_no = ev.end_mark.line
        where = f"{source}: front matter line {line_no + 2}"
        if not ev.style and ev.start_mark.line == line_no and line_no < len(lines):
            rest = lines[line_no][ev.end_mark.column:]
            if re.match(r"\s+#\S", rest) and isinstance(ev.value, str) and " " in ev.value.strip():
                problems.append(f"{where}: {key or 'value'} is cut by a YAML comment at {rest.strip()[:30]!r}; "
                                "quote the value")
                continue
        if key in _PROSE_KEYS and isinstance(ev.value, str) and " " in ev.value.strip():
            v = ev.value.strip()
            if _DANGLING.search(v):
                problems.append(f"{where}: {key} looks truncated (ends with {v[-20:]!r})")
            for a, b in _PAIRS:
                if v.count(a) > v.count(b):
                    problems.append(f"{where}: {key} has an unclosed {a!r} (truncated?)")
                    break
    return problems


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
