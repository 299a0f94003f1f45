"""``metrics.objective`` for a job that logs only loss components (a GAN's generator and
discriminator losses, Ultralytics' box, cls and dfl losses): their sum, kept in a
followed rule's state and extended by the records new since its last tick, is at every
cut the sum a fresh judgement makes, and the work grows with the run, not its square."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainguard.checker import metrics
from trainguard.checker.model import Job, Series


def _gan(n: int, seed: int = 0) -> Job:
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=float)
    g = 2 + np.sin(t / 50) + 0.1 * rng.standard_normal(n)
    d = 1 - 0.5 * np.sin(t / 50) + 0.1 * rng.standard_normal(n)
    return Job(id="gan", clock="step", series={"loss_G": Series("loss_G", t, t, g),
                                                "loss_D": Series("loss_D", t, t, d)})


def _same(a: Series | None, b: Series | None) -> bool:
    return a is not None and b is not None and a.name == b.name and all(
        np.array_equal(x, y, equal_nan=True) for x, y in
        ((a.time, b.time), (a.step, b.step), (a.value, b.value)))


def test_the_kept_sum_is_the_fresh_sum_at_every_cut() -> None:
    job, state = _gan(300), {}  # type: ignore[var-annotated]
    for t in range(300):
        cut = job.until(float(t))
        kept = metrics.objective(cut, False, state)
        fresh = metrics.objective(cut, False)
        assert _same(kept, fresh), t
    assert kept is not None and kept.name == "loss_D+loss_G"
    assert np.allclose(kept.value, job.series["loss_G"].value + job.series["loss_D"].value)


def test_only_new_records_are_added(monkeypatch: pytest.MonkeyPatch) -> None:
    """Followed over 2,000 cuts, 2,000 records of each component are added once; summed
    afresh at each cut, the square of that."""
    added = {"values": 0}
    real = np.sum

    def counting(a: Any, *args: Any, **kw: Any) -> Any:
        added["values"] += int(np.size(a))
        return real(a, *args, **kw)

    monkeypatch.setattr(np, "sum", counting)  # the numpy that metrics sums with
    job, state = _gan(2_000), {}  # type: ignore[var-annotated]
    for t in range(2_000):
        metrics.objective(job.until(float(t)), False, state)
    assert added["values"] == 2 * 2_000
    added["values"] = 0
    for t in range(0, 2_000, 100):
        metrics.objective(job.until(float(t)), False)
    assert added["values"] == sum(2 * (t + 1) for t in range(0, 2_000, 100))


def test_a_component_out_of_step_leaves_the_sum_and_a_rewritten_log_is_summed_afresh(
        ) -> None:
    job, state = _gan(200), {}  # type: ignore[var-annotated]
    for t in range(100):
        metrics.objective(job.until(float(t)), False, state)
    # the discriminator's later records were logged at other steps: it is no longer
    # logged together with the generator's, and the objective is not their sum
    d = job.series["loss_D"]
    shifted = d.step.copy()
    shifted[150:] += 0.5
    job.series["loss_D"] = Series("loss_D", d.time, shifted, d.value)
    cut = job.until(160.0)
    assert metrics.objective(cut, False, state) is None
    assert metrics.objective(cut, False) is None
    # another run under the same names (a log rewritten from the start)
    other = _gan(200, seed=1)
    for at in (50.0, 120.0, 199.0):
        cut = other.until(at)
        assert _same(metrics.objective(cut, False, state), metrics.objective(cut, False))
