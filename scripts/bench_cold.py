"""Cold CLI wall time: `kb ask "DPO NLL loss nan"` and `kb diagnose` on a 3 KB paste, each a fresh process.

    python scripts/bench_cold.py                    # hyperfine when installed (apt-get install hyperfine)
    python scripts/bench_cold.py --runs 10 --json-out /tmp/cold.json

Three situations, each a new `python -m kb.cli` process (nothing is shared but the data dir and the OS page
cache, which a user's repeated calls share too):
  * no daemon   (KB_DAEMON=off): the process loads records, index, model and jieba itself;
  * daemon      (after `kb daemon start`): the process is a thin client of the warm daemon;
  * first ever  (fresh data dir, index built, model cache absent) is reported once, without hyperfine.
Without hyperfine, it times `--runs` subprocesses and reports the median. Also reports `python -c pass`,
the floor no CLI can go under.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from bench_server import log_3kb


def hyperfine(cmds: dict[str, str], env: dict, runs: int, tmp: Path) -> dict:
    out = tmp / "hf.json"
    # -N: no intermediate shell, so its start-up is not counted (hyperfine splits the words itself).
    args = ["hyperfine", "-N", "-w", "1", "-r", str(runs), "--export-json", str(out)]
    for name, c in cmds.items():
        args += ["-n", name, c]
    subprocess.run(args, env=env, cwd=REPO, check=True, capture_output=True, text=True)
    res = json.loads(out.read_text())["results"]
    return {r["command"]: {"median_s": round(r["median"], 3), "mean_s": round(r["mean"], 3),
                           "min_s": round(r["min"], 3), "max_s": round(r["max"], 3), "runs": len(r["times"])}
            for r in res}


def subprocess_median(cmds: dict[str, str], env: dict, runs: int) -> dict:
    res = {}
    for name, c in cmds.items():
        times = []
        for _ in range(runs + 1):
            t = time.perf_counter()
            subprocess.run(["bash", "-c", c], env=env, cwd=REPO, check=True, capture_output=True)
            times.append(time.perf_counter() - t)
        times = times[1:]  # the first warms the page cache, as hyperfine's warm-up does
        res[name] = {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                     "max_s": round(max(times), 3), "runs": len(times)}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    py = sys.executable
    out: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"), "cpus": os.cpu_count(),
                 "load_avg_before": os.getloadavg(), "tool": "hyperfine" if shutil.which("hyperfine") else "subprocess"}
    with tempfile.TemporaryDirectory(prefix="kb-cold-") as tmp_:
        tmp = Path(tmp_)
        log = tmp / "train.log"
        log.write_text(log_3kb(), encoding="utf-8")
        env = {**os.environ, "KB_DATA_DIR": str(tmp / "data"), "KB_INCIDENTS_DIR": str(REPO / "incidents"),
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "KB_DAEMON": "off"}
        subprocess.run([py, "-m", "kb.cli", "-q", "index"], env=env, cwd=REPO, check=True)
        t = time.perf_counter()
        subprocess.run([py, "-m", "kb.cli", "ask", "DPO NLL loss nan"], env=env, cwd=REPO, check=True,
                       capture_output=True)
        out["first_ask_no_model_cache_s"] = round(time.perf_counter() - t, 2)
        cmds = {"python -c pass": f"{py} -c pass",
                "ask": f"{py} -m kb.cli ask 'DPO NLL loss nan'",
                "ask zh": f"{py} -m kb.cli ask '序列并行 DPO nll_loss 为 nan'",
                "diagnose 3KB": f"{py} -m kb.cli diagnose {log}"}
        use_hf = shutil.which("hyperfine") is not None

        def run(c: dict, e: dict) -> dict:
            return hyperfine(c, e, a.runs, tmp) if use_hf else subprocess_median(c, e, a.runs)

        out["no_daemon"] = run(cmds, env)
        denv = {**env, "KB_DAEMON": "auto"}
        subprocess.run([py, "-m", "kb.cli", "daemon", "start"], env=denv, cwd=REPO, check=True, capture_output=True)
        try:
            cmds.pop("python -c pass")
            out["daemon"] = run(cmds, denv)
            info = subprocess.run([py, "-m", "kb.cli", "daemon", "status", "--json"], env=denv, cwd=REPO,
                                  capture_output=True, text=True, check=False).stdout
            out["daemon_info"] = json.loads(info) if info.strip() else None
        finally:
            subprocess.run([py, "-m", "kb.cli", "daemon", "stop"], env=denv, cwd=REPO, check=False,
                           capture_output=True)
    out["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
