"""KBCallback on the real HF Trainer and TRL trainers, training tiny models on CPU (or on a GPU with
`KB_TEST_DEVICE=cuda`): one test per mechanism, each ending with the right category first in
<output_dir>/kb-diagnosis.json; a healthy run writes nothing."""

from __future__ import annotations

import http.server
import json
import math
import os
import threading
from typing import ClassVar

import pytest
import torch
from datasets import Dataset
from integrations_support import DEVICE, ON_CPU, evidence_text, first_category, lm_rows, real_kb, report
from transformers import Trainer, TrainingArguments

from kb.integrations.transformers import KBCallback
from kb.repro.tiny import quiet, tiny_causal_lm, tiny_tokenizer, tiny_words, trainer_args

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def train(tmp_path, rows, dtype=torch.float32, steps: int = 8, **kw):
    cb_kw = {k: kw.pop(k) for k in ("probe", "stop_on_nan", "webhook") if k in kw}
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], save_strategy="no", logging_steps=1,
                             per_device_train_batch_size=2, use_cpu=ON_CPU, max_steps=steps, disable_tqdm=True,
                             seed=0, **{"learning_rate": 5e-5, **kw})
    cb = KBCallback(kb=real_kb(), **cb_kw)
    trainer = quiet(Trainer(model=tiny_causal_lm("llama", dtype=dtype), args=args,
                            train_dataset=Dataset.from_list(rows), callbacks=[cb]))
    trainer.train()
    return trainer, cb


@pytest.mark.slow
def test_all_labels_masked_micro_batch(tmp_path):
    trainer, cb = train(tmp_path, lm_rows(masked=True), probe=True)
    data = report(tmp_path)
    assert data is not None, "the zero-loss step should have produced a report"
    assert first_category(data) == "all-labels-masked"
    assert "0 supervised tokens" in evidence_text(data)  # the probe's tensor-level evidence decided it
    assert cb.session.collected.value("errors") == ["labels_all_masked"]
    assert trainer.state.global_step == 8  # no stop_on_nan: the run goes on


@pytest.mark.slow
def test_fp16_trainable_weights_with_adamw(tmp_path):
    trainer, cb = train(tmp_path, lm_rows(), dtype=torch.float16, probe=True, stop_on_nan=True,
                        learning_rate=1e-5, optim="adamw_torch")
    data = report(tmp_path)
    assert first_category(data) == "half-precision-weights"
    facts = cb.session.collected
    assert facts.value("weights_dtype") == "fp16" and "float16" in facts.facts["weights_dtype"][1]
    assert facts.value("nonfinite_params"), "the probe sees the weights the fp16 AdamW step wrote"
    assert trainer.state.global_step < 8, "stop_on_nan stops the run at the first NaN"


@pytest.mark.slow
def test_learning_rate_far_too_high(tmp_path):
    _, cb = train(tmp_path, lm_rows(), learning_rate=1000.0)
    data = report(tmp_path)
    assert cb.session.monitor.fired is not None  # the 10^6 x loss jump, then grad_norm stuck at 0.0
    assert first_category(data) == "lr-too-high"
    assert "learning_rate=1000" in data["diagnoses"][0]["decided_by"]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="engine gap (for the lead): learning_rate=5.0, finetuning_type=full, "
                   "precision=fp32, loss 4.9 -> 645 (spike_metrics loss) and grad_norm 1.07e4 (huge_metrics "
                   "grad_norm) at step 2 fire no lr-too-high trigger (they need a huge or NaN *loss*): lr-too-high "
                   "comes first at 0.15 and the engine abstains")
def test_learning_rate_too_high_loss_jump_without_nan(tmp_path):
    train(tmp_path, lm_rows(), learning_rate=5.0)
    assert first_category(report(tmp_path)) == "lr-too-high"


@pytest.mark.slow
def test_simpo_cpo_prompt_fills_max_length(tmp_path):
    cpo = pytest.importorskip("trl.experimental.cpo")
    ml = 48
    rows = [{"prompt": tiny_words(ml // 4, 1), "chosen": tiny_words(6, 2), "rejected": tiny_words(6, 3)},
            {"prompt": tiny_words(ml + 8, 4), "chosen": tiny_words(6, 5), "rejected": tiny_words(6, 6)}]
    args = trainer_args(cpo.CPOConfig, str(tmp_path), DEVICE, loss_type="simpo", cpo_alpha=0.0, beta=2.0,
                        simpo_gamma=0.5, max_length=ml, per_device_train_batch_size=2, max_steps=2)
    cb = KBCallback(kb=real_kb(), probe=True)
    trainer = quiet(cpo.CPOTrainer(model=tiny_causal_lm("llama", seed=0), args=args, train_dataset=Dataset.from_list(rows),
                                   processing_class=tiny_tokenizer(), callbacks=[cb]))
    trainer.train()
    data = report(tmp_path)
    assert first_category(data) == "empty-response-length-normalization"
    c = cb.session.collected
    assert c.value("loss_type") == "simpo" and c.value("algorithm") == "SimPO"
    assert c.value("min_response_tokens") == 0 and c.value("prompt_exceeds_max_length") is True


@pytest.mark.slow
def test_kto_one_sided_micro_batches(tmp_path):
    trl = pytest.importorskip("trl")
    rows = [{"prompt": tiny_words(6, 10 + i), "completion": tiny_words(5, 50 + i), "label": False} for i in range(4)]
    args = trainer_args(trl.KTOConfig, str(tmp_path), DEVICE, max_steps=2, per_device_train_batch_size=2,
                        max_length=32, learning_rate=1e-5)
    cb = KBCallback(kb=real_kb())
    trainer = quiet(trl.KTOTrainer(model=tiny_causal_lm("llama", seed=0), ref_model=tiny_causal_lm("llama", seed=0),
                                   args=args, train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer(),
                                   callbacks=[cb]))
    trainer.train()
    logged = [v for h in trainer.state.log_history for k, v in h.items() if isinstance(v, float)]
    if all(math.isfinite(v) for v in logged):
        assert report(tmp_path) is None  # nothing went wrong, nothing is written
        pytest.skip(f"trl {trl.__version__} is not affected: one-sided KTO micro-batches log only finite values")
    data = report(tmp_path)
    assert first_category(data) == "kto-unbalanced-batch"


@pytest.mark.slow
def test_healthy_run_writes_nothing_and_stops_nothing(tmp_path):
    trainer, cb = train(tmp_path, lm_rows(), probe=True, stop_on_nan=True)
    assert report(tmp_path) is None and cb.diagnosis is None
    assert trainer.state.global_step == 8


class _Hook(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", 0))
        _Hook.bodies.append(json.loads(self.rfile.read(n)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a) -> None:
        pass


@pytest.mark.slow
def test_webhook_post_on_trouble(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/open-apis/bot/v2/hook/test"
        train(tmp_path, lm_rows(), dtype=torch.float16, steps=3, webhook=url, stop_on_nan=True,
              learning_rate=1e-5, optim="adamw_torch")
    finally:
        server.shutdown()
        server.server_close()
    assert len(_Hook.bodies) == 1
    body = _Hook.bodies[0]
    assert body["msg_type"] == "text" and "half-precision-weights" in body["content"]["text"]  # Feishu's shape
