"""Injected slowdowns and stragglers, for the ``slowdown`` rule (label ``slowed``).

* ``slowdown``: from a moment at 30-70 % of the run (and no sooner than the rule can have
  learnt the run's speed), throughput is halved for 20 minutes: every record in the 10
  minutes of the run after the onset is spread over 20, and every later record moves 10
  minutes later. Values are untouched. Must fire (``slowed``), within 15 minutes.
* ``straggler``: the same slowdown, and four hosts' GPU use (``Job.hosts``, one sample a
  minute, ~90 %): during it one host's GPUs sit at ~30 % (its input stalls) while the
  others wait in collectives at their usual level. Must fire and name that host.

A run too short (or logged too sparsely) to carry 20 slowed minutes after a learnt
baseline raises ``ValueError``; the bench leaves it out, as it does for other faults.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from trainguard.bench.injected import Injected
from trainguard.checker.cost import progress
from trainguard.checker.model import FloatArray, Job, LogLine, Series
from trainguard.checker.rules.slowdown import SlowdownParams

#: The bar: throughput halved for 20 minutes.
SLOW_FACTOR, SLOW_FOR_S = 2.0, 1200.0
#: Four hosts, as a 4-node job has.
HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")
_P = SlowdownParams()
#: No onset before the rule can know the run's speed: warm-up and a baseline's blocks.
EARLIEST_S = _P.warmup_seconds + (_P.min_baseline_blocks + 2) * _P.block_seconds


def _onset(job: Job, kind: str, rng: np.random.Generator) -> tuple[float, float]:
    """(onset time, onset step) for a slowdown, or ValueError when the run cannot carry one."""
    if job.clock == "step":
        raise ValueError(f"job {job.id!r}: cannot inject {kind}: no time axis (step clock)")
    prog = progress(job)
    if prog is None or len(prog) < 10:
        raise ValueError(f"job {job.id!r}: cannot inject {kind}: no progress series")
    t0, t1 = float(prog.time[0]), float(prog.time[-1])
    # the run's speed is known EARLIEST_S after it started making steps at its pace: past
    # a compile or warm-up silence at the start (the longest gap of its first third, when
    # it is far longer than the run's usual gap)
    gaps = np.diff(prog.time[: max(len(prog) // 3, 2)])
    k = int(np.argmax(gaps)) + 1 if len(gaps) and gaps.max() > 10 * np.median(gaps) else 0
    lo = max(t0 + 0.3 * (t1 - t0), float(prog.time[k]) + EARLIEST_S)
    hi = min(t0 + 0.7 * (t1 - t0), t1 - SLOW_FOR_S / SLOW_FACTOR)
    if hi <= lo:
        raise ValueError(f"job {job.id!r}: cannot inject {kind}: the run ({(t1 - t0) / 60:.0f} "
                         f"min) is too short for {SLOW_FOR_S / 60:.0f} slowed minutes after "
                         f"{EARLIEST_S / 60:.0f} min of learnt speed")
    at = float(rng.uniform(lo, hi))
    inside = (prog.time > at) & (prog.time <= at + SLOW_FOR_S / SLOW_FACTOR)
    if int(inside.sum()) < 2 * _P.min_slow_updates:
        raise ValueError(f"job {job.id!r}: cannot inject {kind}: too few progress records "
                         "in the slowed stretch (sparse logging)")
    before = prog.step[prog.time <= at]
    return at, float(before[-1]) if len(before) else float(prog.step[0])


def _warp(at: float) -> tuple[float, float]:
    return at, at + SLOW_FOR_S / SLOW_FACTOR


def warped(t: FloatArray, at: float) -> FloatArray:
    """Times after ``at``: the next 10 minutes spread over 20, the rest 10 minutes later."""
    start, end = _warp(at)
    out = np.where(t > start, start + SLOW_FACTOR * (t - start), t)
    return np.where(t > end, t + (SLOW_FACTOR - 1.0) * (end - start), out)


def _slowed(job: Job, kind: str, at: float) -> Job:
    def shift(t: object) -> FloatArray:
        return warped(np.asarray(t, dtype=np.float64), at)

    series = {k: Series(s.name, shift(s.time), s.step.copy(), s.value.copy())
              for k, s in job.series.items()}
    logs = [LogLine(float(shift([line.time])[0]), line.text) for line in job.logs]
    end = float(shift([job.end_time])[0]) if job.end_time is not None else None
    tags = {**job.tags, "injected": kind}
    return dataclasses.replace(
        job, id=f"{job.id}#{kind}", name=f"{job.name or job.id}#{kind}", tags=tags,
        series=series, logs=logs, end_time=end,
        restart_times=[float(shift([r])[0]) for r in job.restart_times])


def slowdown(job: Job, rng: np.random.Generator) -> Injected:

    at, step = _onset(job, "slowdown", rng)
    out = _slowed(job, "slowdown", at)
    return Injected(out, "slowdown", "slowed", step, at,
                    f"throughput halved for {SLOW_FOR_S / 60:.0f} min from {at:g} (step {step:g})",
                    {"slow_for_s": SLOW_FOR_S, "factor": SLOW_FACTOR})


def straggler(job: Job, rng: np.random.Generator) -> Injected:

    at, step = _onset(job, "straggler", rng)
    out = _slowed(job, "straggler", at)
    last = out.last_time()
    first = min(float(s.time[0]) for s in out.series.values() if len(s))
    times = np.arange(first, (last if last is not None else first) + 60.0, 60.0)
    lagging = int(rng.integers(len(HOSTS)))
    during = (times > at) & (times <= at + SLOW_FOR_S)
    hosts = {}
    for i, h in enumerate(HOSTS):
        v = rng.normal(90.0, 2.0, len(times))
        if i == lagging:
            v[during] = rng.normal(30.0, 3.0, int(during.sum()))
        hosts[h] = {"gpu_util": Series("gpu_util", times, np.full(len(times), np.nan),
                                       np.clip(v, 0.0, 100.0))}
    out = dataclasses.replace(out, hosts=hosts)
    return Injected(out, "straggler", "slowed", step, at,
                    f"host {HOSTS[lagging]} lags: throughput halved for "
                    f"{SLOW_FOR_S / 60:.0f} min from {at:g} (step {step:g})",
                    {"slow_for_s": SLOW_FOR_S, "straggler": float(lagging + 1)})
