"""``stall`` on a short log: a few regular updates are enough to judge a silence by the
job's own cadence; an irregular few are not; a pause of some ten update gaps (an
evaluation the job has not shown yet) is not taken for a stall.

The failure class: a run logging once an epoch, 30 s apart, stops after eight records.
Before, fewer than ``min_updates`` gaps meant Debugger's fixed 30 minutes, so the stall
was reported some 60 gaps late.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.checker.model import Finding, Job, JobState, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.stall import Stall

T0 = 1_750_000_000.0


def _job(times: np.ndarray) -> Job:
    steps = np.arange(1, len(times) + 1, dtype=np.float64)
    return Job(id="short", clock="wall", state=JobState.RUNNING, start_time=T0 - 60.0,
               series={"step": Series("step", times, steps, steps),
                       "loss": Series("loss", times, steps, 1.0 / steps)})


def _at(job: Job, now: float) -> list[Finding]:
    return Stall().check(job, Context(now=now, policy=Policy(), jobs=[job]))


def _first_fire(job: Job, until: float) -> float | None:
    last = max(float(s.time[-1]) for s in job.series.values())
    for now in np.arange(last, until, 10.0):
        if _at(job, float(now)):
            return float(now) - last
    return None


@pytest.mark.parametrize("seed", range(5))
def test_a_short_regular_log_that_stops_is_found_within_ten_minutes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    times = T0 + np.cumsum(30.0 + rng.normal(0, 0.8, 8))
    after = _first_fire(_job(times), float(times[-1]) + 3_600.0)
    assert after is not None and 300.0 <= after <= 600.0
    (f,) = _at(_job(times), float(times[-1]) + after)
    assert f.evidence["learnt"] == 0.5 and f.evidence["gap_bound_s"] < 40.0


def test_an_irregular_short_log_waits_for_the_fixed_threshold() -> None:
    gaps = np.array([30.0, 400.0, 25.0, 900.0, 60.0, 35.0, 700.0])
    times = T0 + np.cumsum(gaps)
    after = _first_fire(_job(times), float(times[-1]) + 3 * 3_600.0)
    assert after is not None and after >= 1_800.0


def test_too_few_updates_wait_for_the_fixed_threshold() -> None:
    times = T0 + 30.0 * np.arange(1, 6)  # five records: two gaps after the warm-up
    after = _first_fire(_job(times), float(times[-1]) + 3 * 3_600.0)
    assert after is not None and after >= 1_800.0


def test_a_pause_of_ten_update_gaps_after_a_short_regular_log_is_no_stall() -> None:
    """An evaluation of 10 x the cadence after eight epochs, then the run goes on: no
    finding at any moment of the pause."""
    times = T0 + 30.0 * np.arange(1, 9)
    job = _job(times)
    last = float(times[-1])
    for now in np.arange(last, last + 300.0 + 1.0, 10.0):  # a 300 s pause: 10 gaps
        assert _at(job, float(now)) == [], now - last
