"""The five seed repro checks: NaN with the fault, finite with the fix, user settings, runner and `kb repro`."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from repro_support import INCIDENTS, check, finite, nan, verdict

from kb.cli import main as kb_main
from kb.errors import InputError, NotFound
from kb.repro.harness import Verdict, evaluate
from kb.repro.runner import run_all, run_check

SEEDS = ["ms-swift-dpo-sp-nll-nan", "openrlhf-kto-vanilla-loss-nan", "trl-simpo-empty-response-nan",
         "xtuner-internlm2-fp16-overflow", "trl-reward-lora-fp16-head-nan"]


@pytest.mark.parametrize("incident_id", SEEDS)
def test_seed_check_confirms_on_cpu(incident_id):
    v = verdict(incident_id)
    assert v.error is None, v.notes
    assert v.reproduced and v.fixed
    assert v.device == "cpu" and v.torch


def test_dpo_sequence_parallel_nll_is_nan_per_shard_and_finite_by_global_count():
    v = verdict("ms-swift-dpo-sp-nll-nan")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert faulty["label_less_shards"] == 3  # 4 shards, the prompt covers three of them
    assert nan(faulty["nll_loss"]) and finite(faulty["dpo_loss"])  # the summed DPO term is unaffected
    assert finite(fixed["nll_loss"]) and finite(fixed["loss"])
    assert v.user_settings_trigger is True and v.exit_code == 0


def test_dpo_without_sequence_parallel_is_not_triggered():
    v = verdict("ms-swift-dpo-sp-nll-nan", sequence_parallel_size=1)
    assert v.user_settings_trigger is False and v.exit_code == 1
    assert v.evidence["user"]["label_less_shards"] == 0 and finite(v.evidence["user"]["nll_loss"])


def test_dpo_fixed_ms_swift_version_is_not_triggered():
    ok, why = check("ms-swift-dpo-sp-nll-nan").triggers(
        {"sequence_parallel_size": 4, "rpo_alpha": 1.0, "framework_version": "3.4.1"})
    assert ok is False and "3.4.1" in why


def test_kto_vanilla_one_sided_batch_is_nan_and_reported_settings_are_unconfirmed():
    v = verdict("openrlhf-kto-vanilla-loss-nan")
    assert nan(v.evidence["faulty"]["loss"]) and nan(v.evidence["faulty"]["grad_norm"])
    assert finite(v.evidence["fixed"]["loss"])  # default KTO loss skips the empty class
    # micro-batch 2 with the alternating sampler stays finite: the reported settings cannot be confirmed.
    assert finite(v.evidence["faulty"]["loss_alternating_sampler"])
    assert v.user_settings_trigger is None
    assert any("may trigger" in n and "nan_metrics" in n for n in v.notes)  # waits on a logged NaN


def test_kto_micro_batch_one_triggers_and_default_loss_does_not():
    one = verdict("openrlhf-kto-vanilla-loss-nan", micro_batch_size=1)
    assert one.user_settings_trigger is True and nan(one.evidence["user"]["loss_alternating_sampler"])
    default = verdict("openrlhf-kto-vanilla-loss-nan", vanilla_loss=False)
    assert default.user_settings_trigger is False and finite(default.evidence["user"]["loss"])


def test_simpo_empty_response_is_nan_and_room_for_the_response_is_finite():
    v = verdict("trl-simpo-empty-response-nan")
    assert v.evidence["faulty"]["min_response_tokens"] == 0 and nan(v.evidence["faulty"]["loss"])
    assert v.evidence["fixed"]["min_response_tokens"] > 0 and finite(v.evidence["fixed"]["grad_norm"])
    room = verdict("trl-simpo-empty-response-nan", max_length=1024, max_prompt_length=512)
    assert room.user_settings_trigger is False and finite(room.evidence["user"]["loss"])


def test_fp16_overflow_gives_nan_loss_and_sampling_error_bf16_is_finite():
    v = verdict("xtuner-internlm2-fp16-overflow")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert nan(faulty["loss"]) and faulty["skipped_steps"] == 2  # GradScaler skips, the loss stays NaN
    assert "probability tensor contains" in faulty["error"]
    assert finite(fixed["loss"]) and fixed["peak_mlp_activation"] > 65504 and fixed["error"] == ""
    ok, _ = check("xtuner-internlm2-fp16-overflow").triggers({"precision": "bf16"})
    assert ok is False


def test_fp16_reward_head_with_plain_adamw_goes_nan_from_step_two():
    v = verdict("trl-reward-lora-fp16-head-nan")
    faulty, fixed = v.evidence["faulty"], v.evidence["fixed"]
    assert finite(faulty["loss_step1"]) and math.isinf(faulty["head_max_abs_after_step1"])
    assert nan(faulty["loss_step2"]) and nan(faulty["grad_norm_step2"])
    assert faulty["head_dtype"] == "float16" and fixed["head_dtype"] == "float32"
    assert finite(fixed["loss_step3"]) and finite(fixed["grad_norm_step3"])
    ok, why = check("trl-reward-lora-fp16-head-nan").triggers({"weights_dtype": "fp16", "optim": "adamw_torch_fused"})
    assert ok is False and "fused" in why


def _framework(incident_id: str, *modules: str) -> dict:
    """Run a check's framework level (the real trainer code on a tiny model) in-process on CPU."""
    for m in modules:
        pytest.importorskip(m, reason=f"{m} not installed: the framework level is optional (extra 'frameworks')")
    c = check(incident_id)
    return c.run_framework(dict(c.defaults), "cpu")


def test_reward_trainer_with_lora_seq_cls_in_fp16_logs_zero_loss_and_nan_grad_norm():
    ev = _framework("trl-reward-lora-fp16-head-nan", "trl", "peft")
    # PEFT upcasts the LoRA matrices to fp32 but trains the freshly initialised score head as it was loaded.
    assert ev["faulty_score_dtype"] == "float16" and ev["faulty_lora_dtype"] == "float32"
    assert finite(ev["faulty_loss_step1"]) and nan(ev["faulty_grad_norm_step2"])
    assert ev["faulty_loss_step2"] == 0.0  # the Trainer's NaN filter logs a window of NaN steps as 0.0, as reported
    assert ev["fixed_score_dtype"] == "float32" and finite(ev["fixed_grad_norm_step3"]) and ev["fixed_loss_step3"] > 0
    assert ev["affected"] == 1 and ev["fix_works"] == 1


def test_simpo_through_trl_cpo_trainer_is_nan_with_a_prompt_that_fills_max_length():
    ev = _framework("trl-simpo-empty-response-nan", "trl", "datasets")
    assert ev["faulty_min_response_tokens"] == 0 and nan(ev["faulty_loss"]) and nan(ev["faulty_grad_norm"])
    assert ev["fixed_min_response_tokens"] > 0 and finite(ev["fixed_loss"]) and finite(ev["fixed_grad_norm"])
    assert ev["affected"] == 1 and ev["fix_works"] == 1


def test_ipo_through_trl_dpo_trainer_reports_whether_this_version_is_affected():
    ev = _framework("trl-ipo-empty-completion-nan", "trl", "datasets")
    assert ev["rows_given"] == 2 and ev["affected"] in (0, 1)
    if ev["affected"]:  # an old release: the long-prompt sample reaches the loss as 0/0
        assert nan(ev["loss"])
    else:  # a release that drops the sample (and floors the length): the loss is finite
        assert finite(ev["loss"]) and finite(ev["grad_norm"])


def test_orpo_odds_ratio_through_trl_code_with_bf16_logits():
    ev = _framework("trl-orpo-log1p-backward-nan", "trl")
    assert ev["chosen_logp"] == 0.0  # TRL's get_batch_logps in bf16 rounds a confident answer's log-prob to 0
    if ev["affected"]:  # log1mexp(0) = -inf even after PR #4763: the log-odds and the gradient are NaN
        assert nan(ev["grad_norm"])
    else:
        assert finite(ev["loss"]) and finite(ev["grad_norm"])


def test_kto_trainer_on_one_sided_micro_batches_reports_this_versions_behaviour():
    ev = _framework("trl-kto-unbalanced-batch-nan", "trl", "datasets")
    assert ev["logged_steps"] == 2 and finite(ev["last_loss"])
    if ev["affected"]:
        assert ev["nan_logged_values"] > 0
    else:  # a guarded release: the empty side is simply not logged
        assert "last_rewards/chosen" not in ev and finite(ev["last_rewards/rejected"])


def test_framework_level_verdict_says_whether_the_installed_version_is_affected():
    pytest.importorskip("trl", reason="trl not installed: the framework level is optional (extra 'frameworks')")
    v = evaluate(check("trl-simpo-empty-response-nan"), "cpu", None, framework=True)
    assert v.confirmed and v.framework_versions["trl"] != "absent"
    assert any(n.startswith("framework level (trl ") and "still AFFECTED" in n for n in v.notes), v.notes


def test_framework_level_absent_is_a_skip_note_not_an_error(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "trl", None)  # `import trl` now fails as if it were absent
    v = evaluate(check("trl-ipo-empty-completion-nan"), "cpu", None, framework=True)
    assert v.error is None and v.confirmed
    assert any("framework level skipped: trl is not installed" in n for n in v.notes), v.notes


def test_verdict_json_round_trip_keeps_nan():
    v = verdict("trl-simpo-empty-response-nan")
    text = v.to_json()
    assert "NaN" not in text and '"nan"' in text  # strict JSON
    back = Verdict.model_validate_json(text)
    assert nan(back.evidence["faulty"]["loss"]) and back.confirmed


def test_gpu_only_effect_on_cpu_says_so_instead_of_pretending():
    from kb.repro.harness import ReproCheck, Skip

    class KernelBug(ReproCheck):
        incident_id = "some-cuda-kernel-nan"
        gpu_only_effect = True

        def triggers(self, settings):
            return None, "depends on the GPU"

        def run(self, settings, device, fixed):
            if device == "cpu":
                raise Skip("the faulty kernel exists only on CUDA")
            return {"loss": 0.0}

    v = evaluate(KernelBug(), "cpu")
    assert v.cpu_only_skip and v.error is None and not v.reproduced and v.exit_code == 1
    assert any("not reproducible on CPU" in n for n in v.notes)


# --- runner: subprocess path, timeouts, unknown ids, broken checks --------------------------------------------

@pytest.mark.slow  # a subprocess imports torch
def test_runner_runs_a_check_in_a_subprocess_with_user_facts():
    v = run_check("trl-simpo-empty-response-nan", INCIDENTS, device="cpu", framework=False, timeout=120,
                  facts={"algorithm": "SimPO", "max_length": 4096, "max_prompt_length": 4096})
    assert v.error is None and v.exit_code == 0
    assert nan(v.evidence["faulty"]["loss"]) and finite(v.evidence["fixed"]["loss"])  # NaN survived the JSON trip
    assert v.settings["max_length"] == 4096 and v.user_settings_trigger is True
    assert nan(v.evidence["user"]["loss"])


@pytest.mark.slow  # two subprocesses import torch
def test_run_all_runs_checks_at_once_and_keeps_the_id_order():
    ids = ["trl-simpo-empty-response-nan", "colossalai-pretrain-truncation-nan"]  # not sorted: the order is given
    seen: list[str] = []
    vs = run_all(INCIDENTS, device="cpu", framework=False, ids=ids, jobs=2, timeout=120,
                 on_done=lambda v: seen.append(v.incident_id))
    assert [v.incident_id for v in vs] == ids and sorted(seen) == sorted(ids)
    assert all(v.error is None and v.exit_code == 0 for v in vs)
    with pytest.raises(InputError):
        run_all(INCIDENTS, device="cpu", ids=ids, jobs=0)


def _write_check(root: Path, incident_id: str, body: str) -> None:
    folder = root / incident_id
    folder.mkdir(parents=True)
    (folder / "repro.py").write_text(body, encoding="utf-8")


def test_runner_times_out(tmp_path):
    _write_check(tmp_path, "sleepy-check", "import time\ntime.sleep(60)\n")
    t0 = time.perf_counter()
    v = run_check("sleepy-check", tmp_path, device="cpu", timeout=2)
    assert time.perf_counter() - t0 < 20
    assert v.error and "timed out" in v.error and v.exit_code == 2


@pytest.mark.slow  # a subprocess imports torch
def test_runner_reports_a_crashing_check(tmp_path):
    _write_check(tmp_path, "broken-check", (
        "from kb.repro.harness import ReproCheck, cli_main\n"
        "class Broken(ReproCheck):\n"
        "    incident_id = 'broken-check'\n"
        "    def triggers(self, settings):\n        return None, 'n/a'\n"
        "    def run(self, settings, device, fixed):\n        raise ValueError('boom')\n"
        "raise SystemExit(cli_main(Broken))\n"))
    v = run_check("broken-check", tmp_path, device="cpu", timeout=60)
    assert v.exit_code == 2 and "boom" in v.error


def test_unknown_incident_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(NotFound):
        run_check("no-such-incident", INCIDENTS)
    with pytest.raises(NotFound):
        run_check("../etc", INCIDENTS)
    assert kb_main(["--incidents-dir", str(INCIDENTS), "repro", "no-such-incident"]) == 3
    assert "unknown incident" in capsys.readouterr().err


# --- `kb repro ID --config`: do *my* settings trigger it? -----------------------------------------------------

def _kb_repro_json(capsys, *args: str) -> tuple[int, dict]:
    rc = kb_main(["--incidents-dir", str(INCIDENTS), "repro", *args, "--device", "cpu", "--no-framework", "--json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.slow  # a subprocess imports torch
def test_config_that_triggers(tmp_path, capsys):
    cfg = tmp_path / "simpo.yaml"
    cfg.write_text("loss_type: simpo\nmax_length: 2048\nmax_prompt_length: 2048\nbf16: true\n", encoding="utf-8")
    rc, out = _kb_repro_json(capsys, "trl-simpo-empty-response-nan", "--config", str(cfg))
    assert rc == 0 and out["user_settings_trigger"] is True
    assert out["evidence"]["user"]["loss"] == "nan"


@pytest.mark.slow  # a subprocess imports torch
def test_config_that_does_not_trigger(tmp_path, capsys):
    cfg = tmp_path / "simpo.yaml"
    cfg.write_text("loss_type: simpo\nmax_length: 2048\nmax_prompt_length: 1024\n", encoding="utf-8")
    rc, out = _kb_repro_json(capsys, "trl-simpo-empty-response-nan", "--config", str(cfg))
    assert rc == 1 and out["user_settings_trigger"] is False
    assert math.isfinite(out["evidence"]["user"]["loss"])
    assert out["reproduced"] and out["fixed"]  # the mechanism itself still reproduces


@pytest.mark.slow  # a subprocess imports torch
def test_command_line_as_config(tmp_path, capsys):
    cmd = tmp_path / "run.sh"
    cmd.write_text("deepspeed train_kto.py --micro_train_batch_size 1 --max_len 4096 --vanilla_loss\n", encoding="utf-8")
    rc, out = _kb_repro_json(capsys, "openrlhf-kto-vanilla-loss-nan", "--config", str(cmd))
    assert rc == 0 and out["settings"]["micro_batch_size"] == 1 and out["user_settings_trigger"] is True


def test_facts_of_kb_diagnose_map_to_check_settings(tmp_path):
    from kb.repro.user import facts_from_json

    path = tmp_path / "diagnosis.json"  # the shape of `kb diagnose --json`
    path.write_text(json.dumps({"facts": {"sequence_parallel_size": {"value": 1, "kind": "config"},
                                          "framework": {"value": "ms-swift", "kind": "text"}}}), encoding="utf-8")
    c = check("ms-swift-dpo-sp-nll-nan")
    settings = c.settings_from_facts(facts_from_json(path))
    assert settings == {"sequence_parallel_size": 1}
    assert c.triggers({**c.defaults, **settings})[0] is False
