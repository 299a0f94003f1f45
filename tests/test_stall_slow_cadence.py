"""``stall`` on a log slower than its fixed threshold: a silence the job already came back
from is no stall.

The failure class, seen on a held-out MLflow store of an Ultralytics run: one record per
epoch, 114 minutes apart, the first 82 minutes after the run started. Until ten gaps had
been learnt the threshold stayed at Debugger's fixed 30 minutes (a few gaps that said
"slower" were capped at it), so every epoch was a critical stall, from the first: a stop,
where a policy allows one, of a healthy run. The threshold is now at least
``pause_factor`` x the longest silence the job came back from, its start and warm-up
gaps included; a hang is still found, later by that much.
"""

from __future__ import annotations

import numpy as np

from trainguard.checker.model import Finding, Job, JobState, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.stall import Stall

T0 = 1_750_000_000.0
EPOCH = 114 * 60.0
STARTUP = 82 * 60.0


def _job(epochs: int) -> Job:
    rng = np.random.default_rng(0)
    times = T0 + STARTUP + np.cumsum(np.r_[0.0, EPOCH + rng.normal(0, 20, epochs - 1)])
    steps = np.arange(epochs, dtype=np.float64)
    return Job(id="yolo", clock="wall", state=JobState.RUNNING, start_time=T0,
               series={"step": Series("step", times, steps, steps),
                       "train/box_loss": Series("train/box_loss", times, steps,
                                                2.6 - 0.04 * steps)})


def _at(job: Job, now: float) -> list[Finding]:
    return Stall().check(job, Context(now=now, policy=Policy(), jobs=[job]))


def test_two_hour_epochs_logged_once_are_no_stall_at_any_epoch() -> None:
    for epochs in range(1, 14):
        job = _job(epochs)
        last = float(job.series["step"].time[-1])
        # just before the next epoch's record
        assert _at(job, last + EPOCH + 60.0) == [], epochs


def test_a_hang_after_two_hour_epochs_is_still_found() -> None:
    for epochs in (1, 5, 13):
        job = _job(epochs)
        last = float(job.series["step"].time[-1])
        (f,) = _at(job, last + 12 * 3600.0)
        assert f.severity is Severity.CRITICAL, epochs
        assert f.evidence["threshold_s"] <= 1.5 * (EPOCH + 100.0) * 2.5, epochs


def test_a_fast_log_that_hangs_is_held_to_the_fixed_threshold_as_before() -> None:
    """One record a minute, five of them: its gaps (and start) are short, so 30 min."""
    times = np.asarray(T0 + 60.0 * np.arange(1, 6), dtype=np.float64)
    steps = np.arange(1.0, 6.0)
    job = Job(id="fast", clock="wall", state=JobState.RUNNING, start_time=T0,
              series={"step": Series("step", times, steps, steps)})
    assert _at(job, float(times[-1]) + 1_700.0) == []
    (f,) = _at(job, float(times[-1]) + 1_900.0)
    assert f.evidence["threshold_s"] == 1_800.0


def _no_start(job: Job) -> Job:
    """As a local file with no start time reads: its first record is its start."""
    job.start_time = float(job.series["step"].time[0])
    return job


def test_one_record_and_no_start_time_is_a_warning_not_a_stop() -> None:
    """A CSV whose first row is the first two-hour epoch's record: nothing says how long
    a record takes, so a silence after it is a warning (the cadence is unknown), never
    critical, however long; from the second record on, the epoch is learnt."""
    job = _no_start(_job(1))
    last = float(job.series["step"].time[-1])
    for hours in (0.75, 1.5, 1.9, 6.0, 24.0):
        (f,) = _at(job, last + hours * 3600.0)
        assert f.severity is Severity.WARNING, hours
        assert f.evidence["cadence_unknown"] is True
        assert "cadence is unknown" in f.message
    job = _no_start(_job(2))
    last = float(job.series["step"].time[-1])
    assert _at(job, last + EPOCH + 60.0) == []
    (f,) = _at(job, last + 12 * 3600.0)
    assert f.severity is Severity.CRITICAL
    assert "cadence_unknown" not in f.evidence


def test_one_record_after_a_known_start_is_still_judged_on_its_start() -> None:
    """With the start known, the start-up gap bounds the cadence: a hang after it is
    critical (only an unknown start makes the first silence a warning)."""
    job = _job(1)
    last = float(job.series["step"].time[-1])
    (f,) = _at(job, last + 12 * 3600.0)
    assert f.severity is Severity.CRITICAL
