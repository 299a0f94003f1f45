"""``SQLiteStore``: the local loop's state, in one SQLite file (WAL, so a reader such as
``trainguard`` looking at the audit log does not block the watchdog writing it).

Two watchers on one file hold each other off as the cloud stores do: every job memory
carries a ``version``, and ``save``/``delete`` check that each memory is still at the
version this store read, then write, in one ``BEGIN IMMEDIATE`` transaction (the write
lock is taken before the check, so no other writer slips in between). A memory changed
meanwhile raises ``StateConflict`` and nothing of that call is written: the tick that
loses the race stops nothing. Audit records carry their id under a unique index, so a
record appended twice is logged once."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from trainguard.lambdas.plugins import stores
from trainguard.lambdas.state import AuditRecord, JobMemory, StateConflict, StateStoreError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_memory (
    job_key TEXT PRIMARY KEY,
    data TEXT NOT NULL,          -- JobMemory as JSON
    last_seen REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    job_key TEXT NOT NULL,
    action TEXT NOT NULL,
    data TEXT NOT NULL,          -- AuditRecord as JSON
    rid TEXT                     -- AuditRecord.id
);
CREATE INDEX IF NOT EXISTS audit_log_job ON audit_log (job_key, id);
"""
# Files written before versions and record ids get the columns they lack.
_MIGRATIONS = {
    ("job_memory", "version"): "ALTER TABLE job_memory ADD COLUMN version INTEGER NOT NULL "
                               "DEFAULT 1",
    ("audit_log", "rid"): "ALTER TABLE audit_log ADD COLUMN rid TEXT",
}
_OPEN_ATTEMPTS = 50  # tries to switch a new file to WAL while another opens it
_RID_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS audit_log_rid ON audit_log (rid)"


@stores.register("sqlite")
class SQLiteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._versions: dict[str, int] = {}  # job_key -> version last read or written
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            self._db.execute("PRAGMA synchronous=FULL")  # a recorded stop intent must survive
            self._prepare()
        except (sqlite3.Error, OSError) as e:
            raise StateStoreError(f"{self.path}: cannot open the state database: {e}") from e

    def _prepare(self) -> None:
        """WAL mode, tables and migrations, safe when two watchers open one new file at
        once: switching to WAL may answer "locked" without waiting (SQLite does not call
        the busy handler there), so it is retried; the schema and migrations are one
        IMMEDIATE transaction, so two cannot both add a column."""
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == _OPEN_ATTEMPTS - 1:
                    raise
                time.sleep(0.02 * (attempt + 1))
        self._db.execute("BEGIN IMMEDIATE")  # waits up to the connection's timeout
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            for (table, column), sql in _MIGRATIONS.items():
                columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in columns:
                    self._db.execute(sql)
            self._db.execute(_RID_INDEX)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()

    def _fail(self, what: str, e: Exception) -> StateStoreError:
        return StateStoreError(f"{self.path}: cannot {what}: {e}")

    def load_all(self) -> dict[str, JobMemory]:
        try:
            rows = self._db.execute("SELECT job_key, data, version FROM job_memory").fetchall()
        except sqlite3.Error as e:
            raise self._fail("read job memory", e) from e
        self._versions = {k: int(v) for k, _, v in rows}
        return {k: JobMemory.from_json(data) for k, data, _ in rows}

    def _check(self, keys: list[str]) -> None:
        """Inside the write transaction: every key still at the version this store knows
        (absent if it never saw it)."""
        for key in keys:
            row = self._db.execute("SELECT version FROM job_memory WHERE job_key = ?",
                                   (key,)).fetchone()
            found = int(row[0]) if row else None
            if found != self._versions.get(key):
                raise StateConflict(
                    f"{self.path}: the memory of job {key!r} was changed by another watchdog "
                    f"since this one read it (version {self._versions.get(key)} read, "
                    f"{found} now); nothing of this write was saved")

    def save(self, memories: list[JobMemory]) -> None:
        if not memories:
            return
        latest = {m.job_key: m for m in memories}
        versions = {k: self._versions.get(k, 0) + 1 for k in latest}
        try:
            with self._db:  # one transaction: all of these memories, or none of them
                self._db.execute("BEGIN IMMEDIATE")
                self._check(list(latest))
                self._db.executemany(
                    "INSERT OR REPLACE INTO job_memory (job_key, data, last_seen, version) "
                    "VALUES (?, ?, ?, ?)",
                    [(k, m.to_json(), m.last_seen, versions[k]) for k, m in latest.items()])
        except sqlite3.Error as e:
            raise self._fail("save job memory", e) from e
        self._versions.update(versions)

    def delete(self, job_keys: list[str]) -> None:
        if not job_keys:
            return
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._check(job_keys)
                self._db.executemany("DELETE FROM job_memory WHERE job_key = ?",
                                     [(k,) for k in job_keys])
        except sqlite3.Error as e:
            raise self._fail("delete job memory", e) from e
        for k in job_keys:
            self._versions.pop(k, None)

    def append_audit(self, records: list[AuditRecord]) -> None:
        if not records:
            return
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR IGNORE INTO audit_log (time, job_key, action, data, rid) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(r.time, r.job_key, r.action.value, json.dumps(r.to_dict()), r.id)
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
