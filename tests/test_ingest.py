"""Raw-document ingest: seed articles, English/Chinese markdown, HTML pages, curated files and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb.cues import cues
from kb.errors import InputError, InputTooLarge, NotFound
from kb.ingest import IngestResult, parse_document, read_document
from kb.ingest.boilerplate import strip_boilerplate
from kb.taxonomy import categories

DATA = Path(__file__).resolve().parent / "data" / "ingest"

# What each seed article must parse to (field by field). Values are what the article states.
SEEDS = {
    "000": {"framework": "ms-swift", "algorithm": "DPO", "category": "sequence-parallel-label-split",
            "precision": "bf16",
            "config": {"sequence_parallel_size": 4, "max_length": 8192, "rpo_alpha": 1.0, "zero_stage": 3}},
    "001": {"framework": "OpenRLHF", "algorithm": "KTO", "category": "kto-unbalanced-batch",
            "config": {"vanilla_loss": True, "micro_batch_size": 2, "max_length": 8192,
                       "learning_rate": 5e-7, "zero_stage": 3}},
    "002": {"framework": "trl", "algorithm": "SimPO", "category": "empty-response-length-normalization",
            "config": {}},
    "003": {"framework": "xtuner", "algorithm": "SFT", "category": "fp16-overflow", "precision": "fp16",
            "model": "InternLM2", "config": {"precision": "fp16"}},
    "004": {"framework": "trl", "algorithm": "RM", "category": "half-precision-weights",
            "config": {"weights_dtype": "fp16", "lora_task_type": "seq_cls", "gradient_accumulation_steps": 32}},
}

# Names advertised in the seeds' site boilerplate, plus the boilerplate's own markers. None may reach a record.
BOILERPLATE_WORDS = ["Kimi", "ERNIE", "MiniMax", "HunyuanVideo", "MiniCPM", "Spark-Formalizer", "GOT-OCR",
                     "PaddleOCR", "Baichuan-M3", "VLOOK", "RuoYi", "OpenHarmony", "openEuler", "StepFun", "xw-cli",
                     "Qwen3", "SigLIP", "登录后查看全文", "热门项目推荐", "相关项目推荐", "项目优选", "Python00",
                     "暂无简介", "作者"]


def _seed(shared_dir: Path, prefix: str) -> Path:
    found = sorted((shared_dir / "seeds").glob(f"{prefix}_*.txt"))
    if not found:
        pytest.skip(f"seed {prefix} is not in {shared_dir / 'seeds'}")
    return found[0]


def _ingest(path: Path) -> IngestResult:
    text, fmt = read_document(path)
    return parse_document(text, name=path.name, fmt=fmt)


def _record_text(result: IngestResult) -> str:
    return json.dumps(result.incident.model_dump(mode="json"), ensure_ascii=False)


@pytest.mark.parametrize("prefix", sorted(SEEDS))
def test_seed_article_parses_field_by_field(shared_dir, prefix):
    want = SEEDS[prefix]
    result = _ingest(_seed(shared_dir, prefix))
    inc = result.incident
    assert inc.origin == "raw" and inc.lang.value == "zh"
    assert inc.framework.name == want["framework"]
    assert inc.algorithm == want["algorithm"]
    assert inc.root_cause.category == want["category"], result.category_scores
    assert inc.root_cause.status == "unconfirmed"
    assert inc.root_cause.evidence and inc.root_cause.evidence == result.category_evidence
    if "precision" in want:
        assert inc.precision == want["precision"]
    if "model" in want:
        assert inc.model == want["model"]
    for key, value in want["config"].items():
        assert inc.config.get(key) == value, (key, inc.config)
    assert inc.title.zh and not inc.title.en
    assert inc.body.zh and not inc.body.en
    assert inc.fix.summary.zh, "the fix section's first statement becomes fix.summary"
    assert inc.sources[0].file == _seed(shared_dir, prefix).name


def test_seed_specific_facts(shared_dir):
    sp = _ingest(_seed(shared_dir, "000")).incident
    # The article also mentions labels of -100 (a masked-labels cue), but the configuration fact wins.
    assert sp.parallelism == "deepspeed-zero3 + sequence-parallel"
    assert sp.fix.config_changes == {"sequence_parallel_size": 1}
    assert "nll_loss: nan" in sp.symptoms.metrics

    kto = _ingest(_seed(shared_dir, "001")).incident
    assert kto.model == "Qwen2-7B"
    assert kto.fix.config_changes == {"vanilla_loss": False}

    simpo = _ingest(_seed(shared_dir, "002"))
    assert "max_prompt_length == max_length" in simpo.relations
    assert any("max_prompt_length" in e and "max_length" in e for e in simpo.category_evidence)
    assert simpo.incident.triggers[0].all[0].value_fact == "max_length"

    fp16 = _ingest(_seed(shared_dir, "003")).incident
    assert any(e.startswith("RuntimeError: probability tensor contains either inf, nan")
               for e in fp16.symptoms.errors)
    assert fp16.fix.config_changes.get("precision") == "bf16"

    half = _ingest(_seed(shared_dir, "004")).incident
    assert half.fix.config_changes == {"weights_dtype": "auto"}
    assert "loss: 1.19e+34" in half.symptoms.metrics


def test_seed_boilerplate_never_reaches_a_record(shared_dir):
    for prefix in SEEDS:
        result = _ingest(_seed(shared_dir, prefix))
        text = _record_text(result)
        leaked = [w for w in BOILERPLATE_WORDS if w in text]
        assert not leaked, f"seed {prefix}: boilerplate leaked into the record: {leaked}"
        assert result.stripped, "the removed block is reported for debugging"


def test_raw_english_markdown():
    result = _ingest(DATA / "raw_en_grpo_kl.md")
    inc = result.incident
    assert inc.lang.value == "en" and inc.title.en and not inc.title.zh
    assert (inc.framework.name, inc.algorithm, inc.model) == ("verl", "GRPO", "Qwen2.5-7B-Instruct")
    assert inc.root_cause.category == "kl-estimator-overflow"
    # Hydra-style overrides in a code block go through the canonical keys.
    assert inc.config["kl_estimator"] == "k3" and inc.config["use_kl_loss"] is True
    assert inc.config["learning_rate"] == 1e-6 and inc.config["max_completion_length"] == 2048
    assert inc.fix.config_changes == {"kl_estimator": "k1"}
    assert "kl: nan" in inc.symptoms.metrics
    assert inc.symptoms.onset.en == "after about 300 healthy steps"
    assert "https://github.com/example-org/example-trainer/issues/4242" in [s.url for s in inc.sources]
    assert inc.fix.summary.en.startswith("Clamp the log-ratio")


def test_html_page_loses_navigation_sidebar_and_footer():
    text, fmt = read_document(DATA / "page_fp16_overflow.html")
    assert fmt == "html"
    result = parse_document(text, name="page_fp16_overflow.html", fmt=fmt)
    inc = result.incident
    record = _record_text(result)
    for furniture in ("ZetaChat", "OrbitCoder", "Sign in", "Related posts", "Copyright", "trackPageView",
                      "font-family", "2024-03-09"):
        assert furniture not in record, furniture
    assert inc.title.en == "LLaMA-Factory SFT on V100 stops: loss scale already at minimum"
    assert (inc.framework.name, inc.algorithm, inc.model) == ("LLaMA-Factory", "SFT", "Llama-3-8B")
    assert inc.root_cause.category == "fp16-overflow"
    assert inc.precision == "fp16" and inc.config["gpu"] == "V100" and inc.config["num_gpus"] == 4
    assert inc.config["zero_stage"] == 2 and inc.config["deepspeed_version"] == "0.12.6"
    assert any(e.startswith("Current loss scale already at minimum") for e in inc.symptoms.errors)
    assert inc.sources[1].url == "https://blog.example.org/posts/llamafactory-v100-loss-scale"
    assert "```" in inc.body.en, "code blocks survive as fenced blocks"


def test_chinese_markdown_with_generic_site_ads():
    result = _ingest(DATA / "raw_zh_zero2.md")
    inc = result.incident
    record = _record_text(result)
    # Invented ad names: the stripper works from the shape of the lines, not from a list of names.
    for junk in ("NebulaLM", "QuillOCR", "Rust12", "相关推荐", "社区投稿"):
        assert junk not in record, junk
    assert inc.lang.value == "zh" and inc.framework.name == "LLaMA-Factory" and inc.model == "unknown"
    assert inc.root_cause.category == "zero2-overlap-comm-bug"
    assert inc.config["zero_stage"] == 2 and inc.config["overlap_comm"] is True
    assert inc.config["deepspeed_version"] == "0.14.0" and inc.config["gradient_accumulation_steps"] == 4
    assert inc.fix.config_changes == {"overlap_comm": False}
    assert [s.zh[:2] for s in inc.fix.steps] == ["把 ", "或者"]


def test_boilerplate_cut_is_found_from_line_shapes():
    article = ["某框架训练 NaN 问题", "问题现象", "训练到一半 loss 变成 NaN。", "解决方案", "- 降低学习率。"]
    ads = ["FooBar-7BFooBar-7B 是一个示例模型，能写代码Python00", "BazTool示例工具，一键部署Go06", "Vue", "1.2 K"]
    out = strip_boilerplate(article + ads)
    assert out.lines == article
    # Numbers at the end of a real content line are not counters.
    real = ["Title", "问题现象", "- 微批次大小为32", "- 最大长度 8192", "梯度累积步数为16"]
    assert strip_boilerplate(real).lines == real


def test_curated_document_round_trip(repo_root):
    documents = pytest.importorskip("kb.documents", reason="kb.documents (curated parser) is not present")
    paths = sorted((repo_root / "incidents").glob("*/incident.md"))
    if not paths:
        pytest.skip("no curated incidents in the repository yet")
    text = paths[0].read_text(encoding="utf-8")
    result = parse_document(text, name=str(paths[0]))
    assert result.incident.origin == "curated"
    assert result.incident == documents.parse_incident_md(text)
    again = parse_document(documents.dump_incident_md(result.incident), name="copy.md")
    assert again.incident == result.incident


def test_reingest_gives_the_same_id_and_record():
    text = (DATA / "raw_en_grpo_kl.md").read_text(encoding="utf-8")
    first = parse_document(text, name="a.md")
    second = parse_document(text, name="a.md")
    assert first.incident == second.incident
    edited = parse_document(text + "\nAlso reproduced with kl_loss_coef=0.01.\n", name="a.md")
    assert edited.incident.id == first.incident.id, "same article, edited body: same id (update, no duplicate)"
    other = parse_document(text.replace("verl GRPO: KL turns NaN", "verl GRPO: reward turns NaN"), name="a.md")
    assert other.incident.id != first.incident.id


def test_plain_text_without_headings_still_separates_the_fix():
    text = ("TRL DPO run with loss_type ipo: rewards/chosen and logps/chosen become nan when max_prompt_length is "
            "equal to max_length.\nThe fix was to set max_prompt_length to 512 instead of 1024.\n")
    inc = parse_document(text, name="note.txt").incident
    assert inc.root_cause.category == "empty-response-length-normalization"
    assert inc.fix.config_changes == {"max_prompt_length": 512}
    assert "max_prompt_length" not in inc.config


@pytest.mark.parametrize("payload", ["", "   \n\t  ", "abc\x00def"])
def test_bad_text_is_a_clear_input_error(payload):
    with pytest.raises(InputError):
        parse_document(payload, name="bad.txt")


def test_binary_file_is_rejected():
    with pytest.raises(InputError, match="binary"):
        read_document(DATA / "junk.bin")


def test_missing_file_is_not_found(tmp_path):
    with pytest.raises(NotFound):
        read_document(tmp_path / "nope.md")


def test_oversized_input_names_the_limit(tmp_path, monkeypatch):
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse 50 MB file: the size is checked before anything is read
    with pytest.raises(InputTooLarge, match="limit"):
        read_document(big)
    with pytest.raises(InputTooLarge):
        parse_document("x" * (5 * 1024 * 1024 + 1), name="big.txt")
    small = tmp_path / "small.md"
    small.write_text("# A title\n\nloss nan with fp16 training on V100\n", encoding="utf-8")
    with pytest.raises(InputTooLarge):
        read_document(small, max_bytes=10)
    monkeypatch.setenv("KB_INGEST_MAX_BYTES", "20")
    with pytest.raises(InputTooLarge):
        read_document(small)


def test_every_cue_names_a_known_category():
    known = set(categories())
    assert {c.category for c in cues()} <= known


def test_the_added_categories_table_names_each_key_once():
    # categories() keeps the first row of a key, so a second row would be silently ignored.
    import re

    from kb.taxonomy import EXTRA_FILE

    keys = re.findall(r"^\|\s*`([a-z0-9-]+)`", EXTRA_FILE.read_text(encoding="utf-8"), re.MULTILINE)
    assert keys and len(keys) == len(set(keys))
