"""The one boundary for untrusted input: bytes -> text, text checks, and the lines the extractors may read.

Everything a user hands the library (a paste, a config, an uploaded article, a trainer's log records) passes
here once. Decoding (BOMs, UTF-16, GB18030, lone surrogates), binary junk, size, line length and nesting depth
are settled at this boundary, so the extractors behind it only ever see bounded, valid text. Failures are
`kb.errors.InputError` / `InputTooLarge`; the CLI maps them to exit codes and the API to 4xx statuses.
"""

from __future__ import annotations

import re
from pathlib import Path

from kb.errors import InputError, InputTooLarge
from kb.settings import Limits, limits

# Control characters that never occur in a text log (tab, newline, CR, form feed and ANSI ESC do).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f\x7f\ufffd]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_ODD_FOR_GB = re.compile(r"[^\s\x20-\x7e\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
# Lines worth keeping from the skipped middle of a huge log: bad values, errors, warnings, overflow messages.
_SALIENT = re.compile(r"(?<![A-Za-z])(?:nan|inf)(?![A-Za-z])|error|exception|traceback|overflow|warn|skipping step|"
                      r"loss scale|untrained|-100|溢出|报错", re.IGNORECASE)


def decode(data: bytes, name: str = "input") -> str:
    """UTF-8 (BOM or not), UTF-16 with a BOM (Windows editors, PowerShell), or GB18030 (older Chinese pages)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise InputError(f"{name} starts with a UTF-16 mark but does not decode; save it as UTF-8") from None
    if b"\x00" in data[:65536]:
        raise InputError(f"{name} looks binary (NUL bytes); paste a text log, config or command line")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    try:
        text = data.decode("gb18030")
        # GB18030 accepts most byte strings: trust it only when the result reads as Chinese text (hanzi,
        # varied, with the spaces or line breaks every real log or article has).
        head = text[:65536]
        cjk = len(_CJK.findall(head))
        if (cjk and len(_ODD_FOR_GB.findall(head)) <= cjk // 10 and len(set(head)) >= 8
                and any(c in head for c in " \n\t")):
            return text
    except UnicodeDecodeError:
        pass
    # Mostly UTF-8 with a few broken bytes (a log cut mid-character) is still a log; check_text judges the rest.
    return data.decode("utf-8", errors="replace")


def check_text(text: str | bytes, name: str = "input", max_bytes: int | None = None,
               allow_empty: bool = True) -> str:
    """Decode and check one input: binary junk -> InputError, over `max_bytes` -> InputTooLarge.

    Lone surrogates (from JSON `"\\ud800"`) become U+FFFD so that nothing downstream fails to encode them.
    """
    cap = max_bytes if max_bytes is not None else 10 * limits().diagnose_max_bytes
    if isinstance(text, (bytes, bytearray)):
        if len(text) > cap:
            raise too_large(name, len(text), cap)
        text = decode(bytes(text), name)
    if not isinstance(text, str):
        raise InputError(f"{name}: expected text, got {type(text).__name__}")
    # A str needs at least one byte per character, so only measure when it could be over the limit.
    if len(text) > cap // 4:
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > cap:
            raise too_large(name, size, cap)
    if _SURROGATE.search(text):
        text = _SURROGATE.sub("\ufffd", text)
    sample = text[:65536]
    if "\x00" in sample:
        raise InputError(f"{name} looks binary (NUL bytes); paste a text log, config or command line")
    if sample:
        bad = len(_CONTROL.findall(sample))
        if bad > max(3, len(sample) // 10):
            raise InputError(f"{name} looks binary ({bad} control/undecodable characters in the first "
                             f"{len(sample)}); paste a text log, config or command line")
    if not allow_empty and not text.strip():
        raise InputError(f"{name} is empty")
    return text


def read_text_file(path: str | Path) -> str:
    """A text file read through `check_text`: at most one byte past the size cap is read, so a huge file is refused
    without being loaded; a file that cannot be read is an InputError naming it."""
    try:
        with Path(path).open("rb") as fh:
            data = fh.read(10 * limits().diagnose_max_bytes + 1)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from None
    return check_text(data, str(path))


def too_large(name: str, size: int, cap: int) -> InputTooLarge:
    return InputTooLarge(f"{name} is {size / 1e6:.1f} MB; the limit is {cap / 1e6:.1f} MB "
                         "(set KB_DIAGNOSE_MAX_BYTES or KB_INGEST_MAX_BYTES); paste the head and tail of the log")


def nesting_depth(text: str, stop_at: int | None = None) -> int:
    """Deepest bracket / indentation nesting of a JSON or YAML text, counted without parsing it."""
    stop = stop_at if stop_at is not None else 1 << 30
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest >= stop:
                    return deepest
        elif ch in "]}" and depth:
            depth -= 1
    return deepest


def too_deep(text: str, lim: Limits | None = None) -> bool:
    """True when a structured text is nested past the limit (parsers would recurse that deep): brackets, or YAML
    block indentation (two spaces a level)."""
    cap = (lim or limits()).max_nesting
    if nesting_depth(text, cap + 1) > cap:
        return True
    return any(len(line) - len(line.lstrip(" ")) > 2 * cap for line in text.split("\n", 20000)[:20000]
               if line.strip())


def numbered_lines(text: str, name: str = "input", lim: Limits | None = None
                   ) -> tuple[list[tuple[int, str]], list[str]]:
    """(line number, line) pairs within the work caps, line numbers preserved, and warnings about what was cut.

    Past the line or byte cap a quarter of the budget goes to the head (command, config, environment), a quarter
    to middle lines that mention nan / inf / errors / overflow (the first and the last of them), and half to the
    tail. A line longer than `max_line_chars` keeps its head and tail: every pattern behind this boundary then
    runs on bounded lines.
    """
    lim = lim or limits()
    max_bytes, max_lines, max_chars = lim.diagnose_max_bytes, lim.diagnose_max_lines, lim.max_line_chars
    warnings: list[str] = []
    raw = text.split("\n")
    budget = max_lines
    if len(text) > max_bytes:
        # Keep the line budget proportional to the byte cap for long-lined logs.
        avg = max(1.0, len(text) / max(1, len(raw)))
        budget = max(100, min(max_lines, int(max_bytes / avg)))
    if len(raw) <= budget:
        lines = [(i + 1, s) for i, s in enumerate(raw)]
    else:
        n_head, n_mid = budget // 4, budget // 4
        n_tail = budget - n_head - n_mid
        mid_lo, mid_hi = n_head, len(raw) - n_tail
        salient = [i for i in range(mid_lo, mid_hi) if _SALIENT.search(raw[i][:max_chars])]
        if len(salient) > n_mid:
            salient = salient[: n_mid // 2] + salient[-(n_mid - n_mid // 2):]
        keep = list(range(n_head)) + salient + list(range(mid_hi, len(raw)))
        lines = [(i + 1, raw[i]) for i in keep]
        warnings.append(f"{name} has {len(raw)} lines ({len(text) / 1e6:.1f} MB); read the first {n_head}, the last "
                        f"{n_tail} and {len(salient)} lines in between that mention nan / inf / errors "
                        f"(limits KB_DIAGNOSE_MAX_LINES={max_lines}, KB_DIAGNOSE_MAX_BYTES={max_bytes})")
    long_lines = 0
    out = []
    for n, s in lines:
        s = s.rstrip("\r")
        if len(s) > max_chars:
            long_lines += 1
            s = s[:max_chars // 2] + " … " + s[-max_chars // 2:]
        out.append((n, s))
    if long_lines:
        warnings.append(f"{long_lines} line(s) in {name} longer than {max_chars} characters were shortened")
    return out, warnings
