"""``SQLiteStore``: the local loop's state, in one SQLite file (WAL, so a reader such as
``trainguard`` looking at the audit log does not block the watchdog writing it)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from lambdas.state import AuditRecord, JobMemory, StateStoreError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_memory (
    job_key TEXT PRIMARY KEY,
    data TEXT NOT NULL,          -- JobMemory as JSON
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    job_key TEXT NOT NULL,
    action TEXT NOT NULL,
    data TEXT NOT NULL           -- AuditRecord as JSON
);
CREATE INDEX IF NOT EXISTS audit_log_job ON audit_log (job_key, id);
"""


class SQLiteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a recorded stop intent must survive
            self._db.executescript(_SCHEMA)
        except (sqlite3.Error, OSError) as e:
            raise StateStoreError(f"{self.path}: cannot open the state database: {e}") from e

    def close(self) -> None:
        self._db.close()

    def _fail(self, what: str, e: Exception) -> StateStoreError:
        return StateStoreError(f"{self.path}: cannot {what}: {e}")

    def load_all(self) -> dict[str, JobMemory]:
        try:
            rows = self._db.execute("SELECT job_key, data FROM job_memory").fetchall()
        except sqlite3.Error as e:
            raise self._fail("read job memory", e) from e
        return {k: JobMemory.from_json(data) for k, data in rows}

    def save(self, memories: list[JobMemory]) -> None:
        try:
            with self._db:  # one transaction: all of the tick's memory, or none of it
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR REPLACE INTO job_memory (job_key, data, last_seen) VALUES (?, ?, ?)",
                    [(m.job_key, m.to_json(), m.last_seen) for m in memories])
        except sqlite3.Error as e:
            raise self._fail("save job memory", e) from e

    def delete(self, job_keys: list[str]) -> None:
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany("DELETE FROM job_memory WHERE job_key = ?",
                                     [(k,) for k in job_keys])
        except sqlite3.Error as e:
            raise self._fail("delete job memory", e) from e

    def append_audit(self, records: list[AuditRecord]) -> None:
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT INTO audit_log (time, job_key, action, data) VALUES (?, ?, ?, ?)",
                    [(r.time, r.job_key, r.action.value, json.dumps(r.to_dict()))
                     for r in records])
        except sqlite3.Error as e:
            raise self._fail("append to the audit log", e) from e

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        try:
            if job_key is None:
                rows = self._db.execute("SELECT data FROM audit_log ORDER BY id").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT data FROM audit_log WHERE job_key = ? ORDER BY id", (job_key,)
                ).fetchall()
        except sqlite3.Error as e:
            raise self._fail("read the audit log", e) from e
        return [AuditRecord.from_dict(json.loads(data)) for (data,) in rows]
