"""How much would more cases help? Out-of-fold quality of the learned ranker against the size of the case base.

    python scripts/learning_curve.py [--shares 0.25 0.5 0.75 1] [--draws 10] [--folds 5] [--json]

Each point is `kb eval --cv`'s grouped scheme (5 folds grouped by source thread, the mean of `--draws` fold
assignments) with every fold's ranker and text classifiers fitted on only a share of its training threads; the test
folds stay whole, so every point answers the same reports. Share 1 is the headline of `kb eval --cv`. The reading of
2026-12-07 (and of 2026-11-24) is in docs/DIAGNOSE.md ("How much would more cases help?").
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kb import KnowledgeBase
from kb.diagnose.evaluate import learning_curve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shares", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0],
                    help="shares of each fold's training threads to fit on, each in (0, 1]")
    ap.add_argument("--draws", type=int, default=10, help="fold assignments averaged per point (default 10)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--data-dir", default=None, help="index + store folder (default: kb's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if any(not 0.0 < s <= 1.0 for s in args.shares) or not 1 <= args.draws <= 100 or args.folds < 2:
        ap.error("shares must lie in (0, 1], draws in 1-100, folds at least 2")
    kb = KnowledgeBase.open(data_dir=args.data_dir)
    t0 = time.time()
    curve = learning_curve(kb, args.shares, args.folds, args.draws)
    curve["seconds"] = round(time.time() - t0, 1)
    curve["machine"] = f"{platform.machine()}, {platform.system()}, Python {platform.python_version()}"
    if args.json:
        print(json.dumps(curve, indent=1))
        return 0
    print(f"{curve['cases']} cases from {curve['threads']} threads; {curve['folds']} folds grouped by thread, "
          f"mean of {curve['draws']} fold draws per point ({curve['seconds']} s)")
    print("| share of training threads | training cases per fold | top-1 (sd) | in-scope abstained | "
          "out-of-scope abstained |")
    print("|---|---|---|---|---|")
    for p in curve["points"]:
        print(f"| {p['share']:.2f} | {p['train_cases']:.0f} | {p['top1']:.3f} ({p['top1_sd']:.3f}) | "
              f"{p['in_abstained']:.3f} | {p['out_abstained']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
