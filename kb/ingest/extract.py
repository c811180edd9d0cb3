"""What only an article has: the thread URLs it cites, which framework / algorithm / model it is about (the title
outranks the body), and when the NaN first showed up. Settings, errors and metrics come from the fact layer
(kb.facts), the same pipeline that reads a paste."""

from __future__ import annotations

import re

from kb.canonical import (
    ALGORITHMS,
    FRAMEWORKS,
    MODEL_NAMES,
    MODEL_NAMES_NEED_VERSION,
    canonical_algorithm,
)
from kb.facts.prefilter import Haystack, fold

_ASCII_WORD = "A-Za-z0-9_"


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
    hay = Haystack(text)  # one substring test per name instead of a case-insensitive scan of the whole text
    hits = [(m.start(), name) for name, p in pats for m in hay.gate(p).finditer(text)]
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


_MODEL = re.compile(
    r"(?<![A-Za-z0-9])(?P<fam>" + "|".join(sorted(MODEL_NAMES, key=len, reverse=True)) + r")"
    r"(?P<ver>[-_ ]?\d+(?:[._]\d+(?!\d*[bBmM]))?)?"
    r"(?P<tail>(?:[-_ ](?:\d+(?:\.\d+)?[bBmM]|a\d+b|vl|coder|math|instruct|chat|base|moe|r1|it|hf|"
    r"v\d(?:\.\d)?)(?![A-Za-z0-9]))*)", re.IGNORECASE)


def _normalise_model(m: re.Match[str]) -> str | None:
    # fold, not lower: IGNORECASE also matches "İ" / "ı" / "ſ" to i / s, which lower() does not map back.
    fam = fold(m.group("fam"))
    ver = m.group("ver") or ""
    tail = m.group("tail") or ""
    if fam not in MODEL_NAMES or (fam in MODEL_NAMES_NEED_VERSION and not re.search(r"\d", ver + tail)):
        return None
    name = MODEL_NAMES[fam]
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
