"""Measure the packaged embedding models (and BM25 / hybrid) on English, Chinese and cross-language queries.

Usage: python scripts/eval_embedders.py [--models use-multilingual,minilm-l6,...] [--json OUT]

Three query sets:
  * tests/data/retrieval_queries.jsonl — one English and one Chinese question per incident (own words);
  * cross-language — the same questions against an index that holds only the *other* language of each
    record (what a raw-ingested, single-language record looks like);
  * ../shared/eval/dev.jsonl — real reports; a hit counts when the top incident has the expected category.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kb.documents import load_incidents
from kb.embed import get_embedder
from kb.index.bm25 import BM25
from kb.index.bundle import DENSE_CHARS
from kb.paths import shared_dir
from kb.tokenize import tokenize


def rank_of(order: list[str], want: str) -> int | None:
    try:
        return order.index(want) + 1
    except ValueError:
        return None


def summarise(ranks: list[int | None]) -> dict:
    n = len(ranks) or 1
    return {"n": len(ranks), "r@1": round(sum(1 for r in ranks if r == 1) / n, 3),
            "r@3": round(sum(1 for r in ranks if r and r <= 3) / n, 3),
            "mrr": round(sum(1 / r for r in ranks if r) / n, 3)}


def ranked_ids(doc_ids: list[str], scores: np.ndarray) -> list[str]:
    best: dict[str, float] = {}
    for i, s in enumerate(scores):
        best[doc_ids[i]] = max(best.get(doc_ids[i], -1e9), float(s))
    return sorted(best, key=lambda x: -best[x])


def rrf(orders: list[tuple[list[str], float]], k: float = 10.0) -> list[str]:
    score: dict[str, float] = {}
    for order, w in orders:
        for r, rid in enumerate(order, 1):
            score[rid] = score.get(rid, 0.0) + w / (k + r)
    return sorted(score, key=lambda x: -score[x])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="use-multilingual,minilm-l6,e5-small-q4,static-64")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--weights", default="1.0:0.6",
                    help="comma-separated dense:bm25 RRF weight pairs for the hybrid rows, e.g. 1:0.6,0.5:1")
    args = ap.parse_args()

    records, _ = load_incidents(REPO / "incidents")
    queries = [json.loads(x) for x in (REPO / "tests/data/retrieval_queries.jsonl").read_text().splitlines() if x]
    queries = [q for q in queries if any(r.id == q["expected_id"] for r in records)]
    sd = shared_dir()
    dev = [json.loads(x) for x in (sd / "eval/dev.jsonl").read_text().splitlines() if x] if sd else []
    cat_of = {r.id: r.root_cause.category for r in records}

    # Bilingual documents (what curated records index) and single-language ones (cross-language probe).
    both_ids, both_txt, mono = [], [], {"en": ([], []), "zh": ([], [])}
    for r in records:
        for lang, txt in r.search_text().items():
            both_ids.append(r.id)
            both_txt.append(txt)
            mono[lang][0].append(r.id)
            mono[lang][1].append(txt)
    bm_both = BM25().fit([tokenize(t) for t in both_txt])
    bm_mono = {lang: BM25().fit([tokenize(t) for t in mono[lang][1]]) for lang in mono}

    results: dict[str, dict] = {}
    for name in [m for m in args.models.split(",") if m]:
        t0 = time.perf_counter()
        try:
            emb = get_embedder(name)
            emb.encode(["warm up"])
        except Exception as e:  # noqa: BLE001 - a missing optional model is reported, not fatal
            results[name] = {"error": str(e)[:200]}
            continue
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        lat: list[float] = []
        m_both = emb.encode([t[:DENSE_CHARS] for t in both_txt])
        build_s = time.perf_counter() - t0
        m_mono = {lang: emb.encode([t[:DENSE_CHARS] for t in mono[lang][1]]) for lang in mono}
        qcache: dict[str, np.ndarray] = {}

        def qvec(text: str, emb=emb, qcache=qcache, lat=lat) -> np.ndarray:
            if text not in qcache:
                t = time.perf_counter()
                qcache[text] = emb.encode([text], query=True)[0]
                lat.append(time.perf_counter() - t)
            return qcache[text]

        out: dict[str, dict] = {}
        pairs = [tuple(float(x) for x in w.split(":")) for w in args.weights.split(",")]
        modes = ["dense", "bm25"] + [f"hybrid {wd:g}:{wb:g}" for wd, wb in pairs]
        for mode in modes:
            wd, wb = (1.0, 0.0) if mode == "dense" else (0.0, 1.0) if mode == "bm25" else \
                tuple(float(x) for x in mode.split()[1].split(":"))
            same, cross, devr = {"en": [], "zh": []}, {"en": [], "zh": []}, []
            for q in queries:
                qv = qvec(q["query"])
                qt = tokenize(q["query"])
                d_order = ranked_ids(both_ids, m_both @ qv)
                b_order = ranked_ids(both_ids, bm_both.scores(qt))
                order = rrf([(d_order, wd), (b_order, wb)])
                same[q["lang"]].append(rank_of(order, q["expected_id"]))
                other = "en" if q["lang"] == "zh" else "zh"
                ids = mono[other][0]
                d2 = ranked_ids(ids, m_mono[other] @ qv)
                b2 = ranked_ids(ids, bm_mono[other].scores(qt))
                order2 = rrf([(d2, wd), (b2, wb)])
                cross[q["lang"]].append(rank_of(order2, q["expected_id"]))
            for d in dev:
                qv = qvec(d["query"])
                d_order = ranked_ids(both_ids, m_both @ qv)
                b_order = ranked_ids(both_ids, bm_both.scores(tokenize(d["query"])))
                order = rrf([(d_order, wd), (b_order, wb)])
                cats = list(dict.fromkeys(cat_of[i] for i in order))
                devr.append(rank_of(cats, d["expected_category"]))
            out[mode] = {
                "same_lang_en": summarise(same["en"]), "same_lang_zh": summarise(same["zh"]),
                "cross_en_to_zh": summarise(cross["en"]), "cross_zh_to_en": summarise(cross["zh"]),
                "dev_category": summarise(devr),
            }
        results[name] = {"dim": emb.dim, "load_s": round(load_s, 2), "embed_corpus_s": round(build_s, 2),
                         "query_ms_p50": round(1000 * statistics.median(lat), 2), "modes": out}
        print(f"{name}: load {load_s:.2f}s, p50 {1000 * statistics.median(lat):.1f} ms", file=sys.stderr)

    print("| model | mode | en R@1 | zh R@1 | en→zh-only R@1 | zh→en-only R@1 | dev category top-1 | dev MRR | query p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | unavailable: {r['error'][:60]} | | | | | | | |")
            continue
        for mode, m in r["modes"].items():
            if mode == "bm25" and name != next(iter(results)):
                continue  # BM25 does not depend on the model: print it once
            print(f"| {name if mode != 'bm25' else '(none)'} | {mode} | {m['same_lang_en']['r@1']} | "
                  f"{m['same_lang_zh']['r@1']} | {m['cross_en_to_zh']['r@1']} | {m['cross_zh_to_en']['r@1']} | "
                  f"{m['dev_category']['r@1']} | {m['dev_category']['mrr']} | {r['query_ms_p50']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
