"""`kb diagnose --run-dir`: what a finished or crashed run leaves behind (HF/TRL checkpoints, ms-swift,
LLaMA-Factory, verl and OpenRLHF folders), read into facts and diagnosed; bad folders get clear errors."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from integrations_support import ON_CPU, REPO, first_category, lm_rows, real_kb

from kb.errors import InputError
from kb.integrations.collect import render
from kb.runs import load_training_args_bin, read_run_dir


def cli(*args: str) -> subprocess.CompletedProcess:
    kb = real_kb()
    env = {**os.environ, "KB_DATA_DIR": str(kb.data_dir), "KB_INCIDENTS_DIR": str(REPO / "incidents"),
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "kb.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)


@pytest.fixture(scope="module")
def hf_fp16_run(tmp_path_factory) -> Path:
    """A real HF Trainer run with fp16-stored weights and plain AdamW, checkpointed after the NaN."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from kb.repro.tiny import quiet, tiny_causal_lm

    out = tmp_path_factory.mktemp("hf-run")
    args = TrainingArguments(output_dir=str(out), report_to=[], save_strategy="steps", save_steps=3, logging_steps=1,
                             per_device_train_batch_size=2, use_cpu=ON_CPU, max_steps=3, learning_rate=1e-5,
                             optim="adamw_torch", disable_tqdm=True, seed=0)
    quiet(Trainer(model=tiny_causal_lm("llama", dtype=torch.float16), args=args,
                  train_dataset=Dataset.from_list(lm_rows()))).train()
    return out


@pytest.mark.slow
def test_hf_checkpoint_folder_via_cli(hf_fp16_run):
    res = cli("diagnose", "--run-dir", str(hf_fp16_run), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert first_category(data) == "half-precision-weights"
    assert data["facts"]["weights_dtype"]["value"] == "fp16"
    assert data["facts"]["first_bad_step"]["value"] == 2  # the trainer's step, not a record number
    c = read_run_dir(hf_fp16_run)
    assert "checkpoint-3/training_args.bin" in c.value("run_files")  # read after a static check of its pickle
    assert c.value("optim") == "adamw_torch" and c.value("learning_rate") == 1e-5


def test_ms_swift_folder(tmp_path):
    (tmp_path / "args.json").write_text(json.dumps({
        "rlhf_type": "dpo", "sequence_parallel_size": 4, "rpo_alpha": 1.0, "torch_dtype": "bfloat16", "bf16": True,
        "max_length": 8192, "learning_rate": 5e-7, "deepspeed": "zero3"}))
    lines = [{"loss": 0.693, "grad_norm": 1.1, "learning_rate": 5e-7, "rewards/chosen": 0.0, "nll_loss": 1.2,
              "epoch": 0.01, "global_step/max_steps": "1/500"},
             {"loss": 0.691, "grad_norm": 1.3, "learning_rate": 5e-7, "rewards/chosen": 0.01, "nll_loss": float("nan"),
              "epoch": 0.02, "global_step/max_steps": "2/500"}]
    (tmp_path / "logging.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    c = read_run_dir(tmp_path)
    assert c.value("framework") == "ms-swift" and c.value("sequence_parallel_size") == 4
    assert c.value("algorithm") == "DPO" and [r["step"] for r in c.records] == [1, 2]
    assert "nll_loss is nan at step 2" in c.trigger
    assert first_category(real_kb().diagnose(text=render(c)).model_dump()) == "sequence-parallel-label-split"


def test_llamafactory_folder(tmp_path):
    (tmp_path / "training_args.yaml").write_text("stage: sft\nfinetuning_type: full\nfp16: true\n"
                                                 "learning_rate: 1.0e-5\ncutoff_len: 1024\n")
    rows = [{"current_steps": i, "total_steps": 100, "loss": v, "lr": 1e-5, "epoch": i / 100, "percentage": i,
             "elapsed_time": "0:00:10", "remaining_time": "0:10:00"} for i, v in ((5, 2.1), (10, 1.9), (15, 0.0))]
    (tmp_path / "trainer_log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    c = read_run_dir(tmp_path)
    assert c.value("framework") == "LLaMA-Factory" and c.value("precision") == "fp16"
    assert c.value("max_length") == 1024 and c.value("algorithm") == "SFT"
    assert "loss dropped to exactly 0.0" in c.trigger and c.records[-1]["step"] == 15


def test_verl_and_openrlhf_console_logs(tmp_path):
    verl = tmp_path / "verl"
    (verl / ".hydra").mkdir(parents=True)
    (verl / ".hydra" / "config.yaml").write_text(
        "actor_rollout_ref:\n  actor:\n    use_kl_loss: true\n    kl_loss_type: low_var_kl\n    optim:\n      lr: 1.0e-6\n")
    (verl / "train.log").write_text(
        "step:1 - actor/pg_loss:0.012 - actor/kl_loss:0.001 - actor/grad_norm:0.8 - critic/score/mean:0.2\n"
        "step:2 - actor/pg_loss:nan - actor/kl_loss:nan - actor/grad_norm:nan - critic/score/mean:0.1\n")
    c = read_run_dir(verl)
    assert c.value("framework") == "verl" and c.value("kl_estimator") == "k3" and c.value("learning_rate") == 1e-6
    facts = real_kb().diagnose(text=render(c)).facts
    assert "actor/kl_loss" in facts["nan_metrics"]["value"]
    orl = tmp_path / "openrlhf"
    orl.mkdir()
    (orl / "train.log").write_text("[openrlhf] Train epoch [1/1]: 10%| 5/50 [00:10<01:30, kto_loss=nan, chosen_reward=nan,"
                                   " reject_reward=0.1, kl=0.0]\n")
    assert read_run_dir(orl).value("framework") == "OpenRLHF"


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/kb-pwned-by-pickle",))


def test_unsafe_training_args_bin_is_not_unpickled(tmp_path):
    marker = Path("/tmp/kb-pwned-by-pickle")
    marker.unlink(missing_ok=True)
    (tmp_path / "training_args.bin").write_bytes(pickle.dumps(_Boom()))
    d, why = load_training_args_bin(tmp_path / "training_args.bin")
    assert d is None and "would import" in why and ("posix.system" in why or "os.system" in why)
    assert not marker.exists()
    with pytest.raises(InputError):  # nothing readable is left in the folder
        read_run_dir(tmp_path)


def test_bad_run_dirs_give_clear_errors(tmp_path):
    res = cli("diagnose", "--run-dir", str(tmp_path / "missing"))
    assert res.returncode == 2 and "not a directory" in res.stderr and "Traceback" not in res.stderr
    res = cli("diagnose", "--run-dir", str(tmp_path))
    assert res.returncode == 2 and "holds none of" in res.stderr and "Traceback" not in res.stderr
