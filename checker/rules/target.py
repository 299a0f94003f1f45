"""``target``: the forecast says the metric will miss its target by the planned end.

The horizon is the planned end: the planned steps, or the step the job reaches by its
max runtime or its per-job budget at its recent rate, whichever comes first. The rule
fires only when the forecast is confident: the whole interval at ``confidence`` lies on
the wrong side of the target. Runs that miss by a hair are not worth a stop, and a wrong
stop of a run that would have made it is the costliest mistake a watchdog can make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from trainguard.checker import cost, metrics
from trainguard.checker.forecast import Forecast, Prior, forecast
from trainguard.checker.model import Finding, Job, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param


@dataclass
class TargetParams:
    metric: str = param("val_loss", "the metric that has a target")
    target: float | None = param(None, "the value that counts as success; none: rule silent")
    mode: Literal["min", "max"] = param("min", "min: lower is better (losses); max: higher is")
    level: float = param(0.9, "the interval shown in the finding")
    confidence: float = param(
        0.999, "fire only when the forecast gives the target at most 1 - confidence chance "
        "(the interval at 2*confidence - 1 lies wholly past the target)")
    min_progress: float = param(0.2, "do not judge before this fraction of the planned steps")
    prior: dict[str, Any] | None = param(
        None, "a recipe prior from past runs (checker.forecast.learn_prior(...).to_dict()); "
        "without one the run's own points are extrapolated with parametric families")
    act_without_prior: bool = param(
        False, "without a prior, report a miss as info only: on the shared real runs the "
        "prior-less forecast wrongly fired on 8 of 264 runs that reached their target")


def horizon(job: Job, ctx: Context, last_step: float) -> float | None:
    """The step the job will reach at its planned end; None when nothing bounds it."""
    ends: list[float] = []
    if job.planned_steps:
        ends.append(float(job.planned_steps))
    deadlines: list[float] = []
    if job.clock != "step" and job.start_time is not None:
        if job.max_runtime_s:
            deadlines.append(job.start_time + job.max_runtime_s)
        rate = cost.hourly_cost(job, ctx.policy)
        per_job = ctx.policy.budget.per_job_usd
        if per_job is not None and rate:
            deadlines.append(job.start_time + per_job / rate * 3600.0)
    rate = cost.recent_rate(cost.progress(job))
    if deadlines and rate:
        prog = cost.progress(job)
        assert prog is not None  # a rate implies progress
        left = max(min(deadlines) - float(prog.time[-1]), 0.0)
        ends.append(max(float(prog.step[-1]), last_step) + left * rate)
    finite = [e for e in ends if math.isfinite(e) and e > 0]
    return min(finite) if finite else None


@register
class Target(Rule):
    name = "target"
    Params = TargetParams

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        super().__init__(params)
        p: TargetParams = self.params
        if p.mode not in ("min", "max"):
            raise ValueError(f"target: mode must be 'min' or 'max', got {p.mode!r}")
        for name in ("level", "confidence"):
            if not 0.5 <= getattr(p, name) < 1:
                raise ValueError(f"target: {name} must be in [0.5, 1), got {getattr(p, name)}")
        self.prior = Prior.from_dict(p.prior) if p.prior is not None else None

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: TargetParams = self.params
        if p.target is None:
            return []
        series = metrics.get(job, p.metric, ctx.policy)
        if series is None:
            return []
        steps = series.step[series.step == series.step]  # drop NaN steps
        if not len(steps):
            return []
        last = float(steps.max())
        end = horizon(job, ctx, last)
        if end is None:
            return []
        scale = float(job.planned_steps) if job.planned_steps else end
        done = last / scale
        if done < p.min_progress:
            return []
        sure = self._forecast(series.step, series.value, end, scale, 2 * p.confidence - 1)
        if sure is None:
            return []
        misses = sure.low > p.target if p.mode == "min" else sure.high < p.target
        if not misses:
            return []
        shown = self._forecast(series.step, series.value, end, scale, p.level) or sure
        confident = self.prior is not None or p.act_without_prior
        return [Finding(
            job_id=job.id, rule=self.name,
            severity=Severity.WARNING if confident else Severity.INFO,
            message=(f"{p.metric} forecast {shown.mean:.3g} ({shown.low:.3g}–{shown.high:.3g}, "
                     f"{shown.level:.0%}) at step {end:.0f} misses target {p.target:g}"),
            started_at=series.last_time, step=last,
            evidence={"kind": "miss", "metric": p.metric, "mean": shown.mean,
                      "low": shown.low, "high": shown.high, "level": shown.level,
                      "confidence": p.confidence, "target": p.target, "mode": p.mode,
                      "horizon_step": end, "progress": done, "family": shown.family,
                      "n_points": shown.n_points, "prior": self.prior is not None},
        )]

    def _forecast(self, step: Any, value: Any, end: float, scale: float,
                  level: float) -> Forecast | None:
        return forecast(step, value, end, planned=scale, level=level, prior=self.prior)
