"""``ConfigMapStore``: the CronJob's state in one ConfigMap, so the watchdog needs no
volume and no database: one ``data`` key per job (its ``JobMemory`` as JSON) and the
recent audit records under ``audit.jsonl``.

Every write is a full ``PUT`` carrying the ``resourceVersion`` last read (RBAC grants
only ``get`` and ``update`` on this one object). When another writer got there first the
API server answers 409; the store reads the ConfigMap again and retries with its own
keys laid over the fresh data, unless the other writer changed one of the very job
memories this write carries: then two ticks are deciding about the same job, and this
one fails with ``StateConflict`` so that it stops, says and logs nothing.

A ConfigMap holds at most 1 MiB. Only jobs with something to remember have a key (a
finding, a stop, an alarm or record not yet delivered), so thousands of healthy jobs
cost nothing; only the last ``audit_keep`` audit records stay here, besides every record
of a stop, which is never dropped (the CronJob also writes every record to its log,
which cluster logging keeps). When the job memories
alone would pass the limit the write fails with ``StateStoreFull``, which says which
store to use instead; the CronJob raises it as an alarm (lambdas/k8s/cronjob.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from kubernetes import client

from trainguard.adapters.kubeflow.client import describe
from trainguard.lambdas.plugins import stores
from trainguard.lambdas.state import AuditRecord, JobMemory, StateConflict, StateStoreError

AUDIT_KEY = "audit.jsonl"
JOB_PREFIX = "job."
MAX_BYTES = 1_000_000  # the API server refuses objects over 1 MiB (etcd's limit)
_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]")
FULL_ADVICE = ("keep the state in SQLite on a persistent volume instead (the CronJob's "
               "TRAINGUARD_STATE_SQLITE=/PATH), or watch fewer jobs per deployment")


class StateStoreFull(StateStoreError):
    """The ConfigMap cannot hold the job memories: a store with room is needed."""


def data_key(job_key: str) -> str:
    """A ConfigMap key for a job (keys allow only ``-._a-zA-Z0-9``): readable, and unique
    through a hash of the full job key."""
    digest = hashlib.sha256(job_key.encode()).hexdigest()[:12]
    return f"{JOB_PREFIX}{_UNSAFE.sub('_', job_key)[:200]}.{digest}"


@stores.register("configmap")
class ConfigMapStore:
    def __init__(self, core: client.CoreV1Api, namespace: str, name: str,
                 audit_keep: int = 500, attempts: int = 5) -> None:
        self.core = core
        self.namespace, self.name = namespace, name
        self.audit_keep = audit_keep
        self.attempts = attempts
        self._obj: dict[str, Any] | None = None  # the ConfigMap as last read or written
        # each job memory's text as this view last read or wrote it: a write of it goes
        # through only while the ConfigMap still holds exactly that (compare-and-set)
        self._seen: dict[str, str] = {}

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
        self._seen = {k: v for k, v in data.items() if k.startswith(JOB_PREFIX)}
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
        texts = {k: m.to_json() for k, m in ours.items()}

        def change(data: dict[str, str]) -> None:
            data.update(texts)

        self._write("save job memory", change, self._check(ours))
        self._seen.update(texts)

    def _check(self, ours: dict[str, Any]) -> Callable[[dict[str, str]], None]:
        """Fail if a job memory this write carries is not as this view read it (another
        watchdog decided about the same job meanwhile); other keys are merged. Run on
        the data each attempt builds on, so on the fresh data after a 409 too."""
        def check(current: dict[str, str]) -> None:
            for key, m in ours.items():
                if current.get(key) != self._seen.get(key):
                    who = m.job_key if isinstance(m, JobMemory) else m
                    raise StateConflict(
                        f"{self.where}: another watchdog changed the memory of {who} "
                        "since this tick read it (resourceVersion conflict); nothing of "
                        "this write was saved")
        return check

    def delete(self, job_keys: list[str]) -> None:
        keys = {data_key(k): k for k in job_keys}

        def change(data: dict[str, str]) -> None:
            for k in keys:
                data.pop(k, None)

        if job_keys:
            self._write("delete job memory", change, self._check(keys))
            for k in keys:
                self._seen.pop(k, None)

    def append_audit(self, records: list[AuditRecord]) -> None:
        lines = {r.id: json.dumps(r.to_dict(), sort_keys=True) for r in records}

        def change(data: dict[str, str]) -> None:
            old = data.get(AUDIT_KEY, "").splitlines()
            logged = {_record_id(line) for line in old}  # written twice: kept once
            kept = old + [line for rid, line in lines.items() if rid not in logged]
            data[AUDIT_KEY] = "".join(f"{line}\n" for line in _trim(kept, self.audit_keep))

        if records:
            self._write("append to the audit log", change)

    def _write(self, what: str, change: Callable[[dict[str, str]], None],
               check: Callable[[dict[str, str]], None] | None = None) -> None:
        before = self._data()
        for _ in range(self.attempts):
            assert self._obj is not None
            if check is not None:
                check(before)
            data = dict(before)
            change(data)
            size = sum(len(k) + len(v.encode()) for k, v in data.items())
            if size > MAX_BYTES:
                audit = len(data.get(AUDIT_KEY, "").encode())
                jobs = sum(1 for k in data if k.startswith(JOB_PREFIX))
                raise StateStoreFull(
                    f"{self.where} is full: {what} would make it {size} bytes ({jobs} job "
                    f"memories, {audit} bytes of audit records), over the API server's "
                    f"1 MiB; {FULL_ADVICE}")
            body: Any = {**self._obj, "data": data}  # the whole object: labels stay
            try:
                resp: Any = self.core.replace_namespaced_config_map(
                    self.name, self.namespace, body, _preload_content=False)
                obj = json.loads(resp.data)
            except client.ApiException as e:
                if e.status != 409:
                    raise StateStoreError(f"{self.where}: cannot {what}: {describe(e)}") from e
                before = self._read()  # checked again at the top of the loop
                continue
            except Exception as e:
                raise StateStoreError(
                    f"{self.where}: cannot {what}: {type(e).__name__}: {e}") from e
            obj["data"] = dict(obj.get("data") or {})
            self._obj = obj
            return
        raise StateStoreError(f"{self.where}: cannot {what}: still conflicting with other "
                              f"writers after {self.attempts} attempts")


_KEEP_ALWAYS = {"stop", "stop_failed"}  # records of stops are never dropped here


def _trim(lines: list[str], keep: int) -> list[str]:
    """The newest ``keep`` records, but every record of a stop: older decisions go first
    (the CronJob's log keeps them all)."""
    if len(lines) <= keep:
        return lines
    stops = {i for i, line in enumerate(lines) if _action(line) in _KEEP_ALWAYS}
    room = max(keep - len(stops), 0)
    others = [i for i in range(len(lines)) if i not in stops]
    chosen = stops | set(others[len(others) - room:] if room else [])
    return [line for i, line in enumerate(lines) if i in chosen]


def _action(line: str) -> Any:
    try:
        return json.loads(line).get("action")
    except (ValueError, AttributeError):
        return None


def _record_id(line: str) -> Any:
    """The id of one logged audit record (None when it has none or is unreadable)."""
    try:
        return json.loads(line).get("id")
    except (ValueError, AttributeError):
        return None
