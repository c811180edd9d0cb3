"""KnowledgeBase: the library entry point — open, index, ask, search, diagnose, ingest, list, stats."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from kb import paths
from kb.diagnose.models import Diagnosis, Question
from kb.documents import load_incidents
from kb.embed import get_embedder, model_name_from_env
from kb.errors import InputError, NotFound
from kb.facts.boundary import check_text
from kb.facts.masking import distinct_lines
from kb.index import bundle as index_bundle
from kb.index import fusion
from kb.records import Incident
from kb.store import RecordStore, record_sha
from kb.tokenize import paste_lang, tokenize

# Abstain in `ask` when neither signal is convincing (calibrated in README, "Abstention").
MIN_DENSE = 0.35
MIN_BM25_TERMS = 2
GENERIC_TERMS = frozenset(["loss", "nan", "inf", "training", "train", "训练", "损失", "model", "模型", "error", "issue", "问题", "0.0"])


class SearchHit(BaseModel):
    id: str
    score: float  # fused, in [0, 1]
    bm25: float
    dense: float
    bm25_rank: int | None = None
    dense_rank: int | None = None
    matched_terms: list[str] = Field(default_factory=list)
    incident: Incident


class AskResultItem(BaseModel):
    id: str
    title: str
    category: str
    framework: str
    algorithm: str
    score: float
    evidence: list[str]
    fix: str
    sources: list[str]
    repro: str = ""


class AskResult(BaseModel):
    query: str
    lang: str
    results: list[AskResultItem]
    abstained: bool = False
    reason: str = ""
    # When the diagnosis is unsure: the facts whose answers would separate its first candidates (answer them with
    # `kb diagnose --question ... --answer key=value` or the API's `facts`).
    questions: list[Question] = Field(default_factory=list)


class IngestOutcome(BaseModel):
    path: str
    id: str = ""
    status: str  # created | updated | unchanged | duplicate | error
    origin: str = ""
    category: str = ""
    warnings: list[str] = Field(default_factory=list)
    near_duplicates: list[str] = Field(default_factory=list)
    error: str = ""


def _best_per_candidate(cand: np.ndarray, ords: np.ndarray, vals: np.ndarray, missing: float
                        ) -> tuple[np.ndarray, np.ndarray]:
    """For sorted candidate numbers `cand`: the best of `vals` over the rows whose number is each candidate
    (`missing` where none is), and which candidates had a row at all."""
    best = np.full(len(cand), missing)
    pos = np.searchsorted(cand, ords)
    ok = pos < len(cand)
    ok[ok] = cand[pos[ok]] == ords[ok]
    np.maximum.at(best, pos[ok], vals[ok])
    present = np.zeros(len(cand), dtype=bool)
    present[pos[ok]] = True
    return best, present


def _matches(inc: Incident, filters: dict[str, str] | None) -> bool:
    if not filters:
        return True
    checks = {
        "framework": inc.framework.name,
        "algorithm": inc.algorithm,
        "category": inc.root_cause.category,
        "lang": inc.lang.value,
        "origin": inc.origin,
    }
    for key, want in filters.items():
        if want in (None, ""):
            continue
        have = checks.get(key)
        if have is None or str(have).lower() != str(want).lower():
            return False
    return True


class KnowledgeBase:
    """`KnowledgeBase.open().ask("DPO NLL loss nan")` — everything the CLI and the API do goes through here."""

    def __init__(self, data_dir: Path, incidents_dir: Path, model: str, progress: bool = False) -> None:
        self.data_dir = data_dir
        self.incidents_dir = incidents_dir
        self.model_name = model
        self.progress = progress
        try:
            self.store = RecordStore(data_dir / "store.sqlite")
        except (OSError, sqlite3.Error) as e:
            raise InputError(f"cannot use the data dir {data_dir} (--data-dir / KB_DATA_DIR): "
                             f"{getattr(e, 'strerror', None) or e}") from None
        self.load_problems: list[str] = []
        # `_lock` guards the caches and is held only for short reads and swaps. Builds (the index, the case model)
        # run outside it, one at a time under their own lock, while readers answer from the previous build.
        self._lock = threading.RLock()
        self._build_lock = threading.Lock()
        self._case_lock = threading.Lock()
        self._case_stale = False
        self._records: dict[str, Incident] | None = None
        self._fingerprint: str | None = None
        self._doc_tokens: dict[str, tuple[Incident, set[str]]] = {}
        self._bundle: index_bundle.IndexBundle | None = None
        self._embedder = None
        self.cases_dir = paths.cases_dir(incidents=incidents_dir)
        self._case_model: tuple[Any, Any] | None | bool = False  # False: not loaded yet
        self._query_vectors: dict[str, np.ndarray] = {}
        self._last_search: tuple | None = None
        self._ordinals: tuple | None = None

    @classmethod
    def open(cls, data_dir: str | os.PathLike | None = None, incidents_dir: str | os.PathLike | None = None,
             model: str | None = None, progress: bool = False) -> KnowledgeBase:
        return cls(paths.data_dir(data_dir), paths.incidents_dir(incidents_dir), model_name_from_env(model), progress)

    # ---------------------------------------------------------------- records
    def _load_records(self) -> dict[str, Incident]:
        curated, problems = load_incidents(self.incidents_dir)
        self.load_problems = [f"{p.path}: {p.message}" for p in problems]
        out: dict[str, Incident] = {r.id: r for r in self.store.all()}
        # The curated folder is authoritative for the ids it holds.
        out.update({r.id: r for r in curated})
        return dict(sorted(out.items()))

    @property
    def records(self) -> dict[str, Incident]:
        with self._lock:
            if self._records is None:
                self._records = self._load_records()
            return self._records

    def reload(self) -> None:
        """Forget cached records (after an ingest or an edit); the next call re-reads and re-checks the index."""
        with self._lock:
            self._records = None
            self._fingerprint = None
            self._case_stale = True  # rebuilt on next use; the current one answers while that runs

    def get(self, incident_id: str) -> Incident:
        try:
            return self.records[incident_id]
        except KeyError:
            raise NotFound(f"no incident with id {incident_id!r} (see `kb list`)") from None

    def list(self, framework: str | None = None, algorithm: str | None = None, category: str | None = None,
             **more: str | None) -> list[Incident]:
        f = {"framework": framework, "algorithm": algorithm, "category": category, **more}
        return [r for r in self.records.values() if _matches(r, f)]

    def stats(self) -> dict[str, Any]:
        recs = list(self.records.values())
        by = lambda fn: dict(sorted(Counter(fn(r) for r in recs).items(), key=lambda kv: (-kv[1], kv[0])))
        bundle = index_bundle.load(self.index_root)
        return {
            "records": len(recs),
            "by_framework": by(lambda r: r.framework.name),
            "by_category": by(lambda r: r.root_cause.category),
            "by_language": by(lambda r: r.lang.value),
            "by_algorithm": by(lambda r: r.algorithm),
            "by_origin": by(lambda r: r.origin),
            "by_status": by(lambda r: r.root_cause.status),
            "with_repro": sum(1 for r in recs if r.repro.path),
            "index": None if bundle is None else {k: bundle.meta[k] for k in ("model", "n_rows", "vector_index")},
            "problems": self.load_problems,
        }

    # ---------------------------------------------------------------- index
    @property
    def index_root(self) -> Path:
        return self.data_dir / "index"

    def fingerprint(self) -> str:
        """Hash of every record and the model: the index is current when it was built for this value."""
        with self._lock:
            if self._fingerprint is None:
                h = hashlib.sha256()
                h.update(f"{index_bundle.FORMAT_VERSION}|{self.model_name}|".encode())
                for rid, rec in self.records.items():
                    h.update(f"{rid}:{record_sha(rec)}|".encode())
                self._fingerprint = h.hexdigest()
            return self._fingerprint

    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = get_embedder(self.model_name)
        return self._embedder

    def index_is_current(self) -> bool:
        b = self._bundle or index_bundle.load(self.index_root)
        return b is not None and b.meta.get("fingerprint") == self.fingerprint()

    def build_index(self, force: bool = False, progress: Callable[[int, int], None] | None = None
                    ) -> index_bundle.IndexBundle:
        """Build (or reuse) the index for the current records and embedding model.

        One build at a time; readers keep searching the previous index until the new one is swapped in."""
        with self._build_lock:
            with self._lock:
                fp = self.fingerprint()
                existing = self._bundle if self._bundle is not None else index_bundle.load(self.index_root)
                if not force and existing is not None and existing.meta.get("fingerprint") == fp:
                    self._bundle = existing
                    return existing
                recs = list(self.records.values())
            bar = None
            if progress is None and self.progress:
                from tqdm import tqdm

                bar = tqdm(total=sum(len(r.search_text()) for r in recs), desc="indexing", unit="doc")

                def progress(done: int, total: int) -> None:
                    bar.n = done
                    bar.refresh()

            try:
                bundle = index_bundle.build(recs, self.embedder, fp, self.index_root, progress, previous=existing)
            finally:
                if bar is not None:
                    bar.close()
            with self._lock:
                self._bundle = bundle
            return bundle

    def _index(self) -> index_bundle.IndexBundle:
        b = self._bundle
        if b is not None and (b.meta.get("fingerprint") == self.fingerprint() or self._build_lock.locked()):
            return b  # current, or a rebuild is under way and the previous index answers meanwhile
        return self.build_index()

    # ---------------------------------------------------------------- retrieval
    def search(self, text: str, k: int = 10, filters: dict[str, str] | None = None,
               mode: str = "hybrid", weights: tuple[float, float] | None = None) -> list[SearchHit]:
        """Hybrid retrieval: BM25 over jieba tokens fused (RRF) with dense similarity, best first.

        `mode` "bm25" or "dense" ranks by one signal alone (ablations); `weights` = (dense, bm25) for RRF.
        """
        if not text or not text.strip():
            raise InputError("empty query")
        text = check_text(text, "query")
        b = self._index()
        recs = self.records
        # `ask` searches, then diagnoses the same question, which searches again with the same arguments.
        # The memo holds the index and record set it was computed on (compared by identity, never by id()).
        memo_key = (text, k, tuple(sorted(filters.items())) if filters else (), mode, weights)
        with self._lock:
            last = self._last_search
            if last is not None and last[0] == memo_key and last[1] is b and last[2] is recs:
                return list(last[3])
        hits = self._search(text, k, filters, mode, weights, b, recs)
        with self._lock:
            self._last_search = (memo_key, b, recs, hits)
        return list(hits)

    def _search(self, text: str, k: int, filters: dict[str, str] | None, mode: str,
                weights: tuple[float, float] | None, b: index_bundle.IndexBundle,
                recs: dict[str, Incident]) -> list[SearchHit]:
        q_tokens = tokenize(text)
        bm = b.bm25.scores(q_tokens)
        qv = self.embed_query(text)
        # Only the best rows of each ranking become candidates: common terms ("loss", "nan") match nearly every
        # row. Rows map to incidents through arrays (numbered in id order, so fusion's ties break by id): a few
        # hundred candidates per query cost no Python object each (search at 10k records 2.6 -> ~1 ms).
        n_cand = max(200, k * 20) * (10 if filters else 1)
        row_ord, ord_ids, ord_ok = self._row_ordinals(b, recs)
        sims, ids = b.vectors.search(qv, min(len(b.rows), n_cand))
        keep = ids >= 0
        d_ord, d_sim = row_ord[ids[keep]], sims[keep].astype(np.float64)
        hits_idx = np.flatnonzero(bm > 0)
        if len(hits_idx) > n_cand:
            hits_idx = hits_idx[np.argpartition(-bm[hits_idx], n_cand)[:n_cand]]
        b_ord, b_score = row_ord[hits_idx], bm[hits_idx].astype(np.float64)
        cand = np.union1d(d_ord, b_ord)
        cand = cand[ord_ok[cand]]
        if filters:
            cand = cand[np.fromiter((_matches(recs[ord_ids[o]], filters) for o in cand), dtype=bool, count=len(cand))]
        dense, has_dense = _best_per_candidate(cand, d_ord, d_sim, missing=-1.0)
        bm_best, _ = _best_per_candidate(cand, b_ord, b_score, missing=0.0)
        try:
            top, score, dense_rank, bm_rank = fusion.fuse_arrays(dense, bm_best, k, mode=mode, weights=weights)
        except ValueError as e:
            raise InputError(str(e)) from None
        q_set = list(dict.fromkeys(q_tokens))
        hits = []
        for j, sc, dr, br in zip(top.tolist(), score.tolist(), dense_rank.tolist(), bm_rank.tolist()):
            inc = recs[ord_ids[int(cand[j])]]
            hits.append(SearchHit(
                id=inc.id, score=round(sc, 4), bm25=round(float(bm_best[j]), 4),
                dense=round(float(dense[j]), 4) if has_dense[j] else 0.0, bm25_rank=br or None, dense_rank=dr,
                matched_terms=self._matched_terms(q_set, inc, b), incident=inc,
            ))
        return hits

    def _row_ordinals(self, b: index_bundle.IndexBundle, recs: dict[str, Incident]
                      ) -> tuple[np.ndarray, list[str], np.ndarray]:
        """For an index and record set: each row's incident number (incidents numbered in id order), the ids by
        number, and which numbers are records of this set. Computed once per index and record set."""
        cached = self._ordinals
        if cached is not None and cached[0] is b and cached[1] is recs:
            return cached[2], cached[3], cached[4]
        row_ids = [r.incident_id for r in b.rows]
        ord_ids = sorted(set(row_ids))
        number = {rid: i for i, rid in enumerate(ord_ids)}
        row_ord = np.fromiter((number[r] for r in row_ids), dtype=np.int64, count=len(row_ids))
        ord_ok = np.fromiter((rid in recs for rid in ord_ids), dtype=bool, count=len(ord_ids))
        self._ordinals = (b, recs, row_ord, ord_ids, ord_ok)
        return row_ord, ord_ids, ord_ok

    def embed_query(self, text: str) -> np.ndarray:
        """The query's vector, cached for the last few queries (diagnosis embeds the same text for incidents and
        cases). A multi-line paste is embedded with each line shape once (kb.facts.masking.distinct_lines)."""
        key = distinct_lines(text, 4000) if "\n" in text else text[:4000]
        with self._lock:
            v = self._query_vectors.get(key)
        if v is None:
            v = self.embedder.encode([key], query=True)[0]
            with self._lock:
                if len(self._query_vectors) >= 64:
                    self._query_vectors.pop(next(iter(self._query_vectors)))
                self._query_vectors[key] = v
        return v

    # ---------------------------------------------------------------- case base
    @property
    def cases(self) -> list[Any]:
        """The case base (cases/*.yaml): real reports with a confirmed root cause; invalid files are skipped."""
        from kb.cases import load_cases

        found, _ = load_cases(self.cases_dir, self.records.keys())
        return found

    def case_model(self) -> tuple[Any, Any] | None:
        """(case index, fitted ranker) for diagnosis, or None when there is no case base or no fitted ranker.

        Built once; after an ingest it is rebuilt by the next caller while the others use the previous one."""
        with self._lock:
            current, stale = self._case_model, self._case_stale
        if current is not False and (not stale or self._case_lock.locked()):
            return current or None
        with self._case_lock:
            with self._lock:
                if self._case_model is not False and not self._case_stale:
                    return self._case_model or None
                self._case_stale = False  # an ingest during the build marks it stale again
            try:
                built = self._build_case_model()
            except BaseException:
                with self._lock:
                    self._case_stale = True
                raise
            with self._lock:
                self._case_model = built
            return built

    def _build_case_model(self) -> tuple[Any, Any] | None:
        from kb.diagnose.learned import CaseIndex, Ranker, TextModel

        ranker = Ranker.load()
        cases = self.cases if ranker is not None else []
        if not cases:
            return None
        index = CaseIndex.build(cases, self.embedder, self.data_dir / "cases-index.npz")
        ranker.text = TextModel.for_cases(cases, self.data_dir / "cases-text.npz")
        return index, ranker

    def _matched_terms(self, q_tokens: list[str], inc: Incident, b: index_bundle.IndexBundle) -> list[str]:
        # Cached per record object: reload() builds new records, so an edited record is re-tokenized.
        cached = self._doc_tokens.get(inc.id)
        if cached is None or cached[0] is not inc:
            cached = (inc, set(tokenize(" ".join(inc.search_text().values()), drop_stopwords=False)))
            self._doc_tokens[inc.id] = cached
        doc_tokens = cached[1]
        hit = [t for t in q_tokens if t in doc_tokens]
        idf = {t: float(b.bm25.idf[b.bm25.vocab[t]]) if t in b.bm25.vocab else 0.0 for t in hit}
        return sorted(hit, key=lambda t: -idf[t])

    def ask(self, question: str, k: int = 5, filters: dict[str, str] | None = None) -> AskResult:
        """Answer a short question with ranked incidents, their evidence and fix; abstain when nothing fits.

        A question is a paste: the diagnosis engine ranks it (so `ask` and `diagnose` agree on the first
        category), and retrieval fills the rest of the list."""
        if not question or not question.strip():
            raise InputError("empty question")
        question = check_text(question, "question")
        lang = paste_lang(question)  # as the diagnosis below reads it: one language for the whole answer
        # The diagnosis below searches with RETRIEVAL_K: asking for as many here lets it reuse this search.
        from kb.diagnose.engine import RETRIEVAL_K

        hits = self.search(question, k=max(k, 10, RETRIEVAL_K), filters=filters)
        by_id = {h.id: h for h in hits}
        order: list[str] = []
        abstained, reason = False, ""
        questions: list[Question] = []
        lead: list[AskResultItem] = []
        if not filters:
            d = self.diagnose(question=question, k=k)
            # The diagnosis's first incident leads; retrieval orders the rest (other incidents of the same
            # mechanism are what a question usually wants next).
            order = [x.incident_id for x in d.diagnoses[:1] if x.incident_id]
            abstained, reason, questions = d.abstained, d.reason, d.questions
            if d.diagnoses and not d.diagnoses[0].incident_id and not d.abstained:
                # A cause no curated incident describes for this question (a framework defect without its
                # feature): it leads as itself, with the similar real reports as its sources.
                x = d.diagnoses[0]
                lead = [AskResultItem(id="", title=x.title, category=x.category, framework="", algorithm="",
                                      score=x.confidence, evidence=[e.detail for e in x.evidence[:5]], fix="",
                                      sources=[r.url for r in d.similar_reports[:3]])]
        order += [h.id for h in hits if h.id not in order]
        items = list(lead)
        for rid in order[:k - len(lead)]:
            h = by_id.get(rid) or SearchHit(id=rid, score=0.0, bm25=0.0, dense=0.0, incident=self.records[rid])
            items.append(self._ask_item(h, lang))
        if not items:
            abstained, reason = True, "no incident matches the filters"
        elif filters:
            top = hits[0]
            informative = [t for t in top.matched_terms if t not in GENERIC_TERMS]
            if top.dense < MIN_DENSE and len(informative) < MIN_BM25_TERMS:
                abstained = True
                reason = (f"best match is weak (dense similarity {top.dense:.2f} < {MIN_DENSE}, "
                          f"{len(informative)} specific term(s) in common)")
        return AskResult(query=question, lang=lang, results=items, abstained=abstained, reason=reason,
                         questions=questions)

    def _ask_item(self, h: SearchHit, lang: str) -> AskResultItem:
        inc = h.incident
        evidence = [f"terms: {', '.join(h.matched_terms[:8])}"] if h.matched_terms else []
        evidence.append(f"dense similarity {h.dense:.2f} (rank {h.dense_rank}); bm25 {h.bm25:.2f}"
                        + (f" (rank {h.bm25_rank})" if h.bm25_rank else ""))
        fix = inc.fix.summary.pick(lang) or (inc.fix.steps[0].pick(lang) if inc.fix.steps else "")
        return AskResultItem(
            id=inc.id, title=inc.title.pick(lang), category=inc.root_cause.category, framework=inc.framework.name,
            algorithm=inc.algorithm, score=h.score, evidence=evidence, fix=fix,
            sources=[s.url for s in inc.sources if s.url], repro=self.repro_command(inc),
        )

    def repro_command(self, inc: Incident) -> str:
        return f"kb repro {inc.id}" if inc.repro.path else ""

    # ---------------------------------------------------------------- diagnosis
    def diagnose(self, log: str | None = None, config: str | None = None, question: str | None = None,
                 text: str | None = None, k: int = 3, facts: dict[str, Any] | None = None, mode: str = "full",
                 exclude: frozenset[str] = frozenset(), answers: dict[str, Any] | None = None) -> Diagnosis:
        """Diagnose a pasted log / config / command line / question, plus facts handed over as data.

        The one entry point of diagnosis: the CLI, `kb eval`, the API, the chat bots and the training callbacks
        all call it. `facts` (`{key: value}` or `{key: (value, detail)}`) come from a running trainer or a run
        folder and outrank text (the rules rank them); `answers` (the same form) are the reporter's answers to the
        differential questions, and the ranking is redone with them; `mode` "bm25" / "dense" / "hybrid" ranks by
        retrieval alone (baselines); `exclude` drops incidents from the candidates (held-out evaluation). See
        docs/DIAGNOSE.md.
        """
        from kb.diagnose.engine import diagnose

        return diagnose(self, log=log, config=config, question=question, text=text, k=k, mode=mode,
                        exclude=exclude, facts=facts, answers=answers)

    # ---------------------------------------------------------------- ingest
    def ingest_text(self, text: str, name: str = "<text>", fmt: str | None = None,
                    allow_duplicate: bool = False) -> IngestOutcome:
        """Parse one document (curated or raw) into a record and store it; the index is rebuilt lazily."""
        from kb.ingest import parse_document

        result = parse_document(text, name=name, fmt=fmt)
        inc: Incident = result.incident
        out = IngestOutcome(path=name, id=inc.id, status="", origin=inc.origin, category=inc.root_cause.category,
                            warnings=list(result.warnings))
        if inc.id not in self.records:
            dups = self.near_duplicates(inc)
            if dups and not allow_duplicate:
                out.status, out.near_duplicates = "duplicate", dups
                out.warnings.append("near-duplicate of " + ", ".join(dups) + " (same framework and category, "
                                    "overlapping signatures); not added — pass allow_duplicate to add anyway")
                return out
            out.near_duplicates = dups
        if inc.origin == "curated" and (self.incidents_dir / inc.id / "incident.md").is_file():
            out.warnings.append(f"{inc.id} is a curated file in {self.incidents_dir}; that file stays authoritative")
        out.status = self.store.upsert(inc, source=name)
        self.reload()
        return out

    def ingest(self, paths_: list[str | os.PathLike], allow_duplicate: bool = False,
               on_result: Callable[[IngestOutcome], None] | None = None) -> list[IngestOutcome]:
        from kb.ingest import read_document

        outcomes = []
        for p in paths_:
            try:
                text, fmt = read_document(p)
                o = self.ingest_text(text, name=str(p), fmt=fmt, allow_duplicate=allow_duplicate)
            except Exception as e:  # noqa: BLE001 - one bad file must not stop the batch; reported per file
                from kb.errors import KBError

                msg = str(e) if isinstance(e, KBError) else f"{type(e).__name__}: {e}"
                o = IngestOutcome(path=str(p), status="error", error=msg)
            outcomes.append(o)
            if on_result:
                on_result(o)
        return outcomes

    def near_duplicates(self, inc: Incident) -> list[str]:
        """Existing records with the same framework and category and overlapping signatures or sources."""
        urls = {s.url for s in inc.sources if s.url}
        sigs = {s.pattern for s in inc.symptoms.signatures} | set(inc.symptoms.errors)
        out = []
        for other in self.records.values():
            if other.id == inc.id:
                continue
            if urls & {s.url for s in other.sources if s.url}:
                out.append(other.id)
                continue
            same = (other.framework.name.lower() == inc.framework.name.lower()
                    and other.root_cause.category == inc.root_cause.category)
            if not same:
                continue
            other_sigs = {s.pattern for s in other.symptoms.signatures} | set(other.symptoms.errors)
            if sigs & other_sigs:
                out.append(other.id)
                continue
            a, b = (self.embedder.encode([x.title.both() + " " + x.summary.both()])[0] for x in (inc, other))
            if float(a @ b) > 0.9:
                out.append(other.id)
        return out
