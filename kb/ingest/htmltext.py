"""HTML page -> markdown-ish text with the standard library, dropping scripts, navigation, footers and sidebars."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

# Whole subtrees that are never article content.
_SKIP_TAGS = {"script", "style", "noscript", "template", "nav", "footer", "aside", "form", "iframe", "svg",
              "button", "select", "textarea", "object", "canvas", "dialog", "menu"}
# class/id words that mark page furniture (sidebars, share bars, related-post lists, cookie banners).
_SKIP_ATTR = re.compile(
    r"(?:^|[\s_-])(nav|navbar|menu|footer|sidebar|side-bar|breadcrumbs?|comments?|share|social|related|"
    r"recommend(?:ed|ation)?s?|advert\w*|ads?|banner|cookie|subscribe|newsletter|toolbar|pagination|"
    r"hot-?list|tags?-?cloud)(?:$|[\s_-])", re.IGNORECASE)
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
         "wbr"}
_BLOCK = {"p", "div", "section", "article", "main", "header", "table", "tr", "ul", "ol", "dl", "dt", "dd",
          "blockquote", "figure", "figcaption", "details", "summary", "body", "html"}


@dataclass
class HtmlDoc:
    text: str
    title: str = ""
    url: str = ""
    dropped: list[str] = field(default_factory=list)  # names of the subtrees dropped, for debugging


class _Converter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.title = ""
        self.url = ""
        self.dropped: list[str] = []
        self._skip_tag: str | None = None
        self._skip_depth = 0
        self._in_title = False
        self._pre = 0
        self._article = 0  # inside <article>/<main>: a <header> there holds the article title, keep it
        self._stack: list[str] = []

    # -- helpers
    def _emit(self, s: str) -> None:
        self.out.append(s)

    def _newline(self, n: int = 1) -> None:
        self._emit("\n" * n)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth += 1
            return
        if tag == "meta" and a.get("property", a.get("name", "")).lower() in {"og:url", "twitter:url"}:
            self.url = self.url or a.get("content", "").strip()
        if tag == "link" and "canonical" in a.get("rel", "").lower():
            self.url = a.get("href", "").strip() or self.url
        if tag in _VOID:
            if tag == "br":
                self._newline()
            elif tag == "hr":
                self._newline(2)
            return
        marker = f"{a.get('class', '')} {a.get('id', '')} {a.get('role', '')}"
        if (tag in _SKIP_TAGS or (tag == "header" and not self._article)
                or (tag not in {"html", "body", "article", "main"} and not self._pre and _SKIP_ATTR.search(marker))):
            self._skip_tag, self._skip_depth = tag, 1
            self.dropped.append(tag + (f".{a.get('class', '').split()[0]}" if a.get("class", "").split() else ""))
            return
        self._stack.append(tag)
        if tag in {"article", "main"}:
            self._article += 1
        if tag == "title":
            self._in_title = True
        elif re.fullmatch(r"h[1-6]", tag):
            self._newline(2)
            self._emit("#" * int(tag[1]) + " ")
        elif tag == "li":
            self._newline()
            self._emit("- ")
        elif tag == "pre":
            self._pre += 1
            self._newline()
            self._emit("```\n")
        elif tag == "code" and not self._pre:
            self._emit("`")
        elif tag in {"td", "th"}:
            self._emit(" | ")
        elif tag in _BLOCK:
            self._newline(2 if tag == "p" else 1)

    def handle_endtag(self, tag: str) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._skip_tag = None
            return
        if tag not in self._stack:
            return  # stray end tag
        while self._stack and self._stack.pop() != tag:
            pass
        if tag in {"article", "main"}:
            self._article = max(0, self._article - 1)
        if tag == "title":
            self._in_title = False
        elif re.fullmatch(r"h[1-6]", tag):
            self._newline(2)
        elif tag == "pre":
            self._pre = max(0, self._pre - 1)
            self._emit("\n```")
            self._newline()
        elif tag == "code" and not self._pre:
            self._emit("`")
        elif tag in _BLOCK or tag == "li":
            self._newline()

    def handle_data(self, data: str) -> None:
        if self._skip_tag is not None:
            return
        if self._in_title:
            self.title += data
            return
        if "head" in self._stack and "body" not in self._stack:
            return
        if self._pre:
            self._emit(data)
        else:
            self._emit(re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> HtmlDoc:
    """Convert an HTML page to text with `#` headings, `- ` list items and fenced code blocks."""
    conv = _Converter()
    try:
        conv.feed(html)
        conv.close()
    except (AssertionError, ValueError):
        # html.parser gives up on some malformed markup (`<![` + junk): fall back to dropping the tags crudely
        # rather than failing the document.
        crude = re.sub(r"<[^>]{0,2000}>", " ", html)
        return HtmlDoc(text=re.sub(r"[ \t]+", " ", crude).strip(), title="", url="", dropped=["unparseable markup"])
    text = "".join(conv.out)
    lines = [ln.rstrip() if ln.startswith(("    ", "\t")) else ln.strip() for ln in text.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    title = re.sub(r"\s+", " ", conv.title).strip()
    if title and not re.search(r"^# ", text, re.MULTILINE):
        text = f"# {title}\n\n{text}"
    return HtmlDoc(text=text, title=title, url=conv.url, dropped=conv.dropped)
