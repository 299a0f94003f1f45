"""One watchdog tick, shared by every runtime (AWS Lambda, Azure Functions, the Kubernetes
CronJob and the local loop): list jobs, evaluate, remember, alarm, and stop under safety.

The order of work is what keeps stops safe:

1. list jobs from every source (a failing source is reported, the others go on);
2. ``checker.evaluate``;
3. load memory, update it, decide alarms and stops; stop *intents* go into memory;
4. save memory and the decisions' audit records. If the store fails here the tick raises
   ``StateStoreError`` before any stop is made;
5. call ``source.stop`` for each recorded intent, then mark it done. A job with a recorded
   intent is never stopped again, so a crash between 4 and 5 cannot stop a job twice;
6. send alarm events to the sinks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from checker import cost
from checker.evaluate import evaluate
from checker.model import Action, Finding, Job, JobState, Severity
from checker.policy import Policy
from checker.rules.base import Rule
from lambdas.state import (
    AuditAction,
    AuditRecord,
    FindingMemory,
    JobMemory,
    StateStore,
    StateStoreError,
    StopRecord,
)

log = logging.getLogger("trainguard.tick")

REMIND_EVERY_S = 6 * 3600.0
FORGET_AFTER_S = 14 * 86400.0  # memory of a job no source has listed for this long is dropped


class Source(Protocol):
    """An adapter: lists jobs with their series, and carries out stops."""

    name: str

    def list_jobs(self, now: float) -> list[Job]: ...

    def stop(self, job: Job, reason: str) -> None: ...


AlarmKind = Literal["raise", "remind", "resolve"]


@dataclass
class AlarmEvent:
    kind: AlarmKind
    finding: Finding | None  # None on "resolve" when the job is gone: see ``memory``
    job: Job | None  # None on "resolve" when no source lists the job any more
    source: str
    job_key: str
    time: float
    first_seen: float
    ticks: int  # consecutive ticks the finding was seen
    memory: FindingMemory
    stopped: bool = False  # a stop was made (or, dry run, would have been) this tick
    # What the memory said before this alarm: restored if no sink took it, so the next
    # tick says it again instead of waiting hours for the reminder.
    previous: tuple[float | None, str | None] = field(default=(None, None), repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "source": self.source, "job_key": self.job_key,
            "time": self.time, "first_seen": self.first_seen, "ticks": self.ticks,
            "rule": self.memory.rule, "severity": self.memory.severity,
            "message": self.memory.message, "stopped": self.stopped,
            "finding": self.finding.to_dict() if self.finding else None,
        }


class AlarmSink(Protocol):
    def send(self, event: AlarmEvent) -> None: ...


@dataclass
class TickReport:
    time: float
    jobs: dict[str, int] = field(default_factory=dict)  # source -> jobs listed
    source_errors: dict[str, str] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    events: list[AlarmEvent] = field(default_factory=list)
    audit: list[AuditRecord] = field(default_factory=list)
    sink_errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def stops(self) -> list[AuditRecord]:
        return [a for a in self.audit if a.action in (AuditAction.STOP, AuditAction.WOULD_STOP)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time, "jobs": self.jobs, "source_errors": self.source_errors,
            "findings": [f.to_dict() for f in self.findings],
            "events": [e.to_dict() for e in self.events],
            "audit": [a.to_dict() for a in self.audit],
            "sink_errors": self.sink_errors, "warnings": self.warnings,
        }


def job_key(source: str, job: Job) -> str:
    return f"{source}:{job.provider}:{job.scope}:{job.id}"


def is_protected(job: Job, tag: str) -> bool:
    value = job.tags.get(tag)
    return value is not None and value.strip().lower() != "false"


T = TypeVar("T")


def _store(what: str, call: Callable[[], T]) -> T:
    """Run a store call; any failure becomes a ``StateStoreError`` naming what failed."""
    try:
        return call()
    except StateStoreError:
        raise
    except Exception as e:
        raise StateStoreError(f"state store failed to {what}: {type(e).__name__}: {e}") from e


@dataclass
class _Seen:
    """One listed job in this tick."""

    source: Source
    job: Job
    key: str
    memory: JobMemory
    findings: list[Finding] = field(default_factory=list)


def effective_policy(policy: Policy, stop_enabled: bool) -> Policy:
    """The policy as a deployment may run it: in dry run unless the deployment enables
    stops too (the environment's ``stop_enabled``), whatever the policy says."""
    if stop_enabled or policy.safety.dry_run:
        return policy
    return dataclasses.replace(policy, safety=dataclasses.replace(policy.safety, dry_run=True))


def tick(sources: Sequence[Source], policy: Policy, store: StateStore,
         sinks: Sequence[AlarmSink], now: float, rules: list[Rule] | None = None,
         remind_every_s: float = REMIND_EVERY_S) -> TickReport:
    """One tick of the watchdog at time ``now``. Raises ``StateStoreError`` if the store fails
    (and then makes no stop)."""
    report = TickReport(time=now)
    listed = _list_jobs(sources, now, report)
    jobs = [job for _, job in listed]
    report.findings = evaluate(jobs, policy, now, rules)

    memories = _store("load job memory", store.load_all)
    seen: dict[str, _Seen] = {}
    for source, job in listed:
        key = job_key(source.name, job)
        mem = memories.get(key) or JobMemory(key, source.name, job.id, now)
        mem.last_seen = now
        seen[job.id] = _Seen(source, job, key, mem)
    for f in report.findings:
        if f.job_id in seen:
            seen[f.job_id].findings.append(f)

    events, cleared = _update_findings(seen, memories, report, now, remind_every_s)
    intents = _decide_stops(list(seen.values()), policy, report, now)

    # Everything decided so far is written before any stop is made.
    seen_keys = {s.key for s in seen.values()}
    forget = [k for k, m in memories.items() if k not in seen_keys
              and m.source not in report.source_errors and now - m.last_seen > FORGET_AFTER_S]
    changed = [s.memory for s in seen.values()] + [m for m in cleared if m.job_key not in forget]
    _store("save job memory", lambda: store.save(changed))
    if forget:
        _store("delete old job memory", lambda: store.delete(forget))
    _store("append to the audit log", lambda: store.append_audit(list(report.audit)))

    _carry_out(intents, policy, store, report, now)
    stopped = {s.key for s, _ in intents if policy.safety.dry_run
               or (s.memory.stop is not None and s.memory.stop.done_at is not None)}
    for e in events:
        e.stopped = e.job_key in stopped
    undelivered = _send(events, sinks, report)
    if undelivered:
        _say_again_next_tick(undelivered, seen, store, report)
    return report


def _list_jobs(sources: Sequence[Source], now: float,
               report: TickReport) -> list[tuple[Source, Job]]:
    out: list[tuple[Source, Job]] = []
    owner: dict[str, str] = {}
    for source in sources:
        try:
            jobs = source.list_jobs(now)
        except Exception as e:  # one broken source must not blind the watchdog to the others
            log.exception("source %s failed to list jobs", source.name)
            report.source_errors[source.name] = f"{type(e).__name__}: {e}"
            continue
        report.jobs[source.name] = len(jobs)
        for job in jobs:
            if job.id in owner:
                # Findings carry only the job id: an ambiguous id must never lead to a stop.
                report.warnings.append(f"job id {job.id!r} is listed by {owner[job.id]!r} "
                                       f"and {source.name!r}; the second one is ignored")
                continue
            owner[job.id] = source.name
            out.append((source, job))
    return out


def _update_findings(seen: dict[str, _Seen], memories: dict[str, JobMemory],
                     report: TickReport, now: float, remind_every_s: float,
                     ) -> tuple[list[AlarmEvent], list[JobMemory]]:
    """Count each finding's consecutive ticks and decide raise / remind / resolve.

    Also returns the memories of unlisted jobs whose findings were cleared (to save)."""
    events: list[AlarmEvent] = []
    for s in seen.values():
        present: dict[str, Finding] = {}
        for f in s.findings:  # a rule reporting one key twice counts once, at its worst
            if f.key not in present or f.severity.rank > present[f.key].severity.rank:
                present[f.key] = f
        for fkey, f in present.items():
            fm = s.memory.findings.get(fkey)
            if fm is None:
                fm = FindingMemory(fkey, f.rule, f.severity.value, f.message, now, now, 1)
                s.memory.findings[fkey] = fm
            else:
                fm.consecutive += 1
                fm.last_seen, fm.severity, fm.message = now, f.severity.value, f.message
            # Persistence counts the ticks the finding asked for a stop: a warning that
            # turns critical has not yet been seen critical N times.
            fm.stop_ticks = fm.stop_ticks + 1 if f.action == Action.STOP else 0
            if f.action == Action.NONE:
                continue
            kind: AlarmKind | None = None
            if fm.alarmed_at is None or _rank(f.severity.value) > _rank(fm.alarmed_severity):
                kind = "raise"  # new, or worse than what was last said
            elif now - fm.alarmed_at >= remind_every_s:
                kind = "remind"
            if kind:
                before = (fm.alarmed_at, fm.alarmed_severity)
                fm.alarmed_at, fm.alarmed_severity = now, f.severity.value
                events.append(AlarmEvent(kind, f, s.job, s.source.name, s.key, now,
                                         fm.first_seen, fm.consecutive, fm, previous=before))
        for fkey in [k for k in s.memory.findings if k not in present]:
            fm = s.memory.findings.pop(fkey)
            if fm.alarmed_at is not None:
                events.append(AlarmEvent("resolve", None, s.job, s.source.name, s.key, now,
                                         fm.first_seen, fm.consecutive, fm))
    # A job no healthy source lists any more has ended or gone: its findings resolve.
    # A job of a failing source is unknown this tick: its memory stays as it was.
    seen_keys = {s.key for s in seen.values()}
    gone = [m for k, m in memories.items()
            if k not in seen_keys and m.source not in report.source_errors]
    cleared = []
    for mem in gone:
        if not mem.findings:
            continue
        for fm in mem.findings.values():
            if fm.alarmed_at is not None:
                events.append(AlarmEvent("resolve", None, None, mem.source, mem.job_key, now,
                                         fm.first_seen, fm.consecutive, fm))
        mem.findings = {}
        cleared.append(mem)
    return events, cleared


def _rank(severity: str | None) -> int:
    return Severity(severity).rank if severity else -1


def _audit(report: TickReport, s: _Seen, f: Finding, action: AuditAction, reason: str,
           dry_run: bool, now: float, force: bool = False, detail: str = "") -> None:
    """Write an audit record, unless it repeats the last decision for this finding: a
    protected job with a lasting finding gets one record, not one per tick."""
    fm = s.memory.findings[f.key]
    decision = f"{action.value}{detail}"
    if not force and fm.last_decision == decision:
        return
    fm.last_decision = decision
    report.audit.append(AuditRecord(now, s.key, s.job.id, s.source.name, f.key, f.rule,
                                    f.severity.value, action, reason, dry_run))


def _decide_stops(seen: list[_Seen], policy: Policy, report: TickReport,
                  now: float) -> list[tuple[_Seen, Finding]]:
    """Which jobs to stop this tick. Records intents in memory; returns (job, finding) pairs."""
    safety = policy.safety
    candidates: list[tuple[_Seen, Finding]] = []
    for s in seen:
        wanting = [f for f in s.findings if f.action == Action.STOP]
        if not wanting:
            continue
        # The job's worst finding speaks for it; the others are noted in the reason.
        f = max(wanting, key=lambda x: x.severity.rank)
        fm = s.memory.findings[f.key]
        if s.memory.stop is not None:
            _audit(report, s, f, AuditAction.SKIP_INTENT,
                   f"a stop was already recorded at {s.memory.stop.intent_at:.0f} "
                   f"(done: {s.memory.stop.done_at is not None}); never stopped twice",
                   safety.dry_run, now)
        elif s.job.state in (JobState.STOPPING, JobState.STOPPED) or s.job.state.terminal:
            _audit(report, s, f, AuditAction.SKIP_STOPPING,
                   f"job is already {s.job.state.value}", safety.dry_run, now)
        elif is_protected(s.job, safety.protect_tag):
            _audit(report, s, f, AuditAction.SKIP_PROTECTED,
                   f"job has the protect tag {safety.protect_tag!r}", safety.dry_run, now)
        elif fm.stop_ticks < safety.persist_ticks:
            _audit(report, s, f, AuditAction.SKIP_PERSISTENCE,
                   f"seen {fm.stop_ticks} of {safety.persist_ticks} ticks needed",
                   safety.dry_run, now, detail=str(fm.stop_ticks))
        else:
            candidates.append((s, f))

    # Most severe first, then the most expensive per hour: the cap saves the most money.
    def priority(c: tuple[_Seen, Finding]) -> tuple[int, float]:
        rate = cost.hourly_cost(c[0].job, policy)
        return (c[1].severity.rank, rate if rate is not None else 0.0)

    candidates.sort(key=priority, reverse=True)
    chosen = candidates[:max(safety.max_stops_per_tick, 0)]
    for s, f in candidates[len(chosen):]:
        _audit(report, s, f, AuditAction.SKIP_CAP,
               f"cap of {safety.max_stops_per_tick} stops per tick reached", safety.dry_run, now)
    for s, f in chosen:
        others = sorted({x.rule for x in s.findings if x.action == Action.STOP} - {f.rule})
        reason = f"{f.rule} ({f.severity.value}): {f.message}"
        if others:
            reason += f"; also {', '.join(others)}"
        if safety.dry_run:
            _audit(report, s, f, AuditAction.WOULD_STOP, reason, True, now)
        else:
            s.memory.stop = StopRecord(f.key, reason, intent_at=now)
    return chosen


def _carry_out(chosen: list[tuple[_Seen, Finding]], policy: Policy, store: StateStore,
               report: TickReport, now: float) -> None:
    if policy.safety.dry_run:
        return
    first_error: StateStoreError | None = None
    for s, f in chosen:
        assert s.memory.stop is not None  # set by _decide_stops
        start = len(report.audit)
        try:
            s.source.stop(s.job, s.memory.stop.reason)
        except Exception as e:
            log.exception("stopping %s failed", s.key)
            s.memory.stop.error = f"{type(e).__name__}: {e}"
            _audit(report, s, f, AuditAction.STOP_FAILED,
                   f"{s.memory.stop.reason}; stop failed: {s.memory.stop.error}", False, now,
                   force=True)
        else:
            s.memory.stop.done_at = now
            _audit(report, s, f, AuditAction.STOP, s.memory.stop.reason, False, now, force=True)
        memory, records = s.memory, report.audit[start:]
        try:
            # The intent is already stored, so a failure here cannot lead to a second stop.
            _store("mark a stop done", lambda: store.save([memory]))  # noqa: B023
            _store("append to the audit log", lambda: store.append_audit(records))  # noqa: B023
        except StateStoreError as e:
            first_error = first_error or e
    if first_error is not None:
        raise first_error


def _send(events: list[AlarmEvent], sinks: Sequence[AlarmSink],
          report: TickReport) -> list[AlarmEvent]:
    """Every event to every sink; returns the raise and remind events some sink failed."""
    report.events = events
    failed: dict[int, AlarmEvent] = {}
    for sink in sinks:
        for e in events:
            try:
                sink.send(e)
            except Exception as err:  # a broken sink must not hide the others' alarms
                log.exception("alarm sink %s failed", type(sink).__name__)
                report.sink_errors.append(f"{type(sink).__name__}: {type(err).__name__}: {err}")
                if e.kind != "resolve":  # an unsent resolve: the alarm expires or reminds
                    failed[id(e)] = e
    return list(failed.values())


def _say_again_next_tick(undelivered: list[AlarmEvent], seen: dict[str, _Seen],
                         store: StateStore, report: TickReport) -> None:
    """Put back what the memory said before each undelivered alarm and save it. A sink that
    did take the alarm may hear it twice; one that did not is not left silent for hours."""
    by_key = {s.key: s.memory for s in seen.values()}
    changed: dict[str, JobMemory] = {}
    for e in undelivered:
        e.memory.alarmed_at, e.memory.alarmed_severity = e.previous
        if e.job_key in by_key:
            changed[e.job_key] = by_key[e.job_key]
    try:
        store.save(list(changed.values()))
    except Exception as err:  # the stops are done; only the retry of the alarm is lost
        report.sink_errors.append(f"cannot mark undelivered alarms for the next tick: {err}")
