"""Cutting site boilerplate off scraped articles: recommendation/ad blocks, login walls, bylines, counters.

Scraped pages end with blocks that have nothing to do with the article: "log in to read more" walls,
"popular projects" lists, and advertisements for unrelated models whose lines glue a project name to its
description and end in a language name and star/fork counts ("…Python00", "…Go06"). The cut point is found
from the shape of those lines, never from the names they advertise, and only where what follows is mostly
such junk and holds no article section heading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kb.ingest.sections import bare_heading_kind, classify_heading

# Languages as code-hosting sites print them next to star/fork counters.
_LANGS = (r"Python|Jupyter Notebook|JavaScript|TypeScript|Java|Go|Rust|C\+\+|C#|C|Cuda|Shell|HTML|CSS|SCSS|Less|"
          r"Vue|TSX|JSX|Dart|Kotlin|Swift|Ruby|PHP|Scala|Lua|Julia|Zig|Nix|Dockerfile|Makefile|CMake|"
          r"Objective-C|Perl|R|MATLAB|Markdown|Cangjie|ArkTS|Svelte|Haskell|Elixir|Erlang|Clojure|Groovy|Batchfile|"
          r"PowerShell|Assembly|Verilog|Solidity|Fortran|OCaml|Starlark|Mojo|Text|Other")
# "…description text Python00": a language glued to the text before it, then star/fork digits.
_LANG_COUNTS = re.compile(rf"(?<=[^\s\w+#-]|[\u4e00-\u9fff])(?:{_LANGS})\d{{2,}}\s*$")
_LANG_ONLY = re.compile(rf"^(?:{_LANGS})$")
_COUNT_ONLY = re.compile(r"^[\d.,]+\s*[KkMmWw万千]?\+?$")
_NO_DESC = re.compile(r"(暂无简介|暂无描述|暂无介绍|no description(?: provided)?)\s*\d*\s*$", re.IGNORECASE)
_TRAILING_COUNTS = re.compile(r"(?<![\d.,:：=\-+/%x×])\d{2}\s*$")

# Lines that end the article wherever they stand alone: login walls, recommendation headers.
_CUT_MARKERS = re.compile(
    r"^(?:登录后查看全文|登录后阅读全文|登录查看全文|查看全文|阅读全文|展开全文|展开阅读全文|继续阅读|"
    r"热门项目推荐|相关项目推荐|项目优选|相关推荐|推荐阅读|相关文章|相关阅读|猜你喜欢|热门推荐|更多推荐|文章推荐|"
    r"热门文章|最新文章|精选推荐|为你推荐|相关资源|相关项目|"
    r"related (?:posts?|articles?|projects?|reading|stories)|recommended(?: for you| projects| reading| posts)?|"
    r"you (?:may|might) also like|read more|read the full (?:article|story)|sign in to (?:read|view|continue)|"
    r"log ?in to (?:read|view|continue)|more from .{1,30}|popular (?:posts|projects|articles)|trending(?: now)?|"
    r"share this(?: article| post)?)\s*[:：>»]*$", re.IGNORECASE)
# Single lines dropped anywhere: bylines, dates, counters, share buttons, copyright notes.
_DROP_LINE = re.compile(
    r"^(?:\d{4}[-/.年]\d{1,2}[-/.月]\d{1,2}日?(?:\s*\d{1,2}:\d{2}(?::\d{2})?)?\s*(?:(?:作者|作者：|编辑|来源|发布|"
    r"posted|by|author)\s*[:：]?.{0,40})?|"
    r"(?:作者|编辑|来源|责任编辑|author|posted by|written by|by)\s*[:：]\s*.{1,40}|"
    r"(?:阅读|浏览|阅读量|点赞|收藏|评论|分享|转发|views?|likes?|comments?|shares?)\s*[:：]?\s*[\d.,]+\s*[kKwW万]?|"
    r"(?:版权声明|copyright|©|\(c\)).{0,120}|(?:all rights reserved).{0,40}|收起|展开|举报|分享到|"
    r"(?:扫码|关注公众号|点击关注).{0,40}|(?:上一篇|下一篇|previous post|next post)\s*[:：].{0,80})$",
    re.IGNORECASE)


@dataclass
class Stripped:
    lines: list[str]
    removed: list[str] = field(default_factory=list)  # removed lines/blocks, for debugging


def _repeated_name(line: str) -> bool:
    """'Foo-7BFoo 7B is …': an ASCII project name immediately followed by the same name again."""
    m = re.match(r"^[-*•\s]*([A-Za-z][A-Za-z0-9_.\-]{2,})", line)
    if not m:
        return False
    name = m.group(1)
    head = name[:4]
    # The second occurrence starts inside the first ASCII run ("Kimi-K2-ThinkingKimi") or right after it.
    rest = line[m.start(1) + 4:]
    j = rest.find(head)
    return 0 <= j <= len(name)


def ad_strength(line: str) -> int:
    """2: surely an ad/listing line; 1: junk-like (counter, language, short fragment); 0: ordinary text."""
    s = line.strip()
    if not s:
        return 0
    if _LANG_COUNTS.search(s) or _NO_DESC.search(s):
        return 2
    if _repeated_name(s) and (_TRAILING_COUNTS.search(s) or len(s) > 40):
        return 2
    if _CUT_MARKERS.match(s) or _COUNT_ONLY.match(s) or _LANG_ONLY.match(s) or _DROP_LINE.match(s):
        return 1
    if len(s) > 30 and _TRAILING_COUNTS.search(s) and re.search(r"[\u4e00-\u9fff。.!)）]\d{2}\s*$", s):
        return 1
    return 0


def _is_heading(line: str) -> bool:
    s = line.strip()
    m = re.match(r"^#{1,6}\s+(.*)$", s)
    return bool((m and classify_heading(m.group(1), markdown=True)) or bare_heading_kind(s))


def _is_junk(line: str) -> bool:
    return bool(ad_strength(line)) or len(line.strip()) <= 4


def find_cut(lines: list[str]) -> int | None:
    """Index of the first line of the trailing boilerplate, or None when the article runs to the end."""
    n = len(lines)
    # Suffix tables (one pass from the end) keep this linear in the number of lines.
    heading_after = [False] * (n + 1)
    junk_after = [0] * (n + 1)
    nonempty_after = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        s = lines[i].strip()
        heading_after[i] = heading_after[i + 1] or (bool(s) and _is_heading(s))
        nonempty_after[i] = nonempty_after[i + 1] + (1 if s else 0)
        junk_after[i] = junk_after[i + 1] + (1 if s and _is_junk(s) else 0)
    for i in range(2, n):  # the title and the first line of content are never boilerplate
        s = lines[i].strip()
        if not s or heading_after[i + 1]:
            continue
        if _CUT_MARKERS.match(s):
            return i
        tail = nonempty_after[i + 1]
        ratio = junk_after[i + 1] / tail if tail else 1.0
        if ad_strength(s) == 2 and ratio >= 0.5:
            return i
    return None


def strip_boilerplate(lines: list[str]) -> Stripped:
    """Remove the trailing boilerplate block and stray byline/counter lines."""
    removed: list[str] = []
    cut = find_cut(lines)
    if cut is not None:
        # Junk lines just above the cut (counters, "收起") belong to the same block.
        while cut > 1 and lines[cut - 1].strip() and ad_strength(lines[cut - 1]) and \
                not bare_heading_kind(lines[cut - 1]):
            cut -= 1
        removed.append("\n".join(lines[cut:]).strip())
        lines = lines[:cut]
    kept: list[str] = []
    for i, ln in enumerate(lines):
        s = ln.strip()
        if i > 0 and s and _DROP_LINE.match(s):
            removed.append(s)
            continue
        kept.append(ln)
    while kept and not kept[-1].strip():
        kept.pop()
    return Stripped(kept, [r for r in removed if r])
