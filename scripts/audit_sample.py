"""Draw the random sample of cases for a label audit (docs/CASE_AUDIT.md), so that anyone can redraw it.

    python scripts/audit_sample.py                      # 24 in-scope + 8 out-of-scope ids, seed 20261123
    python scripts/audit_sample.py --seed 7 --in 40 --out 10 --cases cases

The draw is seeded and made over the case files in name order, in-scope and out-of-scope separately, so the
same case base and seed always give the same ids (the 2026-11-23 audit drew from the 522 cases at commit 3fbb6eb).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kb.cases import load_cases


def draw(cases_dir: Path, seed: int, n_in: int, n_out: int) -> list[str]:
    cases, problems = load_cases(cases_dir)
    if problems:
        raise SystemExit(f"{len(problems)} case file(s) do not validate; run `kb validate` first")
    ordered = sorted(cases, key=lambda c: f"{c.id}.yaml")  # the order of the files in the folder
    ins = [c.id for c in ordered if c.scope == "in"]
    outs = [c.id for c in ordered if c.scope == "out"]
    rng = random.Random(seed)
    return rng.sample(ins, min(n_in, len(ins))) + rng.sample(outs, min(n_out, len(outs)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=REPO / "cases")
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--in", dest="n_in", type=int, default=24)
    ap.add_argument("--out", dest="n_out", type=int, default=8)
    args = ap.parse_args()
    print("\n".join(draw(args.cases, args.seed, args.n_in, args.n_out)))


if __name__ == "__main__":
    main()
