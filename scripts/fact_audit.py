"""The fact layer against the case records: does what `kb diagnose` reads from a report agree with what the case's
collector wrote down from the whole thread?

    python scripts/fact_audit.py            # the agreement table
    python scripts/fact_audit.py --show     # and every disagreement and odd value, with the evidence line

Each case in cases/ records the run's precision, adapter, algorithm, hardware and parallelism (read by a person
from the thread). The report alone, as `kb eval --cv` gives it to the engine (title, observation, the reporter's
machine output), is read here by the same fact layer (`kb.diagnose.engine.collect_facts`), and each fact is
compared with the record where both say something. A collector may know more than the report says (a fact the
report lacks is a miss of the report, not of the reader), so the table counts disagreements where both speak,
and separately what the reader claimed that the record does not (a value the record leaves blank). It also lists
values of a categorical fact outside its vocabulary (`attn_implementation: "training"`), which no trigger can
match. Nothing here uses the cases' categories: it measures the reading, not the diagnosis.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kb.canonical import DTYPE_OF_WORD, GPU_NAME, canonical_algorithm
from kb.cases import load_cases
from kb.diagnose.engine import collect_facts

PRECISIONS = tuple(sorted(set(DTYPE_OF_WORD.values())))  # fp16 bf16 fp32 fp8 fp4: what a precision can be
# Values a trigger or a question can use; anything else read for these keys is noise.
VOCABULARY = {
    "attn_implementation": {"flash_attention_2", "flash_attention_3", "sdpa", "eager", "triton", "xformers",
                            "flex_attention"},
    "precision": set(PRECISIONS),
    "weights_dtype": {"fp16", "bf16", "fp32", "auto"},
    "working_dtype": {"bf16", "fp32"},
}


def _adapter(facts) -> str | None:
    ft = facts.value("finetuning_type")
    if ft in ("lora", "qlora", "full"):
        return ft
    if facts.value("use_peft"):
        return "lora"
    return None


def _same_algorithm(recorded: str, read) -> bool:
    """The record's words ("pretraining", "GRPO / PPO", "DPO (NCA pair loss)") name the algorithm read."""
    words = [w for w in re.split(r"[^a-z0-9+]+", recorded.lower()) if w]
    names = {canonical_algorithm(w) or w for w in words} | {canonical_algorithm(recorded) or recorded.lower()}
    if "pretraining" in words:
        names.add("pretrain")
    return str(read) in names or str(read).lower() in names


def _gpu(name: str) -> str:
    return re.sub(r"\s+|geforce|nvidia|ascend", "", name.lower())


def _evidence(facts, key: str) -> str:
    """The line a fact was read from, on one line."""
    ev = facts.get(key)
    return re.sub(r"\s+", " ", str(ev.detail if ev else ""))[:160]


def _zero(parallelism: str) -> int | None:
    m = re.search(r"zero[- _]?(\d)", parallelism, re.IGNORECASE)
    return int(m.group(1)) if m else None


def audit(cases) -> tuple[Counter, list[tuple[str, str, str, str, str]]]:
    """(counts per (field, outcome), [(field, case id, record says, facts say, evidence)])."""
    counts: Counter = Counter()
    notes: list[tuple[str, str, str, str, str]] = []

    def compare(field: str, case, recorded, read, fact_key: str, same=lambda a, b: a == b) -> None:
        if read is None or recorded is None:
            if read is not None or recorded is not None:
                counts[(field, "record only" if read is None else "facts only")] += 1
        elif same(recorded, read):
            counts[(field, "agree")] += 1
        else:
            counts[(field, "disagree")] += 1
            notes.append((field, case.id, str(recorded), str(read), _evidence(facts, fact_key)))

    for c in cases:
        facts, _ = collect_facts([("text", c.query())])  # `compare` reads this case's facts
        compare("precision", c, c.precision if c.precision in PRECISIONS else None, facts.value("precision"),
                "precision")
        rec = c.adapter if c.adapter in ("lora", "qlora", "full") else None
        compare("adapter", c, rec, _adapter(facts), "use_peft" if facts.value("use_peft") else "finetuning_type",
                # a QLoRA run is a LoRA run whose base is quantised; the reader may not see the quantisation
                lambda a, b: a == b or {a, b} == {"lora", "qlora"})
        algo = c.algorithm if c.algorithm not in ("unknown", "") else None
        compare("algorithm", c, algo, facts.value("algorithm"), "algorithm", _same_algorithm)
        m = GPU_NAME.search(c.hardware)
        compare("gpu", c, m.group("gpu") if m else None, facts.value("gpu"), "gpu",
                lambda a, b: _gpu(a) == _gpu(str(b)))
        compare("zero stage", c, _zero(c.parallelism), facts.value("zero_stage"), "zero_stage",
                lambda a, b: int(a) == int(b))
        for key, allowed in VOCABULARY.items():
            v = facts.value(key)
            if v is not None:
                ok = str(v) in allowed
                counts[(f"{key} value", "in vocabulary" if ok else "outside")] += 1
                if not ok:
                    notes.append((f"{key} value", c.id, "", repr(v), _evidence(facts, key)))
    return counts, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--show", action="store_true", help="list every disagreement and odd value")
    args = ap.parse_args(argv)
    cases, problems = load_cases(REPO / "cases")
    if problems:
        print(f"{len(problems)} case files do not validate (kb validate lists them); audited the rest", file=sys.stderr)
    counts, notes = audit(cases)
    print(f"{len(cases)} cases; facts read from each report (title, observation, machine output) against its record")
    print(f"{'field':28s} {'agree':>6s} {'disagree':>9s} {'facts only':>11s} {'record only':>12s}")
    for field in ("precision", "adapter", "algorithm", "gpu", "zero stage"):
        a, d = counts[(field, "agree")], counts[(field, "disagree")]
        print(f"{field:28s} {a:6d} {d:9d} {counts[(field, 'facts only')]:11d} {counts[(field, 'record only')]:12d}")
    for key in VOCABULARY:
        f = f"{key} value"
        print(f"{f:28s} {counts[(f, 'in vocabulary')]:6d} {counts[(f, 'outside')]:9d}   (in / outside the vocabulary)")
    if args.show:
        for field, cid, rec, read, detail in notes:
            print(f"- {field}: {cid}: record {rec or '-'}, read {read}  <- {detail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
