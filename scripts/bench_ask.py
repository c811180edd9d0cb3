"""Benchmark `ask`: warm in-process latency, cold CLI wall time, index build time and peak memory.

Usage: python scripts/bench_ask.py [--sizes 10000,100000] [--repeats 50] [--json OUT]

Synthetic corpora are made by recombining sentences of the shipped incidents under new ids (one language
per record), stored through the real RecordStore and indexed through the real KnowledgeBase.build_index.
Each measurement that needs a clean process (cold start, peak memory) runs in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

QUESTIONS = [
    "DPO NLL loss nan", "序列并行 DPO nll_loss 为 nan", "SimPO loss NaN max_prompt_length equals max_length",
    "fp16 训练 loss 突然 nan", "reward model lora torch_dtype half grad_norm nan",
    "GRPO kl nan output exclamation marks", "KTO vanilla_loss nan", "ORPO Log1PBackward0 returned nan values",
]


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}, {platform.system()}"


def child(code: str, env: dict) -> dict:
    """Run code in a fresh interpreter; it prints one JSON line; we add its peak RSS."""
    wrapper = code + "\nimport resource, json as _j\nprint(_j.dumps({**RESULT, 'peak_rss_mb': " \
                     "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))"
    out = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, env=env, cwd=REPO, check=False,
                         timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def synth_store(data_dir: Path, n: int, seed: int = 0) -> None:
    from kb.documents import load_incidents
    from kb.records import Bilingual, Incident
    from kb.store import RecordStore

    base, _ = load_incidents(REPO / "incidents")
    rng = random.Random(seed)
    sentences = {"en": [], "zh": []}
    for r in base:
        for lang in ("en", "zh"):
            text = getattr(r.body, lang) + "\n" + getattr(r.summary, lang)
            sentences[lang] += [s.strip() for s in text.replace("。", ".").split(".") if len(s.strip()) > 20]
    store = RecordStore(data_dir / "store.sqlite")
    con = store._connect()
    con.execute("BEGIN")
    for i in range(n):
        proto = rng.choice(base)
        lang = "zh" if i % 3 == 0 else "en"
        body = ". ".join(rng.sample(sentences[lang], k=min(2, len(sentences[lang]))))[:400]
        inc = Incident(id=f"synth-{i:06d}", title=Bilingual(**{lang: f"{proto.title.pick(lang)} #{i}"}),
                       summary=Bilingual(**{lang: body[:300]}), body=Bilingual(**{lang: body}), lang=lang,
                       origin="raw", framework=proto.framework, algorithm=proto.algorithm,
                       root_cause=proto.root_cause.model_copy(update={"explanation": Bilingual()}))
        con.execute("INSERT INTO records VALUES (?,?,?,?,?,?,?)",
                    (inc.id, inc.origin, inc.model_dump_json(), "synthetic", str(i), time.time(), time.time()))
    con.execute("COMMIT")
    con.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000", help="synthetic corpus sizes (records)")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    env = {**os.environ, "KB_INCIDENTS_DIR": str(REPO / "incidents")}
    results: dict = {"machine": machine(), "model": os.environ.get("KB_EMBED_MODEL", "use-multilingual")}

    with tempfile.TemporaryDirectory() as tmp:
        env["KB_DATA_DIR"] = str(Path(tmp) / "shipped")
        results["build_shipped"] = child(
            "import time\nfrom kb.kb import KnowledgeBase\nt=time.perf_counter()\nkb=KnowledgeBase.open()\n"
            "b=kb.build_index(force=True)\nRESULT={'seconds': time.perf_counter()-t, 'records': b.meta['n_records'],"
            " 'rows': b.meta['n_rows']}", env)
        qs = json.dumps(QUESTIONS, ensure_ascii=False)
        results["warm_ask"] = child(
            "import time, statistics\nfrom kb.kb import KnowledgeBase\nkb=KnowledgeBase.open()\n"
            f"qs={qs}\nkb.ask(qs[0])\nlat=[]\n"
            f"for i in range({args.repeats}):\n    q=qs[i % len(qs)]\n    t=time.perf_counter()\n    kb.ask(q)\n"
            "    lat.append((time.perf_counter()-t)*1000)\nlat.sort()\n"
            "RESULT={'p50_ms': statistics.median(lat), 'p95_ms': lat[int(0.95*(len(lat)-1))], 'n': len(lat)}", env)
        cold = []
        for q in (QUESTIONS[0], QUESTIONS[1], QUESTIONS[0]):
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "kb.cli", "ask", "--json", q], env=env, capture_output=True, check=False,
                               cwd=REPO)
            assert r.returncode == 0, r.stderr
            cold.append(time.perf_counter() - t)
        results["cold_cli_ask_s"] = {"en": round(min(cold[0], cold[2]), 2), "zh": round(cold[1], 2)}
        torch_check = child("import sys\nfrom kb.kb import KnowledgeBase\nKnowledgeBase.open().ask('fp16 nan')\n"
                            "RESULT={'torch_imported': 'torch' in sys.modules}", env)
        results["ask_imports_torch"] = torch_check["torch_imported"]
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, ensure_ascii=False))
        print(json.dumps({k: results[k] for k in ("build_shipped", "warm_ask", "cold_cli_ask_s")}), file=sys.stderr)

        for n in [int(x) for x in args.sizes.split(",") if x]:
            d = Path(tmp) / f"synth-{n}"
            synth_store(d, n)
            env_n = {**env, "KB_DATA_DIR": str(d)}
            build = child("import time\nfrom kb.kb import KnowledgeBase\nt=time.perf_counter()\n"
                          "kb=KnowledgeBase.open()\nkb.records\nt_load=time.perf_counter()-t\n"
                          "b=kb.build_index(force=True)\n"
                          "RESULT={'seconds': time.perf_counter()-t, 'load_records_s': t_load, "
                          "'rows': b.meta['n_rows'], 'vector_index': b.meta['vector_index']}", env_n)
            ask = child("import time, statistics\nfrom kb.kb import KnowledgeBase\nkb=KnowledgeBase.open()\n"
                        f"qs={qs}\nt=time.perf_counter()\nkb.ask(qs[0])\nfirst=time.perf_counter()-t\nlat=[]\n"
                        "for i in range(20):\n    t=time.perf_counter()\n    kb.ask(qs[i % len(qs)])\n"
                        "    lat.append((time.perf_counter()-t)*1000)\nlat.sort()\n"
                        "RESULT={'open_and_first_ask_s': first, 'p50_ms': statistics.median(lat), "
                        "'p95_ms': lat[int(0.95*(len(lat)-1))]}", env_n)
            results[f"synthetic_{n}"] = {"build": build, "ask": ask}
            if args.json:  # write as we go: the 100k build takes a long time on 2 cores
                Path(args.json).write_text(json.dumps(results, indent=1, ensure_ascii=False))
            print(f"{n}: build {build['seconds']:.1f}s, ask p50 {ask['p50_ms']:.1f} ms", file=sys.stderr)

    print(json.dumps(results, indent=1, ensure_ascii=False))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
