"""The CLI as people use it: version, flags anywhere, languages, suggestions, exit codes, colour, width,
progress and shell completion. Real subprocesses (some on a pseudo-terminal), a real data dir."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time

import pytest

from kb import __version__

pytestmark = pytest.mark.slow
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def env(tmp_path_factory, repo_root) -> dict[str, str]:
    data = tmp_path_factory.mktemp("cli-ux-data")
    e = {**os.environ, "KB_DATA_DIR": str(data), "KB_INCIDENTS_DIR": str(repo_root / "incidents"),
         "PYTHONPATH": str(repo_root), "LANG": "C.UTF-8",
         "KB_DAEMON": "off"}  # on a pseudo-terminal kb would otherwise leave an answer daemon running
    for k in ("NO_COLOR", "KB_LANG", "LC_ALL", "LC_MESSAGES", "COLUMNS"):
        e.pop(k, None)
    subprocess.run([sys.executable, "-m", "kb.cli", "-q", "index"], env=e, check=True, timeout=600,
                   capture_output=True)
    return e


@pytest.fixture(scope="module")
def lib(env):
    """The library on the same data, to derive what the CLI must print (ranking is tested elsewhere)."""
    from kb.kb import KnowledgeBase

    return KnowledgeBase.open(data_dir=env["KB_DATA_DIR"], incidents_dir=env["KB_INCIDENTS_DIR"])


def kb(env, *args: str, stdin: str | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kb.cli", *args], capture_output=True, text=True, input=stdin,
                          env={**env, **extra_env}, timeout=600, check=False)


def kb_tty(env, *args: str, columns: int = 120, **extra_env: str) -> tuple[int, str]:
    """Run kb with stdout and stderr on a pseudo-terminal; returns the exit code and everything it drew."""
    master, slave = pty.openpty()
    e = {**env, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": "40", **extra_env}
    proc = subprocess.Popen([sys.executable, "-m", "kb.cli", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=e, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace")


def test_version(env):
    r = kb(env, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kb {__version__}"


def test_global_flags_after_the_subcommand(env, tmp_path, lib):
    want = [r.id for r in lib.ask("DPO NLL loss nan").results]
    r = kb(env, "ask", "DPO NLL loss nan", "--json", "--data-dir", env["KB_DATA_DIR"], "--lang", "zh", "-q")
    assert r.returncode in (0, 1), r.stderr
    assert [x["id"] for x in json.loads(r.stdout)["results"]] == want
    # Before and after give the same answer; a flag before is not reset by the subcommand's defaults.
    before = kb(env, "--data-dir", env["KB_DATA_DIR"], "ask", "--json", "DPO NLL loss nan")
    assert [x["id"] for x in json.loads(before.stdout)["results"]] == want
    empty = tmp_path / "no-incidents"
    empty.mkdir()
    r = kb(env, "list", "--incidents-dir", str(empty), "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 1 and "0 incident(s)" in r.stdout


def test_lang_translates_labels_headers_and_record_text(env, lib):
    zh_q, en_q = "序列并行 DPO nll_loss 为 nan", "DPO NLL loss nan"
    en = kb(env, "ask", "-k", "2", zh_q, "--lang", "en")
    assert en.returncode in (0, 1), en.stderr
    assert "evidence:" in en.stdout and "fix:" in en.stdout and "title" in en.stdout
    assert "证据" not in en.stdout and "修复" not in en.stdout
    top = lib.ask(zh_q, k=2).results[0].id
    assert lib.get(top).title.en[:30] in en.stdout  # the record's English title, not its Chinese one
    zh = kb(env, "ask", "-k", "2", en_q, "--lang", "zh")
    assert "证据" in zh.stdout and "修复" in zh.stdout and "编号" in zh.stdout and "标题" in zh.stdout
    assert not re.search(r"\b(evidence|fix|repro|title|framework|score):?\s", zh.stdout.split("\n1. ")[0])
    top = lib.ask(en_q, k=2).results[0].id
    assert lib.get(top).title.zh[:20] in zh.stdout
    lst = kb(env, "list", "--lang", "zh")
    assert "共 42 个事件" in lst.stdout or re.search(r"共 \d+ 个事件", lst.stdout)
    assert "incident(s)" not in lst.stdout
    val = kb(env, "validate", "--lang", "zh")
    assert val.returncode == 0 and "检查了" in val.stdout


def test_did_you_mean_and_exit_codes(env, lib):
    r = kb(env, "show", "ms-swift-dpo-sp-nll-nam")
    assert r.returncode == 3 and "did you mean ms-swift-dpo-sp-nll-nan" in r.stderr
    r = kb(env, "repro", "trl-simpo-empty-respons-nan")
    assert r.returncode == 3 and "trl-simpo-empty-response-nan" in r.stderr
    r = kb(env, "ask", "loss nan", "--framework", "trll")
    assert r.returncode == 2 and "did you mean trl" in r.stderr and "Traceback" not in r.stderr
    r = kb(env, "list", "--category", "fp16-overflw")
    assert r.returncode == 2 and "fp16-overflow" in r.stderr
    r = kb(env, "--lang", "zh", "show", "ms-swift-dpo-sp-nll-nam")
    assert r.returncode == 3 and "你是不是想找" in r.stderr
    for q in ("DPO NLL loss nan", "loss nan fp16", "how do I bake sourdough bread"):
        assert kb(env, "ask", q).returncode == (1 if lib.ask(q).abstained else 0), q
    assert lib.ask("how do I bake sourdough bread").abstained
    assert kb(env, "list", "--framework", "TRL").returncode == 0  # case does not matter


LOG = "{'loss': nan, 'grad_norm': nan, 'nll_loss': nan, 'epoch': 0.02}\n"


def test_diagnose_exit_codes_and_the_preflight_gate(env, tmp_path, lib):
    paste = LOG + "rlhf_type: dpo\nsequence_parallel_size: 4\nfp16: true\n"
    want = lib.diagnose(text=paste)
    assert kb(env, "diagnose", "-", stdin=paste).returncode == (1 if want.abstained else 0)
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert lib.diagnose(text=oom).abstained and kb(env, "diagnose", "-", stdin=oom).returncode == 1
    # The gate fires exactly at the best diagnosis's confidence.
    run = tmp_path / "run.txt"
    run.write_text(paste)
    j = kb(env, "diagnose", str(run), "--json")
    res = json.loads(j.stdout)
    assert res["diagnoses"] and not res["abstained"], "this paste must be diagnosed for the gate test"
    conf = res["diagnoses"][0]["confidence"]
    r = kb(env, "diagnose", str(run), "--fail-on", f"{conf}")
    assert r.returncode == 4, r.stdout + r.stderr
    assert res["diagnoses"][0]["category"] in r.stderr and "pre-flight" in r.stderr
    assert kb(env, "diagnose", str(run), "--fail-on", f"{conf}", "--json").returncode == 4
    above = min(1.0, conf + 0.005)
    if above > conf:
        r = kb(env, "diagnose", str(run), "--fail-on", f"{above}")
        assert r.returncode == 0 and "pre-flight: no known failure" in r.stdout
    safe = tmp_path / "safe.yaml"
    safe.write_text("learning_rate: 1e-5\nbf16: true\nper_device_train_batch_size: 8\n")
    best = lib.diagnose(config=safe.read_text())
    r = kb(env, "diagnose", "--config", str(safe), "--fail-on", "0.8")
    gated = not best.abstained and best.diagnoses and best.diagnoses[0].confidence >= 0.8
    assert r.returncode == (4 if gated else 0)
    assert kb(env, "diagnose", "--config", str(safe), "--fail-on", "1.5").returncode == 2


def test_similar_reports_header_counts_only_reports_with_the_answers_cause(env, lib):
    # The nearest real reports are listed under every in-scope answer; "seen in N" counts those that share the
    # answer's cause, and when none does the header says so instead of "seen in 0".
    # (Which paste lands in which branch depends on the fitted ranker; the last assert checks both are covered.)
    pastes = ["Qwen2 SFT loss nan at step 300", "swift GRPO 训练 Qwen2.5-7B，自定义奖励函数，日志里 loss 和 grad_norm 一直为 0",
              "SFT: evaluation loss is nan while the training loss is fine, max_length 512",
              "learning rate 1e-3 loss spikes then nan", "learning_rate: 1e-3\nloss nan",
              "grad_norm nan at step 1, loss 0.0 after, Qwen2.5-7B reward model with score head in fp16"]
    counts = []
    for paste in pastes:
        res = lib.diagnose(text=paste)
        assert res.similar_reports, paste
        counts.append(res.seen_in)
        out = kb(env, "--lang", "en", "diagnose", "-", stdin=paste).stdout
        assert "seen in 0 " not in out
        if res.seen_in:
            assert f"seen in {res.seen_in} similar real report(s):" in out, out
        else:
            assert "similar real reports (none of them with this cause):" in out, out
        assert res.similar_reports[0].url in out
    assert 0 in counts and any(counts), f"the pastes must cover both headers: {counts}"


def test_colour_only_on_a_terminal_and_never_with_no_color(env):
    piped = kb(env, "ask", "-k", "2", "DPO NLL loss nan")
    assert not ANSI.search(piped.stdout)
    code, drawn = kb_tty(env, "ask", "-k", "2", "DPO NLL loss nan")
    assert code in (0, 1) and _colours(drawn) and "evidence:" in drawn
    code, drawn = kb_tty(env, "ask", "-k", "2", "DPO NLL loss nan", NO_COLOR="1")
    assert code in (0, 1) and "evidence:" in drawn
    assert not _colours(drawn)  # bold may stay (https://no-color.org asks for no colour)


def _colours(text: str) -> list[str]:
    """SGR parameters that set a foreground or background colour."""
    found = []
    for params in re.findall(r"\x1b\[([0-9;]*)m", text):
        for p in params.split(";"):
            if p and (30 <= int(p) <= 49 or 90 <= int(p) <= 107):
                found.append(p)
    return found


@pytest.mark.parametrize("columns", [72, 100, 180])
def test_tables_fit_the_terminal(env, columns):
    r = kb(env, "ask", "-k", "5", "loss nan fp16", COLUMNS=str(columns))
    table = r.stdout.split("\n\n1. ")[0].splitlines()
    from rich.cells import cell_len

    assert all(cell_len(line.rstrip()) <= columns for line in table), table
    if columns < 100:
        return  # too narrow for the ids and categories side by side: cells wrap, the table still fits
    assert len(table) == 2 + 5  # header, rule, one line per row: nothing wraps
    ids = [line.split()[1] for line in table[2:]]
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]+", i) and len(i) > 10 for i in ids)  # ids are never cut


def test_index_progress_moves(env, tmp_path):
    code, drawn = kb_tty(env, "--data-dir", str(tmp_path / "fresh"), "index", "--force")
    assert code == 0, drawn
    counts = [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+)\s+rows", ANSI.sub("", drawn))]
    assert counts, drawn[-2000:]
    total = counts[-1][1]
    assert total > 0 and max(a for a, _ in counts) == total  # it reached the end, it did not sit at 0


def test_repro_all_progress_moves(env, tmp_path, repo_root):
    small = tmp_path / "incidents"
    for i in ("trl-simpo-empty-response-nan", "ms-swift-dpo-sp-nll-nan"):
        shutil.copytree(repo_root / "incidents" / i, small / i)
    code, drawn = kb_tty(env, "--incidents-dir", str(small), "repro", "--all", "--device", "cpu", "--no-framework")
    plain = ANSI.sub("", drawn)
    assert code == 0, plain[-2000:]
    assert "repro checks: ms-swift-dpo-sp-nll-nan" in plain or "repro checks: trl-simpo" in plain
    assert re.search(r"\b1/2\b", plain) and "confirmed" in plain
    code, drawn = kb_tty(env, "--incidents-dir", str(small), "repro", "--all", "--device", "cpu", "--no-framework",
                         "--jobs", "2")  # both at once: the bar counts the finished ones
    plain = ANSI.sub("", drawn)
    assert code == 0, plain[-2000:]
    assert re.search(r"\b2/2\b", plain) and plain.count("confirmed") >= 2


def test_bash_completion(env, tmp_path):
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("no bash")
    script = kb(env, "completion", "bash").stdout
    assert kb(env, "completion", "zsh").returncode == 0
    (tmp_path / "c.sh").write_text(script)
    probe = f"""
source {tmp_path / "c.sh"}
kb() {{ {sys.executable} -m kb.cli "$@"; }}
COMP_WORDS=(kb dia); COMP_CWORD=1; _kb_complete; echo "A:${{COMPREPLY[*]}}"
COMP_WORDS=(kb show ms-swift-dpo); COMP_CWORD=2; _kb_complete; echo "B:${{COMPREPLY[*]}}"
COMP_WORDS=(kb diagnose --fail); COMP_CWORD=2; _kb_complete; echo "C:${{COMPREPLY[*]}}"
COMP_WORDS=(kb ask x --lang ''); COMP_CWORD=4; _kb_complete; echo "D:${{COMPREPLY[*]}}"
"""
    r = subprocess.run([bash, "-c", probe], capture_output=True, text=True, env=env, timeout=120, check=False)
    lines = dict(line.split(":", 1) for line in r.stdout.splitlines() if ":" in line)
    assert lines["A"] == "diagnose"
    assert "ms-swift-dpo-sp-nll-nan" in lines["B"].split()
    assert lines["C"] == "--fail-on"
    assert lines["D"].split() == ["en", "zh"]


def test_repro_without_torch_is_a_clear_error(env):
    """Core installs have no torch: `kb repro` says what to install instead of failing inside a check."""
    # sys.modules[name] = None is how Python itself marks a module as not importable.
    hide = "import sys\nsys.modules['torch'] = None\nfrom kb.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    r = subprocess.run([sys.executable, "-c", hide, "repro", "trl-simpo-empty-response-nan"], capture_output=True,
                       text=True, env=env, timeout=120, check=False)
    assert r.returncode == 2 and "pip install torch==2.13.0" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-c", hide, "repro", "no-such-check"], capture_output=True, text=True,
                       env=env, timeout=120, check=False)
    assert r.returncode == 3  # an unknown id is still an unknown id
