"""The answer daemon end to end: real `kb` subprocesses, a real daemon process on a Unix socket, a real index."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from kb import daemon

LOG = "\n".join([
    "deepspeed --num_gpus 8 train.py --deepspeed ds_z3.json --bf16 false --fp16 true",
    *[f"{{'loss': {2.3 - i * 0.01:.4f}, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': 0.{i}}}" for i in range(40)],
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}",
])


@pytest.fixture(scope="module")
def env(tmp_path_factory, repo_root):
    # Own copy of the incidents so that one test can change the records under a running daemon.
    base = tmp_path_factory.mktemp("daemon")
    incidents = base / "incidents"
    shutil.copytree(repo_root / "incidents", incidents)
    e = {**os.environ, "KB_DATA_DIR": str(base / "data"), "KB_INCIDENTS_DIR": str(incidents),
         "KB_DAEMON_IDLE": "300", "PYTHONPATH": str(repo_root)}
    t = daemon.Target((base / "data").resolve(), incidents.resolve(), os.environ.get("KB_EMBED_MODEL", ""))
    yield e, t
    daemon.stop(t)


def kb(env, *args, stdin=None, daemon_mode="auto"):
    e, _ = env
    return subprocess.run([sys.executable, "-m", "kb.cli", *args], capture_output=True, text=True, input=stdin,
                          env={**e, "KB_DAEMON": daemon_mode}, timeout=600, check=False)


def test_without_daemon_answers_in_process_and_starts_none(env):
    _, t = env
    r = kb(env, "index")
    assert r.returncode == 0, r.stderr
    r = kb(env, "ask", "--json", "DPO NLL loss nan")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["id"] == "ms-swift-dpo-sp-nll-nan"
    # Not a terminal and KB_DAEMON=auto: a script must not leave a background process behind.
    assert daemon.status(t) is None
    r = kb(env, "daemon", "status")
    assert r.returncode == 1 and "no daemon" in r.stdout


def test_daemon_answers_like_the_library(env):
    _, t = env
    r = kb(env, "daemon", "start")
    assert r.returncode == 0, r.stderr
    info = daemon.status(t)
    assert info is not None and info["pid"] > 0
    before = info["requests"]
    local = kb(env, "ask", "--json", "DPO NLL loss nan", daemon_mode="off")
    remote = kb(env, "ask", "--json", "DPO NLL loss nan")
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    table = kb(env, "ask", "序列并行 DPO nll_loss 为 nan")
    assert "ms-swift-dpo-sp-nll-nan" in table.stdout and "修复" in table.stdout
    d_local = kb(env, "diagnose", "--json", "-", stdin=LOG, daemon_mode="off")
    d_remote = kb(env, "diagnose", "--json", "-", stdin=LOG)
    assert d_remote.returncode == 0, d_remote.stderr
    assert json.loads(d_remote.stdout) == json.loads(d_local.stdout)
    assert daemon.status(t)["requests"] == before + 3


def test_daemon_errors_keep_message_and_exit_code(env):
    r = kb(env, "ask", "   ")
    assert r.returncode == 2 and "empty" in r.stderr and "Traceback" not in r.stderr
    r = kb(env, "diagnose", "-", stdin="\x00\x01\x02binary" * 50)
    assert r.returncode == 2 and "binary" in r.stderr and "Traceback" not in r.stderr


def test_daemon_notices_changed_records(env):
    e, t = env
    r = kb(env, "ask", "--json", "DPO NLL loss nan")
    assert json.loads(r.stdout)["results"][0]["id"] == "ms-swift-dpo-sp-nll-nan"
    shutil.rmtree(os.path.join(e["KB_INCIDENTS_DIR"], "ms-swift-dpo-sp-nll-nan"))
    r = kb(env, "ask", "--json", "DPO NLL loss nan")
    assert r.returncode in (0, 1), r.stderr  # 1 = abstained (kb ask exit codes)
    assert "ms-swift-dpo-sp-nll-nan" not in [x["id"] for x in json.loads(r.stdout)["results"]]
    info = daemon.status(t)
    assert info["reopened"] >= 1


def test_stale_socket_falls_back(env, tmp_path):
    # A socket file nobody listens on (a killed daemon) must not break the CLI.
    t = daemon.Target(tmp_path.resolve(), env[1].incidents_dir, env[1].model)
    t.run_dir.mkdir(parents=True)
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(t.socket_path))
    s.close()
    with pytest.raises(daemon.DaemonUnavailable):
        daemon.request(t, "ask", {"question": "x"})


def test_daemon_exits_when_its_code_changes(env):
    # An upgraded or edited kb must not be answered by the old code: the daemon hands over and exits.
    _, t = env
    daemon.start(t, wait_s=120)
    info = daemon.status(t)
    assert info is not None
    src = os.path.join(os.path.dirname(daemon.__file__), "daemon.py")
    st = os.stat(src)
    try:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        with pytest.raises(daemon.DaemonUnavailable, match="restarting"):
            daemon.request(t, "ask", {"question": "DPO NLL loss nan"})
    finally:
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(info["pid"]):
        time.sleep(0.1)
    assert not _alive(info["pid"])
    # A fresh one for test_stop. A daemon spawned earlier in this test may still be warming up and take the lock
    # first, so the new one exits at once; whichever it is, one must answer before the deadline.
    deadline = time.monotonic() + 120
    while daemon.status(t) is None and time.monotonic() < deadline:
        daemon.start(t, wait_s=5)
    assert daemon.status(t) is not None


def _alive(pid: int) -> bool:
    # A zombie (exited, not yet reaped by a container's init) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stop(env):
    _, t = env
    info = daemon.status(t)
    assert info is not None
    r = kb(env, "daemon", "stop")
    assert r.returncode == 0 and "stopped" in r.stdout
    assert not t.socket_path.exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _alive(info["pid"]):
            break
        time.sleep(0.1)
    else:
        pytest.fail("daemon process still alive after stop")
    r = kb(env, "ask", "--json", "DPO rpo_alpha nan")
    assert r.returncode in (0, 1), r.stderr  # 1 = abstained (kb ask exit codes)


def test_one_interpreter_by_two_names_gets_one_daemon(tmp_path, monkeypatch):
    """`kb` through a pyenv shim runs python3.11, `python -m kb` runs python: the same interpreter (same prefix),
    one daemon. A symlink to this interpreter stands in for the second name."""
    link = tmp_path / "python-by-another-name"
    link.symlink_to(sys.executable)
    t = daemon.target("/tmp/d", "/tmp/i", "")
    key = t.key
    monkeypatch.setattr(sys, "executable", str(link))
    assert t.key == key
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # another environment (a venv) gets its own daemon
    assert t.key != key
