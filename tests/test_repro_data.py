"""The data check: on the user's JSONL and a local tokenizer, count empty responses and label-less SP shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb.errors import InputError, NotFound
from kb.repro.data_check import check_data, has_label_less_shard, response_tokens
from kb.repro.user import facts_from_pairs, facts_from_text


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The checks' in-memory word-level tokenizer (one token per `wN` word), saved locally: no downloads."""
    pytest.importorskip("tokenizers", reason="tokenizers not installed")
    pytest.importorskip("transformers", reason="transformers not installed")
    from kb.repro.tiny import tiny_tokenizer

    out = tmp_path_factory.mktemp("tok")
    tiny_tokenizer().save_pretrained(out)
    return out


@pytest.fixture
def data(tmp_path) -> Path:
    rows = [{"prompt": "w1 " * 10, "chosen": "w2 " * 5, "rejected": "w3 " * 4},  # 10 prompt tokens
            {"prompt": "w1 " * 30, "chosen": "w2 " * 5, "rejected": "w3 " * 4},  # prompt longer than 24
            {"messages": [{"role": "user", "content": "w4 " * 20}, {"role": "assistant", "content": "w5 w6"}]}]
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n", encoding="utf-8")
    return p


def test_prompt_as_long_as_max_length_leaves_an_empty_response(data, tokenizer_dir):
    r = check_data(data, tokenizer_dir, max_length=24, max_prompt_length=24)
    assert (r.samples, r.skipped) == (3, 1)
    assert r.empty_response == 1 and r.empty_response_lines == [2]
    assert r.longest_prompt_tokens == 30 and r.triggered


def test_room_for_the_response_keeps_every_response(data, tokenizer_dir):
    r = check_data(data, tokenizer_dir, max_length=24, max_prompt_length=12)
    assert r.empty_response == 0 and not r.triggered


def test_sequence_parallel_shards_without_labels(data, tokenizer_dir):
    r = check_data(data, tokenizer_dir, max_length=64, sequence_parallel_size=4)
    # 10+5 tokens in 4 shards of 4: labels start at 10, shards 0-1 hold only prompt; likewise the others.
    assert r.label_less_shard == 3 and r.empty_response == 0
    assert check_data(data, tokenizer_dir, max_length=64, sequence_parallel_size=1).label_less_shard == 0


def test_truncation_and_shard_rules():
    assert response_tokens(30, 5, max_length=24, max_prompt_length=24) == 0
    assert response_tokens(30, 5, max_length=24, max_prompt_length=12) == 5
    assert response_tokens(30, 5, max_length=24, max_prompt_length=None) == 0
    assert has_label_less_shard(26, 6, max_length=32, sp=4)  # the seed: 26 prompt tokens of 32, SP 4
    assert not has_label_less_shard(4, 28, max_length=32, sp=4)


def test_bad_inputs_are_clear_errors(tmp_path, tokenizer_dir, data):
    with pytest.raises(NotFound):
        check_data(tmp_path / "missing.jsonl", tokenizer_dir, max_length=24)
    with pytest.raises(NotFound):
        check_data(data, tmp_path / "no-tokenizer", max_length=24)
    junk = tmp_path / "junk.jsonl"
    junk.write_text("hello\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(InputError):
        check_data(junk, tokenizer_dir, max_length=24)


@pytest.mark.slow  # a subprocess imports torch
def test_kb_repro_with_data(data, tokenizer_dir, capsys):
    from kb.cli import main as kb_main

    incidents = Path(__file__).resolve().parent.parent / "incidents"
    if not (incidents / "trl-simpo-empty-response-nan" / "repro.py").is_file():
        pytest.skip("the SimPO seed check is absent")
    rc = kb_main(["--incidents-dir", str(incidents), "repro", "trl-simpo-empty-response-nan", "--device", "cpu",
                  "--no-framework", "--json", "--set", "loss_type=simpo", "--set", "max_length=24",
                  "--set", "max_prompt_length=24", "--data", str(data), "--tokenizer", str(tokenizer_dir)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["data"]["empty_response"] == 1 and out["user_settings_trigger"] is True


def test_user_settings_from_yaml_and_pairs():
    facts = facts_from_text("cutoff_len: 4096\nsequence_parallel_size: 4\nrpo_alpha: 1.0\n")
    assert facts["max_length"] == 4096 and facts["sequence_parallel_size"] == 4
    assert facts_from_pairs(["max_len=1024", "fp16=true"]) == {"max_length": 1024, "precision": "fp16"}
    with pytest.raises(InputError):
        facts_from_pairs(["max_length"])
