"""Splitting an article into its title and sections by headings in Chinese or English (markdown or bare lines)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Section kinds. "Reported" kinds describe what happened (facts are read from them); fix/practice/conclusion
# describe what to do instead, so values there are recommendations, not the reporter's configuration.
REPORTED = {"preamble", "symptoms", "background", "config", "investigation", "cause", "theory", "other"}
FIX = "fix"

HEADINGS: dict[str, tuple[str, ...]] = {
    "symptoms": ("问题现象", "现象", "问题描述", "问题表现", "故障现象", "错误现象", "报错信息", "错误信息", "症状",
                 "复现步骤", "复现方法", "问题复现", "symptoms", "symptom", "problem", "the problem", "issue",
                 "problem description", "description", "what happened", "observed behavior", "observed behaviour",
                 "error", "errors", "error message", "logs", "steps to reproduce", "reproduction", "how to reproduce",
                 "bug description"),
    "background": ("问题背景", "背景", "背景介绍", "概述", "简介", "引言", "摘要", "background", "context",
                   "introduction", "overview", "summary", "tl;dr", "tldr"),
    "config": ("技术配置分析", "配置分析", "训练配置", "环境配置", "参数配置", "配置", "环境", "训练环境", "实验环境",
               "运行环境", "环境信息", "configuration", "config", "setup", "environment", "training setup",
               "settings", "system info", "versions"),
    "investigation": ("问题排查过程", "排查过程", "问题排查", "排查", "调试过程", "问题分析", "技术分析", "分析",
                      "问题定位", "定位过程", "investigation", "debugging", "analysis", "diagnosis",
                      "troubleshooting"),
    "cause": ("根本原因", "根因", "根因分析", "可能原因分析", "可能原因", "原因分析", "原因", "问题根源", "问题原因",
              "问题本质", "root cause", "root causes", "root-cause analysis", "root cause analysis", "cause",
              "causes", "possible causes", "why", "reason", "what went wrong"),
    "theory": ("技术原理分析", "技术原理深入", "技术原理", "原理分析", "原理", "技术背景", "深入分析", "机制分析",
               "technical background", "technical details", "how it works", "mechanism", "explanation",
               "deep dive", "details", "under the hood"),
    "fix": ("解决方案", "解决方案建议", "解决方法", "解决办法", "修复方案", "修复方法", "修复", "解决", "处理方法",
            "规避方法", "临时方案", "应对措施", "fix", "fixes", "the fix", "solution", "solutions", "workaround",
            "workarounds", "resolution", "how to fix", "remedy", "mitigation"),
    "practice": ("最佳实践", "最佳实践建议", "实践经验", "实践建议", "建议", "预防措施", "注意事项", "经验教训",
                 "best practices", "best practice", "recommendations", "prevention", "lessons learned", "tips"),
    "conclusion": ("结论", "总结", "经验总结", "小结", "总结与展望", "写在最后", "conclusion", "conclusions",
                   "takeaways", "wrap-up", "final thoughts"),
}
_BY_TERM: dict[str, str] = {t: kind for kind, terms in HEADINGS.items() for t in terms}
_TERMS_LONGEST_FIRST = sorted(_BY_TERM, key=len, reverse=True)
# A bare heading line may extend a known term only by one of these words ("解决方案建议", "问题排查过程").
_BARE_SUFFIX = re.compile(r"^(建议|过程|分析|方案|方法|说明|详解|深入|总结|措施|步骤|思路|与解决|及解决|"
                          r"和解决|与建议|层面)?$")
_NUMBERING = re.compile(r"^(?:\d+(?:\.\d+)*[.、)）]?|[一二三四五六七八九十]+[、.．]|第[一二三四五六七八九十\d]+[章节部分][:：、]?|"
                        r"[（(][一二三四五六七八九十\d]+[)）])\s*")
_SENTENCE_PUNCT = re.compile(r"[。，,；;！!？?]|\.\s|\.$")
_MD_HEADING_START = re.compile(r"^(#{1,6})\s+")


def _md_heading(line: str) -> tuple[str, str] | None:
    """(the `#`s, the heading text without closing `#`s) of a markdown heading line, else None.

    Not one regex: `(.*?)\\s*#*\\s*$` backtracks in cubic time on a heading with long runs of spaces (a 2 KB
    line took seconds)."""
    m = _MD_HEADING_START.match(line)
    if m is None:
        return None
    return m.group(1), line[m.end():].rstrip().rstrip("#").rstrip()
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•·]|\d+[.)、]|[（(]\d+[)）])\s+")
_CODE_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Section:
    kind: str  # a key of HEADINGS, "preamble" or "other"
    heading: str  # as written ("" for the preamble)
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines).strip()

    @property
    def reported(self) -> bool:
        return self.kind in REPORTED


def _clean_heading(line: str) -> str:
    s = line.strip().strip("*_").strip()
    s = _NUMBERING.sub("", s)
    return s.rstrip(":：").strip().strip("*_").strip()


def classify_heading(text: str, *, markdown: bool) -> str | None:
    """The section kind a heading names, or None. Markdown headings may carry a tail ("## Fix: upgrade")."""
    s = _clean_heading(text).lower()
    if not s:
        return None
    if s in _BY_TERM:
        return _BY_TERM[s]
    for term in _TERMS_LONGEST_FIRST:
        if s.startswith(term):
            rest = s[len(term):].strip()
            ascii_term = term.isascii()
            if ascii_term and rest and rest[0].isalnum():
                continue  # "fixed ..." is not "fix"
            if markdown or _BARE_SUFFIX.match(rest):
                return _BY_TERM[term]
    return None


def bare_heading_kind(line: str) -> str | None:
    """Kind of a bare (non-markdown) heading line: short, no sentence punctuation, a known term."""
    s = line.strip()
    if not s or len(s) > 40 or _LIST_ITEM.match(s):
        return None
    core = _clean_heading(s)
    if not core or len(core) > 24 or _SENTENCE_PUNCT.search(core):
        return None
    return classify_heading(core, markdown=False)


def join_broken_lines(lines: list[str]) -> list[str]:
    """Re-join lines that scrapers split around inline code or list bullets.

    Scraped pages often put an inline code span on a line of its own ("当手动设置" / "torch_dtype为..."), and
    render list bullets as a lone "-" with the item on the next line; facts spanning such breaks are lost
    unless the pieces are joined again.
    """
    out: list[str] = []
    in_code = False
    for raw in lines:
        line = raw.rstrip()
        if _CODE_FENCE.match(line):
            in_code = not in_code
            out.append(line)
            continue
        if in_code or not out:
            out.append(line)
            continue
        prev = out[-1]
        stripped = line.strip()
        if prev.strip() in {"-", "*", "•"} and stripped and not _CODE_FENCE.match(prev):
            out[-1] = "- " + stripped
            continue
        if re.search(r"\S\s+-$", prev) and stripped and not _LIST_ITEM.match(stripped):
            # "...第一项。 -" / "第二项": the next item's bullet was glued to the end of the previous line.
            out[-1] = prev[:-1].rstrip()
            out.append("- " + stripped)
            continue
        prev_s = prev.strip()
        if _continues_paragraph(prev_s, stripped) and len(out) > 1:
            # Hard-wrapped prose: one paragraph spread over several lines.
            glue = "" if re.search(r"[\u4e00-\u9fff]$", prev_s) and re.match(r"[\u4e00-\u9fff]", stripped) else " "
            out[-1] = prev.rstrip() + glue + stripped
            continue
        cjk_open = bool(re.search(r"[\u4e00-\u9fff]$", prev_s)) and not bare_heading_kind(prev_s) \
            and not _md_heading(prev_s) and len(out) > 1
        code_start = bool(re.match(r"^(--?[A-Za-z_]|[A-Za-z][A-Za-z0-9.]{0,40}_|`)", stripped))
        if cjk_open and code_start and not bare_heading_kind(stripped):
            out[-1] = prev.rstrip() + " " + stripped
            continue
        out.append(line)
    return out


def _continues_paragraph(prev: str, cur: str) -> bool:
    """`cur` continues the sentence on `prev` (a long line cut without final punctuation)."""
    if not prev or not cur or len(prev) < 40 or re.search(r"[。.!！?？:：;；]$", prev):
        return False
    if _md_heading(prev) or bare_heading_kind(prev) or prev.startswith(("|", ">")):
        return False
    if _LIST_ITEM.match(cur) or _md_heading(cur) or bare_heading_kind(cur) or _CODE_FENCE.match(cur):
        return False
    looks_like_subheading = len(cur) < 16 and not re.search(r"[。.!！?？,，;；:：]", cur)
    return not (cur.startswith(("|", ">", "    ")) or looks_like_subheading)


def split_sections(lines: list[str]) -> tuple[str, list[Section]]:
    """(title, sections). The title is the first markdown `#` heading or else the first non-empty line."""
    title = ""
    body_start = 0
    for i, ln in enumerate(lines):
        if ln.strip():
            m = _md_heading(ln.strip())
            cand = m[1] if m else ln.strip()
            is_section = (classify_heading(cand, markdown=True) if m else bare_heading_kind(cand)) is not None
            if not is_section:
                title, body_start = cand.strip(), i + 1
            break
    sections: list[Section] = [Section("preamble", "")]
    in_code = False
    for ln in lines[body_start:]:
        if _CODE_FENCE.match(ln):
            in_code = not in_code
            sections[-1].lines.append(ln)
            continue
        if not in_code:
            m = _md_heading(ln.strip())
            if m:
                kind = classify_heading(m[1], markdown=True)
                level = len(m[0])
                if kind:
                    sections.append(Section(kind, m[1].strip()))
                    continue
                if level <= 2 and not title:
                    title = m[1].strip()
                    continue
                if level <= 2:
                    sections.append(Section("other", m[1].strip()))
                    continue
                # A deeper unknown heading is a sub-heading of the current section.
                sections[-1].lines.append(ln.strip())
                continue
            kind = bare_heading_kind(ln)
            if kind:
                sections.append(Section(kind, _clean_heading(ln)))
                continue
        sections[-1].lines.append(ln)
    return title, [s for s in sections if s.text or s.kind != "preamble"]


def list_items(text: str) -> list[str]:
    """The list items of a section (markdown bullets or numbered), with continuation lines folded in."""
    items: list[str] = []
    for ln in text.splitlines():
        if _LIST_ITEM.match(ln):
            items.append(_LIST_ITEM.sub("", ln, count=1).strip())
        elif items and ln.startswith(("  ", "\t")) and ln.strip():
            items[-1] += " " + ln.strip()
    return [i for i in items if i]


def content_lines(text: str) -> list[tuple[str, bool]]:
    """Every non-empty line of a section in order as (text, is_list_item), list bullets removed."""
    return [(_LIST_ITEM.sub("", ln, count=1).strip(), bool(_LIST_ITEM.match(ln))) for ln in text.splitlines()
            if ln.strip() and not _CODE_FENCE.match(ln)]

