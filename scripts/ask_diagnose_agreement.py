"""Do `kb ask` and `kb diagnose` give the same first category for the same text? Every report of the case base,
as its reporter wrote it (title, observation, paste), through both.

    python scripts/ask_diagnose_agreement.py [--json]

A report `kb diagnose` answers agrees when `kb ask`'s first result has the same category; a report it abstains on
agrees when `kb ask` abstains too. Prints the counts and every disagreement. Exit 1 when any report disagrees.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kb import KnowledgeBase


def agreement(kb: KnowledgeBase) -> dict:
    """Every case-base report through `kb.diagnose(text=...)` and `kb.ask(...)`: counts and the disagreements."""
    counts: Counter[str] = Counter()
    disagree = []
    start = time.perf_counter()
    for case in kb.cases:
        text = case.query()
        d, a = kb.diagnose(text=text), kb.ask(text)
        first = d.diagnoses[0].category if d.diagnoses and not d.abstained else None
        asked = a.results[0].category if a.results and not a.abstained else None
        counts[f"route {d.route}"] += 1
        if first == asked and d.abstained == a.abstained:
            counts["agree"] += 1
        else:
            counts["disagree"] += 1
            disagree.append({"case": case.id, "route": d.route, "diagnose": first, "ask": asked})
    return {"reports": len(kb.cases), "agree": counts.pop("agree", 0), "disagree": counts.pop("disagree", 0),
            "routes": {k.removeprefix("route "): v for k, v in sorted(counts.items())}, "disagreements": disagree,
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    out = agreement(KnowledgeBase.open())
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{out['reports']} reports: {out['agree']} agree, {out['disagree']} disagree ({out['seconds']} s); "
              "routes: " + ", ".join(f"{k} {v}" for k, v in out["routes"].items()))
        for x in out["disagreements"]:
            print(f"  {x['case']}: diagnose {x['diagnose']} ({x['route']}), ask {x['ask']}")
    return 1 if out["disagree"] else 0


if __name__ == "__main__":
    sys.exit(main())
