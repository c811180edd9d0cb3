"""A blind reader beside the engine: how much of the root cause do the reports' own words give away?

    python scripts/blind_reader.py write DIR          # DIR/queries.jsonl: the 100 reports of the pinned sample,
                                                      # exactly the text `kb eval --cv` gives the engine
    python scripts/blind_reader.py score LABELS.jsonl [--cv CV.json]

`docs/blind-reader/sample.json` pins the sample (80 in-scope and 20 out-of-scope cases, drawn with a fixed seed;
question ids q000-q099 in shuffled order) and `docs/blind-reader/BRIEF.md` is what the reader is told: the
taxonomy, the labelling convention, and nothing else (no case files, no threads, no search). The reader writes one
`{"qid", "category", "confidence", "why"}` line per report. `score` prints the reader's top-1 on the in-scope
reports (with a Wilson 95 % interval) and how many out-of-scope reports it called out of scope; with `--cv` (the
output of `kb eval --cv --json`) it also prints the engine's out-of-fold answers on the same reports and where the
two disagree. docs/DIAGNOSE.md ("How much do the reports say?") has the 2026-11-23 reading.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kb.cases import load_cases

SAMPLE = REPO / "docs" / "blind-reader" / "sample.json"
OUT = "out-of-scope"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h


def sample() -> dict[str, dict[str, str]]:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))["sample"]


def write(out: Path, cases_dir: Path) -> None:
    cases, _ = load_cases(cases_dir)
    by_id = {c.id: c for c in cases}
    out.mkdir(parents=True, exist_ok=True)
    missing = []
    with (out / "queries.jsonl").open("w", encoding="utf-8") as f:
        for qid, row in sample().items():
            c = by_id.get(row["id"])
            if c is None:
                missing.append(row["id"])
                continue
            f.write(json.dumps({"qid": qid, "report": c.query()}, ensure_ascii=False) + "\n")
    print(f"wrote {out / 'queries.jsonl'}" + (f"; {len(missing)} sampled case(s) no longer exist" if missing else ""))


def score(labels_path: Path, cv_path: Path | None) -> None:
    key = sample()
    said = {}
    for line in labels_path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            said[row["qid"]] = row["category"]
    engine = None
    if cv_path is not None:
        engine = json.loads(cv_path.read_text(encoding="utf-8"))["predictions"]["grouped by thread"]
    ins = [q for q, r in key.items() if r["label"] != OUT]
    outs = [q for q, r in key.items() if r["label"] == OUT]
    right = sum(said.get(q) == key[q]["label"] for q in ins)
    lo, hi = wilson(right, len(ins))
    print(f"reader: in-scope top-1 {right}/{len(ins)} = {right / len(ins):.3f} (95% {lo:.2f}-{hi:.2f}); "
          f"out of scope called out of scope {sum(said.get(q) == OUT for q in outs)}/{len(outs)}")
    if engine is None:
        return
    got = {q: engine.get(key[q]["id"]) for q in key}
    e_right = sum(got[q] == key[q]["label"] for q in ins)
    lo, hi = wilson(e_right, len(ins))
    print(f"engine, out of fold on the same reports: in-scope top-1 {e_right}/{len(ins)} = {e_right / len(ins):.3f} "
          f"(95% {lo:.2f}-{hi:.2f}); out of scope abstained {sum(got[q] == OUT for q in outs)}/{len(outs)}")
    both = {(a, b): 0 for a in (True, False) for b in (True, False)}
    for q in ins:
        both[(said.get(q) == key[q]["label"], got[q] == key[q]["label"])] += 1
    print(f"in scope: both right {both[(True, True)]}, only the reader {both[(True, False)]}, "
          f"only the engine {both[(False, True)]}, neither {both[(False, False)]}")
    for q in ins:
        if said.get(q) == key[q]["label"] != got[q]:
            print(f"  only the reader: {key[q]['id']}: {key[q]['label']} (engine: {got[q]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir", type=Path)
    w.add_argument("--cases", type=Path, default=REPO / "cases")
    s = sub.add_parser("score")
    s.add_argument("labels", type=Path)
    s.add_argument("--cv", type=Path)
    args = ap.parse_args()
    if args.cmd == "write":
        write(args.dir, args.cases)
    else:
        score(args.labels, args.cv)


if __name__ == "__main__":
    main()
