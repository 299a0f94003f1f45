"""The fleet at a glance, once per tick: what the running jobs burn per hour, how many jobs
have each verdict, and what the tick's stops saved. Every runtime publishes these beside
its findings (the Pushgateway on Kubernetes, EMF on AWS, the tick's log on Azure), and the
dashboards (stacks/dashboards) draw them.

"Saved" is the job's projected spend at its planned end minus what it has spent when it
is stopped: the money a stop keeps from being burnt. A job with no price or no planned
end saves an unknown amount and counts as 0 (never a guess).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.checker import cost
from trainguard.checker.model import Finding, Job, JobState, verdict
from trainguard.checker.policy import Policy

#: every verdict a job can have, so a dashboard's series exist even at 0
VERDICTS = ("ok", "info", "warning", "critical")


@dataclass
class Fleet:
    burn_usd_per_hour: float = 0.0  # running jobs' hourly cost
    verdicts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    saved_usd: float = 0.0  # by this tick's stops (would-be stops in a dry run)

    def to_dict(self) -> dict[str, Any]:
        return {"burn_usd_per_hour": round(self.burn_usd_per_hour, 4),
                "verdicts": dict(self.verdicts), "saved_usd": round(self.saved_usd, 2)}


def summarise(jobs: Iterable[Job], findings: Sequence[Finding], policy: Policy) -> Fleet:
    by_job: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_job[f.job_id].append(f)
    fleet = Fleet()
    counts: Counter[str] = Counter()
    for job in jobs:
        counts[verdict(by_job[job.id])] += 1
        if job.state is JobState.RUNNING:
            fleet.burn_usd_per_hour += cost.hourly_cost(job, policy) or 0.0
    fleet.verdicts.update(counts)
    return fleet


def saved(job: Job, policy: Policy, now: float) -> float:
    """What stopping ``job`` at ``now`` keeps from being spent (0 when unknown)."""
    projected = cost.projected(job, policy, now)
    spent = cost.spent(job, policy, now)
    if projected is None or spent is None:
        return 0.0
    return max(projected - spent, 0.0)
