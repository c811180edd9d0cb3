"""The Lightning KBCallback on real tiny models trained on CPU (or on a GPU with `KB_TEST_DEVICE=cuda`): the
mechanisms a plain Lightning loop can show (all labels masked, fp16-stored weights with AdamW, a far too high
learning rate) and a healthy run."""

from __future__ import annotations

import pytest
import torch
from integrations_support import (
    ON_CPU,
    evidence_text,
    first_category,
    lm_batches,
    lm_rows,
    masked_batches,
    real_kb,
    report,
)
from torch.utils.data import DataLoader

from kb.repro.tiny import tiny_causal_lm

pl = pytest.importorskip("lightning.pytorch", reason="lightning is in the test extra (pip install lightning)")
from kb.integrations.lightning import KBCallback


class TinyLit(pl.LightningModule):
    def __init__(self, lr: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.model = tiny_causal_lm("llama", dtype=dtype)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr, foreach=False)


def fit(tmp_path, batches, lr: float = 5e-5, dtype=torch.float32, **kw) -> tuple[pl.Trainer, KBCallback]:
    cb = KBCallback(kb=real_kb(), output_dir=tmp_path, **kw)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu" if ON_CPU else "gpu", devices=1, log_every_n_steps=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb], default_root_dir=tmp_path)
    trainer.fit(TinyLit(lr, dtype), train_dataloaders=DataLoader(batches, batch_size=None))  # pre-batched
    return trainer, cb


@pytest.mark.slow
def test_lightning_all_labels_masked(tmp_path):
    trainer, _ = fit(tmp_path, masked_batches(), probe=True, stop_on_nan=True)
    data = report(tmp_path)
    assert first_category(data) == "all-labels-masked"
    assert "0 supervised tokens" in evidence_text(data)
    assert trainer.global_step == 3  # stopped right after the third micro-batch (no supervised token)


@pytest.mark.slow
def test_lightning_fp16_weights_adamw(tmp_path):
    _, cb = fit(tmp_path, lm_batches(lm_rows()), lr=1e-5, dtype=torch.float16, probe=True)
    data = report(tmp_path)
    assert first_category(data) == "half-precision-weights"
    assert cb.session.collected.value("weights_dtype") == "fp16"


@pytest.mark.slow
def test_lightning_learning_rate_far_too_high(tmp_path):
    _, cb = fit(tmp_path, lm_batches(lm_rows()), lr=1000.0)
    assert first_category(report(tmp_path)) == "lr-too-high"
    assert cb.session.collected.value("learning_rate") == 1000.0


@pytest.mark.slow
def test_lightning_healthy_run_writes_nothing(tmp_path):
    trainer, cb = fit(tmp_path, lm_batches(lm_rows()), probe=True, stop_on_nan=True)
    assert report(tmp_path) is None and cb.diagnosis is None
    assert trainer.global_step == 8
