"""Index growth: build N synthetic records, ask p50 on them, memory, and kb vs txtai hybrid search side by side.

    python scripts/bench_scale.py --n 100000                  # the issue's size (long on 2 cores)
    python scripts/bench_scale.py --n 10000 --json-out /tmp/scale.json
    python scripts/bench_scale.py --n 10000 --no-txtai

Records are made as in scripts/bench_ask.py (sentences of the shipped incidents recombined under new ids,
one language per record, stored through the real RecordStore) and indexed through the real
KnowledgeBase.build_index. The build runs in a fresh process (its peak RSS is reported); then, in one
process, kb's `search` and txtai's hybrid search (BM25 + dense, `pip install txtai`, not a dependency of kb)
answer the same questions over the same rows with the same embedding model instance, alternating, so both
see the same machine load. Reported: build time and its parts, rows/s, index type, ask p50/p95, search
p50/p95 for kb and txtai end to end (the question embedded every time) and with the query vector given (each
library's own retrieval), and both ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_ask import QUESTIONS, machine, synth_store


def child(code: str, env: dict) -> dict:
    wrapper = (code + "\nimport resource, json as _j\nprint(_j.dumps({**RESULT, 'peak_rss_mb': "
               "round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))")
    out = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, env=env, cwd=REPO,
                         check=False, timeout=6 * 3600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


BUILD = """
import time
from kb.kb import KnowledgeBase
t = time.perf_counter()
kb = KnowledgeBase.open()
kb.records
t_records = time.perf_counter() - t
marks = []
def progress(done, total):
    marks.append((time.perf_counter(), done))
b = kb.build_index(force=True, progress=progress)
total = time.perf_counter() - t
embed_s = marks[-1][0] - marks[0][0] if len(marks) > 1 else 0.0
RESULT = {'seconds': round(total, 1), 'load_records_s': round(t_records, 1), 'embed_s': round(embed_s, 1),
          'rows': b.meta['n_rows'], 'records': b.meta['n_records'], 'vector_index': b.meta['vector_index'],
          'rows_per_s_embedding': round(b.meta['n_rows'] / embed_s, 1) if embed_s else None}
"""


def side_by_side(env: dict, repeats: int, use_txtai: bool) -> dict:
    qs = json.dumps(QUESTIONS, ensure_ascii=False)
    code = f"""
import time, statistics
from kb.kb import KnowledgeBase
from kb.index.bundle import rows_for, DENSE_CHARS
qs = {qs}
kb = KnowledgeBase.open()
t = time.perf_counter(); kb.ask(qs[0]); first = time.perf_counter() - t
ask = []
emb = None
import numpy as np
if {use_txtai!r}:
    from txtai import Embeddings
    model = kb.embedder
    _, texts = rows_for(list(kb.records.values()))
    # txtai gets kb's own row vectors (same model, computed once by the kb build); queries it embeds itself.
    b = kb.build_index()
    known = dict(zip((s[:DENSE_CHARS] for s in texts), b.vectors.reconstruct_all()))
    def transform(xs):
        return np.stack([known[x] if x in known else model.encode([x[:4000]], query=True)[0] for x in xs])
    emb = Embeddings(method='external', transform=transform, content=False, hybrid=True, backend='faiss')
    t = time.perf_counter()
    emb.index([(i, s[:DENSE_CHARS], None) for i, s in enumerate(texts)])
    txtai_build = time.perf_counter() - t
    emb.search(qs[0], 10)
# Two readings of "retrieval speed", both timed for kb and txtai alternately on the same questions:
#  - end to end: the question is embedded every time (kb's query-vector cache and search memo are emptied);
#  - retrieval only: the query vector is given (kb's cache is warm; txtai's transform returns the same vector),
#    so the time is what each library's own retrieval (BM25 + vector search + fusion) costs.
qvec = {{q: kb.embed_query(q) for q in qs}}
def transform_given(xs):
    return np.stack([known[x] if x in known else qvec[x] if x in qvec else model.encode([x[:4000]], query=True)[0]
                     for x in xs])
emb_given = None
if emb is not None:
    emb_given = Embeddings(method='external', transform=transform_given, content=False, hybrid=True, backend='faiss')
    emb_given.index([(i, s[:DENSE_CHARS], None) for i, s in enumerate(texts)])
    emb_given.search(qs[0], 10)
kb_e2e, kb_ret, tx_e2e, tx_ret = [], [], [], []
for i in range({repeats}):
    q = qs[i % len(qs)]
    t = time.perf_counter(); kb.ask(q); ask.append((time.perf_counter() - t) * 1000)
    kb._query_vectors.clear(); kb._last_search = None
    t = time.perf_counter(); kb.search(q, k=10); kb_e2e.append((time.perf_counter() - t) * 1000)
    kb._last_search = None
    t = time.perf_counter(); kb.search(q, k=10); kb_ret.append((time.perf_counter() - t) * 1000)
    if emb is not None:
        t = time.perf_counter(); emb.search(q, 10); tx_e2e.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter(); emb_given.search(q, 10); tx_ret.append((time.perf_counter() - t) * 1000)
def pct(v, p):
    v = sorted(v); return round(v[min(len(v) - 1, int(p * (len(v) - 1)))], 2) if v else None
RESULT = {{'open_and_first_ask_s': round(first, 2), 'ask_p50_ms': pct(ask, .5), 'ask_p95_ms': pct(ask, .95),
          'kb_search_p50_ms': pct(kb_e2e, .5), 'kb_search_p95_ms': pct(kb_e2e, .95),
          'kb_search_given_vector_p50_ms': pct(kb_ret, .5), 'kb_search_given_vector_p95_ms': pct(kb_ret, .95),
          'txtai_search_p50_ms': pct(tx_e2e, .5), 'txtai_search_p95_ms': pct(tx_e2e, .95),
          'txtai_search_given_vector_p50_ms': pct(tx_ret, .5),
          'txtai_search_given_vector_p95_ms': pct(tx_ret, .95),
          'txtai_index_s': round(txtai_build, 1) if emb is not None else None, 'n': len(ask)}}
if tx_e2e:
    RESULT['txtai_over_kb_p50'] = round(pct(tx_e2e, .5) / pct(kb_e2e, .5), 2)
    RESULT['txtai_over_kb_given_vector_p50'] = round(pct(tx_ret, .5) / pct(kb_ret, .5), 2)
"""
    return child(code, env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="synthetic records")
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--no-txtai", action="store_true")
    ap.add_argument("--keep", help="build into this data dir and keep it (default: a temp dir)")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    out: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"), "machine": machine(),
                 "n": a.n, "model": os.environ.get("KB_EMBED_MODEL", "use-multilingual"),
                 "embed_procs": os.environ.get("KB_EMBED_PROCS", "cores"), "load_avg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="kb-scale-") as tmp:
        d = Path(a.keep or Path(tmp) / "data")
        d.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "KB_DATA_DIR": str(d), "KB_INCIDENTS_DIR": str(REPO / "incidents"),
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "KB_DAEMON": "off"}
        t = time.perf_counter()
        synth_store(d, a.n)
        out["synth_s"] = round(time.perf_counter() - t, 1)
        out["build"] = child(BUILD, env)
        print(json.dumps(out["build"]), file=sys.stderr, flush=True)
        out["query"] = side_by_side(env, a.repeats, not a.no_txtai)
    out["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1, ensure_ascii=False))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
