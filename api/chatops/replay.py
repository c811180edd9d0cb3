"""Replay and redelivery cache for chat requests, in SQLite under the data dir so every worker on a host shares it."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from pathlib import Path

from kb.store import use_wal

# Expired rows are purged on every PURGE_EVERY-th insert, so the table stays small without a background task.
PURGE_EVERY = 256
# How long a worker waits for another worker's lock (seconds).
TIMEOUT = 10.0


class SharedSQLite:
    """A SQLite file under the data dir that every worker on a host shares: one connection per thread (WAL,
    autocommit; callers open IMMEDIATE transactions), keys stored as digests."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=TIMEOUT, isolation_level=None, check_same_thread=True)
            use_wal(conn, TIMEOUT)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    @staticmethod
    def _digest(key: str) -> str:
        return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class ReplayCache(SharedSQLite):
    """`first_time(key, expires_at)` is True exactly once per key until the key expires, across processes.

    One INSERT OR IGNORE inside an IMMEDIATE transaction decides, so two workers racing on the same signature
    cannot both win. Size is bounded: past `max_rows`, the rows closest to expiry go first.
    """

    def __init__(self, path: str | Path, max_rows: int = 200_000) -> None:
        super().__init__(path)
        self.max_rows = max_rows
        self._inserts = 0
        c = self._conn()
        c.execute("CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, expires REAL NOT NULL)")
        c.execute("CREATE INDEX IF NOT EXISTS seen_expires ON seen (expires)")

    def first_time(self, key: str, expires_at: float, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        digest = self._digest(key)
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute("DELETE FROM seen WHERE key = ? AND expires < ?", (digest, now))
            fresh = c.execute("INSERT OR IGNORE INTO seen (key, expires) VALUES (?, ?)",
                              (digest, max(expires_at, now))).rowcount == 1
            if fresh:
                self._inserts += 1
                if self._inserts % PURGE_EVERY == 0:
                    self._purge(c, now)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return fresh

    def _purge(self, c: sqlite3.Connection, now: float) -> None:
        c.execute("DELETE FROM seen WHERE expires < ?", (now,))
        (n,) = c.execute("SELECT COUNT(*) FROM seen").fetchone()
        if n > self.max_rows:
            c.execute("DELETE FROM seen WHERE key IN (SELECT key FROM seen ORDER BY expires LIMIT ?)",
                      (n - self.max_rows,))

    def __len__(self) -> int:
        (n,) = self._conn().execute("SELECT COUNT(*) FROM seen").fetchone()
        return int(n)
