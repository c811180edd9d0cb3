"""Settings and observations an article or a paste *states* in running text: labelled values ("最大长度:8192",
"learning rate of 1e-5"), flags and identifiers in prose ("--vanilla_loss", "rpo_alpha采用默认值1.0"), precision
phrases, GPU counts, versions, relations between two settings, error strings and metric observations.

`extract` is a pipeline stage (it fills gaps: explicit configs and command lines, read by kb.facts.configs,
outrank it); `extract_config(text, recommendation=True)` reads a fix ("remove X" -> X off); ingest uses
`extract_relations`, `extract_errors` and `extract_metrics` for a record's triggers and symptoms.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any

from kb.canonical import (
    CONTRAST,
    DENIED_BEFORE,
    GPU_MODELS,
    GPU_NAME,
    PACKAGES,
    PROSE_LABELS,
    SAID_FINE,
    SUPPOSED,
    WENT_BAD,
    canonical_algorithm,
    canonical_key,
    gpu_name,
    normalise_value,
    said_as_fix,
    spec,
)
from kb.facts.model import Facts
from kb.facts.prefilter import Haystack, fold


@dataclass
class Finding:
    key: str
    value: Any
    snippet: str  # the text it was read from
    how: str  # "label" | "key" | "flag" | "prose"
    pos: int = -1  # offset in the text it was read from


_SEP = (r"[\"'`]?[ \t]*(?:参数|选项|的值|值|parameter|option|flag|setting)?[ \t]*(?:被)?[ \t]*"
        r"(?:==|[:：=]|设置为|设置成|设定为|设为|配置为|改为|调整为|指定为|调成|取值为|采用|使用|为|是|等于|"
        r"(?:is\s+)?set\s+to(?![A-Za-z])|is(?![A-Za-z])|of(?![A-Za-z])|to(?![A-Za-z])|was(?![A-Za-z])|"
        r"at(?![A-Za-z]))?[ \t]*"
        r"(?:默认值|默认的|默认|(?:the\s+)?default(?:\s+value)?(?:\s+of)?)?[ \t]*"
        r"(?:[（(][ \t]*(?:如|例如|比如|e\.g\.,?|eg\.?)?[ \t]*)?")
_VALUE = re.compile(
    _SEP + r"(?:[\"'“”‘’`](?P<qv>[^\"'“”‘’`\n]{1,80})[\"'“”‘’`]|"
    r"(?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_]|\.[A-Za-z0-9_])|"
    r"(?P<word>[A-Za-z_][A-Za-z0-9_.\-/]{0,120}))", re.IGNORECASE)
# Only words that can be config keys in prose: flags (--x), identifiers with "_" or "." (max_length,
# zero_optimization.stage) and any word directly followed by ":" or "=" (YAML, key=value).
_KEY = re.compile(
    r"(?:(?P<dash>--?)(?P<key>[A-Za-z][A-Za-z0-9_.\-]{0,80}[A-Za-z0-9])|"
    r"(?P<ident>[A-Za-z][A-Za-z0-9]{0,40}[_.][A-Za-z0-9_.\-]{0,80}[A-Za-z0-9])|"
    r"(?P<kv>[A-Za-z][A-Za-z0-9_\-]{0,80}[A-Za-z0-9])(?=[\"'`]?[ \t]*[:=]))")
def _label_regex(label: str) -> str:
    return re.escape(label).replace(r"\ ", r"[\s_-]?") if label.isascii() else re.escape(label)


# No look-behind at the front of these two patterns: it would stop the regex engine from skipping ahead
# to possible first characters, which makes scanning a long document several times slower. Word
# boundaries are checked in Python instead (_ascii_bounded).
_LABEL = re.compile("|".join(_label_regex(lab) for lab in sorted(PROSE_LABELS, key=len, reverse=True)),
                    re.IGNORECASE)


# "global batch size 256", "total train batch size", "effective batch size", "全局批次大小": the whole batch across
# devices and accumulation steps, not the per-device micro-batch that the label names alone.
_OTHER_QUANTITY = re.compile(r"(?:(?<![A-Za-z])(?:global|total|effective|overall)[\s_-]+(?:train(?:ing)?[\s_-]+)?|"
                             r"全局|总的?|有效)$", re.IGNORECASE)


def _ascii_bounded(text: str, start: int, end: int) -> bool:
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return not (before.isascii() and (before.isalnum() or before == "_")) and \
        not (after.isascii() and (after.isalnum() or after == "_"))


_DISABLE = re.compile(r"(禁用|关闭|关掉|移除|去掉|去除|删除|删掉|不使用|不用|不要|取消|避免使用|未开启|未启用|未使用|没有?开启?|"
                      r"没有?用|没有?使用|without|not using|(?:do|does|did)(?:n'?t| not) use|disabl\w*|"
                      r"remov\w*|drop\w*|turn(?:ed|ing)? off|no longer|omit\w*|unset)", re.IGNORECASE)
# A second value offered beside the first ("2048或者4096", "两张v100或者4张v100", "1 or 2"): neither is the run's.
_ALTERNATIVE = re.compile(r"[ \t]{0,2}(?:或者|或是|或|\bor\b)[ \t]{0,2}(?:\d|[两二三四五六七八九十])")
_ALTERNATIVE_BEFORE = re.compile(r"(?:或者|或是|或|\bor\b)[ \t]{0,2}$")
_IN_SHELL_REF = re.compile(r"\$\{\w*$")
_NOT_USER = re.compile(r"\bnot us(?:e|er|ing)\s*$", re.IGNORECASE)  # "not user zero3": a typo of "not using"
_ENABLE = re.compile(r"(启用|开启|打开|使用|用了|加上|加了|添加|设置了|开了|enabl\w*|with|using|turn(?:ed|ing)? on|"
                     r"add\w*|pass\w*|set)", re.IGNORECASE)
_CLAUSE_END = re.compile(r"[。；;！!？?\n]|，|,(?=\s*[\u4e00-\u9fff])|(?<=[^\d]), ")
# Removing a setting restores its default; for these the default is known.
_REMOVAL_DEFAULTS = {"sequence_parallel_size": 1}
_NOT_CONFIG = {"model", "framework", "algorithm"}  # top-level record fields, kept out of `config`


def _clause_before(text: str, pos: int, window: int = 160) -> str:
    """The clause that ends at `pos` (back to the previous sentence or clause boundary, at most `window`)."""
    lo = max(0, pos - window)
    start = lo
    for m in _CLAUSE_END.finditer(text, lo, pos):
        start = m.end()
    return text[start:pos]


def _value_for(key: str, m: re.Match[str] | None) -> Any:
    """Normalised value of `key` from a _VALUE match, or None when it is not a usable value."""
    if m is None:
        return None
    s = spec(key)
    kind = s.kind if s else "str"
    raw = m.group("qv") or m.group("num") or m.group("word")
    if raw is None:
        return None
    if kind in {"int", "float"} and m.group("num") is None:
        return None
    if m.group("word") and canonical_key(m.group("word")) and m.group("word").lower() not in {"auto", "none"}:
        return None  # "max_prompt_length等于max_length": a relation, not a value
    if kind == "bool" and raw.lower() not in {"true", "false", "yes", "no", "on", "off", "0", "1"}:
        return None
    if kind == "str" and key == "algorithm":
        return canonical_algorithm(raw) and raw.lower()
    if kind == "version" and not re.match(r"v?\d", raw):
        return None
    return normalise_value(key, raw)


def _end_of(text: str, pos: int, snippet: str) -> int:
    """Where `snippet` (whitespace collapsed by `_snippet`) ends in `text`, reading from `pos`."""
    want, i, k = len(re.sub(r"\s+", "", snippet)), pos, 0
    while i < len(text) and k < want:
        k += not text[i].isspace()
        i += 1
    return i


def _snippet(text: str, start: int, end: int) -> str:
    return re.sub(r"\s+", " ", text[max(0, start): min(len(text), end)]).strip()


def extract_config(text: str, *, recommendation: bool = False) -> list[Finding]:
    """Config values stated in `text`, in order of appearance.

    With `recommendation=True` the text is a fix: "remove X" / "禁用X" become X = False (or X's default).
    """
    found: list[Finding] = []
    # 1. Prose labels: "最大长度:8192", "学习率5e-7", "梯度累积步数(如32)", "learning rate of 1e-5".
    for lm in _LABEL.finditer(text):
        if lm.group(0).isascii() and not _ascii_bounded(text, lm.start(), lm.end()):
            continue
        if lm.start() > 0 and text[lm.start() - 1] == "/" and PROSE_LABELS.get(
                re.sub(r"[\s_-]+", " ", lm.group(0).lower()), "").startswith("max_"):
            continue  # "completions/max_length': 401.75": a logged measurement of what was sampled, not the limit
        key = PROSE_LABELS.get(re.sub(r"[\s_-]+", " ", lm.group(0).lower()))
        if key is None or _OTHER_QUANTITY.search(text, max(0, lm.start() - 16), lm.start()):
            continue
        if _IN_SHELL_REF.search(text, max(0, lm.start() - 40), lm.start()):
            continue  # `${PER_DEVICE_BATCH_SIZE:-1}`: a shell variable's default, read by kb.facts.configs
        vm = _VALUE.match(text, lm.end())
        if key == "model":
            name = normalise_value("model", vm.group("word") or vm.group("qv")) if vm else None
            if name:  # not "base model (e.g., 30B)": the checks every model value passes
                found.append(Finding("model", name, _snippet(text, lm.start(), vm.end()), "label", lm.start()))
            continue
        value = _value_for(key, vm)
        if value is not None and vm is not None and not _ALTERNATIVE.match(text, vm.end()):
            found.append(Finding(key, value, _snippet(text, lm.start(), vm.end()), "label", lm.start()))
    # 2. Identifiers and flags: "--vanilla_loss", "rpo_alpha采用默认值1.0", `torch_dtype为"half"`, "fp16: true".
    for km in _KEY.finditer(text):
        if km.start() > 0 and re.match(r"[A-Za-z0-9_\-./]", text[km.start() - 1]):
            continue  # inside a longer word or path
        raw = km.group("key") or km.group("ident") or km.group("kv")
        dash = km.group("dash") or ""
        low = raw.lower()
        if low in {"fp16", "bf16", "fp32", "tf32"}:
            vm = _VALUE.match(text, km.end())
            val = vm.group("word") or vm.group("num") if vm else None
            on = (dash and (val is None or val.lower() in {"true", "1"})) or (val or "").lower() in {"true", "1"}
            if on and not _DISABLE.search(_clause_before(text, km.start())):
                found.append(Finding("precision", low, _snippet(text, km.start(), km.end() + 6), "flag", km.start()))
            continue
        key = canonical_key(raw)
        if key is None or key == "framework":
            continue
        vm = _VALUE.match(text, km.end())
        value = _value_for(key, vm)
        snippet_end = vm.end() if (vm and value is not None) else km.end()
        if value is None:
            s = spec(key)
            clause = _clause_before(text, km.start())
            disabled = bool(_DISABLE.search(clause))
            if s and s.kind == "bool":
                if disabled:
                    value = False
                elif dash or _ENABLE.search(clause):
                    value = True
            elif recommendation and disabled and key in _REMOVAL_DEFAULTS:
                value = _REMOVAL_DEFAULTS[key]
        if value is None or (vm is not None and _ALTERNATIVE.match(text, vm.end())):
            continue  # "max_length = 2048或者4096": two values tried, neither the run's
        if key == "algorithm":
            value = canonical_algorithm(str(value)) or value
        found.append(Finding(key, value, _snippet(text, km.start(), snippet_end), "flag" if dash else "key",
                             km.start()))
    found.extend(_prose_facts(text, recommendation))
    return found


_DT = r"(bfloat16|bf16|float16|fp16|float32|fp32|半精度|全精度|单精度|torch\.float16|torch\.bfloat16)"
_DT_MAP = {"半精度": "fp16", "全精度": "fp32", "单精度": "fp32"}
_PRECISION_PROSE = [
    re.compile(rf"(?:使用|采用|用|开启|启用|开了|with|using|use|enabled?)\s*了?\s*{_DT}(?:\s*[（(]\s*{_DT}\s*[)）])?"
               rf"(?:浮点数?)?\s*(?:进行|做|来)?\s*(?:混合精度)?\s*(?:训练|微调|精度训练|training|fine-?tuning|"
               rf"mixed[ -]precision|precision)", re.IGNORECASE),
    re.compile(rf"(?<![A-Za-z0-9_]){_DT}\s*(?:混合精度)?\s*(?:训练|training|mixed[ -]precision)", re.IGNORECASE),
    re.compile(rf"(?:training|trained|train|fine-?tun\w*|训练|微调)\s*(?:in|with|using|使用|采用|用)\s*{_DT}", re.IGNORECASE),
    re.compile(rf"(?<![A-Za-z0-9_]){_DT}\s*\+\s*(?:deepspeed|zero|fsdp)", re.IGNORECASE),
    re.compile(r"\"(fp16|bf16)\"\s*:\s*\{[^}]{0,80}\"enabled\"\s*:\s*(?:true|\"auto\")", re.IGNORECASE),
]
# "使用bf16替代fp16", "switch to bf16 instead of fp16": the first dtype is the recommendation.
_PRECISION_SWITCH = re.compile(
    rf"(?:使用|改用|换成|换用|切换到|切换为|用|switch(?:ing)?\s+to|use|using|move\s+to)\s*{_DT}\s*"
    rf"(?:替代|代替|取代|替换|而非|而不是|instead\s+of|rather\s+than|over)\s*{_DT}", re.IGNORECASE)
_ZERO = [
    re.compile(r"(?<![A-Za-z])zero[_-]?([0-3])(?![0-9])", re.IGNORECASE),
    re.compile(r"(?<![A-Za-z])zero[\s_-]*stage[\s_-]*[:=]?\s*([0-3])(?![0-9])", re.IGNORECASE),
    re.compile(r"deepspeed\s+zero\s*([0-3])(?![0-9])", re.IGNORECASE),
    re.compile(r"deepspeed-([1-3])(?![\d.])", re.IGNORECASE),  # "lora+Deepspeed-3微调"
    re.compile(r"ZeRO\s+([0-3])(?![0-9])"),
    re.compile(r"zero_optimization[\"']?\s*[:=]\s*\{[^{}]{0,200}?[\"']?stage[\"']?\s*[:=]\s*([0-3])"),
]
# Hugging Face `optim` values said in prose: the underscored names are settings, not words.
_OPTIM_NAME = re.compile(r"(?<![\w.-])((?:paged_)?(?:adamw|adam|lion)_(?:torch_fused|torch|hf|8bit|bnb_8bit|32bit|"
                         r"apex_fused|anyprecision))(?![\w-])", re.IGNORECASE)
_NUMBER_WORDS = {"one": 1, "single": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
                 "sixteen": 16, "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8}
# "8卡lora训练": a Chinese unit may run straight into the next word; an English one may not.
# (not "十六卡" read as 六卡, nor "-4a40-" inside an attachment's id; "1 Nvidia L40S")
_NUM_GPUS = re.compile(
    rf"(?<![A-Za-z\d.十百两一二三四五六七八九/-])(\d{{1,3}}|{'|'.join(_NUMBER_WORDS)})[ \t]*(?:个|张|块)?[ \t]*"
    rf"(?:[x×*][ \t]*)?(?:(?:NVIDIA|Nvidia|nvidia)[ \t]+)?(?:(?:{GPU_MODELS})[ \t]*)?"
    rf"(?:(?:GPUs?|NPUs?|cards?|(?:{GPU_MODELS})s?)(?![A-Za-z0-9])|显?卡)", re.IGNORECASE)
_ACROSS_NODES = re.compile(r"[ \t]{1,3}(?:across|over|on|in(?: total)? (?:across|over|on))[ \t]{1,3}(\d{1,3})[ \t]{1,3}"
                           r"(?:nodes|machines|hosts|servers)\b", re.IGNORECASE)
_NODES_THEN_TOTAL = re.compile(r"(?<![\d.])(\d{1,3})[ \t]{0,2}(?:nodes|machines|hosts)[ \t]{0,2}[(（][ \t]{0,2}$", re.IGNORECASE)
_NODES_CARDS = re.compile(r"(?<![\d.])(\d{1,3}|单|两|二|四|八)[ \t]?机[ \t]?(\d{1,4})[ \t]?卡")
_NUM_NODES = re.compile(r"(?<![A-Za-z\d.-])(\d{1,4}|two|three|four|eight|sixteen|两|二|三|四|八)[ \t]?(?:nodes\b|machines\b(?= (?:with|each|of))|"
                        r"个节点|台机器|台服务器)", re.IGNORECASE)
# Around a card's name (a GPU_NAME match): cards counted after it ("A800  80G *8 的机器"), nodes times cards before it
# ("on 4x8H200").
_COUNT_AFTER_GPU = re.compile(r"[ \t]{0,3}(?:\d{2,3}[ \t]?G[Bb]?)?[ \t]{0,3}[*x×][ \t]{0,3}(\d{1,3})(?![\d.])")  # bounded
# A count right before a card: "One 4090", "2张4090", "两张3090", "8*4090", "单张4090", "单卡A100" (not "与单卡", nor
# "两台 4090 机器": 台 counts machines).
_COUNT_BEFORE_CARD = re.compile(r"(?:(?<![A-Za-z])(one|two|four|eight|single|an?) |(?<![\d.])(\d{1,3}|[一两二三四五六七八])[ \t]?"
                                r"[张块个][ \t]?(?:NVIDIA[ \t])?|(?<![\d.])(\d{1,3})[ \t]?[*×xX][ \t]?|(?<![与和跟比同])(单)[张块卡]?[ \t]?)$",
                                re.IGNORECASE)
_NUMBER_WORDS_BEFORE = {"单": 1, "a": 1, "an": 1}  # "单卡A100", "training nanoGPT on an A100 GPU"
_NODES_TIMES_BEFORE_GPU = re.compile(r"(?<![\d.])(\d{1,2})[ \t]?[xX×*][ \t]?(\d{1,2})[ \t]?$")
_VERSION = re.compile(
    r"(?<![A-Za-z0-9_-])(PyTorch|torch|DeepSpeed|transformers?|trl|flash[-_ ]?attn|flash[-_ ]?attention|ms-swift|swift|"
    r"OpenRLHF|xtuner|LLaMA-Factory|llamafactory|verl|vllm|peft|accelerate|slime|colossalai|trlx)\s*(?:==|=|:|版本(?:为|是|号)?|version|v)?\s*v?"
    r"(\d+\.\d+(?:\.\d+)*(?:\.?post\d+|rc\d+|\.dev\d+)?)(?![\d.])", re.IGNORECASE)
_VERSION_KEY = {"pytorch": "torch_version", "torch": "torch_version", "deepspeed": "deepspeed_version",
                "transformers": "transformers_version", "transformer": "transformers_version", "trl": "trl_version",
                "flash-attn": "flash_attn_version", "flash-attention": "flash_attn_version"}


def _prose_facts(text: str, recommendation: bool) -> list[Finding]:
    out: list[Finding] = []
    hay = Haystack(text)  # each pattern scans the whole text: skip those whose literals are not in it
    if recommendation:
        for m in _PRECISION_SWITCH.finditer(text):
            out.append(Finding("precision", _DT_MAP.get(m.group(1), normalise_value("precision", m.group(1))),
                               _snippet(text, m.start(), m.end()), "prose", m.start()))
    else:
        for pat in _PRECISION_PROSE:
            for m in hay.gate(pat).finditer(text):
                clause = _clause_before(text, m.start())
                if _DISABLE.search(clause[-8:]) or SUPPOSED.search(clause):
                    continue  # disabled, or supposed ("假如用bf16来微调的话": no run)
                verdict = _VERDICT_END.split(text[m.end(): m.end() + 24], 1)[0]
                if _FINE.search(verdict) and not WENT_BAD.search(verdict):
                    continue  # "fp16 训练正常，但是 bf16 loss 为 nan": the run that worked, not the one that failed
                word = m.group(1)
                value = _DT_MAP.get(word, normalise_value("precision", word.lower()))
                if value:
                    out.append(Finding("precision", value, _snippet(text, m.start(), m.end()), "prose", m.start()))
        if re.search(r"\.half\(\)", text):
            out.append(Finding("weights_dtype", "fp16", ".half()", "prose", text.find(".half()")))
    if not recommendation:
        for m in hay.gate(_OPTIM_NAME).finditer(text):  # "DPOTrainer using adamw_8bit optimizer"
            clause = _clause_before(text, m.start())
            if not (_DISABLE.search(clause[-10:]) or SUPPOSED.search(clause)):
                out.append(Finding("optim", m.group(1).lower(), _snippet(text, m.start(), m.end()), "prose", m.start()))
    for pat in _ZERO:
        for m in hay.gate(pat).finditer(text):
            if _DISABLE.search(_clause_before(text, m.start())[-14:]) or _NOT_USER.search(text, max(0, m.start() - 14),
                                                                                          m.start()):
                continue  # "I am not using zero3", "（not user zero3）": a stage the run did not use
            out.append(Finding("zero_stage", int(m.group(1)), _snippet(text, m.start(), m.end()), "prose", m.start()))
    if not recommendation:
        for m in hay.gate(_NODES_CARDS).finditer(text):  # "更换2机16卡后": 2 nodes of 8 cards
            nodes = _NUMBER_WORDS.get(m.group(1)) or _NUMBER_WORDS_BEFORE.get(m.group(1)) or int(m.group(1))
            cards = int(m.group(2))
            if 1 <= nodes <= 1024 and cards % nodes == 0 and not _ALTERNATIVE.match(text, m.end()):
                snippet = _snippet(text, m.start(), m.end())
                out.append(Finding("num_nodes", nodes, snippet, "prose", m.start()))
                out.append(Finding("num_gpus", cards // nodes, snippet, "prose", m.start()))
        for m in hay.gate(_NUM_NODES).finditer(text):  # "with 4 nodes each having 8 h100 Gpus", "2个节点"
            if not _ALTERNATIVE.match(text, m.end()):
                word = fold(m.group(1))
                n = _NUMBER_WORDS.get(word) or (int(word) if word.isdigit() else 0)
                if 1 <= n <= 1024:
                    out.append(Finding("num_nodes", n, _snippet(text, m.start(), m.end()), "prose", m.start()))
        for m in hay.gate(_NUM_GPUS).finditer(text):
            word = fold(m.group(1))  # fold: IGNORECASE also matched "sİx" / "ſix"
            n = _NUMBER_WORDS.get(word) or (int(word) if word.isdigit() else 0)
            if 1 <= n <= 1024 and not _ALTERNATIVE.match(text, m.end()) \
                    and not _ALTERNATIVE_BEFORE.search(text, max(0, m.start() - 6), m.start()):
                across = _ACROSS_NODES.match(text, m.end())
                k = int(across.group(1)) if across else 0
                nodes_first = _NODES_THEN_TOTAL.search(text, max(0, m.start() - 24), m.start()) if not k else None
                if nodes_first:  # "2 nodes (16 GPUs)": the total in brackets after the node count
                    k = int(nodes_first.group(1))
                    across = nodes_first
                if k > 1 and n % k == 0:  # "16 GPUs across 2 nodes": num_gpus counts one node's
                    out.append(Finding("num_nodes", k, _snippet(text, min(m.start(), across.start()),
                                                                 max(m.end(), across.end())), "prose", m.start()))
                    n //= k
                out.append(Finding("num_gpus", n, _snippet(text, m.start(), m.end()), "prose", m.start()))
        for m in hay.gate(GPU_NAME).finditer(text):
            c = _COUNT_AFTER_GPU.match(text, m.end())
            if c:  # "A800  80G *8 的机器"
                out.append(Finding("num_gpus", int(c.group(1)), _snippet(text, m.start(), c.end()), "prose", m.start()))
            c = _COUNT_BEFORE_CARD.search(text, max(0, m.start() - 14), m.start())
            if c:  # "One 4090, axolotl", "2张4090", "单卡A100训练": the card counted right before its name
                word = fold(next(g for g in c.groups() if g))
                n = _NUMBER_WORDS.get(word) or _NUMBER_WORDS_BEFORE.get(word) or (int(word) if word.isdigit() else 0)
                if 1 <= n <= 1024 and not _ALTERNATIVE.match(text, m.end()) \
                        and not _ALTERNATIVE_BEFORE.search(text, max(0, c.start() - 6), c.start()) \
                        and not DENIED_BEFORE.search(text[max(0, m.start() - 16):m.start()]):  # "两张v100或者4张v100", "not an A100"
                    out.append(Finding("num_gpus", n, _snippet(text, c.start(), m.end()), "prose", c.start()))
            c = _NODES_TIMES_BEFORE_GPU.search(text, max(0, m.start() - 8), m.start())
            if c:  # "on 4x8H200": 4 nodes of 8 cards
                out.append(Finding("num_nodes", int(c.group(1)), _snippet(text, c.start(), m.end()), "prose", c.start()))
                out.append(Finding("num_gpus", int(c.group(2)), _snippet(text, c.start(), m.end()), "prose", c.start()))
            out.append(Finding("gpu", gpu_name(m.group("gpu")), m.group(0), "prose", m.start()))
        for m in hay.gate(_VERSION).finditer(text):
            name = re.sub(r"[\s_]+", "-", m.group(1).lower())
            key = _VERSION_KEY.get(name) or canonical_key(name) or PACKAGES.get(name)  # "llama-factory 0.6.2"
            if key and (spec(key) and spec(key).kind == "version"):
                out.append(Finding(key, m.group(2), _snippet(text, m.start(), m.end()), "prose", m.start()))
    return out


_REL_OPS = [
    (r"大于等于|大于或等于|不小于|>=|≥|is\s+greater\s+than\s+or\s+equal\s+to|is\s+at\s+least|at\s+least", "ge"),
    (r"小于等于|小于或等于|不大于|<=|≤|is\s+at\s+most|at\s+most", "le"),
    (r"等于|==|=|达到|is\s+equal\s+to|equals?|equal\s+to|is\s+the\s+same\s+as|same\s+as|matches", "eq"),
    (r"大于|超过|>|is\s+greater\s+than|greater\s+than|exceeds?|is\s+larger\s+than|larger\s+than", "gt"),
    (r"小于|<|is\s+less\s+than|less\s+than|is\s+smaller\s+than|smaller\s+than|below", "lt"),
]
_REL = re.compile(
    r"`?(?<![A-Za-z0-9_\-.])(?P<a>[A-Za-z][A-Za-z0-9_.]{1,60})(?![A-Za-z0-9_.])`?\s*(?P<op>"
    + "|".join(p for p, _ in _REL_OPS) + r")\s*`?(?P<b>[A-Za-z][A-Za-z0-9_.]{1,60})(?![A-Za-z0-9_.])`?",
    re.IGNORECASE)
REL_SYMBOL = {"eq": "==", "ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def extract_relations(text: str) -> list[tuple[str, str, str, str]]:
    """Comparisons between two config keys ("max_prompt_length等于max_length"): (key_a, op, key_b, snippet)."""
    out = []
    for m in _REL.finditer(text):
        if "_" not in m.group("a") or "_" not in m.group("b"):
            continue  # identifiers only: "the model is the model" is prose
        a, b = canonical_key(m.group("a")), canonical_key(m.group("b"))
        if not a or not b or a == b:
            continue
        op = next(o for p, o in _REL_OPS if re.fullmatch(p, m.group("op"), re.IGNORECASE))
        rel = (a, op, b, _snippet(text, m.start(), m.end()))
        if rel[:3] not in [r[:3] for r in out]:
            out.append(rel)
    return out


# ----------------------------------------------------------------------------------------------- errors
_EXC = re.compile(r"(?<![A-Za-z])([A-Z][A-Za-z]{0,60}?(?:Error|Exception))\s*[:：]\s*([^\n]{3,300})")
_KNOWN_MESSAGES = [
    re.compile(r"probability tensor contains either `?inf`?, `?nan`? or element < 0", re.IGNORECASE),
    re.compile(r"Current loss scale already at minimum[^\n\"“”。]*"),
    re.compile(r"OVERFLOW! Rank \d+ Skipping step[^\n\"“”。]*|Gradient overflow\.\s*Skipping step[^\n\"“”。]*"),
    re.compile(r"Function '\w+' returned nan values in its \d+(?:st|nd|rd|th) output"),
    re.compile(r"Untrained tokens (?:of|found)[^\n\"“”。]*"),
    re.compile(r"Attempting to unscale FP16 gradients"),
    re.compile(r"Detected (?:inf|nan) (?:or nan )?in (?:loss|gradients)[^\n\"“”。]*", re.IGNORECASE),
]


def extract_errors(text: str) -> list[str]:
    """Error strings as printed: `RuntimeError: ...` and known framework messages."""
    out: list[str] = []
    for m in _EXC.finditer(text):
        msg = re.split(r"[\"“”’`]|。|\s{2,}|(?<=[^\s\d]),(?=[\u4e00-\u9fff])|[\u4e00-\u9fff]{2,}", m.group(2))[0]
        msg = msg.strip().rstrip(".,;:，")
        if len(msg) >= 3:
            full = f"{m.group(1)}: {msg}"
            if full not in out:
                out.append(full)
    for pat in _KNOWN_MESSAGES:
        for m in pat.finditer(text):
            s = m.group(0).strip().rstrip(".,;:")
            if not any(s in e for e in out):
                out.append(s)
    return out


# ----------------------------------------------------------------------------------------------- metrics
_METRIC_NAMES = [
    (r"(?<![A-Za-z_/])nll[_ ]?loss", "nll_loss"), (r"(?<![A-Za-z_/])eval[_ ]loss", "eval_loss"),
    (r"(?<![A-Za-z_/])grad[_ ]?norm|梯度范数", "grad_norm"),
    (r"(?:rewards|logps|logits)/[A-Za-z_/]+", None), (r"(?<![A-Za-z_/])kl(?![A-Za-z_])|KL散度", "kl"),
    (r"(?<![A-Za-z_/])loss(?![A-Za-z_/])|损失", "loss"),
]
_METRIC = re.compile("|".join(f"(?:{p})" for p, _ in _METRIC_NAMES), re.IGNORECASE)
_NAN = re.compile(r"(?<![A-Za-z])(nan|inf)(?![A-Za-z])", re.IGNORECASE)
_GLOSS = re.compile(r"[（(][^()（）\n]{0,24}[)）]")
_LOG_METRIC = re.compile(r"['\"]?(?<![\w/])([A-Za-z][\w/]{0,40}?(?:loss|norm|reward|rewards|logps|kl|acc|advantages?)"
                         r"[\w/]{0,40})['\"]?"
                         r"\s*[:=]\s*(-?nan|-?inf)\b", re.IGNORECASE)


def _metric_name(raw: str) -> str:
    low = raw.lower()
    for pat, name in _METRIC_NAMES:
        if re.fullmatch(pat, raw, re.IGNORECASE):
            return name or low
    return low


def extract_metrics(text: str) -> list[str]:
    """Metric observations ("nll_loss: nan", "loss: 1.19e+34", "loss: 0.0") from prose and pasted logs."""
    out: list[str] = []

    def add(s: str) -> None:
        if s not in out:
            out.append(s)

    for m in _LOG_METRIC.finditer(text):
        add(f"{m.group(1).lower()}: {m.group(2).lower()}")
    for m in re.finditer(r"['\"`]?((?:train[/_])?loss)['\"`]?\s*[:=]\s*0\.0+(?![\d.]|e)", text, re.IGNORECASE):
        add(f"{m.group(1).lower()}: 0.0")
    sentences = re.split(r"[。；;!?！？\n]|\.\s", text)
    for sentence in sentences:
        plain = _GLOSS.sub("", sentence)  # "NLL_Loss(负对数似然损失)为NaN": the gloss is not a second metric
        for nm in _NAN.finditer(plain):
            # Only metric names close to this nan can be its subject; looking further is quadratic.
            for mm in _METRIC.finditer(plain, max(0, nm.start() - 40), nm.end() + 20):
                if re.match(r"[`'\"]?\s*[:=]\s*[-+\d.]", plain[mm.end():]):
                    continue  # "loss: 0.0" carries its own value; a nearby nan belongs to another metric
                if mm.end() <= nm.start():  # "loss ... became NaN"
                    near = nm.start() - mm.end() <= 12
                else:  # "NaN loss" / "NaN的梯度范数": only directly before, never across a clause
                    between = plain[nm.end():mm.start()]
                    near = len(between) <= 3 and not re.search(r"[,，;；:：]", between)
                if near:
                    add(f"{_metric_name(mm.group(0))}: {nm.group(1).lower()}")
        for hm in re.finditer(r"(?<![\d.])(\d{1,20}(?:\.\d{1,20})?)[eE]\+?(\d+)", sentence):
            if int(hm.group(2)) >= 4:
                before = sentence[max(0, hm.start() - 16): hm.start()]
                if re.search(r"loss|损失", before, re.IGNORECASE):
                    add(f"loss: {hm.group(1)}e+{hm.group(2)}")
        zm = re.search(r"(?:loss|损失)[^。;,，]{0,12}?(?:降为|变为|降到|变成|跌到|归零|drops?\s+to|becomes?|became|"
                       r"goes\s+to|went\s+to|collapses?\s+to|is)\s*0(?:\.0+)?(?![\d.])", sentence, re.IGNORECASE)
        if zm:
            add("loss: 0.0")
    return out


_NOT_STATED = {"framework"}  # named by kb.facts.prose with its own precedence
# A line written as a setting (`"fp16": {"enabled": "auto"}`, `fp16: true`, `--fp16`) is read by kb.facts.configs,
# which knows what `auto` or `false` mean; reading it again as prose would contradict it.
_SETTING_LINE = re.compile(r"^\s*(?:[-*]\s+)?[\"']?[A-Za-z_][\w.\-]*[\"']?\s*[:=]|[{}]|(?<![\w-])--[A-Za-z]")


_PART_END = re.compile(r"[,，;；。.!?！？\n]")
_FINE = re.compile(SAID_FINE, re.IGNORECASE)
# Where the verdict on a setting ends: a clause mark or a contrast ("..., but", "但").
_VERDICT_END = re.compile(r"[,，.。;；\n]|" + CONTRAST, re.IGNORECASE)


def _ran_fine(text: str, pos: int) -> bool:
    """The part of the sentence around `pos` says that setup trained fine (the comparison, not the run)."""
    left = max((m.end() for m in _PART_END.finditer(text, max(0, pos - 60), pos)), default=max(0, pos - 60))
    right = _PART_END.search(text, pos)
    part = text[left: right.start() if right else len(text)]
    return bool(_FINE.search(part)) and not WENT_BAD.search(part)


def extract(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    """Pipeline stage: stated settings as "text" facts with their line (explicit settings outrank them)."""
    text = "\n".join(s for _, s in lines)
    starts, pos = [], 0
    for _, s in lines:
        starts.append(pos)
        pos += len(s) + 1
    findings = extract_config(text)
    gpus = {f.value for f in findings if f.key == "gpu"}
    for f in findings:
        if f.key in _NOT_STATED or f.pos < 0:
            continue
        if f.key == "learning_rate" and f.value == 0:
            continue  # `'learning_rate': 0.0` is a warmup's first logged value; nobody trains at a rate of 0
        if f.key == "gpu" and (DENIED_BEFORE.search(text[max(0, f.pos - 16):f.pos])
                               or (len(gpus) > 1 and _ran_fine(text, f.pos))):
            continue  # "it's not a V100, it's an A100"; "之前在 V100 上跑正常，换到 A100 后 loss nan"
        i = bisect.bisect_right(starts, f.pos) - 1
        line = lines[i][1] if i >= 0 else ""
        if f.how != "label" and f.key != "gpu" and _SETTING_LINE.search(line) \
                and not (f.key == "num_gpus" and GPU_NAME.search(f.snippet)):
            continue  # kb.facts.configs reads a command or config line's settings (a GPU and its count are none)
        if said_as_fix(text, f.pos, _end_of(text, f.pos, f.snippet)):
            continue  # "changed it to torch_dtype=fp32", "eager made training work": the fix, not the failing run
        facts.set(f.key, f.value, "text", lines[i][0] if i >= 0 else None, f.snippet, source)
