"""The paste each chat thread began with, so that an answer to a question in the thread ("precision=bf16",
"symptom=nan") re-ranks that paste. In SQLite under the data dir beside the replay cache: every worker on a host
shares it, and a restart keeps open threads."""

from __future__ import annotations

import json
import time
from pathlib import Path

from api.chatops.replay import SharedSQLite

# How long a thread's paste is kept after its last message (seconds), and at most how many threads (the oldest go
# first): with the longest paste kept, a full table is at most ~80 MB of ASCII (~240 MB of Chinese).
TTL_S = 24 * 3600
MAX_ROWS = 2_000
# The longest paste kept (characters): Slack's limit for one message.
MAX_TEXT = 40_000


class ThreadMemory(SharedSQLite):
    """`remember(thread, text)` keeps a thread's paste (and forgets its answers); `recall(thread)` gives (paste,
    answers so far) or None; `answered(thread, answers)` stores the answers given so far. Threads are keyed by a
    digest of the platform's thread id; expired rows go on every write, the oldest past `max_rows`."""

    def __init__(self, path: str | Path, ttl_s: float = TTL_S, max_rows: int = MAX_ROWS) -> None:
        super().__init__(path)
        self.ttl_s, self.max_rows = ttl_s, max_rows
        self._conn().execute("CREATE TABLE IF NOT EXISTS threads (key TEXT PRIMARY KEY, text TEXT NOT NULL, "
                             "answers TEXT NOT NULL, expires REAL NOT NULL)")

    def remember(self, thread: str, text: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute("INSERT OR REPLACE INTO threads (key, text, answers, expires) VALUES (?, ?, '{}', ?)",
                      (self._digest(thread), text[:MAX_TEXT], now + self.ttl_s))
            c.execute("DELETE FROM threads WHERE expires < ?", (now,))
            (n,) = c.execute("SELECT COUNT(*) FROM threads").fetchone()
            if n > self.max_rows:
                c.execute("DELETE FROM threads WHERE key IN (SELECT key FROM threads ORDER BY expires LIMIT ?)",
                          (n - self.max_rows,))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def recall(self, thread: str, now: float | None = None) -> tuple[str, dict] | None:
        now = time.time() if now is None else now
        row = self._conn().execute("SELECT text, answers, expires FROM threads WHERE key = ?",
                                   (self._digest(thread),)).fetchone()
        if row is None or row[2] < now:
            return None
        try:
            answers = json.loads(row[1])
        except ValueError:
            answers = {}
        return row[0], answers if isinstance(answers, dict) else {}

    def answered(self, thread: str, answers: dict, now: float | None = None) -> None:
        """One UPDATE of a live thread (a paste remembered meanwhile is not overwritten with the old one)."""
        now = time.time() if now is None else now
        self._conn().execute("UPDATE threads SET answers = ?, expires = ? WHERE key = ? AND expires >= ?",
                             (json.dumps(answers, ensure_ascii=False), now + self.ttl_s, self._digest(thread), now))
