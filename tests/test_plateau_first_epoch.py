"""A loss logged many times an epoch, still in its first epoch: the model has not seen its
data once. An MMEngine C3D run from scratch (a blind set's ``scalars.json``) sat at ln 101
for its first 350 of 26,000 steps, epoch 1 of 79, and was warned "not learning" at its
7th record (step 140); the warning cleared when it learnt. Its first epoch is not judged
flat for its first 50 points (that run, flat for the whole of its first epoch, is warned
when the epoch ends); a single long epoch (a language model's one pass) is judged from
its 50th point on. Built here and replayed record by record."""

from __future__ import annotations

import math

import numpy as np

from trainguard.checker import Job, Policy, Series, Severity
from trainguard.replay import replay

T0 = 1_700_000_000.0


def _job(loss: np.ndarray, epoch: np.ndarray, every: float = 20.0) -> Job:
    steps = np.arange(1.0, len(loss) + 1) * every
    t = T0 + steps * 0.67
    return Job(id="j", start_time=T0, series={
        "loss": Series("loss", t, steps, loss), "epoch": Series("epoch", t, steps, epoch),
        "step": Series("step", t, steps, steps)})


def _plateau(job: Job) -> list[tuple[float | None, str]]:
    return [(h.first.step, h.finding.message) for h in replay(job, Policy()).histories
            if h.rule == "plateau" and h.worst.rank >= Severity.WARNING.rank]


def test_a_loss_at_chance_in_its_first_epoch_that_then_learns_is_not_warned() -> None:
    rng = np.random.default_rng(0)
    n = 330  # 79 epochs would be 26,000 steps: 4 epochs here, 82 records each
    steps = np.arange(n)
    loss = math.log(101) + 0.13 * np.exp(-steps / 3) + rng.normal(0, 0.01, n)
    loss[17:] -= 4.4 * (1 - np.exp(-(steps[17:] - 17) / 60))  # learning from step 350
    assert _plateau(_job(loss, 1.0 + steps // 82)) == []


def test_a_single_long_epoch_that_never_learns_is_warned_from_its_50th_point() -> None:
    rng = np.random.default_rng(1)
    n = 200
    loss = 3.2 + rng.normal(0, 0.02, n)
    (warned,) = _plateau(_job(loss, np.zeros(n)))
    assert warned[0] is not None and warned[0] >= 50 * 20.0, warned
    assert "not learning" in warned[1]
