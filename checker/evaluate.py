"""``evaluate(jobs, policy, now) -> findings``: one tick of judgement, no I/O."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trainguard.checker import cost
from trainguard.checker.model import Action, Finding, Job, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.registry import RULES, rule_names
from trainguard.checker.rules.base import Context, Rule

if TYPE_CHECKING:
    from trainguard.checker.follow import Followers

log = logging.getLogger("trainguard.checker")


def build_rules(policy: Policy) -> list[Rule]:
    rules = []
    for name in rule_names():
        cfg = policy.rule(name)
        if cfg.enabled:
            rules.append(RULES[name](cfg.params))
    return rules


def evaluate(jobs: list[Job], policy: Policy, now: float,
             rules: list[Rule] | None = None,
             followers: Followers | None = None) -> list[Finding]:
    """Every finding of every enabled rule on every job, as of ``now``.

    A rule that raises on one job is logged and skipped: one odd job must not blind
    the watchdog to all the others. ``followers``, kept from tick to tick of a replay,
    spare re-running a rule whose input has not changed (``checker.follow``).
    """
    rules = build_rules(policy) if rules is None else rules
    ctx = Context(now=now, policy=policy, jobs=jobs)
    configs = ({rule.name: policy.rule(rule.name) for rule in rules} if followers is None
               else followers.configs(policy, rules))
    findings: list[Finding] = []
    for job in jobs:
        found_here: list[Finding] = []
        ask, kept = (rules, []) if followers is None else followers.split(rules, job, now)
        for rule in ask:
            try:
                found = (rule.check(job, ctx) if followers is None
                         else followers.check(rule, job, ctx))
            except Exception:
                log.exception("rule %s failed on job %s", rule.name, job.id)
                continue
            if found:
                _act(found, configs[rule.name].actions)
                found_here.extend(found)
        if kept:  # rules whose input did not change since the tick before: in rule order
            for r, found in kept:
                _act(found, configs[r.name].actions)
            if not found_here:  # ``kept`` is in rule order
                found_here = [f for _, found in kept for f in found]
            else:
                by_rule = {id(r): found for r, found in kept}
                asked, found_here = found_here, []
                for rule in rules:
                    reused = by_rule.get(id(rule))
                    found_here.extend(reused if reused is not None
                                      else [f for f in asked if f.rule == rule.name])
        if found_here:
            # Money only for jobs with something to say: most jobs of a tick have nothing.
            _price(found_here, job, policy, now)
            findings.extend(found_here)
    return findings


def _act(found: list[Finding], actions: dict[Severity, Action]) -> None:
    for f in found:
        f.action = actions.get(f.severity, f.action)


def _price(found: list[Finding], job: Job, policy: Policy, now: float) -> None:
    rate = cost.hourly_cost(job, policy)
    projection = cost.projected(job, policy, now)
    for f in found:
        if f.burnt_usd is None and rate is not None and f.started_at is not None:
            f.burnt_usd = rate * cost.hours_between(job, f.started_at, now)
        if f.projected_usd is None:
            f.projected_usd = projection
