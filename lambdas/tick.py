"""One watchdog tick, shared by every runtime (AWS Lambda, Azure Functions, the Kubernetes
CronJob and the local loop): list jobs, evaluate, remember, alarm, and stop under safety.

Nothing lost, nothing twice. The order of work is what makes a stop, an alarm and an
audit record survive any single failure of the store, a sink or the process:

1. list jobs from every source and check each at the boundary: a malformed job is one
   skipped job, reported with its reason (a failing source is reported, the others go on);
2. ``checker.evaluate``;
3. load memory; decide alarms, audit records and stops. Each is *written down first*:
   alarms to say go into the job's ``outbox``, records to log into its ``audit_outbox``,
   stops into its ``stop`` intent (with the attempt claimed);
4. save the memories that changed, each compare-and-set on the version this tick read. A
   tick that loses that race to an overlapping one says so (it raises ``StateConflict``)
   and stops, says and logs nothing: the other tick owns those decisions. Any other
   store failure here raises ``StateStoreError``; either way before any stop is made;
5. make the stops. An intent not confirmed (the process died, the store failed after the
   call) is retried on a later tick: a job its source lists as stopping or ended counts
   as done, an attempt younger than ``STOP_LEASE_S`` belongs to a tick still making it,
   and after ``STOP_ATTEMPTS`` failed calls the tick gives up with a critical alarm;
6. append the audit records (idempotent: a record logged twice counts once), send every
   alarm still in an outbox to every sink that has not taken it, and save again to mark
   them done. A failure anywhere leaves the rest for the next tick, never for the next
   reminder; the tick then raises ``StateStoreError`` after doing all it could.

Only memories that changed are written, and a job with nothing to remember (no finding,
no stop, nothing left to say) has no memory at all, so a steady tick over thousands of
healthy jobs writes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from trainguard.checker import cost
from trainguard.checker.evaluate import evaluate
from trainguard.checker.model import Action, Finding, Job, JobState, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Rule
from trainguard.lambdas import fleet, trust
from trainguard.lambdas.fleet import Fleet
from trainguard.lambdas.state import (
    AuditAction,
    AuditRecord,
    FindingMemory,
    JobMemory,
    PendingAlarm,
    StateConflict,
    StateStore,
    StateStoreError,
    StopRecord,
)
from trainguard.lambdas.trust import is_protected

log = logging.getLogger("trainguard.tick")

REMIND_EVERY_S = 6 * 3600.0
FORGET_AFTER_S = 14 * 86400.0  # memory of a job no source has listed for this long is dropped
STOP_ATTEMPTS = 3  # stop calls for one intent before the tick gives up and alarms
STOP_LEASE_S = 30.0  # a stop attempt this recent is another tick's, still being made
INTERVAL_SLACK = 0.05  # a schedule may fire this fraction of an interval early
MAX_ID_CHARS = 4096  # a longer job id is malformed (stores hash keys past their own limit)
STOP_FAILED_RULE = "stop_failed"  # the alarm raised when the tick gives up on a stop
CLOCK_KEY = "~tick-clock"  # the memory counting saved ticks (no job key starts with "~")
CLOCK_GAPS = 9  # gaps between ticks the clock keeps; their median is the learnt interval
OUTBOX_KEEP_S = 86400.0  # an alarm a sink has refused for a day is dropped (and reported)


class Source(Protocol):
    """An adapter: lists jobs with their series, and carries out stops."""

    name: str

    def list_jobs(self, now: float) -> list[Job]: ...

    def stop(self, job: Job, reason: str) -> None: ...


AlarmKind = Literal["raise", "remind", "resolve"]


@dataclass
class AlarmEvent:
    kind: AlarmKind
    finding: Finding | None  # None on "resolve", and on an alarm said again a tick late
    job: Job | None  # None when no source lists the job this tick
    source: str
    job_key: str
    time: float  # when the alarm was decided (a retried one keeps its time)
    first_seen: float
    ticks: int  # consecutive ticks the finding was seen
    memory: FindingMemory
    stopped: bool = False  # a stop was made (or, dry run, would have been) for this job
    id: str = ""  # the written-down alarm this is: the same on every retry

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
    skipped: dict[str, str] = field(default_factory=dict)  # malformed job -> why
    findings: list[Finding] = field(default_factory=list)
    events: list[AlarmEvent] = field(default_factory=list)
    audit: list[AuditRecord] = field(default_factory=list)
    sink_errors: list[str] = field(default_factory=list)
    store_errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    writes: int = 0  # job memories written or deleted
    fleet: Fleet = field(default_factory=Fleet)  # spend, verdicts, savings (dashboards)

    @property
    def stops(self) -> list[AuditRecord]:
        return [a for a in self.audit if a.action in (AuditAction.STOP, AuditAction.WOULD_STOP)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time, "jobs": self.jobs, "source_errors": self.source_errors,
            "skipped": self.skipped,
            "findings": [f.to_dict() for f in self.findings],
            "events": [e.to_dict() for e in self.events],
            "audit": [a.to_dict() for a in self.audit],
            "sink_errors": self.sink_errors, "store_errors": self.store_errors,
            "warnings": self.warnings,
        }


def job_key(source: str, job: Job) -> str:
    return f"{source}:{job.provider}:{job.scope}:{job.id}"


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


def tick(sources: Sequence[Source], policy: Policy, store: StateStore,
         sinks: Sequence[AlarmSink], now: float, rules: list[Rule] | None = None,
         remind_every_s: float = REMIND_EVERY_S,
         interval_s: float | None = None) -> TickReport:
    """One tick of the watchdog at time ``now``. ``interval_s`` is the schedule's interval
    (learnt from the ticks themselves when not given): a finding persists for a stop only
    when its ticks span enough time too.

    Raises ``StateStoreError`` if the store fails before the stops (then none is made),
    or after doing all it could when it fails later (what is left is redone next tick)."""
    report = TickReport(time=now)
    listed = _list_jobs(sources, now, report)
    report.findings = _evaluate(listed, policy, now, rules, report)
    report.fleet = fleet.summarise([job for _, job in listed], report.findings, policy)

    memories = _store("load job memory", store.load_all)
    # The tick clock: one small memory counting saved ticks, so a lasting finding's
    # count of ticks is derived, not written on every tick.
    clock = memories.pop(CLOCK_KEY, None) or JobMemory(CLOCK_KEY, "trainguard", CLOCK_KEY, now)
    if clock.ticks and now > clock.last_seen:
        clock.gaps = [*clock.gaps, now - clock.last_seen][-CLOCK_GAPS:]
    clock.ticks, clock.last_seen = clock.ticks + 1, now
    interval_s = interval_s or learnt_interval(clock.gaps)
    stored = {k: _stable(m) for k, m in memories.items()}
    seen: dict[str, _Seen] = {}
    for source, job in listed:
        key = job_key(source.name, job)
        mem = memories.get(key)
        if mem is None:
            mem = memories[key] = JobMemory(key, source.name, job.id, now)
        elif now - mem.last_seen >= FORGET_AFTER_S / 14:  # daily: enough to forget by
            mem.last_seen = now
        seen[job.id] = _Seen(source, job, key, mem)
    for f in report.findings:
        if f.job_id in seen:
            seen[f.job_id].findings.append(f)

    _update_findings(seen, memories, report, now, remind_every_s, interval_s, clock.ticks,
                     policy.safety.persist_ticks)
    to_stop = _decide_stops(list(seen.values()), policy, report, now, interval_s)
    _snapshot(seen, now)

    # Everything decided is written down before any stop is made or alarm said.
    try:
        _write(store, memories, stored, report, now, "save job memory", clock)
    except StateConflict as e:
        raise StateConflict(f"this tick lost the race to an overlapping one and stops, "
                            f"alarms and logs nothing (the other owns those decisions): {e}"
                            ) from e

    stopped = _carry_out(to_stop, policy, report, now)
    report.fleet.saved_usd = sum(fleet.saved(s.job, policy, now) for s in seen.values()
                                 if s.key in stopped)
    _snapshot(seen, now)  # the alarms say what the stops did
    for s in seen.values():
        if s.key in stopped:
            for a in s.memory.outbox:
                if a.time == now:
                    a.stopped = True
    errors: list[StateStoreError] = []
    _log_audit(store, memories, report, errors)
    send_outbox(memories, {s.key: (s.job, s.findings) for s in seen.values()}, sinks, report)
    try:
        _write(store, memories, stored, report, now, "mark stops, alarms and records done")
    except StateStoreError as e:
        errors.append(e)
    if errors:
        raise errors[0]
    return report


# --- the boundary: jobs from sources -------------------------------------------------

_NUMBERS = ("start_time", "end_time", "hourly_price", "max_runtime_s")


def learnt_interval(gaps: list[float]) -> float | None:
    """The schedule's interval as the median gap between saved ticks (None until three
    are known): a duplicated or retried invocation now and then does not move it."""
    if len(gaps) < 3:
        return None
    ordered = sorted(gaps)
    return ordered[len(ordered) // 2]


def invalid_job(job: Any) -> str | None:
    """Why a job a source returned cannot be judged (None when it can)."""
    if not isinstance(job, Job):
        return f"not a Job but a {type(job).__name__}"
    if not isinstance(job.id, str) or not job.id.strip():
        return f"id: {job.id!r} is not a non-empty string"
    if len(job.id) > MAX_ID_CHARS:
        return f"id: {len(job.id)} characters, over the {MAX_ID_CHARS} allowed"
    for name in ("provider", "scope", "name", "raw_state"):
        if not isinstance(getattr(job, name), str):
            return f"{name}: {getattr(job, name)!r} is not a string"
    if not isinstance(job.state, JobState):
        return f"state: {job.state!r} is not one of {[s.value for s in JobState]}"
    if not isinstance(job.tags, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in job.tags.items()):
        return f"tags: {job.tags!r:.80} is not a mapping of strings to strings"
    for name in _NUMBERS:
        v = getattr(job, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                              or not math.isfinite(v)):
            return f"{name}: {v!r} is not a finite number"
    if (not isinstance(job.instance_count, int) or isinstance(job.instance_count, bool)
            or job.instance_count < 0):
        return f"instance_count: {job.instance_count!r} is not a count"
    if not isinstance(job.series, dict) or not all(
            isinstance(s, Series) for s in job.series.values()):
        return "series: not a mapping of names to Series"
    return None


def _list_jobs(sources: Sequence[Source], now: float,
               report: TickReport) -> list[tuple[Source, Job]]:
    out: list[tuple[Source, Job]] = []
    owner: dict[str, str] = {}
    for source in sources:
        try:
            jobs = list(source.list_jobs(now))
        except Exception as e:  # one broken source must not blind the watchdog to the others
            log.exception("source %s failed to list jobs", source.name)
            report.source_errors[source.name] = f"{type(e).__name__}: {e}"
            continue
        report.jobs[source.name] = len(jobs)
        for job in jobs:
            problem = invalid_job(job)
            if problem is not None:  # one malformed job is one skipped job
                _skip(report, source.name, job, problem)
                continue
            if job.id in owner:
                # Findings carry only the job id: an ambiguous id must never lead to a stop.
                report.warnings.append(f"job id {job.id!r} is listed by {owner[job.id]!r} "
                                       f"and {source.name!r}; the second one is ignored")
                continue
            owner[job.id] = source.name
            out.append((source, job))
    return out


def _skip(report: TickReport, source: str, job: Any, problem: str) -> None:
    ref = f"{source}: {getattr(job, 'id', job)!r:.120}"
    report.skipped[ref] = problem
    report.warnings.append(f"job {ref} skipped, malformed: {problem}")
    log.error("job %s skipped, malformed: %s", ref, problem)


def _evaluate(listed: list[tuple[Source, Job]], policy: Policy, now: float,
              rules: list[Rule] | None, report: TickReport) -> list[Finding]:
    """Every job's findings; a job the rules choke on is skipped, the others judged."""
    try:
        return evaluate([job for _, job in listed], policy, now, rules)
    except Exception:  # find the job(s) at fault, one by one
        log.exception("evaluate failed for the tick's jobs; judging them one by one")
    findings: list[Finding] = []
    for source, job in list(listed):
        try:
            findings.extend(evaluate([job], policy, now, rules))
        except Exception as e:
            _skip(report, source.name, job, f"the rules failed on it: {type(e).__name__}: {e}")
            listed.remove((source, job))
    return findings


# --- findings and alarms --------------------------------------------------------------

def say(mem: JobMemory, kind: AlarmKind, fm: FindingMemory, now: float) -> None:
    """Write an alarm down in the job's outbox: it is said after the memory is saved."""
    mem.outbox.append(PendingAlarm(kind, mem.job_key, now, fm.first_seen, fm.consecutive,
                                   FindingMemory(**dataclasses.asdict(fm))))


def _snapshot(seen: dict[str, _Seen], now: float) -> None:
    """This tick's alarms carry their finding as decided, stop decision included."""
    for s in seen.values():
        for p in s.memory.outbox:
            fm = s.memory.findings.get(p.memory.key)
            if p.time == now and p.kind != "resolve" and fm is not None:
                p.memory = FindingMemory(**dataclasses.asdict(fm))


def _count_stop_tick(fm: FindingMemory, asks: bool, now: float,
                     interval_s: float | None, needed: int) -> None:
    """Persistence counts ticks asking for a stop; with a known interval, a tick less than
    half an interval after the last one counted (a retried or duplicated invocation) does
    not count again. The count stops at ``needed``: past it, nothing changes to write."""
    if not asks:
        fm.stop_ticks, fm.stop_since, fm.stop_counted_at = 0, None, None
        return
    if fm.stop_ticks == 0 or fm.stop_since is None or fm.stop_counted_at is None:
        fm.stop_ticks, fm.stop_since, fm.stop_counted_at = 1, now, now
        return
    if interval_s and now - fm.stop_counted_at < interval_s / 2:
        return
    if fm.stop_ticks >= max(needed, 1):
        return
    fm.stop_ticks += 1
    fm.stop_counted_at = now


def _persisted(fm: FindingMemory, needed: int, now: float, interval_s: float | None) -> bool:
    """Seen on ``needed`` ticks, spanning at least ``needed - 1`` intervals when known."""
    if fm.stop_ticks < needed:
        return False
    if not interval_s or fm.stop_since is None:
        return True
    return now - fm.stop_since >= (needed - 1) * interval_s * (1 - INTERVAL_SLACK)


def _update_findings(seen: dict[str, _Seen], memories: dict[str, JobMemory],
                     report: TickReport, now: float, remind_every_s: float,
                     interval_s: float | None, clock: int, needed: int) -> None:
    """Count each finding's consecutive ticks and write down raise / remind / resolve."""
    for s in seen.values():
        present: dict[str, Finding] = {}
        for f in s.findings:  # a rule reporting one key twice counts once, at its worst
            if f.key not in present or f.severity.rank > present[f.key].severity.rank:
                present[f.key] = f
        for fkey, f in present.items():
            fm = s.memory.findings.get(fkey)
            if fm is None:
                fm = FindingMemory(fkey, f.rule, f.severity.value, f.message, now, now, 1,
                                   first_tick=clock)
                s.memory.findings[fkey] = fm
            else:
                if fm.first_tick is None:  # remembered before the clock
                    fm.first_tick = clock - fm.consecutive
                fm.consecutive = clock - fm.first_tick + 1
                fm.last_seen, fm.severity, fm.message = now, f.severity.value, f.message
            # Persistence counts the ticks the finding asked for a stop: a warning that
            # turns critical has not yet been seen critical N times.
            _count_stop_tick(fm, f.action == Action.STOP, now, interval_s, needed)
            if f.action == Action.NONE:
                continue
            kind: AlarmKind | None = None
            if fm.alarmed_at is None or _rank(f.severity.value) > _rank(fm.alarmed_severity):
                kind = "raise"  # new, or worse than what was last said
            elif now - fm.alarmed_at >= remind_every_s:
                kind = "remind"
            if kind:
                fm.alarmed_at, fm.alarmed_severity = now, f.severity.value
                say(s.memory, kind, fm, now)
        for fkey in [k for k in s.memory.findings if k not in present]:
            fm = s.memory.findings.pop(fkey)
            if fm.alarmed_at is not None:
                say(s.memory, "resolve", fm, now)
    # A job no healthy source lists any more has ended or gone: its findings resolve.
    # A job of a failing source is unknown this tick: its memory stays as it was.
    seen_keys = {s.key for s in seen.values()}
    for key, mem in memories.items():
        if key in seen_keys or mem.source in report.source_errors or not mem.findings:
            continue
        for fm in mem.findings.values():
            if fm.alarmed_at is not None:
                say(mem, "resolve", fm, now)
        mem.findings = {}


def _rank(severity: str | None) -> int:
    return Severity(severity).rank if severity else -1


# --- stops ------------------------------------------------------------------------------

def _record(report: TickReport, mem: JobMemory, record: AuditRecord) -> None:
    report.audit.append(record)
    mem.audit_outbox.append(record)


def _audit(report: TickReport, s: _Seen, f: Finding, action: AuditAction, reason: str,
           dry_run: bool, now: float, detail: str = "") -> None:
    """Write an audit record, unless it repeats the last decision for this finding: a
    protected job with a lasting finding gets one record, not one per tick."""
    fm = s.memory.findings[f.key]
    decision = f"{action.value}{detail}"
    if fm.last_decision == decision:
        return
    fm.last_decision = decision
    _record(report, s.memory, AuditRecord(now, s.key, s.job.id, s.source.name, f.key,
                                          f.rule, f.severity.value, action, reason, dry_run))


def _stop_audit(report: TickReport, s: _Seen, action: AuditAction, reason: str) -> None:
    """The record of a stop attempt. Its id and time come from the intent and attempt, so
    the same stop recorded again (a retry confirming it) is logged once."""
    stop = s.memory.stop
    assert stop is not None
    fm = s.memory.findings.get(stop.finding_key)
    attempt = stop.attempt_at if stop.attempt_at is not None else stop.intent_at
    digest = hashlib.sha256(s.key.encode()).hexdigest()[:16]
    rid = f"{action.value}-{digest}-{stop.intent_at!r}"
    if action != AuditAction.STOP:
        rid += f"-{stop.attempts}"
    if stop.given_up_at is not None:
        rid, attempt = f"{rid}-gave-up", stop.given_up_at
    if fm is not None:
        fm.last_decision = action.value
    _record(report, s.memory, AuditRecord(
        attempt, s.key, s.job.id, s.source.name, stop.finding_key,
        fm.rule if fm else stop.finding_key.rsplit("/", 1)[-1],
        fm.severity if fm else Severity.CRITICAL.value, action, reason, False, id=rid))


def _settled(job: Job) -> bool:
    return job.state in (JobState.STOPPING, JobState.STOPPED) or job.state.terminal


def _retry(s: _Seen, report: TickReport, now: float, protect_tag: str) -> bool:
    """An intent recorded on an earlier tick and not confirmed: confirm it, leave it to
    the tick making it, give up on it, or claim another attempt (True)."""
    stop = s.memory.stop
    assert stop is not None
    if _settled(s.job):  # stopping is idempotent: already stopping or ended is done
        stop.done_at, stop.error = now, None
        _stop_audit(report, s, AuditAction.STOP,
                    f"{stop.reason} (confirmed: the job is {s.job.state.value})")
        return False
    if stop.attempt_at is not None and now - stop.attempt_at < STOP_LEASE_S:
        return False  # another tick claimed this attempt moments ago and is making it
    if is_protected(s.job, protect_tag):
        _stop_audit(report, s, AuditAction.SKIP_PROTECTED,
                    f"{stop.reason}; the job is protected now: the stop is dropped")
        s.memory.stop = None
        return False
    if stop.attempts >= STOP_ATTEMPTS:
        stop.given_up_at = now
        why = (f"gave up stopping the job after {stop.attempts} attempts"
               + (f" (last error: {stop.error})" if stop.error else "")
               + "; stop it by hand and check the watchdog's permissions")
        _stop_audit(report, s, AuditAction.STOP_FAILED, f"{stop.reason}; {why}")
        fm = FindingMemory(f"{s.job.id}/{STOP_FAILED_RULE}", STOP_FAILED_RULE,
                           Severity.CRITICAL.value, why, stop.intent_at, now, stop.attempts)
        say(s.memory, "raise", fm, now)
        return False
    stop.attempts += 1
    stop.attempt_at = now
    return True


def _decide_stops(seen: list[_Seen], policy: Policy, report: TickReport, now: float,
                  interval_s: float | None = None) -> list[_Seen]:
    """Which jobs to stop this tick: unconfirmed intents to retry, then new ones under the
    cap. Records intents (with their first attempt claimed) in memory."""
    safety = policy.safety
    retries: list[_Seen] = []
    candidates: list[tuple[_Seen, Finding]] = []
    for s in seen:
        stop = s.memory.stop
        if (stop is not None and stop.done_at is None and stop.given_up_at is None
                and not safety.dry_run):
            if _retry(s, report, now, safety.protect_tag):
                retries.append(s)
            continue
        wanting = [f for f in s.findings if f.action == Action.STOP]
        if not wanting:
            continue
        # The job's worst finding speaks for it; the others are noted in the reason.
        f = max(wanting, key=lambda x: x.severity.rank)
        fm = s.memory.findings[f.key]
        if stop is not None:
            _audit(report, s, f, AuditAction.SKIP_INTENT,
                   f"a stop was already recorded at {stop.intent_at:.0f} "
                   f"(done: {stop.done_at is not None}); never stopped twice",
                   safety.dry_run, now)
        elif _settled(s.job):
            _audit(report, s, f, AuditAction.SKIP_STOPPING,
                   f"job is already {s.job.state.value}", safety.dry_run, now)
        elif is_protected(s.job, safety.protect_tag):
            _audit(report, s, f, AuditAction.SKIP_PROTECTED,
                   f"job has the protect tag {safety.protect_tag!r}", safety.dry_run, now)
        elif (untrusted := trust.refusal(s.source, f, s.findings, policy)) is not None:
            _audit(report, s, f, AuditAction.SKIP_UNTRUSTED, untrusted, safety.dry_run, now)
        elif not _persisted(fm, safety.persist_ticks, now, interval_s):
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
            s.memory.stop = StopRecord(f.key, reason, intent_at=now, attempts=1, attempt_at=now)
    if safety.dry_run:
        return [s for s, _ in chosen]
    return retries + [s for s, _ in chosen]


def _carry_out(to_stop: list[_Seen], policy: Policy, report: TickReport,
               now: float) -> set[str]:
    """Make the stops whose intents are saved; returns the keys of jobs stopped (or, dry
    run, that would have been). Results go to memory, saved at the end of the tick."""
    if policy.safety.dry_run:
        return {s.key for s in to_stop}
    done: set[str] = set()
    for s in to_stop:
        stop = s.memory.stop
        assert stop is not None  # set by _decide_stops
        try:
            trust.before_stop(s.source, s.job, policy)  # tags read again, uncached
            s.source.stop(s.job, stop.reason)
        except trust.StopRefused as e:
            _stop_audit(report, s, AuditAction.SKIP_PROTECTED, f"{stop.reason}; {e}: "
                        "the stop is dropped")
            s.memory.stop = None
        except Exception as e:
            log.exception("stopping %s failed", s.key)
            stop.error = f"{type(e).__name__}: {e}"
            left = STOP_ATTEMPTS - stop.attempts
            _stop_audit(report, s, AuditAction.STOP_FAILED,
                        f"{stop.reason}; stop failed: {stop.error} "
                        + (f"(tried again next tick, {left} more)" if left > 0 else
                           "(no tries left: the next tick gives up and alarms)"))
        else:
            stop.done_at, stop.error = now, None
            _stop_audit(report, s, AuditAction.STOP, stop.reason)
            done.add(s.key)
    return done


# --- writing down and saying ---------------------------------------------------------

#: What changes on every tick a finding lasts, derived again on the next tick (from the
#: clock, ``now`` and the rule): written along when the memory is, never a reason to.
_VOLATILE = ("consecutive", "last_seen", "message")


def _stable(mem: JobMemory) -> str:
    data = mem.to_dict()
    for fm in data["findings"].values():
        for name in _VOLATILE:
            fm.pop(name, None)
    return json.dumps(data, sort_keys=True)


def _write(store: StateStore, memories: dict[str, JobMemory], stored: dict[str, str],
           report: TickReport, now: float, what: str, clock: JobMemory | None = None) -> None:
    """Save the memories that changed since ``stored`` (their stable JSON as last read or
    written) and the tick ``clock`` if given; delete those with nothing left to keep."""
    save: list[JobMemory] = [clock] if clock is not None else []
    drop: list[str] = []
    for key, mem in memories.items():
        forgotten = (not mem.outbox and not mem.audit_outbox
                     and (mem.empty or now - mem.last_seen > FORGET_AFTER_S)
                     and mem.source not in report.source_errors)
        if forgotten:
            if key in stored:
                drop.append(key)
        elif stored.get(key) != (text := _stable(mem)):
            save.append(mem)
            stored[key] = text
    if save:
        _store(what, lambda: store.save(save))
    if drop:
        _store("delete job memory", lambda: store.delete(drop))
        for key in drop:
            stored.pop(key, None)
    report.writes += len(save) + len(drop) - (clock is not None)


def _log_audit(store: StateStore, memories: dict[str, JobMemory], report: TickReport,
               errors: list[StateStoreError]) -> None:
    records = [r for m in memories.values() for r in m.audit_outbox]
    if not records:
        return
    try:
        _store("append to the audit log", lambda: store.append_audit(records))
    except StateStoreError as e:  # kept in the outboxes: logged next tick
        report.store_errors.append(str(e))
        errors.append(e)
        return
    for m in memories.values():
        m.audit_outbox = []


def _sink_names(sinks: Sequence[AlarmSink]) -> list[str]:
    """A stable name per sink, to remember which sinks took an alarm."""
    names: list[str] = []
    for sink in sinks:
        base = getattr(sink, "name", None)
        base = base if isinstance(base, str) and base else type(sink).__name__
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.append(name)
    return names


def send_outbox(memories: dict[str, JobMemory], listed: dict[str, tuple[Job, list[Finding]]],
                sinks: Sequence[AlarmSink], report: TickReport) -> None:
    """Every written-down alarm to every sink that has not taken it yet, oldest first;
    what a sink refuses stays in the outbox. ``listed``: job key -> the job and its
    findings this tick. Save the memories afterwards to mark what was said."""
    names = _sink_names(sinks)
    for mem in memories.values():
        if not mem.outbox:
            continue
        job, findings = listed.get(mem.job_key, (None, []))
        for pending in mem.outbox:
            finding = None
            if pending.kind != "resolve":
                finding = next((f for f in findings if f.key == pending.memory.key), None)
            event = AlarmEvent(pending.kind, finding,  # type: ignore[arg-type]
                               job, mem.source, mem.job_key, pending.time,
                               pending.first_seen, pending.ticks, pending.memory,
                               pending.stopped, pending.id)
            report.events.append(event)
            for name, sink in zip(names, sinks, strict=True):
                if name in pending.sent:
                    continue
                try:
                    sink.send(event)
                except Exception as err:  # a broken sink must not hide the others' alarms
                    log.exception("alarm sink %s failed", name)
                    report.sink_errors.append(f"{name}: {type(err).__name__}: {err}")
                else:
                    pending.sent.append(name)
        left = [p for p in mem.outbox if not set(names) <= set(p.sent)]
        stale = [p for p in left if report.time - p.time > OUTBOX_KEEP_S]
        for p in stale:  # a sink down for a day: reminders say what still holds
            report.warnings.append(
                f"alarm {p.kind} {p.memory.rule} on {mem.job_key} dropped after "
                f"{OUTBOX_KEEP_S / 3600:.0f} h: refused by {sorted(set(names) - set(p.sent))}")
        mem.outbox = [p for p in left if p not in stale]
