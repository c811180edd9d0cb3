"""An issue form's scaffolding and environment dump are not the reporter's words (kb.facts.template): the learned
layer reads the narrative, the fact layer still reads everything."""

from __future__ import annotations

import os

import pytest

from kb.diagnose import learned
from kb.diagnose.evaluate import ISSUE_FORM
from kb.facts import Facts, extract_facts
from kb.facts.template import code_line, narrative, template_line

TRANSFORMERS_ENV = """### System Info
- `transformers` version: 4.46.1
- Platform: Linux-5.15.0-105-generic-x86_64-with-glibc2.35
- Python version: 3.10.14
- Huggingface_hub version: 0.26.2
- PyTorch version (GPU?): 2.4.0+cu121 (True)
- Using distributed or parallel set-up in script?: yes
- GPU type: NVIDIA A100-SXM4-80GB

### Who can help?
@somebody

### Information
- [ ] The official example scripts
- [x] My own modified scripts
"""

COLLECT_ENV = """Collecting environment information...
PyTorch version: 2.1.0+cu121
Is debug build: False
CUDA used to build PyTorch: 12.1
OS: Ubuntu 22.04.3 LTS (x86_64)
GCC version: (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0
Python version: 3.10.12 (main, Nov 20 2023, 15:14:05) [GCC 11.4.0] (64-bit runtime)
Is CUDA available: True
GPU models and configuration:
GPU 0: NVIDIA A100-SXM4-80GB
Nvidia driver version: 535.104.05
cuDNN version: Could not collect
Versions of relevant libraries:
[pip3] numpy==1.24.4
[pip3] torch==2.1.0
[conda] Could not collect
"""

SWIFT_FORM = """**Describe the bug**
What the bug is, and how to reproduce, better with screenshots(描述bug以及复现过程，最好有截图)
**Your hardware and system info**
Write your system info like CUDA version/system/GPU/torch version here(在这里给出硬件信息和系统信息，如CUDA版本，系统，GPU型号和torch版本等)
**Additional context**
Add any other context about the problem here(在这里补充其他信息)
"""

PR_TEMPLATE = """# What does this PR do?

Fixes # (issue)

## Before submitting
- [ ] Did you read the contributor guideline?

## Who can review?
@ArthurZucker @younesbelkada
"""

OWN = """DPO with --fp16 on 8 GPUs: loss becomes nan at step 300, grad_norm inf just before
{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.9e-07, 'epoch': 0.31}"""


@pytest.mark.parametrize("form", [ISSUE_FORM, TRANSFORMERS_ENV, COLLECT_ENV, SWIFT_FORM, PR_TEMPLATE],
                         ids=["llamafactory-form", "transformers-env", "collect-env", "ms-swift-form", "pr-template"])
def test_a_forms_scaffolding_and_environment_dump_leave_only_the_reporters_words(form):
    assert narrative(form + OWN).strip() == OWN
    assert narrative(OWN + "\n" + form).strip() == OWN


def test_screenshots_are_left_out_and_links_kept():
    shot = ("![image](https://github.com/user-attachments/assets/5b0c2f7e-9a41-4c1e-8d3f-2e7a61c0b9d4)\n"
            '<img width="812" alt="curve" src="https://github.com/user-attachments/assets/0d1e">\n'
            "https://github.com/user-attachments/assets/77aa01\n")
    assert narrative(shot + OWN + "\n" + shot).strip() == OWN
    inline = "the curve ![loss](https://user-images.githubusercontent.com/1/2.png) spikes, see [#12](https://x.org/12)"
    assert narrative(inline) == "the curve  spikes, see [#12](https://x.org/12)"


@pytest.mark.parametrize("line", [
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 270.00 MiB.",
    "flash_attn_2_cuda.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
    "CUDA SETUP: Highest compute capability among GPUs detected: 7.0",
    "learning_rate: 0.0001",
    "num_train_epochs: 5.0",
    "gpu_memory_utilization: 0.6",
    "bf16: true",
    "Transformers 4.46 broke everything: loss is nan",
    "GPU: loss goes nan after 300 steps",
    "After upgrading deepspeed the loss is nan",
    "训练到 300 步 loss 变成 nan",
])
def test_machine_output_settings_and_prose_are_kept(line):
    assert not template_line(line)


def test_a_paste_that_is_all_environment_is_kept_whole():
    assert narrative(COLLECT_ENV) == COLLECT_ENV
    assert narrative("") == ""


def test_the_fact_layer_still_reads_the_environment():
    facts = extract_facts(TRANSFORMERS_ENV + OWN)
    assert facts.value("transformers_version") == "4.46.1"
    assert facts.value("gpu_bf16") is True


def test_versions_count_for_a_framework_defect_only_when_the_reporter_names_them():
    dumped = ISSUE_FORM + OWN
    assert any(k in extract_facts(dumped) for k in ("transformers_version", "peft_version"))
    assert not learned.versions_told(extract_facts(dumped), narrative(dumped))
    told = "after upgrading to trl==0.9.6 the DPO loss is nan; 0.9.4 was fine"
    assert learned.versions_told(extract_facts(told), narrative(told))
    assert learned.versions_told(Facts(), "") is False


TRACEBACK = """Traceback (most recent call last):
  File "/home/user/train.py", line 212, in <module>
    trainer.train()
  File "/opt/conda/lib/python3.10/site-packages/transformers/trainer.py", line 3579, in training_step
    loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/conda/lib/python3.10/site-packages/torch/autograd/__init__.py", line 289, in backward
    _engine_run_backward(
RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output."""

SCRIPT = """```python
from transformers import AutoTokenizer, AutoModelForCausalLM, Trainer
import torch
tokenizer = AutoTokenizer.from_pretrained(model_path)
tokenizer.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float16)
model.half()
trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
trainer.train()
```"""


def test_traceback_frames_are_left_out_and_the_exception_kept():
    got = narrative(OWN + "\n" + TRACEBACK)
    assert got == OWN + "\nTraceback (most recent call last):\n" + TRACEBACK.rsplit("\n", 1)[1]


def test_script_plumbing_is_left_out_and_its_settings_kept():
    got = narrative(OWN + "\n" + SCRIPT)
    assert got.split("\n") == [*OWN.split("\n"), "```python", 'tokenizer.padding_side = "left"',
                   "model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float16)",
                   "model.half()", "```"]
    facts = extract_facts(OWN + "\n" + SCRIPT)  # the fact layer reads every line
    assert facts.value("weights_dtype") == "fp16" and facts.value("padding_side") == "left"
    assert facts.value("model") is None  # `Trainer(model=model)` names a variable, not the model


@pytest.mark.parametrize("line", [
    "I called trainer.train() and the loss is nan", "loss = nan", "lr = 1e-4", "    learning_rate=2e-5,",
    "import of the data failed at step 3", "model.to(torch.bfloat16) fixed it", "x = y.float()",
])
def test_prose_and_settings_are_not_code_plumbing(line):
    assert not code_line(line)


def test_the_rules_retrieval_reads_the_reporters_words_too():
    """The incidents' retrieval score is a rule feature: a form's "DeepSpeed version" line must not pull the
    DeepSpeed incidents up (out of fold, a form in front of every report had cost 0.034 top-1 through it)."""
    from kb.diagnose.engine import retrieval_query

    for paste in (ISSUE_FORM + OWN, OWN + "\n" + TRACEBACK, OWN + "\n" + "x " * 3000):
        q = retrieval_query([("text", paste)], extract_facts(paste))
        assert "System Info" not in q and "DeepSpeed version" not in q and 'File "' not in q
        assert "loss becomes nan at step 300" in q


@pytest.fixture(scope="module")
def kb(tmp_path_factory, repo_root):
    from kb import KnowledgeBase

    data = os.environ.get("KB_DATA_DIR") or tmp_path_factory.mktemp("data")
    k = KnowledgeBase.open(data_dir=data, incidents_dir=repo_root / "incidents")
    if k.case_model() is None:
        pytest.fail("the shipped case base and ranker should load")
    return k


@pytest.mark.parametrize("paste", [
    OWN,
    "SFT with Qwen2 and flash_attention_2: loss is 0.0 from the first step, grad_norm 0; with eager it trains",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB while training a 7B LoRA",
    "微调 chatglm3 时 loss 一直是 0，数据里 response 字段大多是空的",
])
def test_a_report_filed_through_an_issue_form_gets_the_same_answer(kb, paste):
    """The same report typed by hand and filed through LLaMA-Factory-style and transformers-style forms."""
    plain = kb.diagnose(text=paste)
    for form in (ISSUE_FORM, TRANSFORMERS_ENV):
        filed = kb.diagnose(text=form + paste)
        assert (filed.route, filed.scope) == (plain.route, plain.scope)
        first = [x.category for x in plain.differential[:1]]
        assert [x.category for x in filed.differential[:1]] == first, form[:40]


@pytest.mark.parametrize("line", [
    " " * 8000 + "#", " " * 390 + "#", "**" + " " * 390 + "x", "- " + " " * 390 + ":", "x: " + "1." * 190 + "(",
    "[pip] " + "a " * 190 + "(", "a" + " " * 300 + "1.1" * 30,
], ids=["8000-spaces", "390-spaces", "bold-spaces", "bullet-spaces", "dotted-value", "pip-tokens", "spaced-version"])
def test_long_and_pathological_lines_are_read_in_one_pass(line):
    """Found by the API fuzz test: a heading pattern with nested optional whitespace backtracked for minutes on
    a line of spaces. The patterns are now unambiguous and lines over 400 characters are never template lines."""
    assert not template_line(line)
    assert narrative(line + "\nloss nan") == line + "\nloss nan"
