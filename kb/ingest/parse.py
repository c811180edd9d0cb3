"""parse_document: one curated or raw document (text, markdown or HTML; zh or en) -> an Incident record."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import PurePath
from typing import Any

import yaml
from pydantic import BaseModel, Field

from kb import cues as cat
from kb.canonical import FACTS
from kb.errors import InputError
from kb.facts import Facts
from kb.facts.boundary import too_deep
from kb.facts.pipeline import DEFAULT as PIPELINE
from kb.facts.statements import REL_SYMBOL, extract_config, extract_errors, extract_metrics, extract_relations
from kb.ingest.boilerplate import strip_boilerplate
from kb.ingest.extract import extract_onset, find_algorithm, find_framework, find_model, source_urls
from kb.ingest.htmltext import html_to_text
from kb.ingest.reader import check_text, sniff_format
from kb.ingest.sections import FIX, Section, content_lines, join_broken_lines, list_items, split_sections
from kb.records import (
    Bilingual,
    Condition,
    Fix,
    FrameworkInfo,
    Incident,
    RootCause,
    Source,
    Symptoms,
    Trigger,
)
from kb.taxonomy import categories
from kb.tokenize import detect_lang


class IngestResult(BaseModel):
    """A parsed document and how it was read: warnings, the cues behind its category, what was stripped."""

    incident: Incident
    warnings: list[str] = Field(default_factory=list)
    # The cues that chose root_cause.category, strongest category only ("+5 sequence parallel degree > 1: ...").
    category_evidence: list[str] = Field(default_factory=list)
    # Total cue weight per category that scored at all, best first.
    category_scores: dict[str, float] = Field(default_factory=dict)
    # Boilerplate lines/blocks removed before parsing, for debugging the stripper.
    stripped: list[str] = Field(default_factory=list)
    # Comparisons between config keys the text states, e.g. "max_prompt_length == max_length".
    relations: list[str] = Field(default_factory=list)
    # "kind: heading" of every section found.
    sections: list[str] = Field(default_factory=list)
    # The text that describes what happened (title + reported sections): the record's facts are read from it
    # by the same pipeline that reads a paste (kb.facts).
    reported_text: str = ""


_FRONT = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)
_SITE_SUFFIX = re.compile(
    r"(?<!\s)\s*[-_|–—]\s*(?:CSDN博客|CSDN|知乎|博客园|GitCode|掘金|简书|SegmentFault\s*思否|思否|腾讯云开发者社区|"
    r"阿里云开发者社区|开源中国|GitHub|Medium|Stack Overflow|Hugging Face Forums|DEV Community)\s*$", re.IGNORECASE)
# Sentences that describe a remedy; in a document without a fix section they are read as the fix.
_FIX_SENTENCE = re.compile(r"(?i)\b(fix(?:ed|es)?|solution|solved|workaround|resolved?|instead of|switch(?:ed|ing)? to|"
                           r"the remedy)\b|解决|修复|改用|替代|规避|换成")


def _front_matter(text: str) -> tuple[dict[str, Any] | None, str]:
    m = _FRONT.match(text)
    if not m:
        return None, text
    if too_deep(m.group(1)):
        return None, text  # nested past KB_MAX_NESTING: not front matter anyone writes; read it as text
    try:
        data = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return None, text
    return (data if isinstance(data, dict) else None), text[m.end():]


def _is_curated(meta: dict[str, Any] | None) -> bool:
    return bool(meta) and "root_cause" in meta and "id" in meta


def _clean_title(title: str) -> str:
    t = re.sub(r"^#+\s*", "", title).strip().strip("*_").strip()
    t = _SITE_SUFFIX.sub("", t)
    return re.sub(r"\s+", " ", t)[:300]


def _norm(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).lower()
    return re.sub(r"[^0-9a-z\u4e00-\u9fff]+", "", t)


def make_id(framework: str, title: str) -> str:
    """Stable id: the same article (same title) always gets the same id, so re-ingesting updates it."""
    digest = hashlib.sha1(_norm(title).encode("utf-8")).hexdigest()[:10]
    fw = re.sub(r"[^a-z0-9]+", "-", framework.lower()).strip("-")
    return f"raw-{fw}-{digest}" if fw and fw != "unknown" else f"raw-{digest}"


def _first_sentences(text: str, limit: int) -> str:
    """Leading sentences of `text` up to about `limit` characters."""
    text = re.sub(r"\s+", " ", re.sub(r"[*`#]+", "", text)).strip()
    if len(text) <= limit:
        return text
    out = ""
    for part in re.split(r"(?<=[。！？!?])|(?<=\.)\s", text):
        if not part:
            continue
        if out and len(out) + len(part) > limit:
            break
        out += part if re.search(r"[\u4e00-\u9fff]", part[-1:] or "") or out.endswith(("。", "！", "？")) \
            else (" " if out and not out.endswith(" ") else "") + part
    return (out or text[:limit]).strip()


def _is_subheading(line: str) -> bool:
    s = line.strip()
    return len(s) < 16 and not re.search(r"[。.!！?？,，;；:：]", s)


def _statement(line: str) -> str:
    """A line without its trailing lead-in ("…。可以通过以下方式实现:" -> "…。"); "" for sub-headings."""
    s = line.strip()
    if _is_subheading(s):
        return ""
    if s.endswith((":", "：")):
        parts = re.split(r"(?<=[。！？!?])|(?<=\.)\s+", s)
        s = "".join(p for p in parts[:-1] if p).strip() if len(parts) > 1 else ""
    return s


def _lead_text(sections: list[Section], kinds: tuple[str, ...]) -> str:
    """The first real statement of the first section of one of `kinds` (in that order of preference)."""
    for kind in kinds:
        for s in sections:
            if s.kind != kind:
                continue
            lines = [st for ln, item in content_lines(s.text) if (st := (ln if item else _statement(ln)))]
            if lines:
                return lines[0] if len(lines[0]) > 20 or len(lines) == 1 else lines[0] + " " + lines[1]
    return ""


def _render_body(sections: list[Section]) -> str:
    parts = []
    for s in sections:
        body = s.text
        if not body:
            continue
        parts.append(f"### {s.heading}\n{body}" if s.heading else body)
    return "\n\n".join(parts).strip()


def _split_unsectioned_fix(sections: list[Section]) -> list[Section]:
    """Without a fix section, remedy sentences of the prose become a synthetic fix section."""
    if any(s.kind == FIX for s in sections):
        return sections
    fix_lines: list[str] = []
    out: list[Section] = []
    for s in sections:
        kept = []
        for ln in s.lines:
            if _FIX_SENTENCE.search(ln) and not ln.strip().startswith(("```", "    ")):
                fix_lines.append(ln)
            else:
                kept.append(ln)
        out.append(Section(s.kind, s.heading, kept))
    if fix_lines:
        out.append(Section(FIX, "", fix_lines))
    return out


def _parallelism(config: dict[str, Any], reported: str) -> str:
    parts = []
    if "zero_stage" in config:
        parts.append(f"deepspeed-zero{config['zero_stage']}")
    elif re.search(r"(?<![A-Za-z])fsdp(?![A-Za-z])", reported, re.IGNORECASE):
        parts.append("fsdp")
    sp = config.get("sequence_parallel_size")
    if isinstance(sp, int) and sp > 1 or re.search(r"ring[\s_-]?attn|ring attention|ulysses", reported, re.IGNORECASE):
        parts.append("sequence-parallel")
    return " + ".join(parts) or "unknown"


# Articles are a few kilobytes; past these sizes a document is mostly pasted logs, and reading every line
# of it would only cost time (extraction is linear, roughly 15 s per MB), so only the head is analysed.
ANALYSIS_CHARS = 300_000
BODY_CHARS = 200_000


def _cap(text: str, warnings: list[str], what: str, limit: int = ANALYSIS_CHARS) -> str:
    if len(text) <= limit:
        return text
    if what:
        warnings.append(f"the {what} text is {len(text):,} characters; facts were read from the first {limit:,}")
    return text[:limit]


def _cap_lines(lines: list[str], warnings: list[str], limit: int = ANALYSIS_CHARS + BODY_CHARS) -> list[str]:
    total = 0
    for i, ln in enumerate(lines):
        total += len(ln) + 1
        if total > limit:
            warnings.append(f"document is longer than {limit:,} characters after cleaning; the rest was not parsed")
            room = limit - (total - len(ln) - 1)
            return lines[:i] + ([ln[:room]] if room > 0 else [])
    return lines


def _known_categories() -> set[str]:
    return set(categories())


# Facts that describe the run's settings (kb.canonical.FACTS) go into `config`, except the record's own fields
# and what is said about a fix rather than the run.
_NOT_CONFIG = {"model", "framework", "algorithm", "working_dtype", "model_family"}
_SETTINGS = {spec.key for spec in FACTS}


def record_config(facts: Facts) -> dict[str, Any]:
    """A record's `config`: the setting facts of its reported text (canonical keys, normalised values)."""
    return {k: f.value for k, f in facts.items.items() if k in _SETTINGS and k not in _NOT_CONFIG}


def _curated(text: str, name: str) -> IngestResult:
    from kb.documents import parse_incident_md

    inc = parse_incident_md(text, source=name or "<text>")
    return IngestResult(incident=inc, category_evidence=list(inc.root_cause.evidence))


def parse_document(text: str, *, name: str = "", fmt: str | None = None,
                   max_bytes: int | None = None) -> IngestResult:
    """Parse one document into a record. Pure: string in, record out; the same text gives the same record.

    A curated `incident.md` (YAML front matter with `id` and `root_cause`) is delegated to
    kb.documents.parse_incident_md. Anything else is a raw article: boilerplate is stripped, sections are
    found by their headings, facts are extracted and a root-cause category is chosen by cues.
    Raises kb.errors.InputError / InputTooLarge for empty, binary or oversized input.
    """
    source = name or "<text>"
    check_text(text, source, max_bytes)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u00a0", " ")
    text = re.sub(r"[\u200b-\u200d\ufeff]", "", text)
    meta, rest = _front_matter(text)
    if _is_curated(meta):
        return _curated(text, name)
    warnings: list[str] = []
    stripped: list[str] = []
    meta = meta or {}
    fmt = fmt or sniff_format(rest, name)
    if fmt not in {"text", "markdown", "html"}:
        raise InputError(f"{source}: unknown format {fmt!r} (expected text, markdown or html)")
    page_url = str(meta.get("url") or meta.get("source") or meta.get("link") or "")
    page_title = str(meta.get("title") or "")
    if fmt == "html":
        doc = html_to_text(rest)
        rest, page_url = doc.text, page_url or doc.url
        page_title = page_title or doc.title
        stripped += [f"<{d}>" for d in doc.dropped]
    if not rest.strip():
        raise InputError(f"{source}: no text left after removing markup")

    cleaned = strip_boilerplate(rest.split("\n"))
    stripped += cleaned.removed
    lines = _cap_lines(cleaned.lines, warnings)
    lines = join_broken_lines(lines)
    title, sections = split_sections(lines)
    title = _clean_title(title or page_title)
    if not title:
        title = _clean_title(PurePath(name).stem.replace("_", " ")) if name else ""
        warnings.append("no title line found; " + ("used the file name" if title else "the record has no title"))
    sections = _split_unsectioned_fix(sections)
    if not any(s.text for s in sections):
        raise InputError(f"{source}: nothing but a title and boilerplate; no article text to parse")

    reported_secs = [s for s in sections if s.reported]
    fix_secs = [s for s in sections if s.kind == FIX]
    advice_secs = [s for s in sections if not s.reported]
    reported_text = _cap("\n".join([title] + [s.text for s in reported_secs]), warnings, "described")
    fix_text = _cap("\n".join(s.text for s in fix_secs), warnings, "fix")
    advice_text = _cap("\n".join(s.text for s in advice_secs), warnings, "advice")
    all_text = _cap("\n".join([title] + [s.text for s in sections]), [], "")
    if not fix_secs:
        warnings.append("no fix / solution section found")

    # ---- facts: the same pipeline a paste goes through; the record's config is its setting facts
    facts = PIPELINE.extract(reported_text, source)
    config = record_config(facts)
    fix_config: dict[str, Any] = {}
    for f in extract_config(fix_text, recommendation=True):
        fix_config.setdefault(f.key, f.value)
    fix_changes = {k: v for k, v in fix_config.items() if k not in _NOT_CONFIG and config.get(k) != v}
    relations = extract_relations(reported_text)
    errors = extract_errors(all_text)
    metrics = extract_metrics(reported_text)
    lang = detect_lang(all_text)
    onset = extract_onset(reported_text, lang)

    framework, fw_why = find_framework(title, all_text)
    algorithm, algo_why = find_algorithm(title, reported_text, str(facts.value("algorithm"))
                                         if "algorithm" in facts else None)
    if algorithm == "unknown":
        algorithm, algo_why = find_algorithm(title, all_text, None)
    labelled = str(facts.value("model")) if "model" in facts else None
    model, _ = find_model(title, reported_text, labelled)
    if framework == "unknown" or "generic" in fw_why:
        warnings.append(f"framework: {fw_why}")
    if "assumed" in algo_why:
        warnings.append(f"algorithm: {algo_why}")
    precision = config.get("precision") or (config.get("weights_dtype")
                                            if config.get("weights_dtype") in {"fp16", "bf16", "fp32"} else None)
    versions = []
    fw_version_key = {"trl": "trl_version", "DeepSpeed": "deepspeed_version",
                      "transformers": "transformers_version", "pytorch": "torch_version"}.get(framework,
                                                                                           "framework_version")
    if fw_version_key in config:
        versions.append(str(config[fw_version_key]))

    # ---- category
    article = Facts()
    article.merge(facts)
    for key, value in (("reported_text", reported_text), ("fix_text", advice_text),
                       ("text", reported_text + "\n" + advice_text), ("onset", onset)):
        if value:
            article.set(key, value, "text", None, key)
    article.set("algorithm", algorithm, "text", None, algo_why)
    article.set("model", model, "text", None, "model")
    for key, values in (("error_messages", errors), ("metric_observations", metrics),
                        ("relations", [f"{a} {op} {b}" for a, op, b, _ in relations]),
                        ("fix_changes", [f"{k}={v}" for k, v in fix_changes.items()])):
        for v in values:
            article.add(key, v, "text", None, v)
    scores = cat.score_categories(article, _known_categories())
    rel_strings = [f"{a} {REL_SYMBOL[op]} {b}" for a, op, b, _ in relations]
    if scores:
        best = scores[0]
        category, evidence = best.category, list(best.evidence)
        if best.score < cat.WEAK_SCORE:
            warnings.append(f"category {category} rests on weak evidence (score {best.score:g})")
        if len(scores) > 1 and scores[1].score >= best.score - 0.5:
            warnings.append(f"category is a close call: {category} {best.score:g} vs "
                            f"{scores[1].category} {scores[1].score:g}")
    else:
        category, evidence = cat.FALLBACK_CATEGORY, []
        warnings.append(f"no category cue fired; category set to {cat.FALLBACK_CATEGORY!r}")

    # ---- record
    def bi(s: str) -> Bilingual:
        return Bilingual(**{lang: s})

    explanation = _first_sentences(" ".join(
        ln for s in sections if s.kind == "cause" for ln, item in content_lines(s.text)
        if item or not _is_subheading(ln)), 400)
    if not explanation:
        explanation = _first_sentences(_lead_text(sections, ("investigation", "theory")), 400)
    fix_items = [i for s in fix_secs for i in list_items(s.text)]
    fix_lead = _lead_text(fix_secs, (FIX,))
    summary = _first_sentences(_lead_text(sections, ("symptoms", "background", "preamble", "investigation")), 300)

    sources: list[Source] = []
    if name:
        sources.append(Source(file=PurePath(name).name, lang=lang, title=title))
    for url in ([page_url] if page_url.startswith(("http://", "https://")) else []) + source_urls(all_text):
        if url not in [s.url for s in sources]:
            sources.append(Source(url=url, lang=lang))

    triggers = [
        Trigger(id=f"stated-{a}-{op}-{b}".replace("_", "-"),
                description=f"the article states {a} {REL_SYMBOL[op]} {b} (raw, unconfirmed)",
                all=[Condition(fact=a, op=op, value_fact=b)], weight=0.5)
        for a, op, b, _ in relations
    ]
    tags = [t for t in dict.fromkeys([
        framework.lower() if framework != "unknown" else "",
        algorithm.lower() if algorithm != "unknown" else "",
        category,
        precision or "",
        "sequence-parallel" if "sequence-parallel" in _parallelism(config, reported_text) else "",
        f"zero{config['zero_stage']}" if "zero_stage" in config else "",
        "lora" if re.search(r"(?<![A-Za-z])(q?lora|peft)(?![A-Za-z])", all_text, re.IGNORECASE) else "",
        "raw",
    ]) if t]

    incident = Incident(
        id=make_id(framework, title or PurePath(name).name or all_text[:2000]),
        title=bi(title),
        summary=bi(summary),
        lang=lang,
        origin="raw",
        framework=FrameworkInfo(name=framework, reported_versions=versions),
        model=model,
        algorithm=algorithm,
        precision=precision or "unknown",
        parallelism=_parallelism(config, reported_text),
        config=config,
        symptoms=Symptoms(errors=errors, metrics=metrics, onset=bi(onset)),
        root_cause=RootCause(category=category, explanation=bi(explanation), status="unconfirmed",
                             evidence=evidence),
        fix=Fix(summary=bi(_first_sentences(fix_lead, 160)),
                steps=[bi(_first_sentences(i, 300)) for i in fix_items[:10]],
                config_changes=fix_changes),
        triggers=triggers,
        sources=sources,
        body=bi(_cap(_render_body(sections), warnings, "body", BODY_CHARS)),
        tags=tags,
    )
    return IngestResult(
        incident=incident,
        warnings=warnings,
        category_evidence=evidence,
        category_scores={s.category: round(s.score, 2) for s in scores},
        stripped=stripped,
        relations=rel_strings,
        sections=[f"{s.kind}: {s.heading}" for s in sections if s.heading],
        reported_text=reported_text,
    )
