"""A spike that takes many records to come back: a loss that jumps 1,000-fold and falls
back over 14 points, 5-50 x its best all the while, pausing for 3 on its way (a μP
sweep's run, labelled spiky in a blind set), is no divergence while it is still coming
back down; a loss that jumps and stays, or climbs, is one as soon as before. Built here,
judged record by record as a watchdog would (``first_critical``)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_divergence_undo import first_critical, job_of

LEARNT = 60  # points of learning, 3.0 -> ~0.025, before the jump


def _learnt(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.025 + 3.0 * np.exp(-np.arange(LEARNT) / 8)) * (1 + rng.normal(0, 0.03, LEARNT))


def _run(after: list[float], seed: int = 0, tail: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """The learnt run, then ``after`` from point ``LEARNT`` on, then ``tail`` points back
    at its level where ``after`` comes back (else at ``after``'s last value)."""
    rng = np.random.default_rng(seed + 100)
    end = after[-1] if after[-1] > 0.05 else 0.025
    rest = end * (1 + rng.normal(0, 0.03, tail))
    loss = np.concatenate([_learnt(seed), np.asarray(after), rest])
    return np.arange(len(loss)) * 10.0, loss


# the blind set's spike as logged: 0.025 -> 24.7, down to 1.3, 3 points there, then back
SLOW_SPIKE = [24.7, 4.96, 3.45, 1.335, 1.357, 1.36, 1.215, 0.943, 0.80, 0.551, 0.364,
              0.294, 0.194, 0.132, 0.11, 0.079, 0.059, 0.052, 0.042, 0.038]


@pytest.mark.parametrize("seed", range(5))
def test_a_spike_coming_back_over_many_points_is_not_stopped(seed: int) -> None:
    steps, loss = _run(SLOW_SPIKE, seed)
    assert first_critical(job_of(steps, loss)) is None


@pytest.mark.parametrize(("shape", "after", "within"), [
    # below half of what it learnt (1.36 here), so the blow-up test's 5th point
    ("jumps and stays", [1.3, 1.25, 1.35, 1.3, 1.28, 1.33, 1.3, 1.31], 4),
    # above the half-way line from its 5th point, so that point and 3 more
    ("climbs", [0.3, 0.5, 0.8, 1.2, 1.9, 2.5, 3.0, 3.2], 7),
    # a 1,000-fold first point, then 50-fold: waited on while its level is still below
    # the points before it, one point longer than it would be without the guard
    ("jumps 1,000-fold then stays", [25.0, 1.3, 1.25, 1.35, 1.3, 1.28, 1.33, 1.3, 1.31,
                                     1.29, 1.32], 5),
    ("jumps 1,000-fold, falls for 2 points, then stays", [25.0, 5.0, 3.0, 3.1, 2.9, 3.0,
                                                          3.05, 2.95, 3.0, 3.1, 3.0], 6),
])
def test_a_loss_that_jumps_and_stays_or_climbs_is_still_stopped(
        shape: str, after: list[float], within: int) -> None:
    steps, loss = _run(after)
    fired = first_critical(job_of(steps, loss))
    assert fired is not None, shape
    assert fired[0] <= LEARNT + within, (shape, fired)


def test_a_loss_falling_back_for_more_than_32_points_is_stopped() -> None:
    """A 1,000-fold jump, then 200-fold falling 4 % a point and still 40-fold 40 points
    on: coming back down all the while, but no spike lasts that long."""
    after = [25.0, *(5.0 * 0.96 ** np.arange(40)).tolist()]
    steps, loss = _run(after, tail=5)
    fired = first_critical(job_of(steps, loss))
    assert fired is not None and LEARNT + 20 < fired[0] <= LEARNT + 32, fired
