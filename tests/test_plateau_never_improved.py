"""``plateau``: a run whose objective never got better than its first evaluation is not
learning, whatever its recent trend; one whose training loss fell is overfitting (not
"not learning"); a first point that is low by chance is not taken for one.

The failure class, seen on real fine-tunes: the held-out loss jumps above its first value
after the first evaluation, wanders there (recovering part of the way near the end) and
never comes back, while the training loss does not fall either. A trend test over the
later half sees "improving"; the run as a whole never improved on where it started.
"""

from __future__ import annotations

import numpy as np

from trainguard.checker.model import Finding, Job, JobState, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.plateau import Plateau


def _job(eval_loss: np.ndarray, train_loss: np.ndarray | None, every: float = 132.0) -> Job:
    steps = np.asarray(every * np.arange(1, len(eval_loss) + 1), dtype=np.float64)
    series = {"eval_loss": Series("eval_loss", steps, steps, eval_loss)}
    if train_loss is not None:
        tsteps = np.asarray(np.linspace(steps[0], steps[-1], len(train_loss)), dtype=np.float64)
        series["loss"] = Series("loss", tsteps, tsteps, train_loss)
    return Job(id="run", clock="step", state=JobState.RUNNING, start_time=0.0, series=series)


def _judge(job: Job) -> list[Finding]:
    now = max(float(s.time[-1]) for s in job.series.values())
    return Plateau().check(job, Context(now=now, policy=Policy(), jobs=[job]))


def _degrading(seed: int) -> np.ndarray:
    """2.5 at the first evaluation, then 3.1-4.3 for 19 more, easing down near the end."""
    rng = np.random.default_rng(seed)
    later = 3.9 - 0.4 * np.linspace(0, 1, 19) + rng.uniform(-0.4, 0.4, 19)
    return np.asarray(np.r_[2.5, later], dtype=np.float64)


def test_a_held_out_loss_that_never_came_back_to_its_first_value_is_not_learning() -> None:
    for seed in range(10):
        found = _judge(_job(_degrading(seed), np.array([1.2, 2.0, 2.2, 2.0, 1.8])))
        assert [(f.severity.value, f.evidence["kind"]) for f in found] == \
               [("warning", "flat")], seed
        assert found[0].evidence["never_improved"] is True
        assert "never improved on its first value 2.5" in found[0].message


def test_the_same_held_out_loss_with_a_falling_training_loss_is_not_called_not_learning(
        ) -> None:
    """The model learns and does not generalise: overfit's business, not plateau's."""
    for seed in range(10):
        found = _judge(_job(_degrading(seed), np.array([2.0, 1.6, 1.2, 0.9, 0.7])))
        assert not [f for f in found if f.severity.value == "warning"], seed


def test_a_training_loss_that_never_improved_on_its_first_value_is_not_learning() -> None:
    rng = np.random.default_rng(3)
    loss = np.r_[2.3, 2.9 + rng.uniform(-0.2, 0.2, 30)]
    found = _judge(_job(loss, None).__class__(
        id="run", clock="step", state=JobState.RUNNING, start_time=0.0,
        series={"loss": Series("loss", np.arange(31.0), np.arange(31.0), loss)}))
    assert [f.evidence.get("never_improved") for f in found] == [True]


def test_a_first_point_low_by_chance_is_not_taken_for_a_run_that_never_improved() -> None:
    """A loss falling steadily whose first point happens to sit a noise width low: later
    points beat it, so it improved. And a level run whose first point is low by less than
    the noise of the points is not 'never improved' either (the flat test judges it)."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        falling = 3.0 - 1.5 * np.linspace(0, 1, 25) + rng.normal(0, 0.1, 25)
        falling[0] -= 0.1
        assert _judge(_job(falling, None)) == [], seed
        level = 3.0 + rng.normal(0, 0.1, 25)
        level[0] = 3.0 - 0.1
        assert not [f for f in _judge(_job(level, None)) if f.evidence.get("never_improved")]


def test_a_healthy_run_is_not_warned() -> None:
    steps = np.arange(1, 41, dtype=float)
    loss = 0.5 + 2.0 / np.sqrt(steps)
    assert [f for f in _judge(_job(loss, loss * 0.9)) if f.severity.value != "info"] == []


def test_a_run_worse_over_its_first_few_points_is_not_yet_warned() -> None:
    """Five epochs worse than the first (a regression loss up 2.4 % before it learnt over
    150 epochs; a detector's loss up over its warm-up): moving, not stuck, and weak
    evidence on fewer than twice ``min_points``; the same shape on 10 points and more is
    a run that never improved."""
    early = np.array([3.867, 3.884, 3.916, 3.979, 3.960])
    assert [f for f in _judge(_job(early, None)) if f.severity.name == "WARNING"] == []
    assert [f for f in _judge(_job(early[:5] + 0.0, early + 0.001)) if
            f.severity.name == "WARNING"] == []
    worse = np.r_[2.5, np.full(11, 3.5) + np.random.default_rng(1).uniform(-0.1, 0.1, 11)]
    (f,) = _judge(_job(worse, None))
    assert f.severity.name == "WARNING" and "never improved on its first value" in f.message
