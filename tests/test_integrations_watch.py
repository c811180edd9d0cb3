"""`kb.watch` in a plain PyTorch loop on real tiny models (CPU): all labels masked, fp16-stored weights with AdamW,
a far too high learning rate, the loss scale of a GradScaler at its minimum, and a healthy loop."""

from __future__ import annotations

import pytest
import torch
from integrations_support import (
    evidence_text,
    first_category,
    lm_batches,
    lm_rows,
    masked_batches,
    real_kb,
    report,
)

import kb
from kb.repro.tiny import tiny_causal_lm


def loop(tmp_path, batches, lr: float = 5e-5, dtype=torch.float32, clip: bool = True, **kw):
    model = tiny_causal_lm("llama", dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)
    steps = 0
    with kb.watch(model, opt, output_dir=tmp_path, kb=real_kb(), **kw) as w:
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0 if clip else float("inf"))
            opt.step()
            opt.zero_grad()
            steps += 1
            if w.step(loss=loss.item(), grad_norm=gn.item(), batch=batch):
                break
    return steps, w


@pytest.mark.slow
def test_watch_all_labels_masked(tmp_path):
    steps, w = loop(tmp_path, masked_batches(), probe=True, stop_on_nan=True)
    data = report(tmp_path)
    assert first_category(data) == "all-labels-masked"
    assert "micro-batch 1 of step 3 (rank 0) has 0 supervised tokens" in evidence_text(data)
    assert steps == 3 and w.stopped


@pytest.mark.slow
def test_watch_fp16_weights_adamw(tmp_path):
    _, w = loop(tmp_path, lm_batches(lm_rows()), lr=1e-5, dtype=torch.float16, probe=True)
    assert first_category(report(tmp_path)) == "half-precision-weights"
    assert w.session.collected.value("precision") == "fp16"  # no autocast: the step computes in fp16


@pytest.mark.slow
def test_watch_learning_rate_far_too_high(tmp_path):
    loop(tmp_path, lm_batches(lm_rows()), lr=1000.0, clip=False)
    assert first_category(report(tmp_path)) == "lr-too-high"


def test_watch_loss_scale_at_minimum(tmp_path):
    """A real GradScaler whose scale is driven to its floor by inf gradients fires the loss-scale trigger."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1000)
    w = kb.watch(model, opt, scaler=scaler, output_dir=tmp_path, kb=real_kb(), print_report=False)
    fired = None
    for step in range(1, 6):
        loss = model(torch.full((2, 4), 1e38)).sum() * 1e10  # inf loss: the scaler halves and skips the step
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        w.step(step=step, loss_value=1.0)
        if w.session.monitor.fired is not None:
            fired = w.session.monitor.fired
            break
    assert fired is not None and "loss scale at its minimum" in fired.reason
    assert w.session.collected.value("precision") == "fp16"


@pytest.mark.slow
def test_watch_healthy_loop_writes_nothing(tmp_path):
    steps, w = loop(tmp_path, lm_batches(lm_rows()), probe=True, stop_on_nan=True)
    assert steps == 8 and not w.stopped and report(tmp_path) is None
