"""Replay a finished run tick by tick, as the watchdog would have seen it live.

Ticks fall at a fixed interval on the run's own time axis (seconds, or steps on a
step clock) from its first record to the first tick at or past its last record.
At each tick the job is cut back to what had been recorded by then
(``Job.until``) and judged by ``checker.evaluate``. The result says when each
finding (by ``Finding.key``) first fired, when it escalated, and what stopping at
the first critical finding would have saved.

The interval, unless given, is the run's own logging interval (the median gap between
its records), but no shorter than the live watchdog's ``LIVE_TICK_S`` on a time axis
(it judges no more often than that) and widened where it would make more than
``MAX_AUTO_TICKS`` ticks. Each first fire and escalation is then timed back to the
record that caused it, so it is reported at most one logging interval late; what
comes and goes between two ticks is not seen, as the live watchdog would not see it.
A given interval is honoured up to ``MAX_TICKS`` ticks, counted before any judging
starts, and fires are reported at the ticks.

The cost stays linear in the run's length where it can honestly be: the job is cut
with views, not copies, and each rule follows the run through a ``checker.follow``
follower that re-runs it only when what it read has changed.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from trainguard.checker import cost
from trainguard.checker.evaluate import build_rules, evaluate
from trainguard.checker.follow import Changed, Followers
from trainguard.checker.model import (
    Finding,
    FloatArray,
    Job,
    JobState,
    LogLine,
    Series,
    Severity,
)
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Rule
from trainguard.checker.skip import Span, quiet_until
from trainguard.checker.skip import skip as skip_ticks

TickUnit = Literal["s", "step"]

#: A given tick making more ticks than this is almost surely a unit mistake (ms for s).
MAX_TICKS = 10_000_000
#: The automatic schedule never makes more ticks than this; each fire is then timed back
#: to its record, so a long run costs this many judgements plus a few per finding.
MAX_AUTO_TICKS = 1_000
#: A fire is timed back over at most this many records by walking them in order with a
#: follower; over more, by bisection with a fresh judgement at each step.
WALK_RECORDS = 4_096
#: The live watchdog's usual cadence (seconds): the automatic schedule on a time axis
#: judges no more often than this.
LIVE_TICK_S = 60.0
#: Ticks skipped at once at most (``checker.skip``): a band is checked over that many.
_SKIP_LIMIT = 1 << 16
#: Where the ticks could not be skipped, the next try waits twice as long, up to this many
#: ticks: a rule run at every tick (one reading the clock) makes each try a loss.
_SKIP_BACKOFF = 64


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
    rule_calls: int = 0  # rule judgements asked for (rules x ticks)
    rule_runs: int = 0  # of those, the ones that ran the rule (the rest: input unchanged)
    timed_back: bool = False  # fires moved back from their tick to the record that made them
    times: FloatArray | None = None  # the ticks
    judged: int = 0  # ticks judged; the others answered as the tick before (checker.skip)

    def tick_before(self, t: float) -> float:
        """The tick before the one at ``t`` (-inf for the first)."""
        if self.times is None:
            return t - self.tick
        at = int(self.times.searchsorted(t, "left"))
        return float(self.times[at - 1]) if at > 0 else -math.inf

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


def record_times(job: Job) -> FloatArray:
    """Every distinct time at which anything was recorded, in order."""
    parts = [s.time for s in job.series.values()]
    parts.append(np.fromiter((line.time for line in job.logs), np.float64, len(job.logs)))
    t = np.concatenate(parts) if parts else np.empty(0)
    return np.unique(t[np.isfinite(t)])


def logging_interval(job: Job) -> float | None:
    """The run's typical gap between records (the median), on its own clock."""
    t = record_times(job)
    gaps = np.diff(t)
    return float(np.median(gaps)) if len(gaps) else None


def auto_tick(job: Job) -> float:
    """One logging interval, no shorter than LIVE_TICK_S on a time axis, widened where
    that would make more than MAX_AUTO_TICKS ticks."""
    t = record_times(job)
    span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    interval = logging_interval(job) or 1.0
    if job.clock != "step":
        interval = max(interval, LIVE_TICK_S)
    return max(interval, span / (MAX_AUTO_TICKS - 1)) if span > 0 else interval


def tick_count(start: float, end: float, tick: float) -> int:
    if not (tick > 0 and math.isfinite(tick)):
        raise ValueError(f"tick must be a positive number, not {tick}")
    return max(math.ceil((end - start) / tick - 1e-9), 0) + 1


def check_ticks(job: Job, tick: float | None) -> float:
    """The tick to replay ``job`` at (``None``: automatic), refused before any work when a
    given tick makes more than MAX_TICKS ticks."""
    if tick is None:
        return auto_tick(job)
    start, end = first_record(job), job.last_time()
    if start is not None and end is not None:
        n = tick_count(start, end, tick)
        if n > MAX_TICKS:
            raise ValueError(f"tick {tick:g} makes {n:,} ticks over a run of {end - start:g}; "
                             f"at most {MAX_TICKS:,}: use a larger --tick, or none for one "
                             "logging interval")
    elif not (tick > 0 and math.isfinite(tick)):
        raise ValueError(f"tick must be a positive number, not {tick}")
    return tick


def tick_times(start: float, end: float, tick: float) -> FloatArray:
    """``start``, ``start + tick``, ... up to the first tick at or past ``end``."""
    return start + tick * np.arange(tick_count(start, end, tick), dtype=np.float64)


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


class Cuts:
    """``job`` as recorded up to a time: what ``Job.until`` gives, made for a million cuts
    of one job. Series are cut as views without re-validating them (a series that gained
    nothing since the last cut is the same object), log lines by bisection when they are
    in time order; tests hold it equal to ``Job.until``."""

    #: ticks planned ahead (``plan``) have their record counts found this many at a time
    CHUNK = 4096

    def __init__(self, job: Job) -> None:
        self.job = job
        t = np.fromiter((line.time for line in job.logs), np.float64, len(job.logs))
        self.log_times = t if bool(np.all(np.diff(t) >= 0)) else None
        self.heads: dict[str, Series] = {}
        self._names = list(job.series)
        self._cols = [job.series[k].time for k in self._names]
        if self.log_times is not None:
            self._cols.append(self.log_times)
        self._ticks: FloatArray = np.empty(0)
        self._ahead: list[float] = []  # the chunk of planned ticks whose counts are known
        self._next = 0  # the planned tick expected next
        self._rows: list[list[int]] = []
        self._rows_from = 0
        self._row: list[int] | None = None  # the counts of the last cut
        self._out: dict[str, Series] = {}
        self._lens = [-1] * len(self._names)  # records in each series' head
        self._logs: list[LogLine] = []
        self._grown: dict[frozenset[str], frozenset[str]] = {}
        # Where the log resumes from a checkpoint, the job was down from its record before
        # to the resume (a live watchdog would have seen the first process end); the cuts
        # in between say so instead of calling the job running. Hindsight, stated as such.
        # Not before a resume that follows one whose process got no further: a restart
        # loop is a stall from its first resume (``cost.counted_resumes``).
        # Where the log says a new process began in the silence (``Job.launches``), down
        # ends there: ``stall`` judges the new process's silence from its launch.
        prog = cost.progress(job)
        self.down = [] if prog is None else cost.down_spans(prog, job)
        # what changed from the cut before to the last one made
        self.grown: set[str] = set()
        self.logs_grown = self.state_changed = True
        self._last: tuple[Any, ...] | None = None

    def plan(self, times: FloatArray) -> None:
        """The ticks about to be cut, in order: their record counts are then found a chunk
        of ticks at a time (one ``searchsorted`` per series per chunk, not per tick)."""
        self._ticks, self._next, self._rows, self._rows_from = times, 0, [], 0
        self._ahead = []

    def skip_to(self, i: int) -> None:
        """Cut at the planned tick ``i``, after ticks skipped (``checker.skip``): what the
        next cut gained is then counted from this one."""
        self._next = i
        self(float(self._ticks[i]))

    def _counts(self, t: float) -> list[int]:
        """Records of each series (then of the log lines, when in time order) at ``t``."""
        i = self._next
        if i < len(self._ticks):
            if not self._rows_from <= i < self._rows_from + len(self._rows):
                ahead = self._ticks[i:i + self.CHUNK]
                cols = [c.searchsorted(ahead, "right") for c in self._cols]
                self._rows = (np.stack(cols, axis=1).tolist() if cols
                              else [[] for _ in range(len(ahead))])
                self._rows_from, self._ahead = i, ahead.tolist()
            if self._ahead[i - self._rows_from] == t:
                self._next = i + 1
                return self._rows[i - self._rows_from]
        return [int(c.searchsorted(t, "right")) for c in self._cols]

    def _series(self, counts: list[int]) -> dict[str, Series]:
        if counts == self._row:
            self.grown = set()
            return self._out  # nothing new since the last cut: the same series
        out = {}
        self.grown = set()
        series, heads, lens = self.job.series, self.heads, self._lens
        for j, (k, n) in enumerate(zip(self._names, counts, strict=False)):
            if lens[j] != n:
                heads[k] = _head(series[k], n)
                lens[j] = n
                self.grown.add(k)
            out[k] = heads[k]
        self._row, self._out = counts, out
        return out

    def __call__(self, t: float) -> Job:
        job = self.job
        counts = self._counts(t)
        if self.log_times is None:
            logs = [line for line in job.logs if line.time <= t]
        elif len(self._logs) == counts[-1]:
            logs = self._logs  # no new line: the same list
        else:
            logs = self._logs = job.logs[: counts[-1]]
        ended = job.end_time is not None and job.end_time <= t
        restarts = ([r for r in job.restart_times if r <= t] if job.restart_times else [])
        down = next(((a, b) for a, b in self.down if a < t < b), None) if self.down else None
        now = (len(logs), ended, len(restarts), down)
        self.logs_grown = self._last is None or now[0] != self._last[0]
        self.state_changed = self._last is None or now[1:] != self._last[1:]
        self._last = now
        cut = object.__new__(Job)  # a shallow copy: dataclasses.replace costs more than a rule
        cut.__dict__.update(job.__dict__)
        state = job.state if ended and not job.state.terminal else JobState.RUNNING
        if down is not None and not ended:
            state = JobState.PENDING
            cut.__dict__["raw_state"] = ("down: its log resumes from a checkpoint "
                                         f"{down[1] - down[0]:.0f} s after its last record")
        cut.__dict__.update(
            state=state,
            end_time=job.end_time if ended else None,
            series=self._series(counts),
            # per-host series (rarely there) are cut plainly: rules read them seldom
            hosts={h: {k: s.until(t) for k, s in by.items()} for h, by in job.hosts.items()}
            if job.hosts else job.hosts,
            logs=logs,
            restart_times=restarts,
            launches=[x for x in job.launches if x <= t] if job.launches else job.launches,
            finishes=[x for x in job.finishes if x <= t] if job.finishes else job.finishes,
            restarts=len(restarts) if job.restart_times else job.restarts,
        )
        return cut

    def changed(self, before: float, now: float) -> Changed:
        """What the last cut (at ``now``) holds that the one before it (at ``before``) did
        not."""
        grown = frozenset(self.grown)
        grown = self._grown.setdefault(grown, grown)  # one object (its hash kept) per kind
        return Changed(before, now, grown, self.logs_grown, self.state_changed)


def _head(s: Series, n: int) -> Series:
    """The first ``n`` records of ``s``: ``s`` itself when that is all of them."""
    if n == len(s):
        return s
    head = Series.__new__(Series)  # views of arrays already checked: no re-validation
    head.name, head.time, head.step, head.value = s.name, s.time[:n], s.step[:n], s.value[:n]
    return head


def first_finding(cut: Job, policy: Policy, rule: Rule, t: float,
                  holds: Callable[[Finding], bool]) -> Finding | None:
    """The first finding of ``rule`` on ``cut`` at ``t`` for which ``holds`` is true."""
    for f in evaluate([cut], policy, t, rules=[rule]):
        if holds(f):
            return f
    return None


def refine(cuts: Cuts, policy: Policy, rule: Rule, holds: Callable[[Finding], bool],
           lo: float, hi: float, records: FloatArray,
           resolution: float | None) -> tuple[float, Finding | None]:
    """The earliest moment in (lo, hi] at which ``rule`` says something that ``holds``,
    given it does at ``hi`` and did not at ``lo``: the record that made it, by bisection
    over the records in between; then, where only time passed since that record (a
    silence), by halving the gap down to ``resolution`` (None: records only)."""
    def found_at(t: float) -> Finding | None:
        return first_finding(cuts(t), policy, rule, t, holds)

    cands = records[(records > lo) & (records < hi)]
    if len(cands) <= WALK_RECORDS:
        a = _walk(cuts, policy, rule, holds, cands)
    else:
        a, b = 0, len(cands)  # it holds at cands[b] (or at hi when b == len)
        while a < b:
            m = (a + b) // 2
            if found_at(float(cands[m])) is not None:
                b = m
            else:
                a = m + 1
    t_hi = float(cands[a]) if a < len(cands) else hi
    t_lo = float(cands[a - 1]) if a > 0 else lo
    # Before the run's first record there is no silence to halve (lo is -inf there): a
    # finding on the first record (a NaN in it) is timed to that record.
    while resolution is not None and math.isfinite(t_lo) and t_hi - t_lo > resolution:
        mid = (t_lo + t_hi) / 2
        if found_at(mid) is not None:
            t_hi = mid
        else:
            t_lo = mid
    return t_hi, found_at(t_hi)


def _walk(cuts: Cuts, policy: Policy, rule: Rule, holds: Callable[[Finding], bool],
          cands: FloatArray) -> int:
    """The index of the first of ``cands`` (records in time order) at which ``rule`` says
    something that ``holds`` (``len(cands)`` when none), judged record after record by a
    follower: one judgement of the whole run, then only the records new at each (a rule
    judged afresh at every step of a bisection reads the whole run each time)."""
    followers = Followers()
    before: float | None = None
    for i, t in enumerate(cands.tolist()):
        cut = cuts(t)
        followers.changed = cuts.changed(before, t) if before is not None else None
        before = t
        if any(holds(f) for f in evaluate([cut], policy, t, rules=[rule],
                                          followers=followers)):
            return i
    return len(cands)


def replay(job: Job, policy: Policy, tick: float | None = None,
           rules: list[Rule] | None = None, followers: Followers | None = None,
           resolution: float = 1.0, skip: bool = True) -> ReplayResult:
    """Judge ``job`` at every tick of ``tick`` (seconds, or steps on a step clock).

    With ``tick`` None the ticks fall every logging interval, no more than
    MAX_AUTO_TICKS of them, and each first fire and escalation is timed back to the
    record that caused it (``refine``; on a time axis, to ``resolution`` seconds within
    a silence), so it is reported at most one logging interval late. With a given tick
    the fires are reported at the ticks, as a live watchdog at that cadence saw them.
    ``followers`` may be passed in to judge the same job again later. ``skip`` False
    judges every tick, where ticks at which no rule has anything new to read are
    otherwise skipped (``checker.skip``): the same result, tested so."""
    began = _time.perf_counter()
    rules = build_rules(policy) if rules is None else rules
    timed_back = tick is None
    tick = check_ticks(job, tick)
    followers = Followers() if followers is None else followers
    start = first_record(job)
    end = job.last_time()
    unit: TickUnit = "step" if job.clock == "step" else "s"
    if start is None or end is None:  # nothing recorded: nothing to replay
        return ReplayResult(job, tick, unit, 0, math.nan, math.nan, cost.hourly_cost(job, policy),
                            [], [], None, (_time.perf_counter() - began) * 1e3)
    prog = cost.progress(job)

    def step_at(t: float) -> float | None:
        return prog.at(t) if prog is not None else None

    cuts = Cuts(job)
    histories: dict[str, History] = {}
    final: list[Finding] = []
    times = tick_times(start, end, tick)
    # the last tick judges the run as of its last record, as ``check`` does: later, the
    # silence after a finished run would read as a stall
    times[-1] = min(times[-1], end)
    cuts.plan(times)
    before: float | None = None
    seen_last: dict[str, tuple[float, Severity]] = {}
    span = Span(job, times, cuts.down) if skip else None
    wait = next_try = 1  # ticks skipped only where that is likely: see ``_SKIP_BACKOFF``
    i = judged = 0
    while i < len(times):
        t = times.item(i)
        cut = cuts(t)
        followers.changed = cuts.changed(before, t) if before is not None else None
        final = evaluate([cut], policy, t, rules=rules, followers=followers)
        before = t
        i += 1
        judged += 1
        if span is not None and i >= next_try and i < len(times):
            # the ticks up to the one before ``quiet`` answer as this one: only that one
            # is judged (each finding's last sighting and money are its own)
            quiet = quiet_until(followers, rules, span, i - 1, _SKIP_LIMIT)
            if quiet > i + 1:
                skip_ticks(followers, rules, span, i - 1, quiet - 2)
                cuts.skip_to(quiet - 2)
                before, i, wait = times.item(quiet - 2), quiet - 1, 1
                next_try = quiet + 1  # (the tick before ``quiet`` is known quiet)
            else:
                wait = min(2 * wait, _SKIP_BACKOFF)
                next_try = i + wait
        for f in final:
            h = histories.get(f.key)
            if h is None:
                fire = Fire(t, step_at(t), f.severity)
                histories[f.key] = History(f.key, f.rule, fire, fire, f)
            elif f.severity.rank > h.worst.rank:
                fire = Fire(t, step_at(t), f.severity)
                h.escalations.append(fire)
                h.last_seen, h.finding = fire, f
            else:  # seen again: its Fire is made once, after the last tick
                h.finding = f
                seen_last[f.key] = (t, f.severity)
    for key, (t, severity) in seen_last.items():
        h = histories[key]
        if t > h.last_seen.time:
            h.last_seen = Fire(t, step_at(t), severity)
    followers.changed = None  # what comes next is not the next tick
    if timed_back:
        _time_back(cuts, policy, rules, list(histories.values()), times, step_at,
                   None if job.clock == "step" else resolution)

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
    result.rule_calls, result.rule_runs = followers.calls, followers.runs
    result.timed_back = timed_back
    result.times = times
    result.judged = judged
    result.elapsed_ms = (_time.perf_counter() - began) * 1e3
    return result


def _time_back(cuts: Cuts, policy: Policy, rules: list[Rule], histories: list[History],
               times: FloatArray, step_at: Callable[[float], float | None],
               resolution: float | None) -> None:
    """Each history's first fire and escalations moved back from their tick to the
    record (or, in a silence, the moment) at which the finding first held."""
    by_name = {r.name: r for r in rules}
    records = record_times(cuts.job)
    for h in histories:
        rule = by_name.get(h.rule)
        if rule is None:
            continue
        moved: list[Fire] = []
        for fire in (h.first, *h.escalations):
            rank = fire.severity.rank

            def holds(f: Finding, key: str = h.key, rank: int = rank) -> bool:
                return f.key == key and f.severity.rank >= rank

            at = int(times.searchsorted(fire.time, "left"))  # the tick before this one
            before = float(times[at - 1]) if at > 0 else -math.inf
            lo = max(before, moved[-1].time if moved else -math.inf)
            t, found = refine(cuts, policy, rule, holds, lo, fire.time, records, resolution)
            moved.append(Fire(t, step_at(t), found.severity if found else fire.severity))
        h.first, h.escalations = moved[0], moved[1:]
