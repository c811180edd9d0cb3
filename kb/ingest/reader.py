"""Reading a document from disk or a string safely: size limit, binary detection, decoding, format sniffing."""

from __future__ import annotations

import os
import re
from pathlib import Path

from kb.errors import InputError, NotFound
from kb.facts import boundary
from kb.settings import Limits, limits

DEFAULT_MAX_BYTES = Limits.model_fields["ingest_max_bytes"].default
FORMATS = ("text", "markdown", "html")

_SUFFIX_FMT = {
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".md": "markdown", ".markdown": "markdown", ".mdown": "markdown",
    ".txt": "text", ".text": "text", ".log": "text",
}
_HTML_TAG = re.compile(r"<(?:!doctype\s+html|html|head|body|article|div|p|h[1-6]|ul|table|meta)\b", re.IGNORECASE)


def size_limit(explicit: int | None = None) -> int:
    """The per-document size limit: the explicit value, else KB_INGEST_MAX_BYTES (kb.settings), else 5 MB."""
    if explicit is not None:
        return int(explicit)
    try:
        return limits().ingest_max_bytes
    except ValueError:
        raise InputError("KB_INGEST_MAX_BYTES must be a number of bytes") from None


def check_text(text: str, source: str = "<text>", limit: int | None = None) -> str:
    """Validate a decoded document at the fact layer's boundary, with the per-document size limit."""
    return boundary.check_text(text, source, max_bytes=size_limit(limit), allow_empty=False)


def sniff_format(text: str, name: str = "") -> str:
    """'html', 'markdown' or 'text', from the file suffix first and the content second."""
    suffix = Path(name).suffix.lower() if name else ""
    if suffix in _SUFFIX_FMT and _SUFFIX_FMT[suffix] == "html":
        return "html"
    head = text[:4000]
    if len(_HTML_TAG.findall(head)) >= 2 or head.lstrip().lower().startswith(("<!doctype html", "<html")):
        return "html"
    if suffix in _SUFFIX_FMT:
        return _SUFFIX_FMT[suffix]
    if re.search(r"^(#{1,6} |```|---\s*$)", head, re.MULTILINE):
        return "markdown"
    return "text"


def read_document(path: str | os.PathLike, *, max_bytes: int | None = None) -> tuple[str, str]:
    """Read one document for `kb ingest`: (text, fmt). Raises NotFound, InputTooLarge or InputError."""
    p = Path(path)
    if not p.exists():
        raise NotFound(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a folder; pass the files inside it")
    lim = size_limit(max_bytes)
    try:
        size = p.stat().st_size
        if size > lim:
            raise boundary.too_large(str(p), size, lim)
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    text = check_text(boundary.decode(raw, str(p)), str(p), lim)
    return text, sniff_format(text, p.name)
