"""What the event-driven invocations left in the state table, folded into the scheduled
tick: log lines added to their jobs (``TickSource``) and log alarms already sent added to
the tick's memory (``SeededStore``), so the tick neither misses nor repeats them."""

from __future__ import annotations

from typing import Any

from trainguard.adapters.sagemaker import SageMakerAdapter
from trainguard.checker.model import Job, LogLine
from trainguard.checker.signatures import BY_NAME
from trainguard.lambdas.aws.dynamodb_state import DynamoDBStore, PendingLogs
from trainguard.lambdas.state import FindingMemory, JobMemory
from trainguard.lambdas.tick import job_key
from trainguard.lambdas.trust import is_protected


class TickSource:
    """The SageMaker adapter as the tick sees it in Lambda: log lines a subscription
    delivered are added to their jobs, and with a stop opt-in tag configured a job
    without it is protected (the IAM policy would refuse its stop anyway)."""

    def __init__(self, adapter: SageMakerAdapter, logs: list[PendingLogs],
                 stop_tag: tuple[str, str] | None, protect_tag: str) -> None:
        self.adapter = adapter
        self.name = adapter.name
        self.logs = {p.job_name: p for p in logs}
        self.stop_tag = stop_tag
        self.protect_tag = protect_tag
        self.jobs: list[Job] = []

    def list_jobs(self, now: float) -> list[Job]:
        self.jobs = self.adapter.list_jobs(now)
        for job in self.jobs:
            kept = self.logs.get(job.id)
            if kept is not None:
                seen = {(line.time, line.text) for line in job.logs}
                extra = [LogLine(t, text) for t, text in kept.lines if (t, text) not in seen]
                job.logs = sorted([*job.logs, *extra], key=lambda line: line.time)
            if self.stop_tag is not None and not is_protected(job, self.protect_tag):
                key, value = self.stop_tag
                if job.tags.get(key) != value:
                    job.tags[self.protect_tag] = f"no opt-in tag {key}={value}"
        return self.jobs

    def stop(self, job: Job, reason: str) -> None:
        self.adapter.stop(job, reason)


class SeededStore:
    """The store, with the log alarms already sent between ticks added to the memory the
    tick loads: the tick then counts those findings on instead of raising them again.
    The seeded memories are saved as they are loaded (the tick writes only what it
    changes, and the seeds are gone once the tick consumed the log lines)."""

    def __init__(self, store: DynamoDBStore, seeds: dict[str, list[FindingMemory]],
                 source: str) -> None:
        self.store = store
        self.seeds = seeds  # job_key -> findings alarmed on at once
        self.source = source

    def load_all(self) -> dict[str, JobMemory]:
        memories = self.store.load_all()
        seeded: list[JobMemory] = []
        for key, found in self.seeds.items():
            mem = memories.get(key)
            if mem is None:
                job_id = key.rsplit(":", 1)[-1]
                mem = memories[key] = JobMemory(key, self.source, job_id, found[0].first_seen)
            new = [fm for fm in found if fm.key not in mem.findings]
            for fm in new:
                mem.findings[fm.key] = fm
            if new:
                seeded.append(mem)
        if seeded:
            self.store.save(seeded)  # conditional, like every write of the tick
        return memories

    def save(self, memories: list[JobMemory]) -> None:
        self.store.save(memories)

    def delete(self, job_keys: list[str]) -> None:
        self.store.delete(job_keys)

    def append_audit(self, records: list[Any]) -> None:
        self.store.append_audit(records)

    def audit_log(self, job_key: str | None = None) -> list[Any]:
        return self.store.audit_log(job_key)


def sagemaker_key(source: str, name: str, scope: str) -> str:
    """The tick's key for a SageMaker job known only by name and scope (a log stream)."""
    return job_key(source, Job(id=name, provider="sagemaker", scope=scope))


def seeds(logs: list[PendingLogs], source: str) -> dict[str, list[FindingMemory]]:
    """The log alarms already sent, as the finding memories the tick would have made."""
    out: dict[str, list[FindingMemory]] = {}
    for p in logs:
        for sig_name, at in p.alarmed.items():
            sig = BY_NAME.get(sig_name)
            if sig is None:
                continue
            fm = FindingMemory(f"{p.job_name}/logs/{sig_name}", "logs", sig.severity.value,
                               sig.meaning, at, at, alarmed_at=at,
                               alarmed_severity=sig.severity.value)
            out.setdefault(sagemaker_key(source, p.job_name, p.scope), []).append(fm)
    return out
