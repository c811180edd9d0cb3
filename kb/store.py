"""SQLite record store under the data dir: ingested records survive restarts; every write is one transaction."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

from kb.records import Incident

# How long a connection waits for another one's lock (seconds).
CONNECT_TIMEOUT = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY,
    origin TEXT NOT NULL,
    json TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    sha TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def use_wal(con: sqlite3.Connection, timeout: float) -> None:
    """Switch `con`'s database to WAL, waiting up to `timeout` seconds for other connections. Several processes
    opening a fresh database at once each need an exclusive lock for the switch; SQLite answers one of two such
    connections "database is locked" at once, without its busy wait (it would deadlock), so that answer is retried
    here. A database already in WAL needs no lock."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            con.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def record_sha(inc: Incident) -> str:
    return hashlib.sha256(inc.model_dump_json().encode()).hexdigest()


class RecordStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # WAL lets the API read while an ingest writes; each connection is short-lived and per-call.
        with self._connect() as con:
            use_wal(con, CONNECT_TIMEOUT)
            con.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=CONNECT_TIMEOUT, isolation_level=None)

    def upsert(self, inc: Incident, source: str = "") -> str:
        """Insert or update; returns 'created', 'updated' or 'unchanged'."""
        sha = record_sha(inc)
        now = time.time()
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            row = con.execute("SELECT sha FROM records WHERE id=?", (inc.id,)).fetchone()
            if row and row[0] == sha:
                con.execute("COMMIT")
                return "unchanged"
            if row:
                con.execute("UPDATE records SET origin=?, json=?, source=?, sha=?, updated_at=? WHERE id=?",
                            (inc.origin, inc.model_dump_json(), source, sha, now, inc.id))
            else:
                con.execute("INSERT INTO records VALUES (?,?,?,?,?,?,?)",
                            (inc.id, inc.origin, inc.model_dump_json(), source, sha, now, now))
            con.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (str(now),))
            con.execute("COMMIT")
            return "updated" if row else "created"
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.close()

    def delete(self, record_id: str) -> bool:
        with self._connect() as con:
            cur = con.execute("DELETE FROM records WHERE id=?", (record_id,))
            con.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (str(time.time()),))
            return cur.rowcount > 0

    def all(self) -> list[Incident]:
        con = self._connect()
        try:
            rows = con.execute("SELECT json FROM records ORDER BY id").fetchall()
        finally:
            con.close()
        return [Incident.model_validate(json.loads(r[0])) for r in rows]

    def generation(self) -> str:
        con = self._connect()
        try:
            row = con.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
        finally:
            con.close()
        return row[0] if row else "0"
