"""What the tick remembers between runs, and where it keeps it.

Every runtime keeps the same two things: one ``JobMemory`` per job (stored as JSON, so a
DynamoDB item, an Azure Table entity or a ConfigMap key holds it as one string) and an
append-only audit log of every action. ``MemoryStore`` keeps them in a dict; the other
stores (``lambdas.sqlite_state`` and the cloud ones) implement the same ``StateStore``.
"""

from __future__ import annotations

import copy
import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


class StateStoreError(RuntimeError):
    """The state store could not be read or written. The tick makes no stop after this."""


class AuditAction(enum.StrEnum):
    STOP = "stop"
    WOULD_STOP = "would_stop"  # dry run: what a real run would have done
    STOP_FAILED = "stop_failed"
    SKIP_PROTECTED = "skip_protected"
    SKIP_CAP = "skip_cap"
    SKIP_PERSISTENCE = "skip_persistence"
    SKIP_STOPPING = "skip_stopping"  # the job is already stopping or stopped
    SKIP_INTENT = "skip_intent"  # a stop was already recorded for this job: never twice


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


@dataclass
class StopRecord:
    """A stop the tick decided on. Written before the stop call, completed after it."""

    finding_key: str
    reason: str
    intent_at: float
    done_at: float | None = None
    error: str | None = None


@dataclass
class JobMemory:
    job_key: str
    source: str
    job_id: str
    last_seen: float
    findings: dict[str, FindingMemory] = field(default_factory=dict)
    stop: StopRecord | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobMemory:
        try:
            stop = data.get("stop")
            return cls(
                job_key=data["job_key"], source=data["source"], job_id=data["job_id"],
                last_seen=float(data["last_seen"]),
                findings={k: FindingMemory(**v) for k, v in data.get("findings", {}).items()},
                stop=StopRecord(**stop) if stop else None,
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
        """Every job memory, by ``job_key``."""
        ...

    def save(self, memories: list[JobMemory]) -> None:
        """Write these memories (replacing any with the same key)."""
        ...

    def delete(self, job_keys: list[str]) -> None:
        ...

    def append_audit(self, records: list[AuditRecord]) -> None:
        ...

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        """The audit records, oldest first; of one job when ``job_key`` is given."""
        ...


class MemoryStore:
    """A ``StateStore`` in a dict, for one process. Round-trips through JSON like the others."""

    def __init__(self) -> None:
        self._jobs: dict[str, str] = {}
        self._audit: list[dict[str, Any]] = []

    def load_all(self) -> dict[str, JobMemory]:
        return {k: JobMemory.from_json(v) for k, v in self._jobs.items()}

    def save(self, memories: list[JobMemory]) -> None:
        for m in memories:
            self._jobs[m.job_key] = m.to_json()

    def delete(self, job_keys: list[str]) -> None:
        for k in job_keys:
            self._jobs.pop(k, None)

    def append_audit(self, records: list[AuditRecord]) -> None:
        self._audit.extend(copy.deepcopy(r.to_dict()) for r in records)

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        return [AuditRecord.from_dict(r) for r in self._audit
                if job_key is None or r["job_key"] == job_key]
