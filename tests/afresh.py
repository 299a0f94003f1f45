"""A replay's histories, and the same worked out the slow way: every rule run afresh at
each of its ticks, with no follower, no band and no skipped tick. Tests that hold a
follower's or a band's shortcut exact compare the two."""

from __future__ import annotations

from trainguard.checker.evaluate import build_rules, evaluate
from trainguard.checker.model import Job
from trainguard.checker.policy import Policy
from trainguard.replay import ReplayResult

History = tuple[str, float, str, list[float]]  # key, first fire, its severity, escalations


def histories(result: ReplayResult) -> list[History]:
    return sorted((h.key, h.first.time, h.first.severity.value,
                   [e.time for e in h.escalations]) for h in result.histories)


def judged_afresh(job: Job, policy: Policy, ticks: list[float]) -> list[History]:
    rules = build_rules(policy)
    first: dict[str, tuple[float, str, list[float]]] = {}
    worst: dict[str, int] = {}
    for t in ticks:
        for f in evaluate([job.until(t)], policy, t, rules=rules):
            if f.key not in first:
                first[f.key], worst[f.key] = (t, f.severity.value, []), f.severity.rank
            elif f.severity.rank > worst[f.key]:
                first[f.key][2].append(t)
                worst[f.key] = f.severity.rank
    return sorted((k, t, sev, esc) for k, (t, sev, esc) in first.items())
