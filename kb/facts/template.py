"""The reporter's own words: a paste without its issue template's scaffolding and environment dump.

A GitHub issue form puts the same lines into every report of a repository, whatever went wrong: checkboxes
("- [X] I have read the README and searched the existing issues"), section headings ("### System Info",
"**Describe the bug**"), the form's own instructions, and an environment dump (`transformers-cli env`,
`python -m torch.utils.collect_env`, `ds_report`, `pip list`); screenshots add links kb cannot read; a traceback's
frames and a pasted script's imports and calls are where the program was, not what the reporter saw. The fact
layer reads all of it (versions and GPU names are facts). The text-based parts of diagnosis (the text classifiers, the nearest reports, the scope words)
read `narrative(text)` instead, so that a report filed through LLaMA-Factory's form and the same report typed
by hand are answered alike. Measured on the case base before this change: putting a LLaMA-Factory-style form
(`kb.diagnose.evaluate.ISSUE_FORM`) in front of every report moved top-1 from 0.633 to 0.582 and out-of-scope
abstention from 0.904 to 0.870 (docs/DIAGNOSE.md).
"""

from __future__ import annotations

import re

from kb.canonical import canonical_package

# A ticked or unticked checkbox of a form.
_CHECKBOX = re.compile(r"^\s*(?:[-*+]\s*)?\[[ xX✓✔]?\]\s")
# A line of nothing but @-mentions (the "Who can help?" answer of a form).
_MENTIONS = re.compile(r"(?:@[\w\-]+[\s,]*)+")
# A line that is only a form's section name (markdown heading, bold, or bare with a colon).
_SECTION_NAMES = (
    "system info", "system information", "environment", "environment info", "environment information",
    "your hardware and system info", "hardware and system info", "ds_report output", "reminder", "checklist",
    "who can help", "who can help?", "information", "tasks", "reproduction", "to reproduce", "steps to reproduce",
    "reproduce", "expected behavior", "expected behaviour", "actual behavior", "actual behaviour", "others",
    "other", "additional context", "additional information", "screenshots", "describe the bug", "bug description",
    "description", "motivation", "your contribution", "logs", "log", "versions", "version",
    "system info (please complete the following information)",
    # a pull request's template: "# What does this PR do?", "## Before submitting", "Who can review?"
    "what does this pr do", "what does this pr do?", "before submitting", "who can review", "who can review?",
    "related issue", "related issues", "motivation and context", "type of change", "test plan",
    "问题描述", "复现", "复现过程", "复现步骤", "环境", "运行环境", "环境信息", "系统信息", "期望行为", "预期行为",
    "其他", "其他信息", "补充信息", "报错信息", "日志", "描述", "bug描述",
)
_SECTION_NAMES_CANON = frozenset(n.rstrip("?:：") for n in _SECTION_NAMES)
# Form instructions printed into every report ("What the bug is, and how to reproduce, better with screenshots").
_INSTRUCTION = re.compile(
    r"^\s*(?:what the bug is, and how to reproduce|a clear and concise description of|steps to reproduce the "
    r"behavior|please (?:provide|share|include|describe|paste|complete)|if applicable, add screenshots|"
    r"add any other context about the problem|copy-and-paste the text below|the official example scripts|"
    r"my own modified scripts|an officially supported task|my own task or dataset|write your system info|"
    r"fixes # \(issue\)|"  # a pull request template's line left unfilled
    r"\(?描述bug以及复现过程|请(?:提供|描述|填写|粘贴))", re.IGNORECASE)
# An environment line: "key: value" whose short key names the machine or a package's version ("Platform:
# Linux-5.15", "GPU type: NVIDIA A800", "- `transformers` version: 4.46.1", "Accelerate version: 0.34.2").
_ENV_KEY = re.compile(
    r"version|platform|\bpython\b|\bos\b|operating system|\bgpus?\b|\bcuda\b|cudnn|driver|\bnccl\b|"
    r"\bhip\b|miopen|\brocm\b|xnnpack|debug build|\bgcc\b|\bclang\b|\bcmake\b|\blibc\b|\bcpus?\b|"
    r"architecture|byte order|address sizes|vendor id|model name|thread\(s\)|core\(s\)|socket\(s\)|numa node|"
    r"stepping|bogomips|l[123][di]? cache|vulnerability|hypervisor|cpu op-mode|cpu family|"
    r"using (?:gpu|distributed|parallel)|distributed or parallel|"
    r"显卡|系统|版本|平台|驱动", re.IGNORECASE)
# Keys that are machine output of a failure, never an environment line ("torch.cuda.OutOfMemoryError: ...",
# "flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol", "CUDA SETUP: ...").
_NOT_ENV_KEY = re.compile(r"error|exception|warn|traceback|\.so\b|\.py\b|setup|assert|fail|line \d", re.IGNORECASE)
# A value that reads as a report, not a setting: a bad metric or a failure said after "key:" ("GPU: loss nan").
_NARRATIVE_VALUE = re.compile(r"\b(?:nan|inf|loss|diverg\w*|error|fail\w*|crash\w*)\b|损失|报错|溢出", re.IGNORECASE)
_VERSION_VALUE = re.compile(r"^v?\d+\.\d+[\w.+\-]*(?: ?\([^)]{0,40}\))?")
# pip / conda listings: "torch   2.4.0", "[pip3] numpy==1.26.4", "transformers==4.46.1",
# "[conda] pytorch 2.4.0 py3.10_cuda12.1 pytorch".
_PACKAGE_LINE = re.compile(r"^(?:\[(?:pip3?|conda)\] *\S+(?: +\S+){0,4}|[A-Za-z][\w.\-]* *== *v?\d[\w.+\-]*"
                           r"|[A-Za-z][\w.\-]* {2,}v?\d+\.\d+[\w.+\-]*(?: +\S+){0,3})")
_ENV_HEADERS = re.compile(r"^\s*(?:collecting environment information|versions of relevant libraries|"
                          r"gpu models and configuration|-*\s*ds_report\b)", re.IGNORECASE)


# Only short lines can be scaffolding or an environment line; longer ones are kept unread (and no pattern here
# backtracks over a long line).
_LONGEST = 400


def _section(s: str) -> bool:
    """A line that is only a form's section name: "### System Info", "**Describe the bug**", "复现过程："."""
    name = s.lstrip("#").strip().strip("*_").strip().rstrip(":：").strip().strip("*_").strip().rstrip(":：?？").strip()
    return name.lower() in _SECTION_NAMES_CANON


def _key_value(s: str) -> tuple[str, str] | None:
    """("key", "value") of a "key: value" line (bullet, backticks and bold stripped), else None."""
    cut = min((i for i in (s.find(":"), s.find("：")) if i >= 0), default=-1)
    if cut <= 0 or "=" in s[:cut]:
        return None
    key = s[:cut].strip().lstrip("-*+").strip().strip("`*_").strip()
    return (key, s[cut + 1:].strip()) if 0 < len(key) <= 60 else None


def _env_line(s: str) -> bool:
    if len(s) <= 160 and _PACKAGE_LINE.fullmatch(s):
        return True
    kv = _key_value(s)
    if kv is None:
        return False
    key, val = kv
    if len(key.split()) > 8 or _NOT_ENV_KEY.search(key) or _NARRATIVE_VALUE.search(val):
        return False
    if _VERSION_VALUE.fullmatch(val):  # "Accelerate: 0.34.2" but not "learning_rate: 0.0001"
        return bool(_ENV_KEY.search(key) or canonical_package(key.strip("`"), val))
    return "_" not in key and bool(_ENV_KEY.search(key))  # "gpu_memory_utilization: 0.6" is a setting


def template_line(line: str) -> bool:
    """Whether a line is issue-form scaffolding or part of an environment dump (not the reporter's words)."""
    s = line.strip()
    if not s or len(s) > _LONGEST:
        return False
    if _CHECKBOX.match(s) or _INSTRUCTION.match(s) or _ENV_HEADERS.match(s) or _MENTIONS.fullmatch(s):
        return True
    return _section(s) or _env_line(s)


# A screenshot: a markdown image, an <img> tag or a bare link to an uploaded attachment. kb cannot read it, and
# its URL's random characters only add noise to the text classifiers (measured: one image line before and after
# every report moved top-1 from 0.642 to 0.621 out of fold).
_IMAGE = re.compile(r"!\[[^\]\n]{0,200}\]\([^)\s]{1,500}\)|<img\b[^>\n]{0,1000}>|"
                    r"https?://(?:github\.com/user-attachments/|(?:private-)?user-images\.githubusercontent\.com/)"
                    r"[^\s)\]>]{1,500}", re.IGNORECASE)


# A traceback's frame ("  File "/x/trainer.py", line 2123, in train"), its source line and its caret line: where
# the program was, the same in every report through the same library, not what the reporter saw (the exception
# line at the bottom stays). Measured out of fold (docs/DIAGNOSE.md): five frames of a Trainer traceback after
# every report took top-1 from 0.645 to 0.594; left out, 0.636 (0.651 without them).
_FRAME = re.compile(r'^(\s*)File "[^"\n]{1,400}", line \d+(?:, in \S+)?\s*$')
_CARETS = re.compile(r"^\s*[~^]+\s*$")
# Program plumbing in a pasted script: imports, definitions, control lines and calls or assignments that carry no
# literal setting (`trainer = Trainer(model=model, args=training_args)`, `trainer.train()`). A line that sets a
# literal stays (`torch_dtype=torch.float16`, `tokenizer.padding_side = "left"`, `lr=1e-4`, `fp16=True`,
# `model.half()`): it says what the run was. The fact layer reads every line either way. Measured the same way: a
# seven-line loading-and-Trainer script after every report took top-1 from 0.645 to 0.597 (its words had come to
# mean half-precision weights, whose reports often paste their loading code); left out, 0.654.
_IMPORT = re.compile(r"^\s*(?:from\s+[\w.]+\s+import\s+\S|import\s+[\w.]+(?:\s+as\s+\w+)?\s*(?:,\s*[\w.]+\s*)*$)")
_CODE = re.compile(r"^\s*(?:(?:def|class)\s+\w+\s*[(:]|(?:return|yield|raise|pass|break|continue)\b|"
                   r"(?:for|while|if|elif|else|with|try|except|finally)\b[^\n]*:\s*$|"
                   r"[\w.\[\]'\"]+\s*(?:[-+*/]?=)\s*[\w.\[\]'\"]*\(|[\w.]+\([^()]*\)\s*$|\)\s*$)")
_LITERAL_SETTING = re.compile(r"""[\w\]'"]\s*=\s*(?:[-+]?\.?\d|["']|True\b|False\b|torch\.\w)|"""
                              r"torch\.(?:float|bfloat|half|int)\w*|\.(?:half|bfloat16|float|double)\(\)")


def code_line(line: str) -> bool:
    """Whether a line is program plumbing (an import, a definition, a call or assignment with no literal setting,
    a traceback's caret line)."""
    s = line.strip()
    if not s or len(s) > _LONGEST:
        return False
    if _IMPORT.match(s) or _CARETS.fullmatch(s):
        return True
    return bool(_CODE.match(s)) and not _LITERAL_SETTING.search(s)


def narrative(text: str, limit: int | None = None) -> str:
    """`text` without its template and environment lines, its screenshots, traceback frames and script plumbing
    (kept whole when nothing else would be left). With `limit`, reading stops once that many characters are kept
    (the learned layer reads the first 4000)."""
    kept: list[str] = []
    size, dropped = 0, False
    frame = -1  # indentation of the traceback frame line just dropped: its source line follows, deeper
    for ln in text.split("\n"):
        if frame >= 0:
            deeper, frame = len(ln) - len(ln.lstrip()) > frame, -1
            if ln.strip() and deeper and not _FRAME.match(ln):
                dropped = True
                continue
        if "](" in ln or "user-" in ln or "<img" in ln.lower():
            bare = _IMAGE.sub("", ln)
            if bare != ln:
                dropped, ln = True, bare
                if not ln.strip():
                    continue
        if len(ln) <= _LONGEST and 'File "' in ln:
            m = _FRAME.match(ln)
            if m:
                dropped, frame = True, len(m.group(1))
                continue
        if template_line(ln) or code_line(ln):
            dropped = True
            continue
        kept.append(ln)
        size += len(ln) + 1
        if limit is not None and size >= limit:
            break
    if not dropped:
        return text if limit is None else text[:max(limit, size)]
    out = "\n".join(kept).strip()
    return out if out else text
