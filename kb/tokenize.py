"""The one tokenizer: ASCII identifiers and numbers stay whole (plus their parts), jieba cuts only CJK runs."""

from __future__ import annotations

import logging
import marshal
import re
import threading
from functools import lru_cache
from pathlib import Path

# Domain words jieba would otherwise split; added once when jieba first loads.
DOMAIN_WORDS = (
    "序列并行", "奖励模型", "半精度", "混合精度", "损失缩放", "梯度爆炸", "梯度裁剪", "梯度累积", "学习率",
    "全参", "全参数", "微调", "偏好优化", "长度归一化", "溢出", "下溢", "标签", "掩码", "截断", "提示词",
    "注意力", "词表", "嵌入", "优化器", "数据并行", "张量并行", "流水线并行", "上下文并行", "环形注意力",
    "强化学习", "策略模型", "参考模型", "价值模型", "采样", "推理", "显存", "精度", "梯度", "损失",
)
# Chinese words that carry no signal for retrieval.
STOP_ZH = frozenset(["的", "了", "在", "是", "和", "与", "或", "时", "后", "中", "为", "对", "把", "被", "就", "都", "也", "而", "及", "等", "这", "那", "一个", "使用", "出现", "问题", "进行", "如何", "怎么", "什么", "吗", "呢", "啊", "我", "你", "他", "们", "训练时"])
STOP_EN = frozenset(
    ["a", "an", "the", "is", "are", "was", "were", "be", "been", "of", "to", "in", "on", "at", "for", "with", "by", "and", "or", "not", "it", "this", "that", "my", "i", "we", "you", "when", "what", "why", "how", "does", "do", "did", "can", "could", "should", "would", "from", "as", "into", "after", "before", "while", "using", "use", "get", "got"]
)

_ASCII_RUN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-/]*[A-Za-z0-9_]|[A-Za-z0-9_]")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_SPLIT_PARTS = re.compile(r"[_.\-/+]+")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?(e[+-]?\d+)?$")
_jieba_lock = threading.Lock()
_jieba = None


def _get_jieba():
    global _jieba
    if _jieba is None:
        with _jieba_lock:
            if _jieba is None:
                import jieba

                jieba.setLogLevel(logging.WARNING)
                # jieba rebuilds its dictionary cache (~2-3 s) whenever the temp dir was cleaned; keep the
                # prebuilt cache beside the index instead, where it lives as long as the data does.
                jieba.dt.tmp_dir = _jieba_cache_dir()
                for w in DOMAIN_WORDS:
                    jieba.add_word(w, freq=200000)
                _jieba = jieba
    return _jieba


def load_segmenter() -> None:
    """Load jieba's dictionary (and any saved segmentations registered so far) now: a server that forks its
    workers does this once, before the fork, so the workers share it."""
    with _jieba_lock:
        _load_pending()
    _get_jieba().initialize()


def _jieba_cache_dir() -> str | None:
    from kb import paths

    d = paths.data_dir() / "cache"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # jieba falls back to the temp dir
    return str(d)


def _ascii_tokens(run: str) -> list[str]:
    tok = run.lower().strip(".-/+")
    if not tok:
        return []
    out = [tok]
    if _NUMBER.match(tok):
        return out
    parts = [p for p in _SPLIT_PARTS.split(tok) if p]
    if len(parts) > 1:
        out.extend(p for p in parts if len(p) > 1 or p.isdigit())
    return out


# Segmentations saved with an index (every CJK run of the corpus, cut by jieba at build time): a process
# that only re-tokenizes corpus text (matched terms, English questions) then never loads jieba's
# dictionary, which costs 1-2 s of a cold start. Runs not in the table still go through jieba.
_known: dict[str, tuple[str, ...]] = {}
_pending: list[Path] = []


def register_segmentations(path: Path) -> None:
    """Use the table saved at `path` by `save_segmentations` (read on the first CJK run looked up)."""
    _pending.append(path)


def save_segmentations(texts: list[str], path: Path) -> None:
    table = {}
    for text in texts:
        for run in _CJK_RUN.findall(text):
            if run not in table:
                table[run] = _cjk_tokens(run)
    with open(path, "wb") as f:
        marshal.dump(table, f)


def _load_pending() -> None:
    while _pending:
        path = _pending.pop()
        try:
            with open(path, "rb") as f:
                table = marshal.load(f)
        except (OSError, EOFError, ValueError, TypeError):
            continue
        if isinstance(table, dict):
            _known.update(table)


@lru_cache(maxsize=4096)
def _cjk_tokens(run: str) -> tuple[str, ...]:
    if _pending:
        with _jieba_lock:
            _load_pending()
    hit = _known.get(run)
    if hit is not None:
        return hit
    jieba = _get_jieba()
    return tuple(w for w in jieba.cut(run, HMM=True) if w.strip() and w not in STOP_ZH)


def tokenize(text: str, *, drop_stopwords: bool = True) -> list[str]:
    """Tokens for BM25: `max_prompt_length` -> [max_prompt_length, max, prompt, length]; `-100` stays whole;
    Chinese runs go through jieba with domain words; punctuation is dropped; everything lowercased."""
    if len(text) <= _MEMO_CHARS:  # one diagnosis tokenizes its query for the incidents and again for the cases
        return list(_tokenize_memo(text, drop_stopwords))
    return _tokenize(text, drop_stopwords)


_MEMO_CHARS = 8000


@lru_cache(maxsize=64)
def _tokenize_memo(text: str, drop_stopwords: bool) -> tuple[str, ...]:
    return tuple(_tokenize(text, drop_stopwords))


def _tokenize(text: str, drop_stopwords: bool) -> list[str]:
    tokens: list[str] = []
    # Keep negative numbers like -100 whole: a leading '-' directly before a digit belongs to the number.
    for m in re.finditer(r"-\d[\d.e+\-]*|" + _ASCII_RUN.pattern + r"|" + _CJK_RUN.pattern, text):
        s = m.group(0)
        if _CJK_RUN.fullmatch(s):
            tokens.extend(_cjk_tokens(s))
        elif s.startswith("-") and s[1:2].isdigit():
            tokens.append(s.rstrip(".-+").lower())
        else:
            tokens.extend(_ascii_tokens(s))
    if drop_stopwords:
        tokens = [t for t in tokens if t not in STOP_EN]
    return tokens


def cjk_ratio(text: str) -> float:
    """Share of CJK characters among letters: used to tell a Chinese text from an English one."""
    cjk = sum(len(m) for m in _CJK_RUN.findall(text))
    latin = len(re.findall(r"[A-Za-z]", text))
    total = cjk + latin
    return cjk / total if total else 0.0


def detect_lang(text: str) -> str:
    # Chinese prose with English identifiers mixed in is still Chinese: a low threshold is right.
    return "zh" if cjk_ratio(text) > 0.15 else "en"


def paste_lang(text: str) -> str:
    """The language of the reporter's own words in a paste: a Chinese sentence or two next to an English traceback
    or log (which outweighs it in letters) is a Chinese report. Lines with a fair share of CJK are the prose; a few
    CJK characters inside machine output (a file path, a dataset name) are not."""
    if "/" in text and _BILINGUAL_LABEL.search(text):
        text = "\n".join(line for line in text.splitlines() if not _BILINGUAL_LABEL.match(line))
    prose = sum(len(m) for line in text.splitlines() if cjk_ratio(line) > 0.2 for m in _CJK_RUN.findall(line))
    if prose >= 6:
        return "zh"
    # A short question counts English terms as words, not letters: "用 Qwen2.5-7B-Instruct 做 DPO，loss 变成 nan" has
    # 4 Chinese characters against 23 letters, but they are 4 against 6 words, and its writer reads Chinese.
    if len(text) <= 300 and _zh_words(text):
        return "zh"
    # A Chinese title above English machine output ("glm4微调出现nan" and a log): the title is the writer's only
    # words unless some other line is an English sentence.
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and _zh_words(lines[0]) and not any(_EN_SENTENCE.search(line) for line in lines[1:200]):
        return "zh"
    # a link's letters are nobody's words: "微调过程中loss=nan" above a screenshot's long URL is a Chinese report
    return detect_lang(_URL.sub(" ", text) if "://" in text else text)


def _zh_words(text: str) -> bool:
    """Chinese characters outweigh the English words: a path's or a quoted string's Chinese is data, not the
    writer's, so machine tokens lend no characters (their letters still count as words)."""
    cjk = sum(len(m) for m in _CJK_RUN.findall(_MACHINE_TOKEN.sub(" ", text)))
    return cjk >= 2 and cjk > 0.25 * (cjk + len(_LATIN_WORD.findall(text)))


_LATIN_WORD = re.compile(r"[A-Za-z]+")
# An English sentence in prose: six plain words in a row ("the loss goes to nan after a few steps"), not a log line's
# `key: value` pairs or a traceback frame.
_EN_SENTENCE = re.compile(r"(?<![\w./-])[A-Za-z]{2,}(?:[ ,]{1,3}[A-Za-z]{1,}(?![\w./-])){5,}")
# An issue form's bilingual heading or label ("### Bug Description / Bug 描述", "System Info / 系統信息"): the
# template's words in both languages, not the reporter's.
_BILINGUAL_LABEL = re.compile(r"^[ \t#*>_-]{0,8}[A-Z][A-Za-z0-9 ()&',.?-]{0,60}[ \t]*/[ \t]*[^/\n=:：，。,]{1,14}$",
                              re.MULTILINE)
_MACHINE_TOKEN = re.compile(r"\S{0,100}[/\\]\S{0,100}|'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"")


_URL = re.compile(r"https?://[^\s)\]>\"']{1,2000}")
