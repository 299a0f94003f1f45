"""``utilization``: GPUs idle or starved, priced in dollars.

Anchor: SageMaker Debugger LowGPUUtilization (p95 < 70 % is under-use, p5 < 10 %
is fluctuation, window 500 samples). This rule says what the idle share of the
GPUs cost over the window, so a team can rank the waste, not just see a percentage.
With each host's series (``Job.hosts``) the message names the under-used hosts: one idle
node among busy ones is a different fix from all of them waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainguard.checker import cost
from trainguard.checker.model import Finding, Job, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.stats import quantile


@dataclass
class UtilizationParams:
    metric: str = param("gpu_util", "GPU utilisation series, percent 0-100")
    window_seconds: float = param(1800.0, "look at this much recent time")
    min_points: int = param(10, "points needed in the window")
    underuse_p95: float = param(70.0, "p95 below this is under-use (Debugger's default)")
    idle_p95: float = param(10.0, "p95 below this means the GPUs sit idle: critical")
    min_waste_usd: float = param(0.0, "stay silent while the window's waste is below this")


@register
class Utilization(Rule):
    name = "utilization"
    Params = UtilizationParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: UtilizationParams = self.params
        s = job.series.get(ctx.policy.metrics.get(p.metric, p.metric))
        if s is None or not len(s) or job.clock == "step":
            return []
        lo = int(np.searchsorted(s.time, ctx.now - p.window_seconds, side="left"))
        v = s.value[lo:]
        finite = np.isfinite(v)
        if not finite.all():
            v = v[finite]
        if len(v) < p.min_points:
            return []
        p95, p5, mean = (float(x) for x in (quantile(v, 0.95), quantile(v, 0.05), v.mean()))
        if p95 >= p.underuse_p95:
            return []
        span_h = min(p.window_seconds, ctx.now - float(s.time[lo])) / 3600.0
        rate = cost.hourly_cost(job, ctx.policy)
        waste = rate * span_h * (1 - mean / 100.0) if rate is not None else None
        if waste is not None and waste < p.min_waste_usd:
            return []
        severity = Severity.CRITICAL if p95 < p.idle_p95 else Severity.WARNING
        money = f", about ${waste:,.2f} of GPU time wasted" if waste is not None else ""
        low = _low_hosts(job, s.name, ctx.now - p.window_seconds, p.underuse_p95)
        if low is not None:
            money += f"; {low}"
        return [Finding(
            job_id=job.id, rule=self.name, severity=severity,
            message=(f"GPUs {'idle' if severity is Severity.CRITICAL else 'under-used'}: "
                     f"mean {mean:.0f} %, p95 {p95:.0f} % over {span_h * 60:.0f} min{money}"),
            started_at=float(s.time[lo]), step=None,
            evidence={"kind": "idle" if severity is Severity.CRITICAL else "underuse",
                      "mean_util": mean, "p95_util": p95, "p5_util": p5,
                      "window_min": span_h * 60, "wasted_usd": waste},
        )]


def _low_hosts(job: Job, name: str, since: float, under: float) -> str | None:
    """Which hosts are under-used, when the source gives each host's series."""
    p95s = {}
    for host, hs in job.host_series(name).items():
        v = hs.value[int(np.searchsorted(hs.time, since, side="left")):]
        v = v[np.isfinite(v)]
        if len(v):
            p95s[host] = quantile(v, 0.95)
    if len(p95s) < 2:
        return None
    low = sorted(h for h, q in p95s.items() if q < under)
    if len(low) == len(p95s):
        return f"all {len(p95s)} hosts alike"
    return f"under-used: {', '.join(low)} (of {len(p95s)} hosts)" if low else None
