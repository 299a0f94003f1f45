"""What a job costs: price per hour, money spent so far, money at its planned end."""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Any

import numpy as np

from trainguard.checker.model import FloatArray, Job, Series
from trainguard.checker.policy import Policy
from trainguard.checker.prices import lookup


def hourly_cost(job: Job, policy: Policy) -> float | None:
    """$ per hour for the whole job (all instances), or None when nothing prices it."""
    count = max(job.instance_count, 1)
    if job.hourly_price is not None:
        return job.hourly_price * count
    if job.instance_type:
        if job.instance_type in policy.cost.prices:
            return policy.cost.prices[job.instance_type] * count
        price = lookup(job.instance_type, policy.cost.region)
        if price is not None:
            return price.usd_per_hour * count
    if policy.cost.gpu_hour_usd is not None and job.gpu_count:
        return policy.cost.gpu_hour_usd * job.gpu_count
    return policy.cost.default_hourly_usd


def hours_between(job: Job, start: float | None, end: float) -> float:
    """Hours of the job's own clock between two times; 0 on a step clock."""
    if job.clock == "step" or start is None:
        return 0.0
    return max(end - start, 0.0) / 3600.0


def spent(job: Job, policy: Policy, now: float) -> float | None:
    rate = hourly_cost(job, policy)
    if rate is None:
        return None
    end = min(now, job.end_time) if job.end_time is not None else now
    return rate * hours_between(job, job.start_time, end)


#: Series that repeat the step without making progress (trainguard.emit's pause lines).
NOT_PROGRESS = ("heartbeat", "pause_seconds")


def progress(job: Job, state: dict[str, Any] | None = None) -> Series | None:
    """The series that counts steps (``progress_source``), as a ``step`` series of its
    steps, records without a step left out.

    A rule judged tick after tick passes its ``ctx.state``: whether every step of the
    chosen series is finite is then looked at once per record, and the series is copied
    only where some of its steps are NaN."""
    s = progress_source(job)
    if s is None or s is job.series.get("step"):
        return s
    # name -> (records checked, every step finite)
    seen: dict[str, tuple[int, bool]] = (
        state.setdefault("progress_steps", {}) if state is not None else {})
    n0, all_finite = seen.get(s.name, (0, True))
    if len(s) < n0:  # not the run it saw: start over
        n0, all_finite = 0, True
    if len(s) > n0:
        all_finite = all_finite and bool(np.isfinite(s.step[n0:]).all())
        seen[s.name] = (len(s), all_finite)
    if all_finite:
        return Series("step", s.time, s.step, s.step)
    ok = np.isfinite(s.step)
    return Series("step", s.time[ok], s.step[ok], s.step[ok])


#: A step logged again after a silence this many times the run's median record interval
#: is a resume from a checkpoint, not a step counter that wraps each epoch.
RESUME_GAP_FACTOR = 3.0


def progress_source(job: Job) -> Series | None:
    """The series ``progress`` reads, not a copy: ``step`` if logged, else the longest
    series with steps (records without a step are skipped where it is read)."""
    series = job.series
    step = series.get("step")
    if step is not None and len(step):
        return step
    best: Series | None = None
    for k in series:
        if k.startswith(NOT_PROGRESS):
            continue
        s = series[k]
        if len(s) and (best is None or len(s) > len(best)) \
                and (math.isfinite(s.step[0]) or bool(np.isfinite(s.step).any())):
            best = s
    return best


def logged_again(series: dict[str, Series], source: Series | None, at: float,
                 step: float) -> bool:
    """Whether the record at ``at``, the first after a silence and at the highest step
    so far, writes again the last record before it: every series but ``source`` (the one
    progress is read from) and ``step`` that logs at ``at`` logs ``step`` there and had
    logged ``step`` last, as a process resumed from the checkpoint of its last logged
    step does (series written at slightly different times, as TensorBoard's scalars are,
    are judged by the first); a record of the step alone (a step line with no metric) is
    that step written again, a heartbeat (``NOT_PROGRESS``) is not. An evaluation logged
    at its training step after a long pause is not that: its evaluation loss last logged
    an earlier step (an epoch counter in both records alone does not make it one).
    Decided from the records up to ``at``, so a replay and a check agree."""
    for name, s in series.items():
        if s is source or name == "step" or not len(s):
            continue
        j = int(np.searchsorted(s.time, at, "left"))
        if j >= len(s) or s.time[j] != at:
            continue  # not in that record
        if name.startswith(NOT_PROGRESS):
            return False  # a heartbeat or a pause's end: the process went on, no resume
        if j == 0 or s.step[j] != step or s.step[j - 1] != step:
            return False
    return True


def resumes(prog: Series, job: Job | None = None) -> np.ndarray:
    """Indices of the records where the run resumed from a checkpoint, after a silence
    well beyond the run's own cadence: the step went back below one already logged, or,
    given the job to tell it by, came back to the last one logged with some series
    writing its record again (``logged_again``). A process that was restarted (a spot
    interruption, a crash, a pre-emption) logs again steps it had passed; the silence
    before it was the job being down, not a hang of the job that resumed."""
    if len(prog) < 3:
        return np.empty(0, dtype=np.intp)
    gaps = np.diff(prog.time)
    typical = float(np.median(gaps))
    if not typical > 0:
        return np.empty(0, dtype=np.intp)
    top = np.maximum.accumulate(prog.step)[:-1]
    silent = gaps > RESUME_GAP_FACTOR * typical
    found = silent & (prog.step[1:] < top)
    if job is not None:
        source = progress_source(job)
        for i in np.flatnonzero(silent & (prog.step[1:] == top)):
            found[i] = logged_again(job.series, source, float(prog.time[i + 1]),
                                    float(prog.step[i + 1]))
        if job.launches or job.finishes:
            # the log says a process ended or another began in the silence: the next
            # record is the new process's, even where it goes on at the next step
            at = np.flatnonzero(silent & ~found)
            found[at] = [marked(job, float(prog.time[i]), float(prog.time[i + 1]))
                         for i in at.tolist()]
    return np.flatnonzero(found) + 1


#: No log line for this long before a launch: the processes before it had ended, and the
#: new one's silence counts from its own launch (a restart loop writes on).
QUIET_S = 1800.0


def last_mark(job: Job, a: float, b: float, after: bool = True) -> float | None:
    """The latest time in (``a``, ``b``] (in [``a``, ``b``] with ``after`` False) where the
    log says a process of the run ended or another began (``Job.finishes``,
    ``Job.launches``, in time order); None where it says neither."""
    first = bisect.bisect_right if after else bisect.bisect_left
    found = [xs[j - 1] for xs in (job.launches, job.finishes)
             if (j := bisect.bisect_right(xs, b)) > first(xs, a)]
    return max(found) if found else None


def marked(job: Job, a: float, b: float) -> bool:
    """Whether the log says, between ``a`` and ``b``, that a process of the run ended or
    another began."""
    return last_mark(job, a, b, after=False) is not None


def _said_before(times: list[float], t: float) -> float:
    """The time of the last log line before ``t`` (``times``, the job's lines' in order),
    or -inf."""
    i = bisect.bisect_left(times, t)
    return times[i - 1] if i else -math.inf


def _fresh(job: Job, launches: list[float], since: float) -> list[bool]:
    """Per launch (in time order, after ``since``): whether the log said nothing for
    ``QUIET_S`` before it, since ``since`` or the launch before: the processes before it
    had ended, and someone began this one (not a restart loop, which writes on)."""
    if not launches:
        return []
    times = [line.time for line in job.logs]
    out, floor = [], since
    for launch in launches:
        out.append(launch - max(_said_before(times, launch), floor) > QUIET_S)
        floor = launch
    return out


def launched_since(job: Job, last: float, now: float) -> float | None:
    """The launch (``Job.launches``) after ``last`` and by ``now`` that a silence counts
    from: the first, as processes that die one after another before their first record
    are one silence, unless the log said nothing for ``QUIET_S`` before a later one (a
    process begun and stopped by hand, hours before the one that ran)."""
    later = [t for t in job.launches if last < t <= now]
    if not later:
        return None
    start = later[0]
    for launch, fresh in zip(later[1:], _fresh(job, later[1:], later[0]), strict=True):
        if fresh:
            start = launch
    return start


def fresh_launch(job: Job | None, a: float, b: float) -> bool:
    """Whether a process began between ``a`` and ``b`` after the log had said nothing
    for ``QUIET_S`` (``_fresh``): a new attempt, whatever the processes before it did."""
    if job is None or not job.launches:
        return False
    later = [t for t in job.launches if a < t <= b]
    return any(_fresh(job, later, a))


def fruitless(prog: Series, back: np.ndarray) -> np.ndarray:
    """Per resume in ``back``: its process logged no step beyond the one it resumed at
    before the next resume (or up to now, for the last)."""
    ends = [*back[1:].tolist(), len(prog)]
    return np.array([not (b > a + 1 and float(np.max(prog.step[a + 1:b])) > prog.step[a])
                     for a, b in zip(back.tolist(), ends, strict=True)], dtype=bool)


def counted_resumes(prog: Series, back: np.ndarray, job: Job | None = None) -> np.ndarray:
    """The resumes in ``back`` that are progress: not those that follow a resume whose
    process got no further. A restart loop (each process writes its checkpoint's record
    again and dies) is one long silence from its first resume, not a string of fresh
    starts, each of which would hide the one before. A resume its log shows begun after
    half an hour of nothing (``fresh_launch``, given ``job``) is a fresh start all the
    same: the user came back to the run."""
    if not len(back):
        return back
    dead = fruitless(prog, back)
    keep = np.r_[True, ~dead[:-1]]
    for k in np.flatnonzero(~keep).tolist():
        i = int(back[k])
        keep[k] = fresh_launch(job, float(prog.time[i - 1]), float(prog.time[i]))
    return back[keep]


def down_spans(prog: Series, job: Job) -> list[tuple[float, float]]:
    """Where the job was down, in hindsight: from the record before each counted resume
    to the resume, or to the launch its new process's silence counts from
    (``launched_since``); and from the last record to a launch after it, beyond the
    run's cadence (a process begun again when the log ends, before its first record)."""
    spans = []
    for i in counted_resumes(prog, resumes(prog, job), job).tolist():
        a, b = float(prog.time[i - 1]), float(prog.time[i])
        spans.append((a, launched_since(job, a, b) or b))
    if job.launches and len(prog) >= 3:
        a = float(prog.time[-1])
        start = launched_since(job, a, math.inf)
        if start is not None and start - a > RESUME_GAP_FACTOR * float(
                np.median(np.diff(prog.time))):
            spans.append((a, start))
    return spans + _down_before(job, float(prog.time[0]) if len(prog) else math.inf)


def _down_before(job: Job, first: float) -> list[tuple[float, float]]:
    """Down before the first record, where no cadence is known yet: from a line saying
    training finished to the next launch (or the first record), and from a process's
    last line to a launch after half an hour of nothing (``_fresh``): launches that
    died or finished before the run that logged began."""
    spans = []
    launches = [t for t in job.launches if t < first]
    for f in (t for t in job.finishes if t < first):
        spans.append((f, next((t for t in launches if t > f), first)))
    times = [line.time for line in job.logs] if launches else []
    for launch, fresh in zip(launches, _fresh(job, launches, -math.inf), strict=True):
        said = _said_before(times, launch)
        if fresh and said > -math.inf:
            spans.append((said, launch))
    return spans


def update_times(prog: Series, job: Job | None = None,
                 back: np.ndarray | None = None) -> FloatArray:
    """When progress was made: the times of the records that raised the step beyond every
    step before them (a repeated or lower step is no progress). After a resume from a
    checkpoint (``back``, or ``resumes`` told by ``job`` where given) the count starts
    again: the resumed process's first record and every step it raises are progress,
    unless the process resumed before it got no further (``counted_resumes``)."""
    if not len(prog):
        return np.empty(0)
    if back is None:
        back = resumes(prog, job)
    counted = set(counted_resumes(prog, back, job).tolist())
    starts = [0, *back.tolist(), len(prog)]
    rises = np.empty(len(prog), dtype=bool)
    for a, b in itertools.pairwise(starts):
        best = np.maximum.accumulate(prog.step[a:b])
        rises[a] = a == 0 or a in counted
        np.greater(best[1:], best[:-1], out=rises[a + 1:b])
    return prog.time[rises]


def recent_rate(prog: Series | None) -> float | None:
    """Steps per second over the most recent half of the progress series, so that
    compile and warm-up gaps at the start fall out; None when it cannot be told."""
    if prog is None or len(prog) < 2:
        return None
    half = len(prog) // 2
    dt = float(prog.time[-1] - prog.time[half])
    ds = float(prog.step[-1] - prog.step[half])
    return ds / dt if dt > 0 and ds > 0 else None


def planned_end(job: Job, now: float) -> float | None:
    """When the job should finish on its clock: planned steps at the recent rate, or max runtime."""
    candidates: list[float] = []
    if job.max_runtime_s and job.start_time is not None:
        candidates.append(job.start_time + job.max_runtime_s)
    # the progress series only when planned steps need it (a copy: a replay asks at every tick)
    prog = progress(job) if job.planned_steps else None
    rate = recent_rate(prog) if job.clock != "step" else None
    if job.planned_steps and prog is not None and rate:
        remaining = max(job.planned_steps - prog.step[-1], 0.0)
        candidates.append(max(now, float(prog.time[-1])) + remaining / rate)
    finite = [c for c in candidates if math.isfinite(c)]
    return min(finite) if finite else None


def projected(job: Job, policy: Policy, now: float) -> float | None:
    """The job's total spend if it runs to its planned end (or what it has spent, if ended)."""
    rate = hourly_cost(job, policy)
    if rate is None:
        return None
    if job.end_time is not None and job.end_time <= now:
        return spent(job, policy, now)
    end = planned_end(job, now)
    if end is None:
        return None
    return rate * hours_between(job, job.start_time, max(end, now))
