"""``TableStore``: the Azure Function's state in Azure Table Storage (azure-data-tables).

One table holds two kinds of entity:

- job memory: PartitionKey ``job``, RowKey the job key (escaped: RowKeys may not hold
  ``/ \\ # ?``), the ``JobMemory`` JSON in ``data`` (split over ``data1``, ``data2``... when
  longer than a string property may be);
- audit records: PartitionKey ``audit``, RowKey the record's time and id (so they list
  oldest first, and a record written twice, a retry after a failure, is one entity: it
  is upserted), the ``AuditRecord`` JSON in ``data`` and ``job_key``, ``action`` and
  ``rule`` beside it for filtering in Storage Explorer.

A key longer than a RowKey may be (1 KiB) is cut and hashed; the full key stays in the
entity's ``job_key`` and in the memory's JSON.

Optimistic concurrency keeps two overlapping runs (a past-due timer beside a fresh one,
two slots) from both stopping a job: every memory is written with the ETag this store
read it with (a new one is inserted, never overwritten), in one transaction per 100 jobs.
If another run wrote any of them meanwhile, the write fails as a whole with a
``StateStoreError`` naming the job, so the tick makes no stop; the run that wrote first
owns the stop intent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from trainguard.lambdas.plugins import stores
from trainguard.lambdas.state import AuditRecord, JobMemory, StateConflict, StateStoreError

JOB, AUDIT = "job", "audit"
BATCH = 100  # operations per Table transaction (the service's limit)
CHUNK = 30_000  # characters per string property (the limit is 64 KiB of UTF-16)
KEY_MAX = 500  # characters in a RowKey: the limit is 1 KiB, counted in UTF-16
#: Not allowed in a PartitionKey or RowKey; ``%`` is escaped too so the escape reverses.
_UNSAFE = re.compile(r"[/\\#?%\x00-\x1f\x7f-\x9f]")
#: Status codes that mean "another writer got there first".
_CONFLICT = {404: "was deleted", 409: "was created", 412: "was changed"}

T = TypeVar("T")


def row_key(job_key: str) -> str:
    """``job_key`` escaped for a RowKey; cut and hashed when longer than one may be."""
    escaped = _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", job_key)
    if len(escaped) <= KEY_MAX:
        return escaped
    digest = hashlib.sha256(job_key.encode()).hexdigest()
    return f"{escaped[:KEY_MAX - len(digest) - 1]}~{digest}"


@stores.register("table")
class TableStore:
    """A ``StateStore`` on one Azure Table. Build it with ``from_connection_string``
    (Azurite, local runs) or ``from_table_url`` (a managed identity in Azure)."""

    def __init__(self, client: TableClient, create: bool = True) -> None:
        self.client = client
        self.where = f"{client.url.rstrip('/')}/{client.table_name}"
        self._etags: dict[str, str] = {}  # job key -> ETag last read or written here
        if create:
            self._call("create the table", self._create)

    @classmethod
    def from_connection_string(cls, connection: str, table: str, retries: int = 3,
                               backoff: float = 0.8, timeout: float = 20.0) -> TableStore:
        try:
            client = TableClient.from_connection_string(
                connection, table, **_transport(retries, backoff, timeout))
        except ValueError as e:  # a malformed connection string
            raise StateStoreError(f"state table {table!r}: bad connection string: {e}") from e
        return cls(client)

    @classmethod
    def from_table_url(cls, url: str, credential: TokenCredential, retries: int = 3,
                       backoff: float = 0.8, timeout: float = 20.0) -> TableStore:
        """``url`` is the table's URL, ``https://ACCOUNT.table.core.windows.net/TABLE``."""
        parts = urlsplit(url)
        *account, table = parts.path.strip("/").split("/")
        if parts.scheme != "https" or not parts.netloc or not table:
            raise StateStoreError(f"state table URL {url!r} is not "
                                  "https://ACCOUNT.table.core.windows.net/TABLE")
        endpoint = "/".join([f"https://{parts.netloc}", *account])  # path-style keeps its account
        try:
            client = TableClient(endpoint, table, credential=credential,
                                 **_transport(retries, backoff, timeout))
        except ValueError as e:
            raise StateStoreError(f"state table URL {url!r}: {e}") from e
        return cls(client)

    def close(self) -> None:
        self.client.close()

    # --- StateStore ---------------------------------------------------------------------

    def load_all(self) -> dict[str, JobMemory]:
        entities = self._call("read job memory", lambda: list(
            self.client.query_entities("PartitionKey eq @pk", parameters={"pk": JOB})))
        out: dict[str, JobMemory] = {}
        etags: dict[str, str] = {}
        for e in entities:
            memory = JobMemory.from_json(_joined(e))
            out[memory.job_key] = memory
            etag = e.metadata.get("etag")
            if etag:
                etags[memory.job_key] = etag
        self._etags = etags
        return out

    def save(self, memories: list[JobMemory]) -> None:
        latest = {m.job_key: m for m in memories}  # one operation per entity in a batch
        ops: list[tuple[str, tuple[Any, ...]]] = []
        for key, m in latest.items():
            entity = {"PartitionKey": JOB, "RowKey": row_key(key), "job_key": key,
                      "last_seen": m.last_seen, **_split(m.to_json())}
            etag = self._etags.get(key)
            if etag is None:  # never seen here: insert, so a concurrent insert conflicts
                ops.append((key, ("create", entity)))
            else:
                ops.append((key, ("update", entity, {
                    "mode": UpdateMode.REPLACE, "etag": etag,
                    "match_condition": MatchConditions.IfNotModified})))
        for i in range(0, len(ops), BATCH):
            batch = ops[i:i + BATCH]
            results = self._transaction("save job memory", batch)
            for (key, _), meta in zip(batch, results, strict=True):
                self._etags[key] = meta["etag"]

    def delete(self, job_keys: list[str]) -> None:
        for key in job_keys:
            etag = self._etags.pop(key, None)
            kwargs: dict[str, Any] = ({"etag": etag, "match_condition":
                                       MatchConditions.IfNotModified} if etag else {})

            def one(key: str = key, kwargs: dict[str, Any] = kwargs) -> None:
                try:
                    self.client.delete_entity(JOB, row_key(key), **kwargs)
                except ResourceNotFoundError:
                    pass  # already gone: what we wanted
                except HttpResponseError as e:
                    conflict = self._conflict(key, e)
                    if conflict is None:
                        raise
                    raise conflict from e

            self._call(f"delete job memory {key!r}", one)

    def append_audit(self, records: list[AuditRecord]) -> None:
        by_key: dict[str, tuple[str, tuple[Any, ...]]] = {}
        for r in records:  # one operation per entity in a batch
            rk = row_key(f"{r.time:017.6f}-{r.id}")
            entity = {"PartitionKey": AUDIT, "RowKey": rk,
                      "job_key": r.job_key, "action": r.action.value, "rule": r.rule,
                      "time": r.time, "data": json.dumps(r.to_dict())}
            by_key[rk] = (r.job_key, ("upsert", entity, {"mode": UpdateMode.REPLACE}))
        ops = list(by_key.values())
        for i in range(0, len(ops), BATCH):
            self._transaction("append to the audit log", ops[i:i + BATCH])

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        query, params = "PartitionKey eq @pk", {"pk": AUDIT}
        if job_key is not None:
            query, params = query + " and job_key eq @key", {**params, "key": job_key}
        entities = self._call("read the audit log", lambda: list(
            self.client.query_entities(query, parameters=params)))
        entities.sort(key=lambda e: str(e["RowKey"]))
        return [AuditRecord.from_dict(json.loads(e["data"])) for e in entities]

    # --- helpers ------------------------------------------------------------------------

    def _create(self) -> None:
        with contextlib.suppress(ResourceExistsError):  # made by the stack, or a run before
            self.client.create_table()

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except StateStoreError:
            raise
        except AzureError as e:
            raise StateStoreError(f"state table {self.where}: cannot {what}: "
                                  f"{type(e).__name__}: {_first_line(e)}") from e

    def _transaction(self, what: str, ops: list[tuple[str, tuple[Any, ...]]]
                     ) -> list[Any]:
        def submit() -> list[Any]:
            try:
                return list(self.client.submit_transaction([op for _, op in ops]))
            except TableTransactionError as e:
                key = ops[e.index][0] if 0 <= e.index < len(ops) else ops[0][0]
                conflict = self._conflict(key, e)
                if conflict is None:
                    raise
                raise conflict from e

        return self._call(what, submit)

    def _conflict(self, key: str, e: HttpResponseError) -> StateConflict | None:
        how = _CONFLICT.get(e.status_code or 0)
        if how is None:
            return None
        return StateConflict(
            f"state table {self.where}: the memory of job {key!r} {how} by another watchdog "
            f"run since this run read it (ETag conflict, HTTP {e.status_code}); nothing of "
            "this run was saved and it makes no stop")


def _transport(retries: int, backoff: float, timeout: float) -> dict[str, Any]:
    return {"retry_total": retries, "retry_backoff_factor": backoff,
            "connection_timeout": timeout, "read_timeout": timeout}


def _split(text: str) -> dict[str, Any]:
    parts = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    out: dict[str, Any] = {"parts": len(parts), "data": parts[0]}
    out.update({f"data{i}": p for i, p in enumerate(parts[1:], start=1)})
    return out


def _joined(entity: dict[str, Any]) -> str:
    try:
        parts = int(entity.get("parts", 1))
        return "".join(str(entity["data" if i == 0 else f"data{i}"]) for i in range(parts))
    except (KeyError, TypeError, ValueError) as e:
        raise StateStoreError(f"job memory entity {entity.get('RowKey')!r} is malformed: "
                              f"missing or bad {e}") from e


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else ""

