"""Replay a finished run tick by tick, as the watchdog would have seen it live.

Ticks fall at a fixed interval on the run's own time axis (seconds, or steps on a
step clock) from its first record to the first tick at or past its last record.
At each tick the job is cut back to what had been recorded by then
(``Job.until``) and judged by ``checker.evaluate``. The result says when each
finding (by ``Finding.key``) first fired, when it escalated, and what stopping at
the first critical finding would have saved.

The benchmark harness calls ``replay`` on hundreds of runs, so the rules are built
once and the run's step axis is read once; ``Job.until`` slices views, not copies.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from checker import cost
from checker.evaluate import build_rules, evaluate
from checker.model import Finding, FloatArray, Job, Severity
from checker.policy import Policy
from checker.rules.base import Rule

TickUnit = Literal["s", "step"]

#: A replay with more ticks than this is almost surely a unit mistake (ms for s).
MAX_TICKS = 200_000


@dataclass(frozen=True)
class Fire:
    """A moment in the replay: the tick's time, the run's last logged step by then."""

    time: float
    step: float | None
    severity: Severity


@dataclass(frozen=True)
class Savings:
    """What stopping the run at ``stop_time`` would have saved, up to its real end."""

    stop_time: float
    stop_step: float | None
    end_time: float
    end_step: float | None
    remaining_hours: float | None  # None on a step clock: there is no time to count
    remaining_steps: float | None
    hourly_usd: float | None  # None when nothing prices the job
    usd: float | None
    gpu_hours: float | None  # None when the job's GPU count is unknown


@dataclass
class History:
    """One finding (one ``Finding.key``) across the replay."""

    key: str
    rule: str
    first: Fire
    last_seen: Fire
    finding: Finding  # as last seen: its latest message, evidence and money
    escalations: list[Fire] = field(default_factory=list)  # each rise above the worst so far
    savings: Savings | None = None  # stopping at this finding's first critical tick

    @property
    def worst(self) -> Severity:
        return self.escalations[-1].severity if self.escalations else self.first.severity

    @property
    def first_critical(self) -> Fire | None:
        for fire in (self.first, *self.escalations):
            if fire.severity is Severity.CRITICAL:
                return fire
        return None


@dataclass
class ReplayResult:
    job: Job
    tick: float
    unit: TickUnit
    ticks: int
    start: float  # the first record, on the job's clock
    end: float  # the last record
    hourly_usd: float | None
    histories: list[History]  # in the order they first fired
    final: list[Finding]  # the findings at the last tick
    savings: Savings | None  # stopping at the run's first critical finding
    elapsed_ms: float  # wall time the replay took

    @property
    def first_critical(self) -> History | None:
        fired = [(h.first_critical, h) for h in self.histories if h.first_critical is not None]
        if not fired:
            return None
        return min(fired, key=lambda pair: pair[0].time if pair[0] else math.inf)[1]


def first_record(job: Job) -> float | None:
    times = [float(s.time[0]) for s in job.series.values() if len(s)]
    times += [job.logs[0].time] if job.logs else []
    return min(times) if times else None


def tick_times(start: float, end: float, tick: float) -> FloatArray:
    """``start``, ``start + tick``, ... up to the first tick at or past ``end``."""
    if not (tick > 0 and math.isfinite(tick)):
        raise ValueError(f"tick must be a positive number, not {tick}")
    n = max(math.ceil((end - start) / tick - 1e-9), 0) + 1
    if n > MAX_TICKS:
        raise ValueError(f"tick {tick:g} makes {n} ticks over a run of {end - start:g}; "
                         f"use a larger --tick (at most {MAX_TICKS} ticks)")
    return start + tick * np.arange(n, dtype=np.float64)


def savings(job: Job, policy: Policy, stop: Fire, end_time: float,
            end_step: float | None) -> Savings:
    """Remaining run time (or steps) after ``stop`` × the job's hourly cost, and GPU-hours."""
    rate = cost.hourly_cost(job, policy)
    hours = None if job.clock == "step" else cost.hours_between(job, stop.time, end_time)
    steps = (max(end_step - stop.step, 0.0)
             if end_step is not None and stop.step is not None else None)
    return Savings(
        stop_time=stop.time, stop_step=stop.step, end_time=end_time, end_step=end_step,
        remaining_hours=hours, remaining_steps=steps, hourly_usd=rate,
        usd=rate * hours if rate is not None and hours is not None else None,
        gpu_hours=job.gpu_count * hours if job.gpu_count and hours is not None else None,
    )


def replay(job: Job, policy: Policy, tick: float,
           rules: list[Rule] | None = None) -> ReplayResult:
    """Judge ``job`` at every tick of ``tick`` (seconds, or steps on a step clock)."""
    began = _time.perf_counter()
    rules = build_rules(policy) if rules is None else rules
    start = first_record(job)
    end = job.last_time()
    unit: TickUnit = "step" if job.clock == "step" else "s"
    if start is None or end is None:  # nothing recorded: nothing to replay
        return ReplayResult(job, tick, unit, 0, math.nan, math.nan, cost.hourly_cost(job, policy),
                            [], [], None, (_time.perf_counter() - began) * 1e3)
    prog = cost.progress(job)

    def step_at(t: float) -> float | None:
        return prog.at(t) if prog is not None else None

    histories: dict[str, History] = {}
    final: list[Finding] = []
    times = tick_times(start, end, tick)
    # the last tick judges the run as of its last record, as ``check`` does: later, the
    # silence after a finished run would read as a stall
    times[-1] = min(times[-1], end)
    for t in times.tolist():
        final = evaluate([job.until(t)], policy, t, rules=rules)
        for f in final:
            fire = Fire(t, step_at(t), f.severity)
            h = histories.get(f.key)
            if h is None:
                histories[f.key] = History(f.key, f.rule, fire, fire, f)
                continue
            if f.severity.rank > h.worst.rank:
                h.escalations.append(fire)
            h.last_seen, h.finding = fire, f

    end_time = job.end_time if job.end_time is not None else end
    end_step = step_at(math.inf)
    for h in histories.values():
        crit = h.first_critical
        if crit is not None:
            h.savings = savings(job, policy, crit, end_time, end_step)
    ordered = sorted(histories.values(), key=lambda h: h.first.time)
    result = ReplayResult(job, tick, unit, len(times), start, end, cost.hourly_cost(job, policy),
                          ordered, final, None, 0.0)
    first = result.first_critical
    result.savings = first.savings if first is not None else None
    result.elapsed_ms = (_time.perf_counter() - began) * 1e3
    return result
