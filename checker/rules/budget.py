"""``budget``: a job's or an account's spend passes a threshold, now or projected.

Anchors: AWS Budgets and Azure budgets see billing data 8-24 h late and cannot
stop a training job. Here spend is job metadata x price, fresh every tick, and
projected to the job's planned end.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass

from trainguard.checker import cost
from trainguard.checker.model import Finding, Job, Severity
from trainguard.checker.policy import AccountBudget, Policy
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param


@dataclass
class BudgetParams:
    project: bool = param(
        True, "warn when the projected spend at the planned end passes the budget")


def period_start(now: float, period: str) -> float:
    """Start of the calendar day, ISO week or month containing ``now`` (UTC epoch seconds)."""
    t = time.gmtime(now)
    day = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
    if period == "day":
        return float(day)
    if period == "week":
        return float(day - t.tm_wday * 86400)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def _level(fraction: float, alert_at: list[float]) -> float | None:
    crossed = [a for a in sorted(alert_at) if fraction >= a]
    return crossed[-1] if crossed else None


def _severity(level: float) -> Severity:
    return Severity.CRITICAL if level >= 1.0 else Severity.WARNING


@register
class Budget(Rule):
    name = "budget"
    Params = BudgetParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        out = self._job_budget(job, ctx)
        accounts = ctx.policy.budget.accounts
        # Account budgets are judged once per tick, on the first running job of the scope.
        if accounts and self._first_of_scope(ctx).get(job.scope) is job:
            for b in accounts:
                if b.scope in ("*", job.scope):
                    out.extend(self._account(job, b, ctx))
        return out

    def _first_of_scope(self, ctx: Context) -> dict[str, Job]:
        first: dict[str, Job] | None = ctx.memo.get("budget.first")
        if first is None:
            first = {}
            for j in ctx.jobs:
                if j.state in self.states:
                    first.setdefault(j.scope, j)
            ctx.memo["budget.first"] = first
        return first

    def _job_budget(self, job: Job, ctx: Context) -> list[Finding]:
        p: BudgetParams = self.params
        limit = ctx.policy.budget.per_job_usd
        if limit is None or limit <= 0:
            return []
        now_usd = cost.spent(job, ctx.policy, ctx.now)
        if now_usd is None:
            return []
        level = _level(now_usd / limit, ctx.policy.budget.alert_at)
        if level is not None:
            return [Finding(
                job_id=job.id, rule=self.name, severity=_severity(level),
                message=f"spent ${now_usd:,.0f}, {now_usd / limit:.0%} of the ${limit:,.0f} "
                        "job budget",
                started_at=job.start_time, evidence={
                    "kind": f"job>={level:g}", "spent_usd": now_usd, "limit_usd": limit}, )]
        proj = cost.projected(job, ctx.policy, ctx.now) if p.project else None
        if proj is not None and proj > limit:
            return [Finding(
                job_id=job.id, rule=self.name, severity=Severity.WARNING,
                message=f"projected ${proj:,.0f} at the planned end passes the ${limit:,.0f} "
                        f"job budget (spent ${now_usd:,.0f} so far)",
                started_at=job.start_time, evidence={
                    "kind": "job-projected", "spent_usd": now_usd, "projected_usd": proj,
                    "limit_usd": limit})]
        return []

    def _account(self, job: Job, b: AccountBudget, ctx: Context) -> list[Finding]:
        if job.clock != "wall":
            return []  # calendar periods need wall-clock time
        start = period_start(ctx.now, b.period)
        total = sum(_spent_since(j, ctx.policy, start, ctx.now) for j in ctx.jobs
                    if b.scope in ("*", j.scope))
        level = _level(total / b.limit_usd, ctx.policy.budget.alert_at)
        if level is None:
            return []
        where = "all accounts" if b.scope == "*" else b.scope
        return [Finding(
            job_id=job.id, rule=self.name, severity=_severity(level),
            message=(f"{where}: ${total:,.0f} spent this {b.period}, {total / b.limit_usd:.0%} of "
                     f"${b.limit_usd:,.0f}"),
            started_at=start, evidence={
                "kind": f"account:{b.scope}:{b.period}>={level:g}", "spent_usd": total,
                "limit_usd": b.limit_usd, "period": b.period, "scope": b.scope})]


def _spent_since(job: Job, policy: Policy, start: float, now: float) -> float:
    rate = cost.hourly_cost(job, policy)
    if rate is None or job.start_time is None or job.clock != "wall":
        return 0.0
    end = min(now, job.end_time) if job.end_time is not None else now
    return rate * max(end - max(job.start_time, start), 0.0) / 3600.0
