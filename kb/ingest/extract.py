"""Facts an article states in prose or lists: framework, model, algorithm, precision, config values, errors.

Every config key goes through kb.canonical (`canonical_key`, `canonical_label`, `normalise_value`), so that
"最大长度:8192", "--max_len 8192" and "max length of 8192" all become `max_length = 8192`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kb.canonical import (
    ALGORITHMS,
    FRAMEWORKS,
    PROSE_LABELS,
    canonical_algorithm,
    canonical_key,
    normalise_value,
    spec,
)

_ASCII_WORD = "A-Za-z0-9_"


# ----------------------------------------------------------------------------------------------- language
def detect_lang(text: str) -> str:
    """'zh' when CJK characters make up a real share of the letters, else 'en'."""
    cjk = len(re.findall(r"[\u4e00-\u9fff]", text))
    latin = len(re.findall(r"[A-Za-z]", text))
    # A CJK character carries about as much as a short word; identifiers inflate the Latin count.
    return "zh" if cjk and cjk * 3 >= latin * 0.5 else "en"


# ----------------------------------------------------------------------------------------------- URLs
_URL = re.compile(r"https?://[^\s<>\"'`)\]）】，。；、]+")
_SOURCE_URL = re.compile(
    r"https?://(?:www\.)?(?:github\.com/[\w.-]+/[\w.-]+/(?:issues|pull|discussions)/\d+|"
    r"gitee\.com/[\w.-]+/[\w.-]+/(?:issues|pulls)/\w+|huggingface\.co/[\w./-]+/discussions/\d+|"
    r"stackoverflow\.com/questions/\d+|discuss\.[\w.-]+/t/[\w/-]+|[\w.-]{0,60}forums?[\w.-]{0,60}/[\w./-]+)")


def source_urls(text: str, limit: int = 6) -> list[str]:
    """Issue/PR/forum links in the text (the threads an article is about), in order of appearance."""
    out: list[str] = []
    for m in _URL.finditer(text):
        url = m.group(0).rstrip(".,;:!?")
        if _SOURCE_URL.match(url) and url not in out:
            out.append(url)
    return out[:limit]


# ----------------------------------------------------------------------------------------------- names
def _alias_regex(alias: str, case_sensitive: bool = False) -> re.Pattern[str]:
    body = re.escape(alias).replace(r"\ ", r"[\s_-]?")
    flags = 0 if case_sensitive else re.IGNORECASE
    return re.compile(rf"(?<![{_ASCII_WORD}]){body}(?![{_ASCII_WORD}])", flags)


def _name_patterns(table: dict[str, tuple[str, ...]], upper_short: bool) -> list[tuple[str, re.Pattern[str]]]:
    pats: list[tuple[str, re.Pattern[str]]] = []
    for name, aliases in table.items():
        for a in {name.lower(), *aliases}:
            if a.isascii() and len(a) <= 2 and upper_short:
                pats.append((name, _alias_regex(a.upper(), case_sensitive=True)))  # "RM", never "rm -rf"
            else:
                pats.append((name, _alias_regex(a)))
    return pats


_FRAMEWORK_PATS = _name_patterns(FRAMEWORKS, upper_short=False)
_ALGORITHM_PATS = _name_patterns(ALGORITHMS, upper_short=True)
_GENERIC_FRAMEWORKS = ("DeepSpeed", "transformers", "pytorch")
# A command line names its framework even when the prose does not.
_FRAMEWORK_COMMANDS = (
    (re.compile(r"(?<![\w-])swift\s+(?:sft|rlhf|pt|infer|export)\b"), "ms-swift"),
    (re.compile(r"(?<![\w-])xtuner\s+train\b"), "xtuner"),
    (re.compile(r"openrlhf\.cli\.|train_(?:kto|dpo|rm|ppo|sft)\.py"), "OpenRLHF"),
    (re.compile(r"(?<![\w-])trl\s+(?:sft|dpo|kto|grpo)\b|\b(?:DPO|KTO|CPO|ORPO|GRPO|Reward|SFT)Trainer\b"), "trl"),
    (re.compile(r"verl\.trainer\.|actor_rollout_ref\."), "verl"),
)


def _mentions(text: str, pats: list[tuple[str, re.Pattern[str]]]) -> list[tuple[int, str]]:
    hits = [(m.start(), name) for name, p in pats for m in p.finditer(text)]
    return sorted(hits)


def find_framework(title: str, body: str) -> tuple[str, str]:
    """(framework, why). Title mentions beat body mentions; specific frameworks beat DeepSpeed/transformers."""
    def specific(hits: list[tuple[int, str]]) -> list[str]:
        return [n for _, n in hits if n not in _GENERIC_FRAMEWORKS]

    t_hits = _mentions(title, _FRAMEWORK_PATS)
    if specific(t_hits):
        return specific(t_hits)[0], "named in the title"
    b_hits = _mentions(body, _FRAMEWORK_PATS) + [(m.start(), n) for p, n in _FRAMEWORK_COMMANDS
                                                 for m in p.finditer(body)]
    b_spec = specific(sorted(b_hits))
    if b_spec:
        best = max(dict.fromkeys(b_spec), key=lambda n: (b_spec.count(n), -b_spec.index(n)))
        return best, f"named {b_spec.count(best)}x in the text"
    for hits, where in ((t_hits, "title"), (sorted(b_hits), "text")):
        if hits:
            names = [n for _, n in hits]
            best = min(_GENERIC_FRAMEWORKS, key=lambda n: (-names.count(n), _GENERIC_FRAMEWORKS.index(n)))
            if best in names:
                return best, f"only a generic framework named in the {where}"
    return "unknown", "no framework named"


_PREFERENCE_FIRST = ("SimPO", "IPO", "ORPO", "CPO", "KTO", "DPO", "GRPO", "PPO", "RM", "SFT", "pretrain")


def find_algorithm(title: str, body: str, config_algorithm: str | None) -> tuple[str, str]:
    """(algorithm, why): the title's first algorithm, else the configured one, else the text's main one."""
    t_hits = _mentions(title, _ALGORITHM_PATS)
    if t_hits:
        return t_hits[0][1], "named in the title"
    if config_algorithm:
        algo = canonical_algorithm(config_algorithm)
        if algo:
            return algo, "from the configuration"
    names = [n for _, n in _mentions(body, _ALGORITHM_PATS)]
    if names:
        # An article about DPO after SFT is about DPO: the later-stage algorithm wins over SFT/pretrain.
        staged = [n for n in names if n not in {"SFT", "pretrain"}] or names
        def order(n: str) -> int:
            return _PREFERENCE_FIRST.index(n) if n in _PREFERENCE_FIRST else len(_PREFERENCE_FIRST)

        best = max(dict.fromkeys(staged), key=lambda n: (staged.count(n), -order(n)))
        return best, f"named {names.count(best)}x in the text"
    if re.search(r"训练|微调|fine-?tun|\btrain", title + body, re.IGNORECASE):
        return "SFT", "no algorithm named; plain fine-tuning assumed"
    return "unknown", "no algorithm named"


_FAMILIES = {
    "tinyllama": "TinyLlama", "codellama": "CodeLlama", "llama": "Llama", "qwen": "Qwen", "internlm": "InternLM",
    "mistral": "Mistral", "mixtral": "Mixtral", "gemma": "Gemma", "baichuan": "Baichuan", "chatglm": "ChatGLM",
    "deepseek": "DeepSeek", "minicpm": "MiniCPM", "olmo": "OLMo", "starcoder": "StarCoder", "vicuna": "Vicuna",
    "pythia": "Pythia", "bloomz": "bloomz", "bloom": "BLOOM", "falcon": "Falcon", "glm": "GLM", "yi": "Yi",
    "phi": "Phi", "opt": "OPT", "gpt2": "GPT-2",
}
# Short or common-word families only count with a version or size ("Yi-34B", "phi-2", "OPT-1.3b").
_NEEDS_VERSION = {"glm", "yi", "phi", "opt", "bloom", "falcon"}
_MODEL = re.compile(
    r"(?<![A-Za-z0-9])(?P<fam>" + "|".join(sorted(_FAMILIES, key=len, reverse=True)) + r")"
    r"(?P<ver>[-_ ]?\d+(?:[._]\d+(?!\d*[bBmM]))?)?"
    r"(?P<tail>(?:[-_ ](?:\d+(?:\.\d+)?[bBmM]|a\d+b|vl|coder|math|instruct|chat|base|moe|r1|it|hf|"
    r"v\d(?:\.\d)?)(?![A-Za-z0-9]))*)", re.IGNORECASE)


def _normalise_model(m: re.Match[str]) -> str | None:
    fam = m.group("fam").lower()
    ver = m.group("ver") or ""
    tail = m.group("tail") or ""
    if fam in _NEEDS_VERSION and not re.search(r"\d", ver + tail):
        return None
    name = _FAMILIES[fam]
    if ver:
        sep = ver[0] if ver[0] in "-_ " else ""
        digits = ver.lstrip("-_ ")
        digits = re.sub(r"(?<=\d)_(?=\d)", ".", digits)  # qwen2_5 -> Qwen2.5
        name += ("-" if sep in {"-", " ", "_"} and fam not in {"qwen", "internlm", "chatglm", "baichuan"}
                 else "") + digits
    for part in re.split(r"[-_ ]", tail):
        if not part:
            continue
        if re.fullmatch(r"\d+(?:\.\d+)?[bBmM]", part):
            part = part[:-1] + part[-1].upper()
        elif part.lower() in {"instruct", "chat", "base", "coder", "math"}:
            part = part.capitalize()
        elif part.lower() in {"vl", "moe", "hf", "it", "r1"}:
            part = part.upper() if part.lower() != "hf" else "hf"
        name += "-" + part
    return name


def model_mentions(text: str) -> list[str]:
    """Model names in order of appearance, normalised ("qwen2_5" -> "Qwen2.5", "Qwen2 7B" -> "Qwen2-7B")."""
    out = []
    for m in _MODEL.finditer(text):
        if re.match(r"[-_ ]?factory", text[m.end():], re.IGNORECASE):
            continue  # LLaMA-Factory is a framework, not a model
        name = _normalise_model(m)
        if name:
            out.append(name)
    return out


def find_model(title: str, body: str, labelled: str | None) -> tuple[str, str]:
    """(model, why): the title's model, refined by a more specific mention ("Qwen2" -> "Qwen2-7B")."""
    body_models = model_mentions(body)

    def refine(base: str) -> str:
        longer = [b for b in body_models if b.lower().startswith(base.lower() + "-")]
        return max(longer, key=len) if longer else base

    t = model_mentions(title)
    if t:
        return refine(t[0]), "named in the title"
    if labelled:
        named = model_mentions(labelled)
        if named:  # "Qwen/Qwen2.5-7B-Instruct": the most specific mention is the model
            return refine(max(named, key=len)), "from the configuration"
        if re.fullmatch(r"[\w.-]+/[\w.-]+", labelled):  # a hub id such as org/name
            return labelled.split("/")[-1], "from the configuration"
    if body_models:
        # A bare family name ("Qwen") only when nothing more specific is named.
        specific = [b for b in body_models if re.search(r"\d", b)] or body_models
        return refine(specific[0]), "first model named in the text"
    return "unknown", "no model named"


# ----------------------------------------------------------------------------------------------- config
@dataclass
class Finding:
    key: str
    value: Any
    snippet: str  # the text it was read from
    how: str  # "label" | "key" | "flag" | "prose"


_SEP = (r"[\"'`]?[ \t]*(?:参数|选项|的值|值|parameter|option|flag|setting)?[ \t]*(?:被)?[ \t]*"
        r"(?:==|[:：=]|设置为|设置成|设定为|设为|配置为|改为|调整为|指定为|调成|取值为|采用|使用|为|是|等于|"
        r"(?:is\s+)?set\s+to(?![A-Za-z])|is(?![A-Za-z])|of(?![A-Za-z])|to(?![A-Za-z])|was(?![A-Za-z])|"
        r"at(?![A-Za-z]))?[ \t]*"
        r"(?:默认值|默认的|默认|(?:the\s+)?default(?:\s+value)?(?:\s+of)?)?[ \t]*"
        r"(?:[（(][ \t]*(?:如|例如|比如|e\.g\.,?|eg\.?)?[ \t]*)?")
_VALUE = re.compile(
    _SEP + r"(?:[\"'“”‘’`](?P<qv>[^\"'“”‘’`\n]{1,80})[\"'“”‘’`]|"
    r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_.])|"
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


def _ascii_bounded(text: str, start: int, end: int) -> bool:
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return not (before.isascii() and (before.isalnum() or before == "_")) and \
        not (after.isascii() and (after.isalnum() or after == "_"))


_DISABLE = re.compile(r"(禁用|关闭|关掉|移除|去掉|去除|删除|删掉|不使用|不用|不要|取消|避免使用|without|disabl\w*|"
                      r"remov\w*|drop\w*|turn(?:ed|ing)? off|no longer|omit\w*|unset)", re.IGNORECASE)
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
        key = PROSE_LABELS.get(re.sub(r"[\s_-]+", " ", lm.group(0).lower()))
        if key is None:
            continue
        vm = _VALUE.match(text, lm.end())
        if key == "model":
            if vm and (vm.group("word") or vm.group("qv")):
                found.append(Finding("model", vm.group("word") or vm.group("qv"),
                                     _snippet(text, lm.start(), vm.end()), "label"))
            continue
        value = _value_for(key, vm)
        if value is not None and vm is not None:
            found.append(Finding(key, value, _snippet(text, lm.start(), vm.end()), "label"))
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
                found.append(Finding("precision", low, _snippet(text, km.start(), km.end() + 6), "flag"))
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
        if value is None:
            continue
        if key == "algorithm":
            value = canonical_algorithm(str(value)) or value
        found.append(Finding(key, value, _snippet(text, km.start(), snippet_end), "flag" if dash else "key"))
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
    re.compile(r"ZeRO\s+([0-3])(?![0-9])"),
    re.compile(r"zero_optimization[\"']?\s*[:=]\s*\{[^{}]{0,200}?[\"']?stage[\"']?\s*[:=]\s*([0-3])"),
]
_GPU_MODEL = (r"A100|A800|H100|H800|H200|H20|V100|T4|A10G?|A6000|L40S?|RTX\s?\d{4}(?:\s?Ti)?|4090|3090|"
              r"910B\w*|MI\d{3}X?")
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
                 "sixteen": 16, "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8}
_NUM_GPUS = re.compile(
    rf"(?<![A-Za-z\d.])(\d{{1,3}}|{'|'.join(_NUMBER_WORDS)})[ \t]*(?:个|张|块)?[ \t]*(?:[x×*][ \t]*)?"
    rf"(?:(?:{_GPU_MODEL})[ \t]*)?(?:GPUs?|卡|显卡|NPUs?|cards?|{_GPU_MODEL})(?![A-Za-z0-9])", re.IGNORECASE)
_GPU = re.compile(rf"(?<![A-Za-z0-9])({_GPU_MODEL})(?![A-Za-z0-9])")
_VERSION = re.compile(
    r"(?<![A-Za-z0-9_-])(PyTorch|torch|DeepSpeed|transformers|trl|flash[-_ ]?attn|flash[-_ ]?attention|ms-swift|swift|"
    r"OpenRLHF|xtuner|LLaMA-Factory|llamafactory|verl|vllm|peft|accelerate)\s*(?:==|=|:|版本|version|v)?\s*v?"
    r"(\d+\.\d+(?:\.\d+)*(?:\.?post\d+|rc\d+|\.dev\d+)?)(?![\d.])", re.IGNORECASE)
_VERSION_KEY = {"pytorch": "torch_version", "torch": "torch_version", "deepspeed": "deepspeed_version",
                "transformers": "transformers_version", "trl": "trl_version", "flash-attn": "flash_attn_version",
                "flash-attention": "flash_attn_version"}


def _prose_facts(text: str, recommendation: bool) -> list[Finding]:
    out: list[Finding] = []
    if recommendation:
        for m in _PRECISION_SWITCH.finditer(text):
            out.append(Finding("precision", _DT_MAP.get(m.group(1), normalise_value("precision", m.group(1))),
                               _snippet(text, m.start(), m.end()), "prose"))
    else:
        for pat in _PRECISION_PROSE:
            for m in pat.finditer(text):
                if _DISABLE.search(_clause_before(text, m.start())[-8:]):
                    continue
                word = m.group(1)
                value = _DT_MAP.get(word, normalise_value("precision", word.lower()))
                if value:
                    out.append(Finding("precision", value, _snippet(text, m.start(), m.end()), "prose"))
        if re.search(r"\.half\(\)", text):
            out.append(Finding("weights_dtype", "fp16", ".half()", "prose"))
    for pat in _ZERO:
        for m in pat.finditer(text):
            out.append(Finding("zero_stage", int(m.group(1)), _snippet(text, m.start(), m.end()), "prose"))
    if not recommendation:
        for m in _NUM_GPUS.finditer(text):
            n = _NUMBER_WORDS.get(m.group(1).lower()) or int(m.group(1))
            if 1 <= n <= 1024:
                out.append(Finding("num_gpus", n, _snippet(text, m.start(), m.end()), "prose"))
        for m in _GPU.finditer(text):
            out.append(Finding("gpu", m.group(1).replace(" ", ""), m.group(0), "prose"))
        for m in _VERSION.finditer(text):
            name = re.sub(r"[\s_]+", "-", m.group(1).lower())
            key = _VERSION_KEY.get(name) or canonical_key(name)
            if key and (spec(key) and spec(key).kind == "version"):
                out.append(Finding(key, m.group(2), _snippet(text, m.start(), m.end()), "prose"))
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


def merge_findings(findings: list[Finding]) -> tuple[dict[str, Any], dict[str, Finding], list[str]]:
    """(config, chosen finding per key, conflict warnings). Explicit statements beat prose inferences;
    among equals the first one wins."""
    rank = {"label": 0, "key": 0, "flag": 0, "prose": 1}
    chosen: dict[str, Finding] = {}
    warnings: list[str] = []
    for f in sorted(findings, key=lambda f: rank[f.how]):
        if f.key not in chosen:
            chosen[f.key] = f
        elif chosen[f.key].value != f.value and rank[f.how] == rank[chosen[f.key].how]:
            msg = (f"{f.key}: the text gives {chosen[f.key].value!r} ({chosen[f.key].snippet!r}) and "
                   f"{f.value!r} ({f.snippet!r}); kept the first")
            if msg not in warnings:
                warnings.append(msg)
    config = {k: f.value for k, f in chosen.items() if k not in _NOT_CONFIG}
    return config, chosen, warnings


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


def extract_onset(text: str, lang: str) -> str:
    """When the NaN first shows up, in a few words of the document's language ("" when not stated)."""
    m = re.search(r"(?:前|after|first|for)\s*(?:约|about|roughly|around|~)?\s*(\d+)\s*(?:多|\+)?\s*(?:个)?\s*"
                  r"(?:迭代|步|steps?|iterations?|iters?)[^。\n]{0,30}(?:正常|normal|fine|healthy|下降|converg)",
                  text, re.IGNORECASE)
    if m:
        n = m.group(1)
        return f"约 {n} 步正常训练之后" if lang == "zh" else f"after about {n} healthy steps"
    if re.search(r"(?:第一步|第1步|first step|step 1\b|一开始|from the start)[^。\n]{0,30}(?:nan|NaN|inf)", text):
        return "从第一步开始" if lang == "zh" else "from the first step"
    if re.search(r"(?:第二步|第2步|step 2\b)", text):
        return "从第二步开始" if lang == "zh" else "from step 2"
    return ""
