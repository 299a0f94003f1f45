"""A loss that climbs from its first record (a re-id run's total loss 10.8, 19.5, 45.3,
70.3, 82.2, 85.5, 85.8 in a blind set's issue thread): its first level, a median of
three points, is already in the climb, so no level stood 5 x below it. Where each of the
first three points stands above the one before, the first point is the best level so
far. Told from a noisy loss whose first three points happen to rise, and from a
fine-tune's warm-up that rises and comes back. Built here, judged record by record as a
watchdog would (``first_critical``), and judged whole by ``replay``'s vectorised path."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_divergence_undo import first_critical, job_of
from trainguard.checker import Policy, Severity
from trainguard.replay import replay


def _climb(first: float, top: float, n: int = 8, tail: int = 0) -> np.ndarray:
    """From ``first``, up towards ``top`` (each point nearer it), then ``tail`` more there."""
    up = top - (top - first) * np.exp(-np.arange(n) / 2.0)
    return np.concatenate([up, np.full(tail, top)])


def test_a_loss_that_climbs_from_its_first_record_is_critical() -> None:
    loss = _climb(10.8, 86.0)
    steps = np.arange(len(loss)) * 100.0
    found = first_critical(job_of(steps, loss))
    assert found is not None and "climbed to over 5x its best level (10.8)" in found[1]
    assert found[0] <= 7  # its 4th point at 5 x (54) and more
    # the same from a longer log, read in one chunk (the vectorised path)
    long = _climb(10.8, 86.0, tail=300)
    result = replay(job_of(np.arange(len(long)) * 100.0, long), Policy())
    assert [h.first.step for h in result.histories if h.worst is Severity.CRITICAL] \
        == [found[0] * 100.0]


@pytest.mark.parametrize("seed", range(30))
def test_a_noisy_loss_whose_first_points_rise_is_not_stopped(seed: int) -> None:
    """A per-batch loss scattering a third around a falling level: a rising start by
    chance is no climb, its points are nowhere near 5 x its first."""
    rng = np.random.default_rng(seed)
    n = 200
    loss = (2.0 + 3.0 * np.exp(-np.arange(n) / 60)) * np.exp(rng.normal(0, 0.3, n))
    loss[:3] = np.sort(loss[:3])  # the first three rise
    assert first_critical(job_of(np.arange(n) * 10.0, loss)) is None


def test_a_fine_tunes_warm_up_that_rises_and_comes_back_is_not_stopped() -> None:
    """A pretrained model's first loss low (0.6), rising 3-fold while the rate warms up,
    then learning back down: under 5 x its first."""
    up = [0.6, 0.9, 1.3, 1.7, 1.8, 1.75, 1.6]
    down = list(1.6 * np.exp(-np.arange(1, 60) / 20) + 0.4)
    loss = np.array(up + down)
    assert first_critical(job_of(np.arange(len(loss)) * 10.0, loss)) is None
