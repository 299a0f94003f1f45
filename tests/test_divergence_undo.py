"""A divergence without NaN that never reaches many times its best: the run climbs back to
where it started and stays there, having undone what it learnt (a fine-tune whose loss
fell four-fold and came all the way back). Built here, judged tick by tick as a
watchdog would; with the healthy shapes that must stay quiet beside it.
"""

from __future__ import annotations

import numpy as np

from trainguard.checker import Job, Policy, Series, Severity
from trainguard.checker.follow import Followers
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.divergence import Divergence

T0 = 1_750_000_000.0


def job_of(steps: np.ndarray, loss: np.ndarray) -> Job:
    t = T0 + steps * 10.0
    return Job(id="j", start_time=T0, series={"loss": Series("loss", t, steps, loss)})


def first_critical(job: Job) -> tuple[int, str] | None:
    """The first record at which divergence said critical, replayed record by record with
    the default policy (the rule called through its follower, not through ``evaluate``,
    which would log and skip a rule that raises)."""
    policy, followers, rule = Policy(), Followers(), Divergence()
    s = job.series["loss"]
    for i, t in enumerate(s.time.tolist()):
        cut = job.until(t)
        for f in followers.check(rule, cut, Context(now=t, policy=policy, jobs=[cut])):
            if f.severity is Severity.CRITICAL:
                return i, f.message
    return None


CLIMB = 23  # the first point of the climb
BACK = CLIMB + 8  # the first point back at the start


def undone(seed: int, noise: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """41 points: an odd first value, a fall from ~8,600 to ~2,100, from point ``CLIMB`` a
    climb back to ~8,500 that stays from point ``BACK`` on; the points scatter by 2 %."""
    rng = np.random.default_rng(seed)
    fall = 2100 + 6500 * np.exp(-np.arange(22) / 5)
    climb = np.linspace(2300, 8500, 8)
    stay = np.full(10, 8500.0)
    loss = np.concatenate([[25000.0], fall, climb, stay]) * (1 + rng.normal(0, noise, 41))
    steps = np.arange(len(loss)) * 50.0
    return steps, loss


def test_a_run_back_at_its_starting_level_after_learning_four_fold_is_critical() -> None:
    for seed in range(5):
        steps, loss = undone(seed)
        fired = first_critical(job_of(steps, loss))
        assert fired is not None, seed
        at, message = fired
        assert "gave back" in message and "of what it had learnt" in message
        # never 5x its best: the ratio test alone would not fire
        assert loss[CLIMB:].max() < 5 * 2100
        # four points in a row most of the way back up, as for any divergence without
        # NaN: on the climb, and by the time it has been back up for four points
        assert CLIMB + 3 <= at <= BACK + 3, (seed, at)


def test_the_same_climb_that_comes_back_down_within_three_points_is_not_critical() -> None:
    steps, loss = undone(0)
    loss[CLIMB:] = loss[CLIMB - 1]  # no climb ...
    loss[CLIMB + 3: CLIMB + 6] = 8500.0  # ... but three points back at the start, then down
    assert first_critical(job_of(steps, loss)) is None


def test_noisy_healthy_runs_that_learnt_two_to_three_fold_are_never_critical() -> None:
    """A loss whose points scatter by a third around a level that halves and then holds
    (a small-batch regression, say): single points reach the starting level often, four
    in a row never do, and medians of nine do not mistake the scatter for a climb."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        steps = np.arange(1_200.0)
        level = 0.12 + 0.18 * np.exp(-steps / 40)
        loss = level * np.exp(rng.normal(0, 0.33, len(steps)))
        assert first_critical(job_of(steps, loss)) is None, seed


def test_a_run_that_learnt_little_and_wanders_back_is_not_critical() -> None:
    """A loss that fell by a fifth and drifted back: too little learnt to call undone."""
    steps = np.arange(200.0)
    loss = np.concatenate([np.linspace(1.0, 0.8, 100), np.linspace(0.8, 1.0, 100)])
    loss *= 1 + np.random.default_rng(1).normal(0, 0.01, 200)
    assert first_critical(job_of(steps, loss)) is None


def test_a_loss_on_a_coarse_grid_with_a_lucky_quiet_stretch_is_not_critical() -> None:
    """A loss that takes a few coarse values (a regression on binned targets): early on
    mostly 15, later any of 4, 5, 10 and 15, with one quiet stretch of nine points at 5.
    Its points reach back to 15 four at a time by chance; what it "learnt" (from 15 to
    about 5) is small against how far apart its values are, so that is no undoing."""
    rng = np.random.default_rng(7)
    early = rng.choice([10.0, 15.0, 15.0, 15.0], size=20)
    quiet = np.array([5, 5, 4, 5, 5, 15, 5, 5, 5], dtype=float)
    late = rng.choice([4.0, 5.0, 10.0, 15.0], size=500)
    loss = np.concatenate([early, quiet, late])
    assert any((loss[i:i + 4] >= 15).all() for i in range(29, len(loss) - 4))  # it does
    assert first_critical(job_of(np.arange(len(loss), dtype=float), loss)) is None


def test_a_spikes_recovery_tail_in_a_run_that_learnt_within_nine_points_is_no_undo() -> None:
    """A memorisation sweep's run (a blind held-out CSV, labelled spiky): 3.2 -> 0.007 in
    its first 8 records, so its first 9-point median is 0.035, then a spike to 26.9 whose
    recovery takes 5 records (0.025, 0.23, 0.15, 0.09, 0.03) before it is back at 0.008.
    Measured against a start of 0.035 the tail stood "80 % of the way back" for 4 records
    and the run was stopped; it started at 3.2, its first median of 3 points, and had
    undone none of that. A run that climbs back near that start is still stopped."""
    head = [3.2, 0.546, 0.337, 0.115, 0.0353, 0.0203, 0.00932, 0.00705, 0.00711]
    calm = list(0.0065 + 0.0005 * np.sin(np.arange(25.0)))
    tail = [26.9, 0.0251, 0.234, 0.149, 0.0922, 0.0298, 0.00836, 0.00571, 0.0042]
    loss = np.array(head + calm + tail + calm)
    assert first_critical(job_of(np.arange(len(loss)) * 10.0, loss)) is None
    undone_run = np.array(head + calm + list(np.linspace(0.5, 2.9, 6)) + [2.9] * 12)
    found = first_critical(job_of(np.arange(len(undone_run)) * 10.0, undone_run))
    assert found is not None and found[0] <= len(head) + len(calm) + 10
