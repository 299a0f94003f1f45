"""Labelled faults injected into real healthy runs, seeded and reproducible.

Each injector takes a healthy ``Job`` and a ``numpy.random.Generator`` and returns
a new Job (the input is never changed) with what a detector should say about it:

* ``stall``: the log stops at 30-80 % of the run while the job stays RUNNING.
  Must fire (label ``stalled``); ``onset_time`` is the last record's time.
* ``pause``: a long evaluation or checkpoint gap (5-10x the median update
  interval, at least 120 s) shifts every later record forward. Must not fire
  (``healthy``); ``extra["gap_s"]`` is the gap. Not injected where each record is a
  whole epoch's (a Keras console log): the evaluation is inside the record.
* ``divergence``: from step k (40-80 % of the run) the losses grow by a factor of
  1.5-3 per logged point, then turn NaN for good after 3-8 points. Must fire
  (``diverged``); ``extra["first_nan_step"]`` is where NaN starts.
* ``spike``: the losses jump 3-10x for 1-3 logged points, then return to the
  original curve. Must not fire critical (``healthy``).
* ``slowdown``, ``straggler`` (``inject_speed``): throughput halved for 20 minutes, one
  host lagging in the second. Must fire ``slowdown`` (``slowed``).

Positions are counted on the run's densest loss series (the reference); every
other loss series is changed at the same steps, so train and validation losses
stay consistent, and non-loss series (the step counter, GPU use) are untouched
except where the fault itself cuts or shifts time. Records of a loss series that
carry no step are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from trainguard.bench import inject_speed
from trainguard.bench.injected import Injected, Injector
from trainguard.checker.metrics import loss_like
from trainguard.checker.model import FloatArray, Job, JobState, LogLine, Series

#: Fewer logged points than this leave no room to place a fault and watch it.
MIN_POINTS = 10


def _reference(job: Job, kind: str) -> Series:
    """The densest loss series with steps: where a fault's position is counted."""
    losses = [s for s in loss_like(job) if int(np.isfinite(s.step).sum()) >= MIN_POINTS]
    if not losses:
        raise ValueError(
            f"job {job.id!r}: cannot inject {kind}: no loss series with at least "
            f"{MIN_POINTS} stepped records (series: {', '.join(sorted(job.series)) or 'none'})")
    return max(losses, key=lambda s: int(np.isfinite(s.step).sum()))


def _ref_steps(ref: Series) -> FloatArray:
    return np.unique(ref.step[np.isfinite(ref.step)])


def _time_at_step(job: Job, ref: Series, step: float) -> float | None:
    if job.clock == "step":
        return None
    at = np.flatnonzero(ref.step == step)
    return float(ref.time[at[0]]) if len(at) else None


def _record_times(job: Job) -> FloatArray:
    parts = [s.time for s in job.series.values()]
    t = np.concatenate(parts) if parts else np.empty(0)
    return np.unique(t[np.isfinite(t)])


def _renamed(job: Job, kind: str, **changes: Any) -> Job:
    """A copy of ``job`` named for its fault (``<id>#<kind>``, tag ``injected``)."""
    tags = {**job.tags, "injected": kind}
    return dataclasses.replace(job, id=f"{job.id}#{kind}", name=f"{job.name or job.id}#{kind}",
                               tags=tags, **changes)


def _with_losses(job: Job, change: Callable[[Series], FloatArray]) -> dict[str, Series]:
    """Every series of ``job``, its loss series' values replaced by ``change(series)``."""
    out = dict(job.series)
    for s in loss_like(job):
        out[s.name] = Series(s.name, s.time.copy(), s.step.copy(), change(s))
    return out


# -- the injectors ----------------------------------------------------------------------------


def stall(job: Job, rng: np.random.Generator) -> Injected:
    """The log stops at a random 30-80 % of the run; the job stays RUNNING with no end."""
    times = _record_times(job)
    if len(times) < MIN_POINTS:
        raise ValueError(f"job {job.id!r}: cannot inject stall: only {len(times)} record times")
    frac = float(rng.uniform(0.3, 0.8))
    cut = float(times[0] + frac * (times[-1] - times[0]))
    cut = float(times[np.searchsorted(times, cut, side="right") - 1])  # the last record kept
    seen = job.until(cut)
    stalled = _renamed(seen, "stall", state=JobState.RUNNING, end_time=None, raw_state="")
    steps = [float(np.nanmax(s.step)) for s in seen.series.values()
             if len(s) and np.isfinite(s.step).any()]
    onset_step = max(steps) if steps else None
    onset_time = None if job.clock == "step" else cut
    return Injected(stalled, "stall", "stalled", onset_step, onset_time,
                    f"log stops at {frac:.0%} of the run (last record at {cut:g}); "
                    "the job is still RUNNING",
                    {"cut_fraction": frac})


def _paused(job: Job, kind: str, gap: float, at: float) -> tuple[Job, float | None]:
    """``job`` with every record after ``at`` shifted ``gap`` seconds later, and the last
    step logged before the pause."""

    def shifted(t: FloatArray) -> FloatArray:
        return np.where(t > at, t + gap, t)

    series = {k: Series(s.name, shifted(s.time), s.step.copy(), s.value.copy())
              for k, s in job.series.items()}
    logs = [LogLine(line.time + gap if line.time > at else line.time, line.text)
            for line in job.logs]
    end = job.end_time + gap if job.end_time is not None and job.end_time > at else job.end_time
    paused = _renamed(job, kind, series=series, logs=logs, end_time=end,
                      restart_times=[r + gap if r > at else r for r in job.restart_times])
    steps = [float(np.nanmax(s.step[s.time <= at])) for s in job.series.values()
             if np.isfinite(s.step[s.time <= at]).any()]
    return paused, (max(steps) if steps else None)


def _checked_times(job: Job, kind: str) -> FloatArray:
    if job.clock == "step":
        raise ValueError(f"job {job.id!r}: cannot inject {kind}: it has no time axis "
                         "(step clock)")
    times = _record_times(job)
    if len(times) < MIN_POINTS:
        raise ValueError(f"job {job.id!r}: cannot inject {kind}: only {len(times)} record "
                         "times")
    return times


def _pause_at(times: FloatArray, rng: np.random.Generator) -> float:
    """The last record before a pause placed at 20-80 % of the run."""
    frac = float(rng.uniform(0.2, 0.8))
    return float(times[np.searchsorted(times, times[0] + frac * (times[-1] - times[0]),
                                       side="right") - 1])


def _records_are_epochs(job: Job) -> bool:
    """Whether each record is a whole epoch's (a Keras console log: its step is the epoch,
    one loss record each): its evaluation is inside the record, and a silence 5-10 records
    long is 5-10 epochs of nothing, no evaluation or checkpoint."""
    ep = job.series.get("epoch")
    if ep is None or not len(ep) or not np.array_equal(ep.step, ep.value, equal_nan=True):
        return False
    ref = _reference(job, "pause")
    steps = ref.step[np.isfinite(ref.step)]
    # every record at an epoch's step (but a first one before the log's first "Epoch")
    return len(np.unique(steps)) == len(steps) \
        and int(np.isin(steps, ep.value).sum()) >= len(steps) - 1


def pause(job: Job, rng: np.random.Generator) -> Injected:
    """A legitimate long gap (eval, checkpoint): later records shift forward; values unchanged."""
    times = _checked_times(job, "pause")
    if _records_are_epochs(job):
        raise ValueError(f"job {job.id!r}: cannot inject pause: its records are whole "
                         "epochs, each with its evaluation: 5-10 of them is no pause")
    median = float(np.median(np.diff(times)))
    gap = max(float(rng.uniform(5.0, 10.0)) * median, 120.0)
    at = _pause_at(times, rng)
    paused, step = _paused(job, "pause", gap, at)
    return Injected(paused, "pause", "healthy", step, at,
                    f"a {gap:.0f} s pause after the record at {at:g} "
                    f"({gap / median:.1f}x the median update interval {median:.3g} s)",
                    {"gap_s": gap, "median_interval_s": median})


HEARTBEAT_EVERY_S = 30.0  # trainguard.emit's default


def heartbeat_pause(job: Job, rng: np.random.Generator) -> Injected:
    """A 35-55 minute checkpoint (a large model written to object storage) that the job
    heartbeats through as ``trainguard.emit.pause("checkpoint")`` does: a heartbeat line
    every 30 s, a resume line at the end, then normal progress. Healthy: a watchdog that
    reads the heartbeats must not fire; one that counts only training records may."""
    at = _pause_at(_checked_times(job, "heartbeat_pause"), rng)
    gap = float(rng.uniform(35.0, 55.0)) * 60.0
    paused, step = _paused(job, "heartbeat_pause", gap, at)
    beats = at + np.arange(0.0, gap, HEARTBEAT_EVERY_S)
    # emit's heartbeat lines carry the step the job paused at
    at_step = np.full(len(beats), step if step is not None else np.nan)
    series = dict(paused.series)
    series["heartbeat"] = Series("heartbeat", beats, at_step, beats - at)
    series["heartbeat/checkpoint"] = Series("heartbeat/checkpoint", beats.copy(),
                                            at_step.copy(), beats - at)
    series["pause_seconds"] = Series("pause_seconds", np.array([at + gap]),
                                     at_step[:1].copy(), np.array([gap]))
    out = dataclasses.replace(paused, series=series)
    return Injected(out, "heartbeat_pause", "healthy", step, at,
                    f"a {gap / 60:.0f} min checkpoint after the record at {at:g}, with a "
                    f"heartbeat every {HEARTBEAT_EVERY_S:g} s and a resume line",
                    {"gap_s": gap})


def divergence(job: Job, rng: np.random.Generator) -> Injected:
    """From step k the losses grow geometrically, then turn NaN and stay NaN."""
    ref = _reference(job, "divergence")
    steps = _ref_steps(ref)
    frac = float(rng.uniform(0.4, 0.8))
    growth = float(rng.uniform(1.5, 3.0))
    n_grow = int(rng.integers(3, 9))  # 3..8 growing points before NaN
    i0 = int(np.searchsorted(steps, steps[0] + frac * (steps[-1] - steps[0])))
    # A diverged job goes on logging NaN: keep at least two NaN points in the run, as a
    # live watchdog would see the next logging interval after the first one.
    i0 = min(i0, len(steps) - 3)
    n_grow = max(1, min(n_grow, len(steps) - 2 - i0))
    k, nan_step = float(steps[i0]), float(steps[i0 + n_grow])
    cadence = float(np.median(np.diff(steps)))

    def change(s: Series) -> FloatArray:
        v = s.value.copy()
        before = v[(s.step < k) & np.isfinite(v)]
        finite = v[np.isfinite(v)]
        base = float(before[-1]) if len(before) else float(finite[0]) if len(finite) else 1.0
        scale = abs(base) or 1.0
        grow = (s.step >= k) & (s.step < nan_step)
        # x growth per reference point, counted in steps so sparse series follow suit
        mult = growth ** (1.0 + (s.step[grow] - k) / cadence)
        v[grow] = base + (mult - 1.0) * scale
        v[s.step >= nan_step] = np.nan
        return v

    diverged = _renamed(job, "divergence", series=_with_losses(job, change))
    return Injected(diverged, "divergence", "diverged", k, _time_at_step(job, ref, k),
                    f"losses grow x{growth:.2f} per logged point from step {k:g}; NaN from step "
                    f"{nan_step:g} on", {"first_nan_step": nan_step, "growth": growth})


def spike(job: Job, rng: np.random.Generator) -> Injected:
    """The losses jump 3-10x for 1-3 logged points and then return to the original curve."""
    ref = _reference(job, "spike")
    steps = _ref_steps(ref)
    frac = float(rng.uniform(0.2, 0.8))
    factor = float(rng.uniform(3.0, 10.0))
    width = int(rng.integers(1, 4))  # 1..3 points
    i0 = min(int(np.searchsorted(steps, steps[0] + frac * (steps[-1] - steps[0]))),
             len(steps) - 1 - width)  # leave the curve room to return
    first, last = float(steps[i0]), float(steps[i0 + width - 1])

    def change(s: Series) -> FloatArray:
        v = s.value.copy()
        hit = (s.step >= first) & (s.step <= last)
        v[hit] = v[hit] + (factor - 1.0) * np.abs(v[hit])  # up by (factor-1)|v|: x factor if v>0
        return v

    spiked = _renamed(job, "spike", series=_with_losses(job, change))
    return Injected(spiked, "spike", "healthy", first, _time_at_step(job, ref, first),
                    f"losses jump x{factor:.2f} (up by {factor - 1:.2f} times their size) for "
                    f"{width} point(s), steps {first:g}-{last:g}; "
                    "then back on the original curve",
                    {"factor": factor, "last_step": last, "width": float(width)})


def nanblip(job: Job, rng: np.random.Generator) -> Injected:
    """One logged loss turns NaN or inf and the next is back on the original curve: a
    mixed-precision overflow that the loss scaler skipped. Healthy: must not stop the run."""
    ref = _reference(job, "nanblip")
    steps = _ref_steps(ref)
    frac = float(rng.uniform(0.2, 0.8))
    bad = float(rng.choice([np.nan, np.inf]))
    i0 = min(int(np.searchsorted(steps, steps[0] + frac * (steps[-1] - steps[0]))),
             len(steps) - 2)  # the curve comes back on the next point
    at = float(steps[i0])

    def change(s: Series) -> FloatArray:
        v = s.value.copy()
        v[s.step == at] = bad
        return v

    blipped = _renamed(job, "nanblip", series=_with_losses(job, change))
    return Injected(blipped, "nanblip", "healthy", at, _time_at_step(job, ref, at),
                    f"losses are {bad} at step {at:g} only (a skipped overflow); the next "
                    "point is back on the original curve", {"value": bad})


INJECTORS: dict[str, Injector] = {
    "stall": stall,
    "pause": pause,
    "divergence": divergence,
    "spike": spike,
    "nanblip": nanblip,
    "heartbeat_pause": heartbeat_pause,
    # throughput halved for 20 minutes, and the same with one host lagging (label slowed)
    "slowdown": inject_speed.slowdown,
    "straggler": inject_speed.straggler,
}


def inject(job: Job, kind: str, seed: int) -> Injected:
    """One fault of ``kind`` in ``job``, reproducible from ``seed``."""
    if kind not in INJECTORS:
        raise ValueError(f"unknown fault {kind!r}; known: {', '.join(INJECTORS)}")
    return INJECTORS[kind](job, np.random.default_rng(seed))

