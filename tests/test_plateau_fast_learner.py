"""``plateau``: a run that learnt in its first stretch and then sat still for the rest is
converged, not "not learning"; spikes on a flat run are still set aside.

The failure class, seen on a held-out Lightning run (an LSTM whose loss fell 1.75 -> 0.25
in its first 8 % of steps, then sat at 0.25000 to five digits for 11,000 steps): the
spike filter measured "far on the bad side" against the run's median, so the whole
descent was read as spikes, dropped, and the rest called "improved +0.00% over the whole
run: not learning" (a warning flipped on from the *converged* it had said earlier). The
same shape in a reward (an agent that reaches its ceiling early) failed the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.checker.model import Finding, Job, JobState, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.plateau import Plateau


def _job(name: str, values: np.ndarray, every: float = 50.0) -> Job:
    steps = np.asarray(every * np.arange(1, len(values) + 1), dtype=np.float64)
    return Job(id="run", clock="step", state=JobState.RUNNING, start_time=0.0,
               series={name: Series(name, steps, steps, values)})


def _judge(job: Job) -> list[Finding]:
    now = max(float(s.time[-1]) for s in job.series.values())
    return Plateau().check(job, Context(now=now, policy=Policy(), jobs=[job]))


def _fast_then_still(seed: int, n: int, learn: float, noise: float,
                     start: float = 1.75, end: float = 0.25) -> np.ndarray:
    """From ``start`` to ``end`` over the first ``learn`` of ``n`` points (exponential, with
    2 % noise), then ``end`` with relative noise ``noise``."""
    rng = np.random.default_rng(seed)
    k = max(int(learn * n), 3)
    descent = end + (start - end) * np.exp(-5 * np.arange(k) / k)
    descent *= 1 + 0.02 * rng.standard_normal(k)
    still = end * (1 + noise * rng.standard_normal(n - k))
    return np.asarray(np.r_[descent, still], dtype=np.float64)


@pytest.mark.parametrize("noise", [1e-6, 1e-4, 1e-3])
@pytest.mark.parametrize("learn", [0.05, 0.1, 0.2])
def test_a_loss_that_learnt_early_and_sat_still_is_converged_at_every_length(
        noise: float, learn: float) -> None:
    for seed in range(3):
        values = _fast_then_still(seed, 240, learn, noise)
        for n in (60, 120, 240):  # as a replay sees it, and as check does at the end
            found = _judge(_job("train_loss", values[:n]))
            kinds = [(f.severity.value, f.evidence["kind"]) for f in found]
            assert ("warning", "flat") not in kinds, (seed, n, found[0].message)
        assert kinds == [("info", "converged")], (seed, found)
        assert "learnt and has levelled off" in found[0].message


def test_a_reward_that_reached_its_ceiling_early_is_converged() -> None:
    for seed in range(3):
        values = _fast_then_still(seed, 240, 0.08, 1e-4, start=10.0, end=500.0)
        found = _judge(_job("episode_reward", values))
        assert [(f.severity.value, f.evidence["kind"]) for f in found] == \
               [("info", "converged")], (seed, found)


def test_a_flat_loss_with_spikes_is_still_not_learning() -> None:
    """What the spike filter is for: spikes 3-10x on a loss that never learnt are set
    aside, and the flat rest is judged."""
    rng = np.random.default_rng(0)
    for seed in range(5):
        values = 2.0 * (1 + 0.01 * np.random.default_rng(seed).standard_normal(200))
        at = rng.choice(np.arange(5, 200), size=8, replace=False)
        values[at] *= rng.uniform(3, 10, size=8)
        found = _judge(_job("train_loss", values))
        assert [(f.severity.value, f.evidence["kind"]) for f in found] == \
               [("warning", "flat")], (seed, found)


def test_a_loss_at_the_last_digit_of_a_4_decimal_log_is_converged() -> None:
    """A Whisper fine-tune's training loss, logged by the Hugging Face Trainer to 4
    decimals: 0.3 down to 0.0002, then 0.0001-0.0002 for its last thousand steps. Its
    medians move by whole units of 0.0001, 50 % of the level: no change of one logged
    unit is measurable, so it has levelled off."""
    rng = np.random.default_rng(0)
    steps = np.arange(25.0, 5001.0, 25.0)
    values = np.round(0.3 * np.exp(-steps / 250) + 0.00012 + rng.uniform(0, 0.00006,
                                                                          len(steps)), 4)
    job = Job(id="run", clock="step", state=JobState.RUNNING, start_time=0.0,
              series={"loss": Series("loss", steps, steps, values)})
    found = _judge(job)
    assert [(f.severity.value, f.evidence["kind"]) for f in found] == \
           [("info", "converged")], found
    assert "no change beyond its last logged digit, 0.0001," in found[0].message


def test_a_loss_that_learnt_early_then_rose_and_sat_above_its_best_is_not_learning() -> None:
    """Learnt 1.75 -> 0.25 in its first 10 %, then up to 0.33 (1.3 x its best) and flat
    there: stuck above what it had learnt, a warning, not *converged*."""
    for seed in range(3):
        values = _fast_then_still(seed, 240, 0.1, 1e-4)
        values[60:] = 0.33 * (1 + 1e-4 * np.random.default_rng(seed).standard_normal(180))
        found = _judge(_job("train_loss", values))
        assert [(f.severity.value, f.evidence["kind"]) for f in found] == \
               [("warning", "flat")], (seed, found)


def test_a_descent_inside_the_first_epoch_is_learning_when_judged_per_epoch() -> None:
    """A blind set's DeBERTa classifier (read with no definitions): its loss 0.0517 at
    step 100, 0.0497 from step 300 on to step 15,300, five epochs of 30 records, logged
    to 4 decimals. Judged as per-epoch medians (the epoch column holds many records an
    epoch), all five epochs stand at 0.0497, and it was "not learning" beside the
    records' own "converged": medians per epoch hide a descent inside the first epoch.
    A loss flat from its first record, judged the same way, is still not learning."""
    steps = np.arange(1, 151, dtype=np.float64) * 100.0
    rng = np.random.default_rng(2)
    floor = 0.0497 + np.round(rng.choice([0.0, 0.0, -0.0001], 150), 4)
    learnt = floor.copy()
    learnt[:2] = [0.0517, 0.0503]
    epoch = np.floor((steps - 1) / 3060.0) + 1

    def job(values: np.ndarray) -> Job:
        return Job(id="run", clock="step", state=JobState.RUNNING, start_time=0.0,
                   series={"loss": Series("loss", steps, steps, values),
                           "epoch": Series("epoch", steps, steps, epoch)})

    (f,) = _judge(job(learnt))
    assert "(per-epoch median)" in f.message  # judged as medians per epoch
    assert f.severity.value == "info" and "converged" in f.message
    (flat,) = _judge(job(floor))
    assert flat.severity.value == "warning" and "not learning" in flat.message
