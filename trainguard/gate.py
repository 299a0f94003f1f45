"""``trainguard gate JOB --source ...``: a gate for CI pipelines.

A pipeline launches a training job, then runs the gate on it. The gate watches that one
job with the watchdog's own tick (``lambdas.tick``: the same rules, persistence, trust
checks, audit records and the source's own stop call), prints findings as they appear,
and ends with an exit code the pipeline reads:

====  ===========  ==========================================================================
code  verdict      when
====  ===========  ==========================================================================
0     pass         the job succeeded (``--until done``), or is healthy at the deadline
                   (``--until deadline``; the job is left running)
1     failed       the job failed on its own, or the gate stopped it for a critical finding
                   (divergence, stall, restarts, a failure in its logs: it fails fast)
2     error        bad input, or the job could not be read or stopped
3     cancelled    the gate cancelled it: forecast to miss its target by the deadline or
                   budget (the ``target`` rule), over its budget (``budget``), or still
                   running at the deadline with ``--until done`` (it overran its time)
====  ===========  ==========================================================================

Stops are real (the pipeline owns the job) unless ``--dry-run``; the policy's protect
tag and its trust rules still hold: a finding resting on metrics that other principals
can write does not stop a job alone (``--trust-metrics`` when the pipeline's account
closes them, docs/security.md).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from trainguard.checker import cost
from trainguard.checker.model import Action, Job, JobState, Severity
from trainguard.checker.policy import Policy, RuleConfig
from trainguard.checker.registry import rule_names
from trainguard.lambdas.local import ConsoleSink
from trainguard.lambdas.state import AuditAction, AuditRecord, MemoryStore
from trainguard.lambdas.tick import tick

PASS, FAILED, ERROR, CANCELLED = 0, 1, 2, 3
EXIT_CODES = {"pass": PASS, "failed": FAILED, "error": ERROR, "cancelled": CANCELLED}
#: a stop for these rules is a cancel: the job was not broken, it would not pay off
CANCEL_RULES = frozenset({"target", "budget"})
#: the source may fail to answer this many ticks in a row before the gate gives up
READ_FAILURES = 3
Until = Literal["done", "deadline"]


class GateError(Exception):
    """The gate cannot go on (bad input, the job unreadable); the message says why."""


@dataclass(frozen=True)
class GateSpec:
    until: Until = "done"
    deadline_s: float | None = None  # the job's time, from its start
    budget_usd: float | None = None  # the job's spend
    tick_s: float = 30.0
    dry_run: bool = False
    trust_metrics: bool = False
    target: tuple[str, str, float] | None = None  # (metric, "min"|"max", value)
    prior: dict[str, Any] | None = None
    without_prior: bool = False


@dataclass
class GateResult:
    verdict: str  # pass, failed, error, cancelled
    reason: str
    job_id: str
    state: str | None = None
    ticks: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str | None = None
    audit: list[AuditRecord] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "trainguard.gate/v1", "verdict": self.verdict,
                "exit_code": self.exit_code, "reason": self.reason, "job_id": self.job_id,
                "state": self.state, "ticks": self.ticks, "findings": self.findings,
                "stopped_by": self.stopped_by, "audit": [a.to_dict() for a in self.audit]}


def parse_duration(text: str) -> float:
    """``5400``, ``90m``, ``1h30m``, ``2h``, ``45s`` -> seconds."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*"
                         r"(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise ValueError(f"{text!r} is not a duration (e.g. 5400, 90m, 1h30m)")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return seconds


def parse_target(text: str) -> tuple[str, str, float]:
    """``val_loss<=0.35`` (lower is better) or ``accuracy>=0.9`` (higher is better)."""
    m = re.fullmatch(r"\s*([A-Za-z_][\w./-]*)\s*(<=|>=|<|>)\s*(\S+)\s*", text)
    if m is None:
        raise ValueError(f"{text!r}: expected METRIC<=VALUE or METRIC>=VALUE, "
                         "e.g. val_loss<=0.35")
    try:
        value = float(m.group(3))
    except ValueError:
        raise ValueError(f"{text!r}: {m.group(3)!r} is not a number") from None
    return m.group(1), "min" if m.group(2).startswith("<") else "max", value


def gate_policy(policy: Policy, spec: GateSpec) -> Policy:
    """The policy the gate ticks with: every enabled rule's critical finding stops the job
    (it fails fast), the target rule's miss and a budget overrun cancel it; stops are real
    unless ``--dry-run``; one job, so one stop."""
    rules = {}
    for name in rule_names():
        cfg = policy.rule(name)
        actions = dict(cfg.actions)
        actions[Severity.CRITICAL] = Action.STOP
        params = dict(cfg.params)
        if name == "target":
            actions[Severity.WARNING] = Action.STOP  # the rule's confident miss
            if spec.target is not None:
                params.update(metric=spec.target[0], mode=spec.target[1],
                              target=spec.target[2])
            if spec.prior is not None:
                params["prior"] = spec.prior
            if spec.without_prior:
                params["act_without_prior"] = True
        rules[name] = RuleConfig(enabled=cfg.enabled, params=params, actions=actions)
    budget = policy.budget
    if spec.budget_usd is not None:
        budget = dataclasses.replace(budget, per_job_usd=spec.budget_usd)
    trusted = list(policy.safety.trusted_signals)
    if spec.trust_metrics and "metrics" not in trusted:
        trusted.append("metrics")  # type: ignore[arg-type]  # a Writable literal
    safety = dataclasses.replace(policy.safety, dry_run=spec.dry_run, max_stops_per_tick=1,
                                 trusted_signals=trusted)
    return dataclasses.replace(policy, rules=rules, budget=budget, safety=safety)


class GateSource:
    """The tick's source for the one job: the adapter's read of it, with the gate's
    deadline as its max runtime (what the target rule forecasts to), and its stop."""

    def __init__(self, name: str, read: Callable[[float], Job | None],
                 stop: Callable[[Job, str], None], ref: str,
                 deadline_s: float | None, adapter: Any = None) -> None:
        self.name, self.ref, self.deadline_s = name, ref, deadline_s
        self._read, self._stop = read, stop
        self.adapter = adapter if adapter is not None else self  # for lambdas.trust
        self.last: Job | None = None

    def list_jobs(self, now: float) -> list[Job]:
        job = self._read(now)
        if job is None:
            raise GateError(f"job {self.ref!r} not found on {self.name}")
        if self.deadline_s is not None:
            limit = min(job.max_runtime_s or self.deadline_s, self.deadline_s)
            job = dataclasses.replace(job, max_runtime_s=limit)
        self.last = job
        return [job]

    def stop(self, job: Job, reason: str) -> None:
        self._stop(job, reason)


def _verdict_of_stop(rule: str) -> str:
    return "cancelled" if rule in CANCEL_RULES else "failed"


def run_gate(source: GateSource, policy: Policy, spec: GateSpec, console: Console,
             clock: Callable[[], float] = time.time,
             sleep: Callable[[float], None] = time.sleep) -> GateResult:
    """Tick until the job ends, a stop is made, or the deadline; see the module."""
    pol = gate_policy(policy, spec)
    store = MemoryStore()
    started = clock()
    sink = ConsoleSink(console, started)
    result = GateResult("error", "", source.ref)
    failures = seen = 0
    mode = "dry run: stops are only audited" if spec.dry_run else "stops enabled"
    console.print(f"[bold]trainguard gate[/]: {escape(source.ref)} on {source.name}, until "
                  f"{spec.until}, tick {spec.tick_s:g}s ({mode})")
    while True:
        now = clock()
        report = tick([source], pol, store, [sink], now, interval_s=spec.tick_s)
        result.ticks += 1
        result.audit += report.audit
        result.findings += [{"rule": e.memory.rule, "severity": e.memory.severity,
                             "message": e.memory.message, "time": e.time}
                            for e in sink.events[seen:] if e.kind == "raise"]
        seen = len(sink.events)
        if report.source_errors:
            failures += 1
            (problem,) = report.source_errors.values()
            console.print(f"[red]cannot read the job[/] ({failures}/{READ_FAILURES}): "
                          f"{escape(problem)}")
            if failures >= READ_FAILURES:
                return _end(console, result, "error", f"the job could not be read: {problem}")
            sleep(spec.tick_s)
            continue
        failures = 0
        job = source.last
        assert job is not None  # read this tick
        result.job_id, result.state = job.id, job.state.value
        done = _after_tick(console, result, report.audit, report.skipped, job, pol, spec,
                           source, now)
        if done is not None:
            return done
        sleep(max(0.0, spec.tick_s - (clock() - now)))


def _after_tick(console: Console, result: GateResult, audit: list[AuditRecord],
                skipped: dict[str, str], job: Job, policy: Policy, spec: GateSpec,
                source: GateSource, now: float) -> GateResult | None:
    """The gate's decision after a tick: a verdict, or None to tick again."""
    for a in audit:
        if a.action in (AuditAction.STOP, AuditAction.WOULD_STOP):
            verb = "stopped" if a.action == AuditAction.STOP else "would stop (dry run)"
            result.stopped_by = a.rule
            return _end(console, result, _verdict_of_stop(a.rule), f"{verb}: {a.reason}")
        if a.action == AuditAction.STOP_FAILED:
            return _end(console, result, "error", f"the stop failed: {a.reason}")
        console.print(f"[dim]not stopping: {escape(a.reason)}[/]")
    if skipped:
        return _end(console, result, "error", "; ".join(skipped.values()))
    if job.state is JobState.UNKNOWN and job.end_time is not None:
        return _end(console, result, "error", f"the job ended and how is unknown "
                                              f"({job.raw_state})")
    if job.state.terminal:
        if job.state is JobState.SUCCEEDED:
            return _end(console, result, "pass", "the job succeeded")
        reason = job.failure_reason or job.raw_state or job.state.value
        return _end(console, result, "failed", f"the job ended {job.state.value.lower()}: "
                                               f"{reason}")
    ran = now - job.start_time if job.start_time is not None else None
    if spec.deadline_s is not None and ran is not None and ran >= spec.deadline_s:
        if spec.until == "deadline":
            return _end(console, result, "pass", f"healthy at the deadline "
                                                 f"({spec.deadline_s:g}s); left running")
        return _cancel(console, result, source, job, spec,
                       f"still running at the deadline ({spec.deadline_s:g}s of run time)")
    spent = cost.spent(job, policy, now)
    if spec.budget_usd is not None and spent is not None and spent >= spec.budget_usd:
        return _cancel(console, result, source, job, spec,
                       f"spent ${spent:,.2f} of its ${spec.budget_usd:,.2f} budget")
    return None


def _cancel(console: Console, result: GateResult, source: GateSource, job: Job,
            spec: GateSpec, why: str) -> GateResult:
    """An overrun: the job is cancelled through the source's own stop call."""
    result.stopped_by = "gate"
    if spec.dry_run:
        return _end(console, result, "cancelled", f"would cancel (dry run): {why}")
    try:
        source.stop(job, f"trainguard gate: {why}")
    except Exception as e:  # the job may still run: the pipeline must know
        return _end(console, result, "error", f"{why}; the cancel failed: "
                                              f"{type(e).__name__}: {e}")
    return _end(console, result, "cancelled", f"cancelled: {why}")


def _end(console: Console, result: GateResult, verdict: str, reason: str) -> GateResult:
    result.verdict, result.reason = verdict, reason
    style = {"pass": "bold green", "failed": "bold red", "cancelled": "bold magenta"}.get(
        verdict, "bold red")
    console.print(f"[{style}]gate: {verdict.upper()}[/] ({escape(result.job_id)}): "
                  f"{escape(reason)} (exit {result.exit_code})", soft_wrap=True)
    return result
