"""The learning-curve forecast and the ``target`` rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import bench_scripts
from trainguard.checker.forecast import Prior, forecast, learn_prior
from trainguard.checker.model import Job, Series, Severity
from trainguard.checker.policy import Budget, Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.target import Target


def power(step: np.ndarray, planned: float, a: float = 2.0, b: float = 1.0,
          c: float = 0.5) -> np.ndarray:
    return a + b * (step / planned) ** -c


def noisy(v: np.ndarray, sd: float, seed: int) -> np.ndarray:
    return v + np.random.default_rng(seed).normal(0, sd, len(v))


@pytest.mark.parametrize("seed", range(5))
def test_power_law_forecast_converges_to_the_limit_and_covers_it(seed: int) -> None:
    step = np.arange(10, 5001, 10.0)
    value = noisy(power(step, 5000), 0.003, seed)
    horizon = 5000.0 * 400  # far out: the curve is within 0.05 of its limit a = 2
    truth = float(power(np.array([horizon]), 5000)[0])
    errors = []
    for upto in (1000, 5000):
        fc = forecast(step[step <= upto], value[step <= upto], horizon, planned=5000)
        assert fc is not None
        assert fc.low <= truth <= fc.high
        errors.append(abs(fc.mean - truth))
    assert errors[1] < 0.05
    assert errors[1] <= errors[0] + 0.01


@pytest.mark.parametrize("seed", range(5))
def test_exponential_decay_forecast_covers_the_limit(seed: int) -> None:
    step = np.arange(1, 301, 1.0)
    value = noisy(0.5 + 2.0 * np.exp(-3.0 * step / 1000), 0.002, seed)
    fc = forecast(step, value, 3000.0, planned=1000)
    assert fc is not None
    truth = 0.5 + 2.0 * np.exp(-9.0)
    assert fc.low <= truth <= fc.high
    assert abs(fc.mean - truth) < 0.1
    assert fc.at == 3000.0 and fc.level == 0.9 and fc.n_points == 300


def test_too_few_points_give_no_forecast() -> None:
    assert forecast(np.array([0.0, 10, 20, 30]), np.array([9.0, 5, 4, 3.5]), 100.0) is None
    assert forecast(np.array([]), np.array([]), 100.0) is None


def test_bad_level_or_horizon_is_refused() -> None:
    step = np.arange(1, 50.0)
    with pytest.raises(ValueError, match="level"):
        forecast(step, power(step, 100), 100.0, level=1.5)
    with pytest.raises(ValueError, match="horizon"):
        forecast(step, power(step, 100), 0.0)


def warmdown(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """A loss with a linear learning-rate warm-down over the last 40%: it bends down late."""
    return a + b * (x ** -0.4 - 1) - 0.4 * b * np.clip((x - 0.6) / 0.4, 0, 1) ** 1.5


def recipe(n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(n):
        planned = float(rng.integers(1000, 3000))
        step = np.linspace(planned / 12, planned, 12).round()
        a, b = rng.normal(3.3, 0.1), rng.normal(0.5, 0.05)
        runs.append((step, noisy(warmdown(step / planned, a, b), 0.004, int(rng.integers(10**9))),
                     planned))
    return runs


def test_a_prior_carries_the_late_drop_that_a_plain_fit_cannot_see() -> None:
    prior = learn_prior(recipe(40, seed=1))
    hits, errs = 0, []
    for step, value, planned in recipe(40, seed=2):
        half = step <= planned / 2
        fc = forecast(step[half], value[half], planned, planned=planned, prior=prior)
        assert fc is not None and fc.family == "prior"
        hits += fc.low <= value[-1] <= fc.high
        errs.append(abs(fc.mean - value[-1]))
    assert hits >= 32  # a nominal 90% interval on 40 new runs
    assert np.mean(errs) < 0.03
    again = Prior.from_dict(prior.to_dict())
    assert again == prior


def test_a_broken_prior_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="missing field"):
        Prior.from_dict({"x": [0, 1]})
    with pytest.raises(ValueError, match="needs at least 4"):
        learn_prior(recipe(3, seed=1))


def job_with(step: np.ndarray, value: np.ndarray, planned: int, **kw: object) -> Job:
    return Job(id="j1", planned_steps=planned, clock="step",
               series={"val_loss": Series("val_loss", step, step, value)}, **kw)  # type: ignore[arg-type]


def check(rule: Target, job: Job, policy: Policy | None = None) -> list:  # type: ignore[type-arg]
    return rule.check(job, Context(now=0.0, policy=policy or Policy(), jobs=[job]))


def test_rule_fires_on_a_run_that_clearly_misses_its_target() -> None:
    step = np.arange(10, 601, 10.0)
    value = noisy(power(step, 1000, a=3.6, b=0.3), 0.002, 0)
    # Without a recipe prior the miss is only information; asked to act, it warns.
    (info,) = check(Target({"target": 3.28}), job_with(step, value, 1000))
    assert info.severity is Severity.INFO and info.evidence["prior"] is False
    found = check(Target({"target": 3.28, "act_without_prior": True}),
                  job_with(step, value, 1000))
    assert len(found) == 1
    f = found[0]
    assert f.severity is Severity.WARNING and f.rule == "target"
    assert f.evidence["low"] > 3.28 and f.evidence["horizon_step"] == 1000
    assert f.evidence["progress"] == pytest.approx(0.6)
    assert "val_loss forecast" in f.message and "misses target 3.28" in f.message
    assert "at step 1000" in f.message and "90%" in f.message


def test_rule_is_silent_on_a_run_that_reaches_its_target() -> None:
    step = np.arange(10, 601, 10.0)
    value = noisy(power(step, 1000, a=3.0, b=0.3), 0.002, 0)
    assert check(Target({"target": 3.28}), job_with(step, value, 1000)) == []


def test_rule_is_silent_before_min_progress_and_without_a_target() -> None:
    step = np.arange(10, 601, 10.0)
    value = noisy(power(step, 1000, a=3.6, b=0.3), 0.002, 0)
    assert check(Target({"target": 3.28, "min_progress": 0.7}), job_with(step, value, 1000)) == []
    assert check(Target(), job_with(step, value, 1000)) == []


def test_rule_for_a_metric_to_maximise() -> None:
    step = np.arange(10, 601, 10.0)
    acc = 0.7 - 0.06 * (step / 1000) ** -0.5  # levels off near 0.7
    rule = Target({"metric": "val_acc", "target": 0.9, "mode": "max"})
    job = Job(id="j1", planned_steps=1000, clock="step",
              series={"val_acc": Series("val_acc", step, step, noisy(acc, 0.001, 3))})
    assert len(check(rule, job)) == 1


def test_the_budget_brings_the_horizon_forward() -> None:
    step = np.arange(10, 401, 10.0)
    value = noisy(power(step, 10_000, a=2.9, b=0.3), 0.002, 0)
    # 1 step per second from t=0; the budget pays for 500 s at $3.6/h: horizon step ~500.
    job = Job(id="j1", planned_steps=10_000, clock="elapsed", start_time=0.0, hourly_price=3.6,
              series={"val_loss": Series("val_loss", step, step, value)})
    policy = Policy(budget=Budget(per_job_usd=0.5))
    found = check(Target({"target": 3.28, "min_progress": 0.0}), job, policy)
    assert len(found) == 1
    assert found[0].evidence["horizon_step"] == pytest.approx(500, rel=0.05)
    # Without the budget the planned 10k steps get it there.
    assert check(Target({"target": 3.28, "min_progress": 0.0}), job) == []


def test_bad_params_are_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        Target({"mode": "lowest"})
    with pytest.raises(ValueError, match="confidence"):
        Target({"confidence": 1.0})


@pytest.mark.realdata
@pytest.mark.slow
def test_the_bar_on_real_modded_nanogpt_runs(curves_dir: Path) -> None:
    rows = bench_scripts.load("forecast_eval").evaluate_corpus(curves_dir)
    table = {row["checkpoint"]: row for row in rows}
    for row in table.values():
        assert row["wrong_stops"] == 0, row
    half = table[0.5]
    assert 0.85 <= half["coverage_90"] <= 0.95
    assert half["mae_forecast"] <= 0.5 * min(half["mae_last"], half["mae_best"])
