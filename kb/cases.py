"""Case base: real public reports with a thread-confirmed root cause (cases/<id>.yaml), schema and loader.

A case is what one reporter saw and what the thread established, in our own words, plus the reporter's
machine output (log lines, error strings, config keys, command lines, versions) kept verbatim as data.
Cases are retrieval targets ("seen in N reports like yours") and the labelled data that ranking and
confidence are fitted on, always out of fold grouped by `thread` (kb.evaluate).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kb.taxonomy import categories

Scope = Literal["in", "out"]
# Out of scope: not a training divergence at all. The engine must say "this is not a NaN/divergence problem".
OUT_OF_SCOPE_KINDS = ("oom", "install", "inference", "plateau", "data-format", "hang", "crash", "eval-metric",
                      "other")
Confirmation = Literal["maintainer", "reporter", "pr", "fix-worked", "docs"]
Precision = Literal["fp16", "bf16", "fp32", "fp8", "fp4", "mixed", "int8", "int4", "unknown"]

_THREAD = re.compile(r"github\.com/([^/\s]+)/([^/\s#?]+)/(?:issues|pull|pulls|discussions)/(\d+)", re.IGNORECASE)
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{2,120}$")


def thread_key(url: str) -> str:
    """Issues, PRs and discussions with the same number are one thread; other URLs are their own thread."""
    m = _THREAD.search(url)
    if m:
        return f"{m.group(1).lower()}/{m.group(2).lower().removesuffix('.git')}#{int(m.group(3))}"
    return re.sub(r"[#?].*$", "", url.strip().lower()).rstrip("/")


class Framework(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    version: str = ""


class Report(BaseModel):
    """The reporter's machine output, verbatim (data, not prose): what a user would paste."""

    model_config = ConfigDict(extra="forbid")
    logs: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    config: str = ""  # config lines or keys as the reporter pasted them (YAML / JSON / key=value)
    commands: list[str] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)

    def text(self) -> str:
        parts = [*self.commands, self.config, *self.logs, *self.errors]
        parts += [f"{k}=={v}" for k, v in self.versions.items()]
        return "\n".join(p for p in parts if p and p.strip())


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    url: str
    lang: Literal["zh", "en"]
    title: str  # our own words, in the reporter's language
    observed: str  # what the reporter saw, our own words, in the reporter's language
    framework: Framework
    model: str = "unknown"
    algorithm: str = "unknown"  # SFT DPO KTO SimPO IPO ORPO CPO RM PPO GRPO pretrain ...
    hardware: str = ""
    precision: Precision = "unknown"
    parallelism: str = ""
    adapter: Literal["lora", "qlora", "full", "other", "unknown"] = "unknown"
    scope: Scope
    out_of_scope_kind: str = ""
    category: str  # a key of kb.taxonomy; "out-of-scope" when scope is "out"
    framework_defect: bool = False
    incident: str = ""  # id of the curated incident with the same mechanism, if one exists
    confirmation: Confirmation
    confirmed_by: str  # our own words: who established the cause and how
    fix: str  # our own words: what fixed it
    report: Report = Field(default_factory=Report)
    related: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"id {v!r}: lower-case slug (letters, digits, . _ -)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Case:
        if self.scope == "out":
            if self.category != "out-of-scope":
                raise ValueError("scope 'out' needs category 'out-of-scope'")
            if self.out_of_scope_kind not in OUT_OF_SCOPE_KINDS:
                raise ValueError(f"out_of_scope_kind must be one of {', '.join(OUT_OF_SCOPE_KINDS)}")
        else:
            if self.category == "out-of-scope" or self.category not in categories():
                raise ValueError(f"unknown category {self.category!r} (see kb/data/categories_extra.md)")
            if self.out_of_scope_kind:
                raise ValueError("out_of_scope_kind is only for scope 'out'")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError("url must be the public thread's URL")
        return self

    @property
    def thread(self) -> str:
        return thread_key(self.url)

    def query(self) -> str:
        """What this reporter would bring to `kb diagnose`: their words (title, what they saw) and their paste."""
        return "\n".join(p for p in (self.title, self.observed, self.report.text()) if p.strip())


class CaseProblem(BaseModel):
    path: str
    message: str


def parse_case(text: str, name: str = "<case>") -> Case:
    import yaml

    from kb.documents import YAML_LOADER

    try:
        data = yaml.load(text, Loader=YAML_LOADER)  # a safe loader (libyaml's when present)
    except yaml.YAMLError as e:
        raise ValueError(f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError("a case is a YAML mapping")  # noqa: TRY004 - one error type for a bad case file
    try:
        return Case.model_validate(data)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ValueError(msgs) from None


REJECTED_FILE = "rejected.tsv"


def load_rejected(folder: str | Path) -> dict[str, str]:
    """Threads reviewed and turned down (cases/rejected.tsv: URL, a tab, why), by thread key.

    Collectors find a thread's fix PR more easily than the thread, and a review's verdict is easily forgotten:
    a case whose thread is listed here is a problem for `kb validate`, so a dropped thread cannot come back."""
    path = Path(folder) / REJECTED_FILE
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        url, _, why = line.partition("\t")
        out[thread_key(url.strip())] = why.strip() or "rejected on review"
    return out


def load_cases(folder: str | Path, incident_ids: Iterable[str] | None = None
               ) -> tuple[list[Case], list[CaseProblem]]:
    """Every cases/*.yaml, validated; problems (schema, duplicate thread, a thread rejected on review, unknown
    incident) are listed, not raised."""
    folder = Path(folder)
    cases: list[Case] = []
    problems: list[CaseProblem] = []
    known = set(incident_ids) if incident_ids is not None else None
    rejected = load_rejected(folder)
    by_thread: dict[str, str] = {}
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        try:
            case = parse_case(path.read_text(encoding="utf-8"), path.name)
        except (ValueError, UnicodeDecodeError) as e:
            problems.append(CaseProblem(path=str(path), message=str(e)))
            continue
        if path.stem != case.id:
            problems.append(CaseProblem(path=str(path), message=f"file name must be {case.id}.yaml"))
            continue
        if case.thread in by_thread:
            problems.append(CaseProblem(path=str(path), message=f"same thread as {by_thread[case.thread]}"))
            continue
        if case.thread in rejected:
            problems.append(CaseProblem(path=str(path), message=f"thread rejected on review: {rejected[case.thread]}"))
            continue
        if known is not None and case.incident and case.incident not in known:
            problems.append(CaseProblem(path=str(path), message=f"unknown incident {case.incident!r}"))
            continue
        by_thread[case.thread] = case.id
        cases.append(case)
    return cases, problems


def summary(cases: list[Case]) -> dict[str, Any]:
    from collections import Counter

    def count(fn) -> dict[str, int]:
        return dict(Counter(fn(c) for c in cases).most_common())

    return {
        "cases": len(cases),
        "threads": len({c.thread for c in cases}),
        "by_lang": count(lambda c: c.lang),
        "by_scope": count(lambda c: c.scope),
        "framework_defects": sum(c.framework_defect for c in cases),
        "frameworks": len({c.framework.name.lower() for c in cases}),
        "by_framework": count(lambda c: c.framework.name),
        "by_category": count(lambda c: c.category),
        "matching_an_incident": sum(bool(c.incident) for c in cases),
    }


if __name__ == "__main__":  # python -m kb.cases cases/  -> validate and summarise (for collectors)
    import json
    import sys

    from kb.paths import incidents_dir

    ids = [p.name for p in incidents_dir().iterdir() if (p / "incident.md").is_file()]
    found, probs = load_cases(sys.argv[1] if len(sys.argv) > 1 else "cases", ids)
    for p in probs:
        print(f"PROBLEM {p.path}: {p.message}")
    print(json.dumps(summary(found), ensure_ascii=False, indent=1))
    sys.exit(1 if probs else 0)
