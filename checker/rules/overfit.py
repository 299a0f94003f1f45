"""``overfit``: the held-out loss climbs many-fold while the training loss falls.

Anchor: SageMaker Debugger's ``overfit`` (patience=1, ratio_threshold=0.1 on the gap
between validation and training loss) and ``overtraining`` (patience_validation=10,
delta=0.01). A gap ratio fires on any model whose validation loss sits above its
training loss, which is most models. This rule asks for the failure itself: the
validation level (a median of three evaluations, so one odd evaluation cannot move
it) at least ``factor`` times its own best for ``points`` evaluations in a row, while
the training loss is lower than it was when validation was at its best. It reports
the step of the best validation value (the checkpoint to keep) and, priced by the
checker, what the run has spent since.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainguard.checker.metrics import get, objective, training_objective
from trainguard.checker.model import Finding, Job, Series, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.stats import median, rolling_median3


@dataclass
class OverfitParams:
    metric: str | None = param(
        None, "the held-out loss; default val_loss, else the held-out total (eval_loss, "
        "val/loss, or the sum of val/* loss components)")
    train_metric: str | None = param(
        None, "the training loss; default loss/train_loss, or the sum of its components")
    factor: float = param(
        3.0, "the held-out level at least this many times its best is overfitting: a "
        "many-fold climb, not the doubling of a fine-tune growing over-confident while "
        "its accuracy still holds")
    points: int = param(3, "... for this many consecutive evaluations")


@register
class Overfit(Rule):
    name = "overfit"
    Params = OverfitParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: OverfitParams = self.params
        val = (job.series.get(p.metric) if p.metric else
               get(job, "val_loss", ctx.policy) or objective(job, held_out=True))
        train = (job.series.get(p.train_metric) if p.train_metric else
                 training_objective(job, ctx.policy))
        if val is None or train is None or val is train:
            return []
        ok = np.isfinite(val.value)
        v = val.value[ok]
        if len(v) < 2 + p.points or float(v.min()) <= 0:
            return []
        level = rolling_median3(v)
        best = np.minimum.accumulate(level)
        high = level >= p.factor * best
        # Only a climb that is still going on as of the last evaluation.
        if not high[-p.points:].all():
            return []
        idx = np.flatnonzero(ok)
        best_at = int(idx[int(np.argmin(v[: len(v) - p.points]))])  # the best evaluation
        start = len(high) - int(np.argmin(high[::-1])) if not high.all() else 0
        fell = _train_fell(train, float(val.step[best_at]), float(val.time[best_at]))
        if fell is None:
            return []
        then, now = fell
        best_step = float(val.step[best_at]) if np.isfinite(val.step[best_at]) else None
        where = f"step {best_step:g}" if best_step is not None else f"record {best_at}"
        return [Finding(
            job_id=job.id, rule=self.name, severity=Severity.WARNING,
            message=(f"{val.name} climbed to {level[-1] / best[-1]:.1f}x its best "
                     f"({float(val.value[best_at]):.4g} at {where}) while {train.name} fell "
                     f"{then:.4g} -> {now:.4g}: overfitting; the best checkpoint is at {where}"),
            started_at=float(val.time[best_at]), step=best_step,
            evidence={"kind": "overfit", "metric": val.name, "train_metric": train.name,
                      "best_value": float(val.value[best_at]), "best_step": best_step,
                      "level": float(level[-1]), "ratio": float(level[-1] / best[-1]),
                      "climbing_since_step": float(val.step[idx[min(start, len(idx) - 1)]]),
                      "train_then": then, "train_now": now},
        )]


def _train_fell(train: Series, step: float, time: float) -> tuple[float, float] | None:
    """(training level around the best evaluation, training level now) when it is lower
    now; None when it is not, or there is too little to tell."""
    ok = np.isfinite(train.value)
    if ok.sum() < 3:
        return None
    t, s, v = train.time[ok], train.step[ok], train.value[ok]
    # Where the best evaluation happened, on the training loss's own records.
    at = int(np.searchsorted(s, step, side="left")) if np.isfinite(step) else int(
        np.searchsorted(t, time, side="left"))
    at = min(at, len(v) - 1)
    then = median(v[max(at - 1, 0): at + 2])
    now = median(v[-3:])
    if at >= len(v) - 2 or not now < then:
        return None
    return then, now
