"""A local answer daemon: one warm KnowledgeBase answering ask/diagnose over a Unix socket in the data dir.

A cold `kb ask` pays for the interpreter, the embedding model, the jieba dictionary and the index (seconds);
the daemon pays once and later calls pay one socket round trip, as dmypy and the Gradle daemon do. Clients
fall back to answering in-process when none runs. Staleness: before each request the daemon compares a
stamp of the records (incident files, store, published index) and of its own code with the one it
answered from; changed records reopen the knowledge base, changed code makes it exit so a fresh one starts.

This module's top level imports only the standard library: the client side runs in a cold CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

PROTOCOL = 1
# An idle daemon exits after this many seconds (env KB_DAEMON_IDLE); a forgotten one costs no more than that.
DEFAULT_IDLE_S = 900.0
# Unix socket paths are limited to ~107 bytes; longer data dirs put the socket in the temp dir instead.
_MAX_SOCK_PATH = 100
_PACKAGE_DIR = Path(__file__).resolve().parent


class Target:
    """Which knowledge base a daemon serves; clients with the same target share one daemon."""

    # A plain class, not a dataclass: importing dataclasses (and inspect) costs a thin client ~10 ms.
    def __init__(self, data_dir: Path, incidents_dir: Path, model: str) -> None:
        self.data_dir = data_dir
        self.incidents_dir = incidents_dir
        self.model = model  # as given (flag or KB_EMBED_MODEL); "" = the library default

    @property
    def key(self) -> str:
        # The interpreter and package location are part of the key: another checkout or venv gets its own
        # daemon instead of answers from code it does not run. The interpreter by its real path and prefix:
        # `kb` run through a pyenv shim is python3.11 and `python -m kb` is python, the same interpreter.
        raw = (f"{self.incidents_dir}|{self.model}|{_PACKAGE_DIR}|{os.path.realpath(sys.executable)}|"
               f"{sys.prefix}|{PROTOCOL}")
        return hashlib.sha1(raw.encode()).hexdigest()[:12]

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "daemon"

    @property
    def socket_path(self) -> Path:
        p = self.run_dir / f"{self.key}.sock"
        if len(str(p)) <= _MAX_SOCK_PATH:
            return p
        import tempfile

        h = hashlib.sha1(f"{self.data_dir}|{self.key}".encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"kb-{os.getuid()}-{h}.sock"

    @property
    def info_path(self) -> Path:
        return self.run_dir / f"{self.key}.json"

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.key}.log"


def target(data_dir: str | os.PathLike | None = None, incidents_dir: str | os.PathLike | None = None,
           model: str | None = None) -> Target:
    from kb import paths

    return Target(paths.data_dir(data_dir), paths.incidents_dir(incidents_dir),
                  model or os.environ.get("KB_EMBED_MODEL", ""))


# ---------------------------------------------------------------- stamps (staleness)
def _stat_key(p: Path) -> str:
    try:
        st = p.stat()
        return f"{st.st_mtime_ns}:{st.st_size}"
    except OSError:
        return "-"


def records_stamp(t: Target) -> str:
    """Cheap (stat-only) fingerprint of everything an answer depends on besides code: the curated incident
    files, the record store and the published index. Any edit, ingest or rebuild changes it."""
    h = hashlib.sha1()
    try:
        entries = sorted(os.scandir(t.incidents_dir), key=lambda e: e.name)
    except OSError:
        entries = []
    for e in entries:
        if e.is_dir():
            p = Path(e.path)
            h.update(f"{e.name}={_stat_key(p / 'incident.md')};".encode())
    for name in ("store.sqlite", "store.sqlite-wal"):
        h.update(f"{name}={_stat_key(t.data_dir / name)};".encode())
    try:
        h.update((t.data_dir / "index" / "CURRENT").read_bytes())
    except OSError:
        h.update(b"no-index")
    return h.hexdigest()


def code_stamp() -> str:
    """Fingerprint of the kb package's source: an upgraded or edited install must not be answered by old code."""
    h = hashlib.sha1()
    for p in sorted(_PACKAGE_DIR.rglob("*")):
        if p.suffix in (".py", ".yaml", ".yml", ".json", ".md") and "__pycache__" not in p.parts:
            h.update(f"{p.relative_to(_PACKAGE_DIR)}={_stat_key(p)};".encode())
    return h.hexdigest()


# ---------------------------------------------------------------- wire format
def _send(sock: socket.socket, obj: object) -> None:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv(sock: socket.socket) -> dict:
    head = _recv_exact(sock, 4)
    (n,) = struct.unpack("!I", head)
    return json.loads(_recv_exact(sock, n).decode("utf-8"))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("daemon closed the connection")
        buf += chunk
    return bytes(buf)


# ---------------------------------------------------------------- client
class DaemonUnavailable(Exception):
    """No daemon answered (none running, stale, or it asked to be restarted): answer in-process instead."""


def request(t: Target, op: str, params: dict | None = None, timeout: float = 300.0) -> object:
    """Send one request; the daemon's result, a KBError re-raised with its message and exit code, or
    DaemonUnavailable when no daemon can answer."""
    path = t.socket_path
    if not path.exists():
        raise DaemonUnavailable("no daemon")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(2.0)
        s.connect(str(path))
        s.settimeout(timeout)
        _send(s, {"v": PROTOCOL, "op": op, "params": params or {}})
        reply = _recv(s)
    except (OSError, ConnectionError, ValueError) as e:
        raise DaemonUnavailable(f"{type(e).__name__}: {e}") from None
    finally:
        s.close()
    if reply.get("restart"):
        raise DaemonUnavailable("daemon is restarting (code changed)")
    if reply.get("ok"):
        return reply.get("result")
    err = reply.get("error") or {}
    if err.get("kb"):
        from kb.errors import KBError

        e = KBError(err.get("message", "error"))
        e.exit_code = int(err.get("exit_code", 2))
        e.code = err.get("code", "bad_request")
        raise e
    raise DaemonUnavailable(f"daemon failed: {err.get('message', '?')}")


def status(t: Target) -> dict | None:
    """The running daemon's info (pid, uptime, requests, ...) or None."""
    try:
        return request(t, "ping", timeout=5.0)
    except DaemonUnavailable:
        return None


def stop(t: Target, wait_s: float = 10.0) -> bool:
    """Ask the daemon to exit; True when one was running."""
    try:
        request(t, "stop", timeout=5.0)
    except DaemonUnavailable:
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and t.socket_path.exists():
        time.sleep(0.05)
    return True


def all_daemons(data_dir: Path) -> list[dict]:
    """Info files of the daemons started for this data dir (any target), live or not."""
    out = []
    for p in sorted((data_dir / "daemon").glob("*.json")):
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return out


def _private_dir(path: Path) -> None:
    # Only the owner may reach the socket: it answers with the whole knowledge base.
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def start(t: Target, wait_s: float = 0.0) -> int:
    """Start a detached daemon for `t` (a no-op race-wise: a second one exits on the lock); returns its pid.
    With wait_s > 0, wait until it answers."""
    import subprocess

    _private_dir(t.run_dir)
    cmd = [sys.executable, "-m", "kb.daemon", "--data-dir", str(t.data_dir),
           "--incidents-dir", str(t.incidents_dir), "--model", t.model]
    env = dict(os.environ)
    # The daemon must import this very package (a worktree on PYTHONPATH, not some other install).
    env["PYTHONPATH"] = os.pathsep.join([str(_PACKAGE_DIR.parent), *filter(None, [env.get("PYTHONPATH")])])
    with open(t.log_path, "ab") as log:
        # cwd: the run dir, so that a long-lived daemon does not keep the user's working directory busy.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=t.run_dir,
                                start_new_session=True, close_fds=True)
    deadline = time.monotonic() + wait_s
    while wait_s > 0 and time.monotonic() < deadline:
        if status(t) is not None:
            break
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    return proc.pid


# ---------------------------------------------------------------- server
class _Server:
    def __init__(self, t: Target, idle_s: float) -> None:
        import threading

        self.t = t
        self.idle_s = idle_s
        self.lock = threading.Lock()
        self.code = code_stamp()
        self.stamp = ""
        self.kb = None
        self.started = time.time()
        self.last = time.monotonic()
        self.requests = 0
        self.reopened = 0
        self.stopping = threading.Event()
        self.sock: socket.socket | None = None
        self.sock_ino = 0

    # The knowledge base is reopened whenever the records stamp moves; the embedder and jieba stay loaded
    # (process-wide caches), so a reopen costs reading records, not models.
    def _kb(self):
        stamp = records_stamp(self.t)
        if self.kb is None or stamp != self.stamp:
            from kb.kb import KnowledgeBase

            kb = KnowledgeBase.open(self.t.data_dir, self.t.incidents_dir, self.t.model or None)
            kb.build_index()
            self.reopened += self.kb is not None
            self.kb, self.stamp = kb, records_stamp(self.t)
        return self.kb

    def warm(self) -> None:
        from kb.tokenize import tokenize

        kb = self._kb()
        kb.ask("loss nan warm up")
        tokenize("损失 预热")
        try:
            kb.diagnose(text="loss: nan")
        except Exception as e:  # noqa: BLE001 - warming is best effort; the real request reports errors
            print(f"warm-up diagnose failed: {e}", file=sys.stderr)

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if req.get("v") != PROTOCOL:
            return {"ok": False, "error": {"message": f"protocol {req.get('v')} != {PROTOCOL}"}}
        if op == "ping":
            return {"ok": True, "result": self.info()}
        if op == "stop":
            self.stopping.set()
            return {"ok": True, "result": {"stopping": True}}
        if code_stamp() != self.code:
            self.stopping.set()
            return {"restart": True}
        p = req.get("params") or {}
        from kb.errors import KBError

        try:
            with self.lock:
                kb = self._kb()
                if op == "ask":
                    res = kb.ask(str(p.get("question", "")), k=int(p.get("k", 5)), filters=p.get("filters") or None)
                elif op == "diagnose":
                    res = kb.diagnose(**_diagnose_args(p))
                else:
                    return {"ok": False, "error": {"message": f"unknown op {op!r}"}}
                self.requests += 1
            return {"ok": True, "result": res.model_dump(mode="json")}
        except KBError as e:
            return {"ok": False, "error": {"kb": True, "message": str(e), "exit_code": e.exit_code,
                                           "code": e.code}}

    def info(self) -> dict:
        import resource

        return {"pid": os.getpid(), "key": self.t.key, "data_dir": str(self.t.data_dir),
                "incidents_dir": str(self.t.incidents_dir), "model": self.t.model or "(default)",
                "socket": str(self.t.socket_path), "uptime_s": round(time.time() - self.started, 1),
                "requests": self.requests, "reopened": self.reopened, "idle_exit_s": self.idle_s,
                "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}

    def _serve_conn(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30.0)
            req = _recv(conn)
            conn.settimeout(None)
            try:
                reply = self.handle(req)
            except Exception as e:  # noqa: BLE001 - a bug must reach the client as a fallback, not kill us
                reply = {"ok": False, "error": {"message": f"{type(e).__name__}: {e}"}}
            _send(conn, reply)
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            conn.close()
            self.last = time.monotonic()

    def _still_ours(self) -> bool:
        try:
            return self.t.socket_path.stat().st_ino == self.sock_ino
        except OSError:
            return False

    def run(self) -> None:
        path = self.t.socket_path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path.unlink(missing_ok=True)
        self.sock.bind(str(path))
        os.chmod(path, 0o600)
        self.sock_ino = path.stat().st_ino
        self.sock.listen(64)
        self.sock.settimeout(1.0)
        self.t.info_path.write_text(json.dumps(self.info()), encoding="utf-8")
        try:
            while not self.stopping.is_set():
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    # Exit when idle, or when someone removed / replaced our socket (data dir deleted, a
                    # newer daemon took over): nobody can reach us any more.
                    if time.monotonic() - self.last > self.idle_s or not self._still_ours():
                        break
                    continue
                self.last = time.monotonic()
                import threading

                threading.Thread(target=self._serve_conn, args=(conn,), daemon=True).start()
        finally:
            self.sock.close()
            if self._still_ours():
                path.unlink(missing_ok=True)
            self.t.info_path.unlink(missing_ok=True)


def _diagnose_args(p: dict) -> dict:
    """Decode the raw inputs a client sent (bytes, base64) with the library's own text check."""
    import base64

    from kb.facts import check_text

    def dec(item):
        if not item:
            return None
        name, b64 = item
        return check_text(base64.b64decode(b64), name)

    texts = [dec(x) for x in p.get("files") or []]
    return {"log": dec(p.get("log")), "config": dec(p.get("config")), "question": p.get("question"),
            "text": "\n".join(texts) if texts else None, "k": int(p.get("k", 3))}


def serve(t: Target, idle_s: float | None = None) -> int:
    """Run the daemon in this process until stopped, idle or orphaned; 0, or 1 when another one holds the lock."""
    import fcntl

    _private_dir(t.run_dir)
    lock = open(t.run_dir / f"{t.key}.lock", "w")  # noqa: SIM115 - held for the process lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("another daemon already serves this target", file=sys.stderr)
        return 1
    if idle_s is None:
        try:
            idle_s = float(os.environ.get("KB_DAEMON_IDLE", DEFAULT_IDLE_S))
        except ValueError:
            idle_s = DEFAULT_IDLE_S
    srv = _Server(t, idle_s)
    t0 = time.perf_counter()
    srv.warm()
    print(f"kb daemon {os.getpid()} warm in {time.perf_counter() - t0:.2f}s on {t.socket_path}",
          file=sys.stderr, flush=True)
    srv.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kb.daemon", description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir")
    ap.add_argument("--incidents-dir")
    ap.add_argument("--model", default="")
    ap.add_argument("--idle", type=float, default=None, help="exit after this many idle seconds")
    a = ap.parse_args(argv)
    return serve(target(a.data_dir, a.incidents_dir, a.model), a.idle)


if __name__ == "__main__":
    sys.exit(main())
