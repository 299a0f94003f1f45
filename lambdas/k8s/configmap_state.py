"""``ConfigMapStore``: the CronJob's state in one ConfigMap, so the watchdog needs no
volume and no database: one ``data`` key per job (its ``JobMemory`` as JSON) and the
recent audit records under ``audit.jsonl``.

Every write is a full ``PUT`` carrying the ``resourceVersion`` last read (RBAC grants
only ``get`` and ``update`` on this one object). When another writer got there first the
API server answers 409; the store reads the ConfigMap again and retries with its own
keys laid over the fresh data, except when the other writer changed a job's stop
record: then two ticks are deciding to stop the same job, and this one fails with
``StateStoreError`` so that it makes no stop (the tick never stops after a store error).

A ConfigMap holds at most 1 MiB, so only the last ``audit_keep`` audit records stay
here; the CronJob also writes every record to its log, which cluster logging keeps.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from kubernetes import client

from adapters.kubeflow.client import describe
from lambdas.state import AuditRecord, JobMemory, StateStoreError

AUDIT_KEY = "audit.jsonl"
JOB_PREFIX = "job."
MAX_BYTES = 1_000_000  # the API server refuses objects over 1 MiB (etcd's limit)
_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]")


def data_key(job_key: str) -> str:
    """A ConfigMap key for a job (keys allow only ``-._a-zA-Z0-9``): readable, and unique
    through a hash of the full job key."""
    digest = hashlib.sha256(job_key.encode()).hexdigest()[:12]
    return f"{JOB_PREFIX}{_UNSAFE.sub('_', job_key)[:200]}.{digest}"


class ConfigMapStore:
    def __init__(self, core: client.CoreV1Api, namespace: str, name: str,
                 audit_keep: int = 500, attempts: int = 5) -> None:
        self.core = core
        self.namespace, self.name = namespace, name
        self.audit_keep = audit_keep
        self.attempts = attempts
        self._obj: dict[str, Any] | None = None  # the ConfigMap as last read or written

    @classmethod
    def from_ref(cls, core: client.CoreV1Api, ref: str, **kw: Any) -> ConfigMapStore:
        """``ref`` is ``NAMESPACE/NAME``."""
        ns, _, name = ref.partition("/")
        if not ns or not name or "/" in name:
            raise ValueError(f"state ConfigMap {ref!r}: expected NAMESPACE/NAME")
        return cls(core, ns, name, **kw)

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    # -- reading -------------------------------------------------------------------
    def _read(self) -> dict[str, str]:
        try:
            resp: Any = self.core.read_namespaced_config_map(
                self.name, self.namespace, _preload_content=False)
            obj = json.loads(resp.data)
        except client.ApiException as e:
            raise StateStoreError(f"{self.where}: cannot read it: {describe(e)}") from e
        except Exception as e:
            raise StateStoreError(f"{self.where}: cannot read it: {type(e).__name__}: {e}") from e
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise StateStoreError(f"{self.where}: the API server answered with no object")
        obj["data"] = dict(obj.get("data") or {})
        self._obj = obj
        return dict(obj["data"])

    def _data(self) -> dict[str, str]:
        return dict(self._obj["data"]) if self._obj is not None else self._read()

    def load_all(self) -> dict[str, JobMemory]:
        data = self._read()  # always fresh: the resourceVersion every write builds on
        out = {}
        for key, text in data.items():
            if not key.startswith(JOB_PREFIX):
                continue
            try:
                memory = JobMemory.from_json(text)
            except StateStoreError as e:
                raise StateStoreError(f"{self.where}: key {key}: {e}") from e
            out[memory.job_key] = memory
        return out

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        records = []
        for n, line in enumerate(self._read().get(AUDIT_KEY, "").splitlines(), start=1):
            try:
                record = AuditRecord.from_dict(json.loads(line))
            except (ValueError, TypeError, KeyError) as e:
                raise StateStoreError(f"{self.where}: key {AUDIT_KEY} line {n}: {e}") from e
            if job_key is None or record.job_key == job_key:
                records.append(record)
        return records

    # -- writing -------------------------------------------------------------------
    def save(self, memories: list[JobMemory]) -> None:
        if not memories:
            return
        ours = {data_key(m.job_key): m for m in memories}

        def change(data: dict[str, str]) -> None:
            data.update({k: m.to_json() for k, m in ours.items()})

        def check(before: dict[str, str], fresh: dict[str, str]) -> None:
            for key, m in ours.items():
                if fresh.get(key) != before.get(key) and _stop(fresh.get(key)) != _stop(
                        before.get(key)):
                    raise StateStoreError(
                        f"{self.where}: another watchdog changed the stop record of "
                        f"{m.job_key} since this tick read it (resourceVersion conflict); "
                        "this tick makes no stop")

        self._write("save job memory", change, check)

    def delete(self, job_keys: list[str]) -> None:
        keys = [data_key(k) for k in job_keys]

        def change(data: dict[str, str]) -> None:
            for k in keys:
                data.pop(k, None)

        if job_keys:
            self._write("delete job memory", change)

    def append_audit(self, records: list[AuditRecord]) -> None:
        lines = [json.dumps(r.to_dict(), sort_keys=True) for r in records]

        def change(data: dict[str, str]) -> None:
            kept = data.get(AUDIT_KEY, "").splitlines() + lines
            data[AUDIT_KEY] = "".join(f"{line}\n" for line in kept[-self.audit_keep:])

        if records:
            self._write("append to the audit log", change)

    def _write(self, what: str, change: Callable[[dict[str, str]], None],
               check: Callable[[dict[str, str], dict[str, str]], None] | None = None) -> None:
        before = self._data()
        for _ in range(self.attempts):
            assert self._obj is not None
            data = dict(before)
            change(data)
            size = sum(len(k) + len(v.encode()) for k, v in data.items())
            if size > MAX_BYTES:
                raise StateStoreError(
                    f"{self.where}: cannot {what}: the data would be {size} bytes, over the "
                    f"API server's 1 MiB; lower audit_keep or keep state in SQLite on a volume")
            body: Any = {**self._obj, "data": data}  # the whole object: labels stay
            try:
                resp: Any = self.core.replace_namespaced_config_map(
                    self.name, self.namespace, body, _preload_content=False)
                obj = json.loads(resp.data)
            except client.ApiException as e:
                if e.status != 409:
                    raise StateStoreError(f"{self.where}: cannot {what}: {describe(e)}") from e
                fresh = self._read()
                if check is not None:
                    check(before, fresh)
                before = fresh
                continue
            except Exception as e:
                raise StateStoreError(
                    f"{self.where}: cannot {what}: {type(e).__name__}: {e}") from e
            obj["data"] = dict(obj.get("data") or {})
            self._obj = obj
            return
        raise StateStoreError(f"{self.where}: cannot {what}: still conflicting with other "
                              f"writers after {self.attempts} attempts")


def _stop(text: str | None) -> Any:
    """The stop record in a stored job memory (None when absent or unreadable)."""
    if text is None:
        return None
    try:
        return json.loads(text).get("stop")
    except (ValueError, AttributeError):
        return None
