"""One pipeline from input to facts: the boundary check, then extractor stages over the numbered lines.

A stage is a function `(lines, facts, source) -> None` that adds facts with evidence (as Drain3's miner takes
its handlers, the stages are passed in). The default stages read configs and command lines, log records and
error strings, then settings stated in running text, then prose; `derive` runs last because it reasons over
what the others found.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kb.facts import configs, logs, prose, statements
from kb.facts.boundary import check_text, numbered_lines
from kb.facts.model import Facts

Lines = list[tuple[int, str]]
Stage = Callable[[Lines, Facts, str], None]

_UNTICKED = re.compile(r"^\s*(?:[-*+]\s*)?\[ \]\s")

DEFAULT_STAGES: tuple[Stage, ...] = (configs.extract, logs.extract, statements.extract, prose.extract, prose.derive)


class Pipeline:
    """`Pipeline().extract(text)` -> Facts; `Pipeline((my_stage, *DEFAULT_STAGES))` adds an extractor."""

    def __init__(self, stages: Iterable[Stage] = DEFAULT_STAGES) -> None:
        self.stages = tuple(stages)

    def extract_with_lines(self, text: str | bytes, source: str = "text") -> tuple[Facts, Lines]:
        text = check_text(text, source)
        lines, warnings = numbered_lines(text, source)
        facts = Facts(warnings=warnings)
        # An unticked box of an issue form ("- [ ] One of the scripts in the examples/ folder of ... `transformers`")
        # is an option the reporter did not pick: nothing in it is a fact of the run.
        read = [(n, s) for n, s in lines if not _UNTICKED.match(s)] if "[ ]" in text else lines
        # `# flash_attn: fa2` in a pasted YAML or script: a setting switched off, not one the run used.
        read = [(n, s) for n, s in read if not configs.commented_setting(s)] if "#" in text else read
        for stage in self.stages:
            stage(read, facts, source)
        return facts, lines

    def extract(self, text: str | bytes, source: str = "text") -> Facts:
        return self.extract_with_lines(text, source)[0]

    def extract_inputs(self, inputs: list[tuple[str, str]]) -> tuple[Facts, list[tuple[str, int, str]]]:
        """Several named inputs (question, log, config …) -> merged facts and every numbered line read."""
        facts = Facts()
        lines: list[tuple[str, int, str]] = []
        for name, value in inputs:
            f, numbered = self.extract_with_lines(value, source=name)
            facts.merge(f)
            lines += [(name, n, s) for n, s in numbered]
        return facts, lines


DEFAULT = Pipeline()


def extract_facts(text: str | bytes, source: str = "text") -> Facts:
    """All facts in one input (logs, tracebacks, env dumps, configs, command lines, prose), with evidence.

    Pure function: string in, facts out. Raises InputError for binary junk, InputTooLarge past the caps.
    """
    return DEFAULT.extract(text, source)


def facts_from_mapping(values: Mapping[str, Any], source: str = "trainer", kind: str = "trainer") -> Facts:
    """Facts handed over as data: `{key: value}` or `{key: (value, detail)}`.

    Keys go through kb.canonical like any setting; list facts (nan_metrics, errors …) take a list value. Kind
    "trainer" (a running trainer, a run folder) outranks anything read from text; a reporter's answers to the
    differential questions come as kind "config" from source "answer" (`answers_as_facts`).
    """
    from kb.canonical import canonical
    from kb.facts.model import LIST_FACTS

    said = "your answer" if source == "answer" else "from the running trainer"
    facts = Facts()
    for key, raw in values.items():
        value, detail = raw if isinstance(raw, tuple) and len(raw) == 2 else (raw, "")
        detail = detail or f"{key} = {value!r} ({said})"
        if key in LIST_FACTS:
            for el in value if isinstance(value, (list, tuple, set)) else [value]:
                facts.add(key, el, kind, None, detail, source)
            continue
        got = canonical(key, value)
        k, v = got if got is not None else (key, value)
        facts.set(k, v, kind, None, detail, source)
    return facts


def answers_as_facts(values: Mapping[str, Any]) -> Facts:
    """A reporter's answers to the differential questions (`kb diagnose --answer`, the API's `facts`): settings of
    their run, as sure as a config's (they outrank what the paste's prose says), but not a trainer's observations,
    so the learned ranker still reads the paste with them (kb.diagnose.engine)."""
    from kb.canonical import QUESTIONS, SYMPTOM_ANSWERS
    from kb.errors import InputError

    said = dict(values)
    if "symptom" in said:  # the answer to the scope question: a word of its options (or "none": no symptom)
        raw = said.pop("symptom")
        words = raw if isinstance(raw, (list, tuple, set)) else str(raw).replace(",", " ").split()
        unknown = [str(w) for w in words if str(w).strip().lower() not in SYMPTOM_ANSWERS]
        if unknown or not words:
            raise InputError(f"symptom takes one or more of {', '.join(QUESTIONS['symptom'][2])}; got {str(raw)[:60]!r}")
        picked = [SYMPTOM_ANSWERS[str(w).strip().lower()] for w in words]
        picked = list(dict.fromkeys(picked))
        if any(picked):
            said["symptom"] = [w for w in picked if w]
        else:
            said["no_symptom"] = True  # answered: none (the question is not asked again)
    return facts_from_mapping(said, source="answer", kind="config")
