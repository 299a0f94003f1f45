"""What the tick remembers between runs, and where it keeps it.

Every runtime keeps the same two things: one ``JobMemory`` per job (stored as JSON, so a
DynamoDB item, an Azure Table entity or a ConfigMap key holds it as one string) and an
append-only audit log of every action. ``MemoryStore`` keeps them in a dict; the other
stores (``lambdas.sqlite_state`` and the cloud ones) implement the same ``StateStore``.

Two rules every store keeps (the contract suite, tests/test_store_contract.py, holds them):

* optimistic concurrency: ``save`` and ``delete`` write a memory only if nobody changed
  it since this store object read it (a version, an ETag, a resourceVersion); otherwise
  they raise ``StateConflict`` and write nothing of that call;
* idempotent audit: appending a record whose ``id`` is already in the log adds nothing,
  so a record can be written again after a failure without being doubled.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from trainguard.lambdas.plugins import stores


class StateStoreError(RuntimeError):
    """The state store could not be read or written. The tick makes no stop after this."""


class StateConflict(StateStoreError):
    """Another tick changed a job's memory since this one read it: this one lost the race."""


def fit_key(key: str, limit: int) -> str:
    """``key`` if it fits in ``limit`` bytes (UTF-8), else its head and a SHA-256 of the
    whole: still unique and readable. The full key stays in the stored memory."""
    raw = key.encode()
    if len(raw) <= limit:
        return key
    digest = hashlib.sha256(raw).hexdigest()
    head = raw[:max(limit - len(digest) - 1, 0)].decode(errors="ignore")
    return f"{head}#{digest}"


def _new_id() -> str:
    return uuid.uuid4().hex


class AuditAction(enum.StrEnum):
    STOP = "stop"
    WOULD_STOP = "would_stop"  # dry run: what a real run would have done
    STOP_FAILED = "stop_failed"
    SKIP_PROTECTED = "skip_protected"
    SKIP_CAP = "skip_cap"
    SKIP_PERSISTENCE = "skip_persistence"
    SKIP_STOPPING = "skip_stopping"  # the job is already stopping or stopped
    SKIP_INTENT = "skip_intent"  # a stop was already recorded for this job: never twice
    SKIP_UNTRUSTED = "skip_untrusted"  # rests on signals others can write: lambdas/trust.py


@dataclass
class AuditRecord:
    time: float
    job_key: str
    job_id: str
    source: str
    finding_key: str
    rule: str
    severity: str
    action: AuditAction
    reason: str
    dry_run: bool
    id: str = field(default_factory=_new_id)  # the same record written twice counts once

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["action"] = self.action.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditRecord:
        return cls(**{**data, "action": AuditAction(data["action"])})


@dataclass
class FindingMemory:
    """One finding (by ``Finding.key``) while it keeps being seen, tick after tick."""

    key: str
    rule: str
    severity: str
    message: str
    first_seen: float
    last_seen: float
    consecutive: int = 1  # ticks in a row this finding was present
    stop_ticks: int = 0  # ticks in a row its action was "stop": what persistence counts
    alarmed_at: float | None = None  # last raise or reminder sent
    alarmed_severity: str | None = None  # the severity last raised: a worse one raises again
    last_decision: str | None = None  # "action: reason" last audited, to audit changes only
    stop_since: float | None = None  # when the run of stop-asking ticks began
    first_tick: int | None = None  # the tick clock when first seen: ``consecutive`` from it
    stop_counted_at: float | None = None  # the last tick counted in ``stop_ticks``


@dataclass
class StopRecord:
    """A stop the tick decided on. Written before the stop call, completed after it."""

    finding_key: str
    reason: str
    intent_at: float
    done_at: float | None = None
    error: str | None = None
    attempts: int = 0  # stop calls made (or being made) for this intent
    attempt_at: float | None = None  # when the last one was claimed: others keep off a while
    given_up_at: float | None = None  # too many failed attempts: alarmed, no more tries


@dataclass
class PendingAlarm:
    """An alarm decided and written down, not yet taken by every sink (write-ahead)."""

    kind: str  # raise, remind, resolve
    job_key: str
    time: float
    first_seen: float
    ticks: int
    memory: FindingMemory  # the finding as it was when the alarm was decided
    stopped: bool = False
    sent: list[str] = field(default_factory=list)  # sinks that took it
    id: str = field(default_factory=_new_id)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PendingAlarm:
        return cls(**{**data, "memory": FindingMemory(**data["memory"])})


@dataclass
class JobMemory:
    job_key: str
    source: str
    job_id: str
    last_seen: float
    findings: dict[str, FindingMemory] = field(default_factory=dict)
    stop: StopRecord | None = None
    outbox: list[PendingAlarm] = field(default_factory=list)  # alarms not yet said
    audit_outbox: list[AuditRecord] = field(default_factory=list)  # records not yet logged
    ticks: int = 0  # on the tick clock's own memory only: the ticks saved so far
    gaps: list[float] = field(default_factory=list)  # the clock's: seconds between its ticks

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["audit_outbox"] = [r.to_dict() for r in self.audit_outbox]
        return out

    @property
    def empty(self) -> bool:
        """Nothing worth keeping: no finding, no stop, nothing left to say or log."""
        return not (self.findings or self.stop or self.outbox or self.audit_outbox)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobMemory:
        try:
            stop = data.get("stop")
            return cls(
                job_key=data["job_key"], source=data["source"], job_id=data["job_id"],
                last_seen=float(data["last_seen"]),
                findings={k: FindingMemory(**v) for k, v in data.get("findings", {}).items()},
                stop=StopRecord(**stop) if stop else None,
                outbox=[PendingAlarm.from_dict(a) for a in data.get("outbox", [])],
                audit_outbox=[AuditRecord.from_dict(r) for r in data.get("audit_outbox", [])],
                ticks=int(data.get("ticks", 0)),
                gaps=[float(g) for g in data.get("gaps", [])],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise StateStoreError(f"job memory {data.get('job_key')!r} is malformed: {e}") from e

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobMemory:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise StateStoreError(f"job memory is not JSON: {e}") from e
        return cls.from_dict(data)


class StateStore(Protocol):
    """Per-job memory and the audit log. Every method raises ``StateStoreError`` on failure."""

    def load_all(self) -> dict[str, JobMemory]:
        """Every job memory, by ``job_key``; remembers the version of each."""
        ...

    def save(self, memories: list[JobMemory]) -> None:
        """Write these memories (replacing any with the same key), each only if it is
        unchanged since this store read or wrote it; else ``StateConflict``."""
        ...

    def delete(self, job_keys: list[str]) -> None:
        """Delete these memories, under the same condition as ``save``."""
        ...

    def append_audit(self, records: list[AuditRecord]) -> None:
        """Append records; one whose ``id`` is already logged is not added again."""
        ...

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        """The audit records, oldest first; of one job when ``job_key`` is given."""
        ...


@stores.register("memory")
class MemoryStore:
    """A ``StateStore`` in a dict, for one process. Round-trips through JSON like the others.
    ``MemoryStore(shared=other)`` is a second view of ``other``'s data, with its own
    versions read: two ticks overlapping in one process each hold one."""

    def __init__(self, shared: MemoryStore | None = None) -> None:
        # job_key -> (version, JSON): the versioned data every view shares
        self._jobs: dict[str, tuple[int, str]] = shared._jobs if shared else {}
        self._audit: list[dict[str, Any]] = shared._audit if shared else []
        self._ids: set[str] = shared._ids if shared else set()
        self._versions: dict[str, int] = {}  # what this view last read or wrote

    def load_all(self) -> dict[str, JobMemory]:
        self._versions = {k: v for k, (v, _) in self._jobs.items()}
        return {k: JobMemory.from_json(text) for k, (_, text) in self._jobs.items()}

    def _check(self, keys: list[str]) -> None:
        for k in keys:
            if self._jobs.get(k, (0, ""))[0] != self._versions.get(k, 0):
                raise StateConflict(f"memory of {k!r} changed since this tick read it")

    def save(self, memories: list[JobMemory]) -> None:
        self._check([m.job_key for m in memories])  # all or nothing
        for m in memories:
            version = self._versions.get(m.job_key, 0) + 1
            self._jobs[m.job_key] = (version, m.to_json())
            self._versions[m.job_key] = version

    def delete(self, job_keys: list[str]) -> None:
        self._check(job_keys)
        for k in job_keys:
            self._jobs.pop(k, None)
            self._versions.pop(k, None)

    def append_audit(self, records: list[AuditRecord]) -> None:
        for r in records:
            if r.id not in self._ids:
                self._ids.add(r.id)
                self._audit.append(copy.deepcopy(r.to_dict()))

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        return [AuditRecord.from_dict(r) for r in self._audit
                if job_key is None or r["job_key"] == job_key]
