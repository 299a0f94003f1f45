"""``plateau``: the objective stopped improving.

Anchors: Keras EarlyStopping (patience=0, min_delta=0), Lightning EarlyStopping
(patience=3 checks), Debugger loss_not_decreasing (10 steps, 0.1 %). Those compare
single noisy values. This rule compares robust levels at the start and end of a
window (by default the later half of the run so far, which suits power-law
learning curves at any stage) and fires only when it is confident, given the
window's own noise, that the improvement is below ``min_rel_improvement`` of the
level. A metric that has gone below zero (a GAN critic's Wasserstein loss) has no
floor to measure improvement against and is not judged.

On the shared real runs, healthy runs improve by at least 2.4 % over the later
half at every stage; the flat ones by at most 0.6 % (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from checker.metrics import primary
from checker.model import Finding, Job, Series, Severity
from checker.registry import register
from checker.rules.base import Context, Rule, param
from checker.stats import median


@dataclass
class PlateauParams:
    metric: str | None = param(None, "the objective; default val_loss, loss, train_loss, *loss*")
    mode: Literal["min", "max"] = param("min", "min for a loss, max for an accuracy")
    window_fraction: float = param(0.5, "the window is this later fraction of the run so far")
    window_steps: float | None = param(None, "a fixed window in steps instead of the fraction")
    window_seconds: float | None = param(None, "a fixed window in seconds instead of the fraction")
    min_points: int = param(12, "points needed in the window before judging")
    min_rel_improvement: float = param(0.01, "improvement below this fraction of the level is flat")
    z: float = param(2.0, "confidence: the improvement plus z standard errors must stay below")


@register
class Plateau(Rule):
    name = "plateau"
    Params = PlateauParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: PlateauParams = self.params
        s = job.series.get(p.metric) if p.metric else primary(job, ctx.policy)
        if s is None or len(s) < p.min_points:
            return []
        if not np.isfinite(s.value[-1]):
            return []  # the divergence rule is on it
        win = self._window(job, s)
        if win is None:
            return []
        lo, v = win
        finite = np.isfinite(v)
        if not finite.all():
            v = v[finite]  # a lone NaN that recovered is the divergence rule's business
        if len(v) < p.min_points:
            return []
        sign = 1.0 if p.mode == "min" else -1.0
        if np.nanmin(s.value) < 0:
            # Improvement relative to the level needs a floor at zero; a metric that went
            # negative (a GAN critic's Wasserstein loss, a continuous NLL) has none.
            return []
        # Spikes (points far on the bad side of the window) are the divergence rule's
        # business, recovered or not: judge the points around them.
        sigma = 1.4826 * median(np.abs(np.diff(v))) / np.sqrt(2)
        centre = median(v)
        calm = sign * (v - centre) <= 8 * sigma + 0.1 * abs(centre)
        if not calm.all():  # the level of what is judged, spikes set aside
            v = v[calm]
            if len(v) < p.min_points:
                return []
            centre = median(v)
        k = max(len(v) // 3, 2)
        head, tail = v[:k], v[-k:]
        level = abs(centre)
        if level == 0:
            return []
        improvement = sign * (median(head) - median(tail))
        # Noise from first differences (robust to the trend itself): a median of k
        # points has a standard error of about 1.25 sigma / sqrt(k).
        se = 1.25 * sigma * np.sqrt(2.0 / k)
        limit = p.min_rel_improvement * level
        if improvement + p.z * se >= limit:
            return []
        start_step = float(s.step[lo]) if np.isfinite(s.step[lo]) else None
        return [Finding(
            job_id=job.id, rule=self.name, severity=Severity.WARNING,
            message=(f"{s.name} improved {improvement / level:+.2%} over the last {len(v)} "
                     f"points (needs {p.min_rel_improvement:.1%}): not learning"),
            started_at=float(s.time[lo]), step=start_step,
            evidence={"kind": "flat", "metric": s.name, "points": len(v),
                      "rel_improvement": improvement / level, "noise_se": se / level,
                      "level": centre, "window_start_step": start_step},
        )]

    def _window(self, job: Job, s: Series) -> tuple[int, np.ndarray] | None:
        p: PlateauParams = self.params
        n = len(s)
        if p.window_steps is not None and np.isfinite(s.step[-1]):
            lo = int(np.searchsorted(s.step, s.step[-1] - p.window_steps, side="left"))
        elif p.window_seconds is not None and job.clock != "step":
            lo = int(np.searchsorted(s.time, s.time[-1] - p.window_seconds, side="left"))
        else:
            lo = n - max(int(n * p.window_fraction), 1)
        if n - lo < p.min_points:
            return None
        return lo, s.value[lo:]
