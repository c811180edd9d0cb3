"""Reading a document from disk or a string safely: size limit, binary detection, decoding, format sniffing."""

from __future__ import annotations

import os
import re
from pathlib import Path

from kb.errors import InputError, InputTooLarge, NotFound

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
FORMATS = ("text", "markdown", "html")

_SUFFIX_FMT = {
    ".html": "html", ".htm": "html", ".xhtml": "html",
    ".md": "markdown", ".markdown": "markdown", ".mdown": "markdown",
    ".txt": "text", ".text": "text", ".log": "text",
}
# Control characters other than tab/newline/carriage return/form feed: their presence means binary data.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\ufffd]")
_HTML_TAG = re.compile(r"<(?:!doctype\s+html|html|head|body|article|div|p|h[1-6]|ul|table|meta)\b", re.IGNORECASE)


def size_limit(explicit: int | None = None) -> int:
    """The per-document size limit: the explicit value, else env KB_INGEST_MAX_BYTES, else 5 MB."""
    if explicit is not None:
        return int(explicit)
    env = os.environ.get("KB_INGEST_MAX_BYTES", "").strip()
    if env:
        try:
            return int(float(env))
        except ValueError:
            raise InputError(f"KB_INGEST_MAX_BYTES must be a number of bytes, got {env!r}") from None
    return DEFAULT_MAX_BYTES


def _too_large(source: str, size: int, limit: int) -> InputTooLarge:
    return InputTooLarge(f"{source}: {size:,} bytes is over the {limit:,}-byte limit per document "
                         "(raise it with KB_INGEST_MAX_BYTES or max_bytes=)")


def check_text(text: str, source: str = "<text>", limit: int | None = None) -> str:
    """Validate a decoded document: a non-empty string within the size limit and without binary junk."""
    if not isinstance(text, str):
        raise InputError(f"{source}: expected text, got {type(text).__name__}")
    lim = size_limit(limit)
    # A str needs at least one byte per character, so only measure when it could be over the limit.
    if len(text) > lim // 4:
        size = len(text.encode("utf-8", errors="replace"))
        if size > lim:
            raise _too_large(source, size, lim)
    if "\x00" in text:
        raise InputError(f"{source}: contains NUL bytes; this looks like a binary file, not a document")
    if not text.strip():
        raise InputError(f"{source}: the document is empty")
    bad = len(_CONTROL.findall(text[:200_000]))
    if bad > max(3, len(text[:200_000]) // 100):
        raise InputError(f"{source}: {bad} control or undecodable characters; this is not a text document")
    return text


def decode_bytes(raw: bytes, source: str = "<bytes>") -> str:
    """Decode a document's bytes (UTF-8, UTF-16 with BOM, or GB18030 for older Chinese pages)."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return raw.decode("utf-16")
        except UnicodeDecodeError:
            raise InputError(f"{source}: has a UTF-16 byte-order mark but does not decode as UTF-16") from None
    if b"\x00" in raw:
        raise InputError(f"{source}: contains NUL bytes; this looks like a binary file, not a document")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    try:
        text = raw.decode("gb18030")
    except UnicodeDecodeError:
        raise InputError(f"{source}: not valid UTF-8 or GB18030 text; binary or unknown encoding") from None
    # GB18030 accepts most byte strings; only trust it when the result reads as text.
    cjk = len(re.findall(r"[\u4e00-\u9fff]", text))
    odd = len(re.findall(r"[^\s\x20-\x7e\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]", text))
    if cjk == 0 or odd > cjk // 10:
        raise InputError(f"{source}: not valid UTF-8 text; binary or unknown encoding")
    return text


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
            raise _too_large(str(p), size, lim)
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    text = check_text(decode_bytes(raw, str(p)), str(p), lim)
    return text, sniff_format(text, p.name)
