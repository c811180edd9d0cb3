"""Log parsing: trainer metric lines (HF/TRL dicts, tqdm postfix, verl, pipes, markdown tables), known error
strings and environment dumps -> facts nan_metrics, zero_metrics, huge_metrics, first_bad_step, errors, versions."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from kb.canonical import (
    DENIED_BEFORE,
    ERROR_PATTERNS,
    GPU_NAME,
    GPU_WITHOUT_BF16,
    HUGE_VALUE,
    canonical_package,
    gpu_name,
    is_grad_norm,
    is_limit_name,
    is_loss_like,
)
from kb.facts.model import INFERRED_LR, Facts
from kb.facts.prefilter import Haystack

# --- metric lines -----------------------------------------------------------------------------------------
_NUM = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)|[-+]?nan(?:\.0)?|[-+]?inf(?:inity)?(?:\.0)?"
# Keys start at a word boundary (the look-behind), so a long run of word characters is scanned once, not once per
# position. Keys are ASCII: in "使用bf16訓練總是出現loss': 0.0" the key is "loss", not the Chinese words before it.
_PAIR = re.compile(r"(?<![A-Za-z0-9_/.\-])['\"]?(?P<k>[A-Za-z_][A-Za-z0-9_/.\-]*)['\"]?\s*[:=]\s*(?:tensor\()?['\"]?(?P<v>" + _NUM + r")(?![A-Za-z0-9_.])",
                   re.IGNORECASE)  # (a Chinese word may follow the value: "loss=nan的情况", "loss=nan了")
# "step 10 loss 3.2, step 20 loss nan": name and number separated by spaces only; read only when a line has
# no `k: v` / `k=v` pairs, and only for names that look like metrics (prose like "after 100 iterations" is not).
_LOOSE_PAIR = re.compile(r"(?<![A-Za-z0-9_./\-])(?P<k>[A-Za-z_][A-Za-z0-9_/.\-]*)\s+(?P<v>" + _NUM + r")(?![\w.])", re.IGNORECASE)
_SPACE_PAIR = re.compile(r"^\s*(?P<k>[A-Za-z_][\w/.\-]*)(?:[ \t]*[:=][ \t]*|[ \t]+)(?P<v>" + _NUM + r")\s*$",
                         re.IGNORECASE)
# (the short names as whole parts of a key: "actor/kl_loss", "train/lr", not "already" or "clipped")
_METRIC_WORD = re.compile(r"loss|norm|reward|(?<![a-z])(?:kl|lr|ppl)(?![a-z])|acc(?:uracy)?(?![a-z])|logps|logits|margin|"
                          r"entropy|score|learning_rate|perplexity|advantage|ratio|clip|value|returns?\b|step|epoch|"
                          r"iter(?:ation)?s?(?![a-z])", re.IGNORECASE)
_DEVICES = {"cuda", "npu", "xpu", "mps", "cpu", "hpu"}  # "device='cuda:0'" is no metric
_DIVISION = re.compile(r"/\d+$")
_STEP_KEYS = {"step", "global_step", "steps", "iter", "iteration", "train/global_step", "training/global_step",
              "global_steps", "update", "timestep", "updates", "num_updates", "counters/updates", "trainer/global_step",
              "train/step"}  # fairseq's num_updates, the reference DPO trainer's counters/updates
_TQDM_STEP = re.compile(r"\b(\d+)/(\d+)\s*\[")
# A progress counter that names itself: Megatron's "iteration      120/  100000", XTuner / mmengine's
# "Iter(train) [ 120/3000]", ms-swift's "'global_step/max_steps': '45/380'", "Step 45/380".
_COUNTER_STEP = re.compile(r"(?<![\w/])(?:iteration|iter(?:\(train\))?|global_step/max_steps|step|batch)['\"]?\s*[:=]?\s*"
                           r"['\"]?\[?\s*(\d+)\s*/\s*\d+", re.IGNORECASE)
# A bare bracketed counter, LAVIS / BLIP's MetricLogger: "Train: data epoch: [0]  [  50/4427]  eta: ...  loss: nan";
# not the epoch's own "Epoch [1/3]".
_BRACKET_STEP = re.compile(r"\[\s*(\d+)\s*/\s*\d+\s*\]")
_EPOCH_BEFORE = re.compile(r"epoch\W{0,3}$", re.IGNORECASE)
# The step after the epoch's bracket, minimind / baby-llama2's "Epoch:[0/2](7000/293491) loss:nan lr:0.0000987".
_EPOCH_THEN_STEP = re.compile(r"epoch\W{0,3}\[\s*\d+\s*/\s*\d+\s*\]\s*\(\s*(\d+)\s*/\s*\d+\s*\)", re.IGNORECASE)
# A line that opens with its counter: nanochat's "step 00004 (0.33%) | loss: nan", "step 1: loss=0.0", mlx's "Iter 10:".
_LEAD_STEP = re.compile(r"^\W{0,3}(?:global[ _])?(?:step|iter(?:ation)?|batch)\s*[:#]?\s*(\d+)\b(?![./])", re.IGNORECASE)
# Megatron names some metrics in two words ("lm loss: NAN | grad norm: nan | loss scale: 1.0"), so do hand-written
# loops ("Train Loss: nan, Val Loss: nan", "Grad Norm: inf"); joined with "_" they read like the one-word names of
# other trainers, and a training / evaluation loss named so is the trainers' `loss` / `eval_loss`.
_TWO_WORDS = re.compile(r"(?<![A-Za-z0-9_])(lm|grad|params|loss|learning|num|mtp|moe|z|load[ _]balancing|train(?:ing)?|eval(?:uation)?|"
                        r"val(?:id|idation)?|test)\s+(loss|norm|scale|rate|zeros)(?=\s*:|\s+(?:[-+]?nan|[-+]?inf|[-+]?\.?\d)\b)",
                        re.IGNORECASE)  # "grad norm: nan", and "grad norm nan，loss 0.0" with no colon
_SPLIT_NAMES = {"train": "loss", "training": "loss", "eval": "eval_loss", "evaluation": "eval_loss", "val": "eval_loss",
                "valid": "eval_loss", "validation": "eval_loss", "test": "eval_loss"}


def _two_words(m: re.Match[str]) -> str:
    first, second = m.group(1).lower().replace(" ", "_"), m.group(2).lower()
    return _SPLIT_NAMES.get(first, f"{first}_{second}") if second == "loss" else f"{first}_{second}"
_MD_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?\s*$")


# The table a notebook's Trainer progress prints, pasted with its tabs: "Step\tTraining Loss\tValidation Loss".
_TAB_HEAD = re.compile(r"(?:global[ _])?(?:step|epoch|iteration|iter)s?", re.IGNORECASE)
_TAB_NAMES = {"training loss": "loss", "train loss": "loss", "validation loss": "eval_loss", "eval loss": "eval_loss"}


def _tab_name(cell: str) -> str:
    name = " ".join(cell.lower().split())
    if _TAB_HEAD.fullmatch(name.replace(" ", "_")):
        return "step" if not name.startswith("epoch") else "epoch"
    return _TAB_NAMES.get(name, re.sub(r"\W+", "_", name).strip("_") or "value")


def _value(v: str) -> float:
    s = v.lower().lstrip("+")
    if "nan" in s:
        return math.nan
    if "inf" in s:
        return -math.inf if s.startswith("-") else math.inf
    return float(s)


@dataclass
class Record:
    line: int
    text: str
    metrics: dict[str, float]
    raw: dict[str, str]
    step: int | None


def _record_from_pairs(n: int, text: str, pairs: list[tuple[str, str]]) -> Record | None:
    metrics: dict[str, float] = {}
    raw: dict[str, str] = {}
    for k, v in pairs:
        try:
            metrics[k] = _value(v)
            raw[k] = v
        except ValueError:
            continue
    # A metric record has at least two numbers, one of them named like a metric (a config line has one).
    # ("advantages stats: min=-1e6, max=1e6" names its metric once, before the pairs.)
    lead = text[: text.find(pairs[0][0])] if pairs else ""
    if len(metrics) < 2 or not (any(_METRIC_WORD.search(k) for k in metrics) or _METRIC_WORD.search(lead)):
        return None
    step = None
    for k, val in metrics.items():
        if k.lower() in _STEP_KEYS and math.isfinite(val):
            step = int(val)
    return Record(n, text, metrics, raw, _counter(text) if step is None else step)


def _counter(text: str) -> int | None:
    """The step a log line's own progress counter names, if it has one."""
    m = (_COUNTER_STEP.search(text) or _LEAD_STEP.search(text) or _TQDM_STEP.search(text) or _EPOCH_THEN_STEP.search(text)
         or next((b for b in _BRACKET_STEP.finditer(text) if not _EPOCH_BEFORE.search(text[:b.start()])), None))
    return int(m.group(1)) if m else None


# The HF Trainer's summary at the end of a run or an evaluation: "***** train metrics *****", then one
# "  train_loss               =        0.0" per line; the block is one record.
_METRICS_BANNER = re.compile(r"^\s*\*{3,}\s*(?:train|eval|predict|test)\s+metrics\s*\*{3,}\s*$", re.IGNORECASE)
_BANNER_PAIR = re.compile(r"^\s*(?P<k>[A-Za-z_][\w/.\-]*)[ \t]*=[ \t]*(?P<v>\S+)[ \t]*$")


def parse_metric_records(lines: list[tuple[int, str]]) -> list[Record]:
    """Every metric record in the paste, in order: dict/JSON lines, `k=v`, `k:v - k:v`, `k v | k v`, tables, the
    HF Trainer's metrics summary."""
    records: list[Record] = []
    header: list[str] | None = None
    tab_header: list[str] | None = None
    block: list[tuple[int, str, str, str]] | None = None  # (line, text, key, value) under a metrics banner
    for idx, (n, s) in enumerate(lines):
        if _METRICS_BANNER.match(s):
            block = []
            continue
        if block is not None:
            m = _BANNER_PAIR.match(s)
            if m:
                block.append((n, s, m.group("k").lower(), m.group("v")))
                continue
            records += _banner_record(block)
            block = None
        if "\t" in s:
            cells = [c.strip() for c in s.strip().split("\t")]
            if _TAB_HEAD.fullmatch(cells[0].replace(" ", "_")) and len(cells) >= 2 and not any(re.fullmatch(_NUM, c, re.IGNORECASE)
                                                                         for c in cells):
                tab_header = [_tab_name(c) for c in cells]
                continue
            if tab_header and len(cells) == len(tab_header) and re.fullmatch(r"\d+", cells[0]):
                pairs = [(h, c) for h, c in zip(tab_header, cells) if re.fullmatch(_NUM, c, re.IGNORECASE)]
                rec = _record_from_pairs(n, s, pairs)
                if rec:
                    records.append(rec)
                continue
        tab_header = None if s.strip() else tab_header
        if "|" in s and s.count("|") >= 2:
            cells = [c.strip() for c in s.strip().strip("|").split("|")]
            if _MD_SEP.match(s):
                continue
            nxt = lines[idx + 1][1] if idx + 1 < len(lines) else ""
            if _MD_SEP.match(nxt) or (header is None and all(not re.fullmatch(_NUM, c, re.IGNORECASE) for c in cells)
                                      and any(_METRIC_WORD.search(c) for c in cells) and len(cells) >= 2
                                      and not any(_SPACE_PAIR.match(c) or _PAIR.search(c) or len(c) > 40
                                                  for c in cells)):
                header = cells
                continue
            if header and len(cells) == len(header) and all(re.fullmatch(_NUM, c, re.IGNORECASE) or not c for c in cells):
                pairs = [(h if _METRIC_WORD.search(h) or i else "step", c) for i, (h, c) in
                         enumerate(zip(header, cells)) if c]
                # A table's non-step columns are the metric the user tracks (often the loss / grad_norm).
                pairs = [(("step" if i == 0 and re.search(r"step|iter|epoch", header[0], re.IGNORECASE) else k), v)
                         for i, (k, v) in enumerate(pairs)]
                rec = _record_from_pairs(n, s, pairs) or _table_record(n, s, pairs)
                if rec:
                    records.append(rec)
                continue
            # GPT-NeoX's "| learning rate: 1.212E-09 | lm_loss: nan |": two-word names joined as on other lines
            space = [m for c in cells if (m := _SPACE_PAIR.match(_TWO_WORDS.sub(_two_words, c)))]
            if len(space) >= 2:
                rec = _record_from_pairs(n, s, [(m.group("k").lower(), m.group("v")) for m in space])
                if rec:
                    records.append(rec)
                continue
        else:
            header = None
        joined = _TWO_WORDS.sub(_two_words, s)
        # "loss `= sum/0 = NaN`" in a sentence: a division, no metric named "sum/0"
        pairs = [(m.group("k").lower(), m.group("v")) for m in _PAIR.finditer(joined)
                 if m.group("k").lower() not in _DEVICES and not _DIVISION.search(m.group("k"))]
        loose = not pairs
        if loose:
            pairs = [(m.group("k").lower(), m.group("v")) for m in _LOOSE_PAIR.finditer(joined)
                     if _METRIC_WORD.search(m.group("k"))]
        # "'loss': 1.19e+34, 'grad_norm': nan, then 'loss': 0.0": a repeated key starts the next record.
        group: list[tuple[str, str]] = []
        for k, v in pairs + [("", "")]:
            if k == "" or k in {g[0] for g in group}:
                rec = _record_from_pairs(n, s, group) if len(group) >= 2 or (records and group) else None
                if rec is None and group and records and records[-1].line == n:
                    rec = _single(n, s, group)
                if rec is None and not loose and len(group) == 1 and _nonfinite_metric(*group[0]):
                    rec = _single(n, s, group)
                if rec:
                    records.append(rec)
                group = []
            if k:
                group.append((k, v))
    if block is not None:
        records += _banner_record(block)
    return records


def _banner_record(block: list[tuple[int, str, str, str]]) -> list[Record]:
    pairs = [(k, v) for _, _, k, v in block if re.fullmatch(_NUM, v, re.IGNORECASE)]
    rec = _record_from_pairs(block[0][0], "; ".join(s.strip() for _, s, _, _ in block), pairs) if pairs else None
    return [rec] if rec else []


def _nonfinite_metric(k: str, v: str) -> bool:
    """`grad_norm=nan` or `'loss': inf,` alone on a line is a metric, not a setting: no config holds a NaN. Limits
    and thresholds (`max_grad_norm: inf`, `clip_ratio=inf`) can be infinite on purpose and are not read."""
    name = k.lower()
    return (bool(re.fullmatch(r"[-+]?(?:nan|inf(?:inity)?)", v, re.IGNORECASE)) and bool(_METRIC_WORD.search(name))
            and name not in _STEP_KEYS and not is_limit_name(name))


def _single(n: int, s: str, group: list[tuple[str, str]]) -> Record | None:
    try:
        return Record(n, s, {k: _value(v) for k, v in group}, dict(group), _counter(s))
    except ValueError:
        return None


def _table_record(n: int, s: str, pairs: list[tuple[str, str]]) -> Record | None:
    metrics = {}
    for k, v in pairs:
        try:
            metrics[k] = _value(v)
        except ValueError:
            continue
    if len(metrics) < 2:
        return None
    step = int(metrics["step"]) if "step" in metrics and math.isfinite(metrics["step"]) else None
    return Record(n, s, metrics, dict(pairs), step)


_NOT_METRICS = {"epoch", "learning_rate", "lr"}


def metric_facts(records: list[Record], facts: Facts, source: str) -> None:
    seen_nonzero: dict[str, bool] = {}
    min_pos: dict[str, float] = {}  # smallest positive value seen so far, per metric (spike reference)
    broken = False  # a bad value seen: later jumps are the breakage itself, not spikes before it
    bad: list[Record] = []
    for r in records:
        bad_here = False
        for k, v in r.metrics.items():
            if k.lower() in _STEP_KEYS or k.lower() in _NOT_METRICS or k.lower().endswith(("error", "exception")):
                continue  # (`ValueError: nan loss detected`: an exception's class, not a metric)
            detail = r.text.strip()
            if math.isnan(v) or math.isinf(v):
                facts.add("nan_metrics", k, "log", r.line, detail, source)
                facts.add("symptom", "inf" if math.isinf(v) else "nan", "log", r.line, detail, source)
                bad_here = True
            elif v == 0.0 and is_loss_like(k):
                facts.add("zero_metrics", k, "log", r.line, detail, source)
                facts.add("symptom", "zero_loss", "log", r.line, detail, source)
                bad_here = True
            elif v == 0.0 and is_grad_norm(k):
                facts.add("symptom", "zero_grad", "log", r.line, detail, source)  # no gradient reached the weights
            elif abs(v) > HUGE_VALUE and (is_loss_like(k) or "norm" in k.lower() or "advantage" in k.lower()):
                facts.add("huge_metrics", k, "log", r.line, detail, source)
                facts.add("symptom", "huge", "log", r.line, detail, source)
            elif abs(v) > HUGE_VALUE and k.lower() in ("min", "max") and "advantage" in r.text.lower():
                # "Normalized advantages stats: min=-1000000.0, max=1000000.0": the stats name their subject once.
                facts.add("huge_metrics", "advantages", "log", r.line, detail, source)
                facts.add("symptom", "huge", "log", r.line, detail, source)
            if math.isfinite(v) and v != 0.0:
                seen_nonzero[k] = True
            if not broken and math.isfinite(v) and (is_loss_like(k) or "norm" in k.lower()):
                ref = min_pos.get(k)
                if ref is not None and v > 10 * ref and v > 1.0:
                    facts.add("spike_metrics", k, "log", r.line, detail, source)
                if v > 0:
                    min_pos[k] = v if ref is None else min(ref, v)
        broken = broken or bad_here
        if bad_here:
            bad.append(r)
    _logged_learning_rate(records, facts, source)
    _first_bad_step([r for r in records if r.step is not None or not _prose(r)], bad, facts, source)
    _pairwise_tie(records, facts, source)
    _framework_of_log(records, facts, source)


_SWIFT_KEYS = re.compile(r"['\"](?:memory\(GiB\)|train_speed\((?:iter/s|s/it)\))['\"]\s*:")


def _pairwise_tie(records: list[Record], facts: Facts, source: str) -> None:
    """A preference loss pinned at ln 2 with chosen and rejected scored alike, record after record (`'loss': 0.6931,
    'rewards/margins': 0.0`): the collapse the prose reader calls `pairwise_tie`. One such record is every DPO run's
    first step (the policy starts as the reference), so it takes two."""
    tied = []
    for r in records:
        m = {k.lower(): v for k, v in r.metrics.items()}
        loss = m.get("loss", m.get("train_loss"))
        margin = m.get("rewards/margins", m.get("train/rewards/margins"))
        if loss is not None and 0.6928 <= loss <= 0.6935 and margin is not None and margin == 0.0:
            tied.append(r)
    if len(tied) >= 2:
        detail = tied[0].text.strip()
        facts.set("pairwise_tie", True, "log", tied[0].line, detail, source)
        facts.add("symptom", "collapse", "log", tied[0].line, detail, source)


def _framework_of_log(records: list[Record], facts: Facts, source: str) -> None:
    """A trainer's own log format names it: ms-swift's records (`'memory(GiB)': 55.3`, `'train_speed(iter/s)'` or
    `'train_speed(s/it)'`), torchtitan's `[titan]` lines."""
    for r in records:
        if _SWIFT_KEYS.search(r.text):
            facts.set("framework", "ms-swift", "log", r.line, r.text.strip(), source)
            return
        if "[titan]" in r.text:
            facts.set("framework", "torchtitan", "log", r.line, r.text.strip(), source)
            return


def _is_lr(name: str) -> bool:
    low = re.sub(r"[-_]pg_?0$", "", name.lower())  # slime / Megatron's first param group: `train/lr-pg_0`
    return low == "lr" or low.endswith(("learning_rate", "/lr"))


def _logged_learning_rate(records: list[Record], facts: Facts, source: str) -> None:
    """A scheduler's value is logged each record: during warmup the first one is far below the setting (even 0.0),
    so the highest one logged stands for the run's rate when no setting says it (a config or command line wins)."""
    logged = [(v, r) for r in records for k, v in r.metrics.items() if _is_lr(k) and math.isfinite(v) and v > 0]
    if not logged:
        return
    low = sorted(v for v, _ in logged)[(len(logged) - 1) // 2]  # the lower median
    # a paste cut short mid-number ("'learning_rate': 9.9879" of 9.9879e-06) stands orders of magnitude above the
    # rest; a warmup's ramp (3e-08 up to 1e-04) does not
    best_v, best = max(((v, r) for v, r in logged if v <= 10_000 * low), key=lambda x: x[0])
    facts.set("learning_rate", best_v, "log", best.line, f"{INFERRED_LR}: {best.text.strip()}", source)


def _first_bad_step(logged: list[Record], bad: list[Record], facts: Facts, source: str) -> None:
    """The step of the first record with a bad value (`logged`: log lines, and sentences that name their step:
    "loss NaN at step 4"): the record's own counter; on a line that continues the line before it (a wrapped verl
    line: "step:83 - ..." then "actor/kl_loss:nan - ..."), that line's counter; a bad record without a counter
    among records with one (a title's "grad_norm: nan" above the log) is passed over; the record's number only when
    the records carry no counter at all and the paste starts the run."""
    stepped = any(r.step is not None for r in logged)
    bad_ids = {id(b) for b in bad}  # a set: a 50 MB log holds hundreds of thousands of records
    steps = [r.step for r in logged if r.step is not None]
    if len(steps) >= 2 and all(a > b for a, b in itertools.pairwise(steps)):
        # a log viewer's newest-first paste (step 3, then 2, then 1): the earliest bad step is the smallest
        early = min((r for r in logged if id(r) in bad_ids and r.step is not None), key=lambda r: r.step, default=None)
        if early is not None:
            facts.set("first_bad_step", early.step, "log", early.line, f"step {early.step}: {early.text.strip()}", source)
            return
    for k, r in enumerate(logged):
        if id(r) not in bad_ids:
            continue
        prev = logged[k - 1] if k else None
        if r.step is not None:
            facts.set("first_bad_step", r.step, "log", r.line, f"step {r.step}: {r.text.strip()}", source)
        elif prev is not None and prev.step is not None and prev.line == r.line - 1:
            facts.set("first_bad_step", prev.step, "log", r.line, f"step {prev.step}: {prev.text.strip()} / "
                      f"{r.text.strip()}", source)
        elif stepped:
            continue  # a title's "grad_norm: nan" before the log: the log's own counter says when
        elif _from_the_start(logged):
            facts.set("first_bad_step", k + 1, "log", r.line, f"record #{k + 1}: {r.text.strip()}", source)
        return


def _from_the_start(records: list[Record]) -> bool:
    """Whether a log record's number may stand in for its step (the records carry none): the paste begins with
    the run's first log. A fractional epoch says so: 0.0 on a lone record (the Trainer rounds to two decimals),
    up to 0.01 on the first of several. With no epoch logged, a run of several records does. A lone
    `{'loss': nan, 'grad_norm': nan, 'epoch': 0.01}` or `Epoch 0, Loss nan` (an epoch's index, not a fraction)
    says nothing about the step it came from."""
    first = records[0]
    key = next((k for k in first.metrics if k.lower() == "epoch"), None)
    if key is not None:
        epoch = first.metrics[key]
        if "." not in first.raw.get(key, ""):
            return False
        return math.isfinite(epoch) and epoch <= (0.0 if len(records) == 1 else 0.01)
    # no epoch on the first (a title's "loss: nan" above the record): the first record that has one says where
    # the paste starts (`'epoch': 0.45` is far into the run)
    later = next(((r, k) for r in records[1:] for k in r.metrics if k.lower() == "epoch"), None)
    if later is not None:
        r, k = later
        return "." in r.raw.get(k, "") and math.isfinite(r.metrics[k]) and r.metrics[k] <= 0.01
    return len(records) >= 2


# A sentence, not a log line: a run of four plain words ("loss goes nan after a few steps") or Chinese text.
# Metric values read from it are kept, but its place among the records is not a step.
_PROSE_RUN = re.compile(r"(?:\b[A-Za-z]+\b[ ,]+){3}\b[A-Za-z]+\b(?![:=(\[])|[\u4e00-\u9fff]{2}")


# An issue title's tag: "[BUG] FP8+PP+Recompute+GA>1, loss = nan" is a title, not a log line.
_TITLE_TAG = re.compile(r"^\s*\[(?:bug|question|help|qa|feature|discussion|usage|issue)\b[^\]\n]{0,20}\]", re.IGNORECASE)


def _prose(r: Record) -> bool:
    """The record was read from a sentence (its text less its values has a run of plain words or Chinese), or from
    an issue title."""
    if _TITLE_TAG.match(r.text):
        return True
    rest = r.text
    for v in r.raw.values():
        rest = rest.replace(v, " ")
    return bool(_PROSE_RUN.search(rest))


# A setting followed by its comment, up to the error's words: `gpu_memory_utilization = 0.9, # Reduce if out of memory`
# (a notebook's advice, not an error that happened).
_CODE_COMMENT = re.compile(r"^[ \t]*[A-Za-z_][\w.]{0,60}[ \t]*[=:][^#\n]{0,200}?[ \t]#[^\n]*$")


def error_facts(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    hay = Haystack("\n".join(s for _, s in lines))
    patterns = [(eid, pat) for eid, pat, _ in ERROR_PATTERNS if hay.may(pat)]
    for n, s in lines:
        for eid, pat in patterns:
            m = pat.search(s)
            if m and not _CODE_COMMENT.match(s[: m.start()]):
                facts.add("errors", eid, "log", n, s.strip(), source)


# "TRL (0.26.2)" and a markdown table's "| Torch | 2.5.1+cpu |" name a version too
_PKG = re.compile(r"(?<![\w\-])(?P<pkg>[A-Za-z][A-Za-z0-9_\-]*)`?[ \t]*(?P<op>==|=|>=|~=|:|：|\(|\||version[ \t]*[:：]?|版本[ \t]*[:：]?)[ \t]*['\"]?"
                  r"(?P<ver>v?\d+(?:\.\d+)+"
                  r"[\w+\-]*(?:\.[\w+\-]+)*)", re.IGNORECASE)
# A requirements list's line: `torch>=1.13.1`, `- peft~=0.7`.
_REQUIREMENT = re.compile(r"^[\s>*-]{0,6}[A-Za-z][\w\-]{0,40}[ \t]{0,3}(?:>=|~=)[ \t]{0,3}v?\d")
_PIP_LIST = re.compile(r"^\s*(?P<pkg>[A-Za-z][\w\-]*)\s{2,}(?P<ver>v?\d+(?:\.\d+)+[\w+\-]*(?:\.[\w+\-]+)*)\s*$")
# Unsloth's start-up banner: "==((====))==  Unsloth 2025.3.17: Fast Gemma3 patching.", "Unsloth: Fast Mistral patching
# release 2024.7".
_UNSLOTH_BANNER = re.compile(r"Unsloth:? (?:(?P<a>20\d\d\.\d{1,2}(?:\.\d{1,3})?):? Fast \w+ patching|Fast \w+ patching "
                             r"release (?P<b>20\d\d\.\d{1,2}(?:\.\d{1,3})?))")
# An environment list's GPU count ("- GPU number: 8", "GPU数量：8").
_GPU_COUNT_ENV = re.compile(r"^(?:\[\d{1,7}\])?[\s>*-]*(?:GPU[ _]?(?:number|count|num)|Number of GPUs|GPU数量|显卡数量|卡数)\s*[:：]\s*(?P<n>\d{1,4})\s*$",
                            re.IGNORECASE)
_SMI_CARD = re.compile(r"^[ \t]*(?:nvidia-smi:[ \t]*)?(?:GPU \d{1,3}: NVIDIA [^\n(]{1,60}\(UUID|NVIDIA [A-Za-z0-9 -]{1,40}, \d{3}\.\d{1,3}(?:\.\d{1,3})?[ \t]*$)")
_DEVICE_LIST = re.compile(r"^[\s>*-]{0,6}CUDA device\(s\)[ \t]*:[ \t]*(?P<d>[^\n]{1,2000})$", re.IGNORECASE)
_PY_VISIBLE = re.compile(r"os\.environ\[[ \t]*[\"'](?:CUDA|ASCEND_RT|HIP)_VISIBLE_DEVICES[\"'][ \t]*\][ \t]*=[ \t]*"
                         r"[\"'](?P<d>\d{1,3}(?:,[ \t]?\d{1,3}){0,63})[\"']")
_TORCH_ENV = re.compile(r"PyTorch version(?:\s*\((?:GPU|accelerator)\?\))?\s*:\s*(?P<ver>\d+(?:\.\d+)+[\w+\-]*(?:\.[\w+\-]+)*)", re.IGNORECASE)
def env_facts(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    requirements = sum(1 for _, s in lines if _REQUIREMENT.match(s)) >= 2
    cards = [(n, s) for n, s in lines if "NVIDIA" in s and _SMI_CARD.match(s)]
    for n, s in lines:
        pip = _PIP_LIST.match(s)
        for m in list(_PKG.finditer(s)) + ([pip] if pip else []):
            if m.re is _PKG and m.group("op") in (">=", "~=") and (_PROSE_RUN.search(s) or requirements):
                # "fixed in transformers>=4.47", a requirements list (`torch>=1.13.1` / `trl>=0.7.4` / ...): bounds
                continue
            got = canonical_package(m.group("pkg"), m.group("ver"))
            if got:
                key, ver, fw = got
                facts.set(key, ver, "env", n, m.group(0), source)
                if fw:
                    facts.set("framework", fw, "env", n, m.group(0), source)
        m = _TORCH_ENV.search(s)
        if m:
            facts.set("torch_version", m.group("ver"), "env", n, m.group(0), source)
        m = _DEVICE_LIST.match(s) if "device" in s else None
        if m and "num_gpus" not in facts:  # TRL's `trl env`: "- CUDA device(s): NVIDIA A100-SXM4-80GB, NVIDIA A100-..."
            facts.set("num_gpus", len([d for d in m.group("d").split(",") if d.strip()]), "env", n, s.strip(), source)
        m = _PY_VISIBLE.search(s) if "environ" in s else None
        if m and "num_gpus" not in facts:  # `os.environ["CUDA_VISIBLE_DEVICES"] = "0"` at the top of a script
            facts.set("num_gpus", len(m.group("d").split(",")), "config", n, s.strip(), source)
        m = _UNSLOTH_BANNER.search(s) if "patching" in s else None
        if m:
            facts.set("framework_version", m.group("a") or m.group("b"), "env", n, m.group(0), source)
            facts.set("framework", "unsloth", "env", n, m.group(0), source)
        m = _GPU_COUNT_ENV.match(s) if "num_gpus" not in facts else None
        if m is None and cards and n == cards[-1][0] and "num_gpus" not in facts:
            # `nvidia-smi -L` ("GPU 0: NVIDIA H20 (UUID: ...)") or `--query-gpu=name,driver_version`: a line per card
            facts.set("num_gpus", len(cards), "env", cards[0][0], cards[0][1].strip(), source)
        if m and int(m.group("n")) > 0:
            facts.set("num_gpus", int(m.group("n")), "env", n, m.group(0).strip(), source)
        # a sentence may name GPUs it compares ("之前在 V100 上正常", "it's not a V100"): kb.facts.statements reads those
        m = None if _PROSE_RUN.search(s) else next(
            (g for g in GPU_NAME.finditer(s) if not DENIED_BEFORE.search(s[max(0, g.start() - 16):g.start()])), None)
        if m:
            gpu = gpu_name(m.group("gpu"))
            facts.set("gpu", gpu, "env", n, s.strip(), source)
            facts.set("gpu_bf16", not bool(GPU_WITHOUT_BF16.search(gpu)), "env", n, s.strip(), source)


def extract(lines: list[tuple[int, str]], facts: Facts, source: str) -> None:
    metric_facts(parse_metric_records(lines), facts, source)
    error_facts(lines, facts, source)
    env_facts(lines, facts, source)
