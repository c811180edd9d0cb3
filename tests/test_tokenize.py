"""The tokenizer keeps identifiers whole, splits their parts, and cuts Chinese with domain words."""

from kb.tokenize import detect_lang, tokenize


def test_identifiers_stay_whole_with_their_parts():
    toks = tokenize("--max_prompt_length 2048 sequence_parallel_size grad_norm")
    assert "max_prompt_length" in toks and "prompt" in toks
    assert "sequence_parallel_size" in toks and "grad_norm" in toks
    assert "--max_prompt_length" not in toks


def test_numbers_and_negative_labels_stay_whole():
    toks = tokenize("labels are all -100, loss 1.19e+34")
    assert "-100" in toks and "1.19e+34" in toks


def test_case_folding_and_model_names():
    toks = tokenize("Qwen2-7B-Instruct DPO")
    assert "qwen2-7b-instruct" in toks and "qwen2" in toks and "dpo" in toks


def test_chinese_domain_words_and_mixed_text():
    toks = tokenize("序列并行 DPO nll_loss 为 nan，奖励模型用半精度")
    for w in ("序列并行", "dpo", "nll_loss", "nan", "奖励模型", "半精度"):
        assert w in toks
    assert "，" not in toks and "为" not in toks


def test_language_detection():
    assert detect_lang("序列并行 DPO nll_loss 为 nan") == "zh"
    assert detect_lang("DPO NLL loss nan with sequence_parallel_size 4") == "en"


def test_paste_lang_is_the_language_of_the_reporters_own_words():
    from kb.tokenize import detect_lang, paste_lang

    paste = "torch.cuda.OutOfMemoryError: CUDA out of memory.\n用 LoRA 微调 Qwen2-7B，单卡 24G，batch size 8 就报错"
    assert detect_lang(paste) == "en" and paste_lang(paste) == "zh"  # the traceback outweighs it in letters
    assert paste_lang("loading /data/中文数据/train.json\n{'loss': nan, 'grad_norm': nan, 'epoch': 0.1}") == "en"
    assert paste_lang("DPO NLL loss nan") == "en" and paste_lang("DPO 训练时 nll loss 变成 nan") == "zh"
    # a thread's opening: a short Chinese title above a screenshot whose URL has far more letters
    shot = "![image](https://user-images.githubusercontent.com/16174341/225230965-b3cb1226-7dfe-463c-b236-8e2dafc1e26e.png)"
    assert paste_lang("微调过程中loss=nan\n" + shot) == "zh"
    assert paste_lang("loss is nan after step 3\n" + shot) == "en"
    # a short Chinese question full of English terms: its words are Chinese (4 characters against 6 English words)
    assert paste_lang("用 Qwen2.5-7B-Instruct 做 DPO，loss 变成 nan") == "zh"
    # ... but Chinese inside a quoted string or a path is data
    assert paste_lang('{"instruction": "你好啊", "output": "x"} loss nan at step 3') == "en"
    assert paste_lang("Qwen2-7B-Instruct 推理 probability tensor contains either inf") == "en"
