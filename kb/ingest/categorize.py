"""Root-cause category of a raw article by a transparent cue scorer: weighted cues, each one listed as evidence.

Facts beat prose: a configuration fact (sequence_parallel_size = 4, torch_dtype half, --vanilla_loss with KTO)
weighs more than a phrase, so an article that mentions labels of -100 but runs sequence parallelism lands on
`sequence-parallel-label-split`, not `all-labels-masked`. A fix that undoes a setting ("remove
--sequence_parallel_size", "use bf16 instead of fp16") is strong evidence too: it is what made the NaN go away.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FALLBACK_CATEGORY = "uncategorized"
# Below this total the category is a guess; parse_document says so in a warning.
WEAK_SCORE = 3.0


@dataclass
class CueContext:
    """What the scorer looks at, all already extracted from the article."""

    config: dict[str, Any]
    fix_changes: dict[str, Any]
    algorithm: str
    model: str
    errors: list[str]
    metrics: list[str]
    relations: list[tuple[str, str, str, str]]
    reported_text: str  # title + sections describing what happened
    fix_text: str  # fix / best-practice sections
    onset: str = ""

    @property
    def text(self) -> str:
        return self.reported_text + "\n" + self.fix_text


@dataclass
class Cue:
    category: str
    weight: float
    name: str
    # Returns the evidence detail when the cue fires, else None.
    test: Callable[[CueContext], str | None]


@dataclass
class CategoryScore:
    category: str
    score: float
    evidence: list[str] = field(default_factory=list)


def _cfg(key: str, pred: Callable[[Any], bool], label: str = "") -> Callable[[CueContext], str | None]:
    def test(c: CueContext) -> str | None:
        if key in c.config:
            try:
                ok = pred(c.config[key])
            except (TypeError, ValueError):
                ok = False
            if ok:
                return f"config {key} = {c.config[key]!r}{label}"
        return None
    return test


def _fix(key: str, pred: Callable[[Any], bool], label: str) -> Callable[[CueContext], str | None]:
    def test(c: CueContext) -> str | None:
        if key in c.fix_changes and pred(c.fix_changes[key]):
            return f"fix sets {key} = {c.fix_changes[key]!r} ({label})"
        return None
    return test


def _phrase(pattern: str, where: str = "reported", flags: int = re.IGNORECASE) -> Callable[[CueContext], str | None]:
    rx = re.compile(pattern, flags)

    def test(c: CueContext) -> str | None:
        text = {"reported": c.reported_text, "fix": c.fix_text, "all": c.text}[where]
        m = rx.search(text)
        if m:
            snippet = re.sub(r"\s+", " ", m.group(0)).strip()
            return f"{'fix says' if where == 'fix' else 'text says'} {snippet!r}"
        return None
    return test


def _error(pattern: str) -> Callable[[CueContext], str | None]:
    rx = re.compile(pattern, re.IGNORECASE)

    def test(c: CueContext) -> str | None:
        for e in c.errors:
            if rx.search(e):
                return f"error {e!r}"
        return None
    return test


def _metric(pattern: str) -> Callable[[CueContext], str | None]:
    rx = re.compile(pattern, re.IGNORECASE)

    def test(c: CueContext) -> str | None:
        hits = [m for m in c.metrics if rx.search(m)]
        return f"metric {hits[0]!r}" if hits else None
    return test


def _algo(*names: str) -> Callable[[CueContext], str | None]:
    def test(c: CueContext) -> str | None:
        return f"algorithm {c.algorithm}" if c.algorithm in names else None
    return test


def _both(a: Callable[[CueContext], str | None], b: Callable[[CueContext], str | None]):
    def test(c: CueContext) -> str | None:
        x, y = a(c), b(c)
        return f"{x} and {y}" if x and y else None
    return test


def _relation(a: str, ops: set[str], b: str) -> Callable[[CueContext], str | None]:
    def test(c: CueContext) -> str | None:
        for ka, op, kb, snip in c.relations:
            if ka == a and kb == b and op in ops:
                return f"text states {snip!r}"
        return None
    return test


def _gt1(v: Any) -> bool:
    return float(v) > 1


_SP_WORDS = r"序列并行|sequence[\s_-]?parallel|ring[\s_-]?attn|ring attention|ulysses|context[\s_-]?parallel"

CUES: tuple[Cue, ...] = (
    # --- sequence-parallel-label-split
    Cue("sequence-parallel-label-split", 5.0, "sequence parallel degree > 1",
        _cfg("sequence_parallel_size", _gt1, " (> 1)")),
    Cue("sequence-parallel-label-split", 3.0, "the fix turns sequence parallelism off",
        _fix("sequence_parallel_size", lambda v: int(v) <= 1, "sequence parallelism off")),
    Cue("sequence-parallel-label-split", 1.5, "sequence / context parallelism discussed", _phrase(_SP_WORDS)),
    Cue("sequence-parallel-label-split", 1.0, "labels of a shard all ignored",
        _both(_phrase(_SP_WORDS), _phrase(r"-100|IGNORE_INDEX|标签.{0,8}(丢失|异常|为空)|labels?.{0,20}(lost|empty)"))),
    # --- all-labels-masked
    Cue("all-labels-masked", 2.0, "labels all -100 / masked",
        _phrase(r"(label|标签)[^。\n]{0,12}-100|IGNORE_INDEX|labels?\s+(are\s+)?all\s+(masked|ignored)|"
                r"loss[_ ]mask[^。\n]{0,12}(all\s+)?(0|zero)|no supervised tokens|没有.{0,6}(监督|有效).{0,4}token")),
    Cue("all-labels-masked", 1.0, "truncation keeps only the prompt",
        _cfg("truncation_mode", lambda v: str(v) == "keep_end")),
    Cue("all-labels-masked", 1.0, "loss only on completions", _cfg("completion_only_loss", bool)),
    Cue("all-labels-masked", 1.5, "empty answers in the data",
        _phrase(r"(assistant|回答|答案|response)[^。\n]{0,10}(缺失|为空|missing|empty)")),
    # --- empty-response-length-normalization
    Cue("empty-response-length-normalization", 4.0, "prompt length limit reaches the total length",
        _relation("max_prompt_length", {"eq", "ge", "gt"}, "max_length")),
    Cue("empty-response-length-normalization", 2.0, "length-normalised preference loss",
        _algo("SimPO", "IPO")),
    Cue("empty-response-length-normalization", 2.0, "length-normalised loss configured",
        _cfg("loss_type", lambda v: str(v) in {"simpo", "ipo"})),
    Cue("empty-response-length-normalization", 1.5, "average_log_prob on", _cfg("average_log_prob", bool)),
    Cue("empty-response-length-normalization", 3.0, "empty response",
        _phrase(r"响应[^。\n]{0,4}为空|空响应|回复为空|response[^.\n]{0,10}(is\s+)?empty|empty\s+(response|completion)"
                r"|zero[- ]length\s+(response|completion)")),
    Cue("empty-response-length-normalization", 1.5, "division by a zero length",
        _phrase(r"归一化[^。\n]{0,10}(为零|为0|零)|长度归一化|length[- ]normali[sz]|normali[sz]\w* by (the )?length|"
                r"denominator[^.\n]{0,20}zero|分母为零")),
    # --- kto-unbalanced-batch
    Cue("kto-unbalanced-batch", 5.0, "vanilla KTO loss with KTO",
        _both(_cfg("vanilla_loss", bool), _algo("KTO"))),
    Cue("kto-unbalanced-batch", 2.0, "the fix turns vanilla_loss off",
        _fix("vanilla_loss", lambda v: v is False, "vanilla KTO loss off")),
    Cue("kto-unbalanced-batch", 1.0, "KTO training", _algo("KTO")),
    Cue("kto-unbalanced-batch", 1.5, "desirable/undesirable imbalance",
        _both(_algo("KTO"), _phrase(r"desirable|undesirable|unbalanced|imbalanc|不平衡|不均衡|正负样本|"
                                    r"mean of (an )?empty|空.{0,4}(batch|批次)", "all"))),
    # --- fp16-overflow
    Cue("fp16-overflow", 3.0, "fp16 mixed precision",
        lambda c: ("precision fp16" if c.config.get("precision") == "fp16"
                   and c.config.get("weights_dtype") != "fp16" else None)),
    Cue("fp16-overflow", 3.0, "the fix moves from fp16 to bf16/fp32",
        _fix("precision", lambda v: v in {"bf16", "fp32"}, "away from fp16")),
    Cue("fp16-overflow", 4.0, "loss-scaler messages", _error(r"loss scale|OVERFLOW|overflow|unscale FP16")),
    Cue("fp16-overflow", 2.0, "sampling on NaN probabilities", _error(r"probability tensor contains")),
    Cue("fp16-overflow", 1.5, "overflow discussed",
        _phrase(r"溢出|上溢|overflow|loss[\s_]scal|65504|65,504|数值范围较小")),
    Cue("fp16-overflow", 1.0, "GPU without bf16", _cfg("gpu", lambda v: str(v).upper() in {"V100", "T4"})),
    Cue("fp16-overflow", 1.0, "NaN after healthy steps",
        lambda c: f"onset {c.onset!r}" if re.search(r"正常训练之后|healthy steps", c.onset) else None),
    # --- half-precision-weights
    Cue("half-precision-weights", 5.0, "trainable weights stored in fp16",
        _cfg("weights_dtype", lambda v: v == "fp16", " (weights, not mixed precision)")),
    Cue("half-precision-weights", 3.0, "pure fp16 training",
        _phrase(r"\.half\(\)|pure (fp16|half)|纯\s*(fp16|半精度)|fp32\s*(master|主)|master (weights|copy)")),
    Cue("half-precision-weights", 1.5, "reward / classification head",
        lambda c: ("reward model / SEQ_CLS head" if c.algorithm == "RM"
                   or str(c.config.get("lora_task_type", "")) == "seq_cls" else None)),
    Cue("half-precision-weights", 2.0, "astronomically large first loss", _metric(r"loss: \d+(\.\d+)?e\+(2\d|3\d)")),
    Cue("half-precision-weights", 1.0, "loss collapses to 0", _metric(r"^loss: 0\.0$")),
    Cue("half-precision-weights", 2.0, "the fix loads weights in another dtype",
        _fix("weights_dtype", lambda v: v in {"auto", "bf16", "fp32"}, "weights no longer fp16")),
    # --- kl-estimator-overflow
    Cue("kl-estimator-overflow", 3.0, "k3 / low_var_kl estimator", _cfg("kl_estimator", lambda v: v == "k3")),
    Cue("kl-estimator-overflow", 1.5, "KL as a loss term", _cfg("use_kl_loss", bool)),
    Cue("kl-estimator-overflow", 2.0, "KL goes NaN", _metric(r"^kl: (nan|inf)")),
    Cue("kl-estimator-overflow", 1.5, "KL estimator discussed",
        _phrase(r"low_var_kl|\bk3\b|schulman|kl[\s_]?(estimator|penalty)|importance (ratio|sampling).{0,20}(overflow|inf)")),
    Cue("kl-estimator-overflow", 2.0, "output collapses to '!!!!'", _phrase(r"!!!!|token id 0")),
    # --- zero2-overlap-comm-bug
    Cue("zero2-overlap-comm-bug", 4.0, "ZeRO-2 with overlap_comm",
        _both(_cfg("zero_stage", lambda v: int(v) == 2), _cfg("overlap_comm", bool))),
    Cue("zero2-overlap-comm-bug", 2.0, "overlap_comm discussed", _phrase(r"overlap_comm")),
    Cue("zero2-overlap-comm-bug", 1.0, "DeepSpeed 0.12.4-0.14.x",
        _both(_cfg("zero_stage", lambda v: int(v) == 2),
              _cfg("deepspeed_version", lambda v: bool(re.match(r"0\.(12\.[4-9]|13\.|14\.)", str(v)))))),
    # --- attention-kernel-bug
    Cue("attention-kernel-bug", 2.0, "attention kernel blamed",
        _phrase(r"(flash[\s_-]?attn|flash[\s_-]?attention|sdpa|cudnn)[^。\n]{0,30}(nan|bug|错误|问题)|soft-?capping|"
                r"softcap")),
    Cue("attention-kernel-bug", 2.0, "the fix switches the attention implementation",
        _fix("attn_implementation", lambda v: v in {"eager", "flash_attention_2", "sdpa"}, "other kernel")),
    # --- untrained-token-embeddings
    Cue("untrained-token-embeddings", 4.0, "untrained tokens reported", _error(r"untrained tokens")),
    Cue("untrained-token-embeddings", 3.0, "untrained embeddings discussed",
        _phrase(r"untrained tokens?|reserved_special_token|未训练的?\s*token|embedding[^。\n]{0,16}(never trained|未训练)")),
    # --- log-odds-cancellation
    Cue("log-odds-cancellation", 5.0, "log1p backward NaN", _error(r"Log1PBackward")),
    Cue("log-odds-cancellation", 2.0, "ORPO odds ratio", _algo("ORPO")),
    Cue("log-odds-cancellation", 2.0, "log1p(-exp()) discussed", _phrase(r"log1p|log1mexp|odds[\s_-]ratio")),
    # --- lr-too-high
    Cue("lr-too-high", 1.5, "learning rate blamed",
        _phrase(r"学习率[^。\n]{0,4}(过大|过高|太大|太高)|过大的学习率|(learning rate|lr)[^.\n]{0,10}too (high|large)|"
                r"(lower|reduce|decrease)\w* the (learning rate|lr)|降低学习率|学习率减半", "all")),
    Cue("lr-too-high", 1.0, "loss spikes / exploding gradients",
        _phrase(r"loss spikes?|梯度爆炸|gradient explosion|exploding gradients?|grad_norm spikes?")),
    Cue("lr-too-high", 2.0, "vision tower on the LLM's learning rate",
        _phrase(r"vision (tower|encoder)[^.\n]{0,30}(learning rate|lr)|视觉(编码器|塔)[^。\n]{0,20}学习率")),
    # --- grpo-group-std-degenerate
    Cue("grpo-group-std-degenerate", 4.0, "group std of zero",
        _both(_algo("GRPO"), _phrase(r"(std|标准差)[^。\n]{0,12}(为0|为零|zero|= ?0)"))),
    # --- padding-side-mismatch
    Cue("padding-side-mismatch", 3.0, "padding side", _phrase(r"padding[_\s]side|左填充|右填充|left[- ]padding")),
    # --- micro-batch-misconfig
    Cue("micro-batch-misconfig", 2.0, "accumulation of zero",
        _phrase(r"gradient_accumulation[^。\n]{0,20}(为0|为零|= ?0\b|is 0)")),
    # --- framework-bug
    Cue("framework-bug", 1.5, "fixed upstream",
        _phrase(r"fixed in (v|version )?\d|已在.{0,10}修复|升级到.{0,10}\d+\.\d+|upgrade to .{0,10}\d+\.\d+|"
                r"bug in (the )?(trainer|framework|library)", "all")),
)


def score_categories(ctx: CueContext, known: set[str] | None = None) -> list[CategoryScore]:
    """Every category with at least one firing cue, best first; each carries the cues that fired."""
    scores: dict[str, CategoryScore] = {}
    for cue in CUES:
        if known is not None and cue.category not in known:
            continue
        detail = cue.test(ctx)
        if not detail:
            continue
        s = scores.setdefault(cue.category, CategoryScore(cue.category, 0.0))
        s.score += cue.weight
        s.evidence.append(f"+{cue.weight:g} {cue.name}: {detail}")
    return sorted(scores.values(), key=lambda s: (-s.score, s.category))
