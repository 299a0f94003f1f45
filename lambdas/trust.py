"""What the watchdog trusts before it stops a job (issue 16; docs/security.md).

Two checks, both on the stop path of the shared tick:

* ``refusal``: where other principals can write a job's training metrics or log lines
  (on SageMaker anyone allowed ``cloudwatch:PutMetricData`` or ``logs:PutLogEvents`` can
  write them for any job name; on Azure ML anyone who can log to a run), a finding that
  rests on them alone never stops the job. It needs a second finding of the same job,
  this tick, resting on a *different* signal the policy trusts
  (``safety.corroborate_with``: ``state``, ``logs``, ``platform_metrics``). A source says
  which of its signals others can write with ``forgeable`` (none by default: local
  files, and Kubeflow jobs read through their own namespace).
* ``before_stop``: the job's tags are read again, uncached, right before the stop call,
  where the source can (``fresh_tags``): a protect tag added, or an opt-in tag removed,
  since the job was listed is honoured.
"""

from __future__ import annotations

from typing import Any

from trainguard.checker.model import Finding, Job, Severity
from trainguard.checker.policy import Policy

#: rule -> the signal its findings rest on; any other rule rests on the training metrics
#: the job writes (loss, step, throughput), the most easily forged.
EVIDENCE: dict[str, str] = {
    "logs": "logs",
    "budget": "state",  # the platform's own times, instance type and count, and prices
    "restarts": "state",  # restart counts and failure reasons the platform records
    "utilization": "platform_metrics",
    "rightsizing": "platform_metrics",
}
METRICS = "metrics"


class StopRefused(Exception):
    """A stop the watchdog will not make; the message says why (it is audited)."""


def evidence_of(rule: str) -> str:
    return EVIDENCE.get(rule, METRICS)


def _adapter(source: Any) -> Any:
    # A runtime may wrap its adapter (the AWS TickSource): ask the adapter itself.
    return getattr(source, "adapter", source)


def forgeable(source: Any, policy: Policy | None = None) -> frozenset[str]:
    """The signals of ``source`` that principals other than the job can write, less those
    the policy says this account has closed (``safety.trusted_signals``)."""
    trusted = set(policy.safety.trusted_signals) if policy is not None else set()
    return frozenset(getattr(_adapter(source), "forgeable", ())) - trusted


def refusal(source: Any, finding: Finding, findings: list[Finding],
            policy: Policy) -> str | None:
    """Why ``finding`` must not stop its job on ``source`` (None: it may). ``findings``
    are all of the job's findings this tick."""
    kind = evidence_of(finding.rule)
    if kind not in forgeable(source, policy):
        return None
    trusted = set(policy.safety.corroborate_with) - {kind}
    for f in findings:
        if (f is not finding and evidence_of(f.rule) in trusted
                and f.severity.rank >= Severity.WARNING.rank):
            return None
    name = getattr(source, "name", "the source")
    return (f"{finding.rule} rests on {kind}, which principals other than the job can write "
            f"on {name}; no finding resting on {' or '.join(sorted(trusted)) or 'nothing'} "
            "(safety.corroborate_with) corroborates it this tick, so it does not stop the job "
            "(safety.trusted_signals can trust it where others cannot write it)")


def is_protected(job: Job, tag: str) -> bool:
    """The job carries the protect tag with any value but "false"."""
    value = job.tags.get(tag)
    return value is not None and value.strip().lower() != "false"


def before_stop(source: Any, job: Job, policy: Policy) -> None:
    """Read the job's tags again, uncached, and raise ``StopRefused`` if they no longer
    allow the stop: the protect tag is on, or the runtime's opt-in tag is off."""
    fresh = getattr(_adapter(source), "fresh_tags", None)
    if fresh is None:
        return
    tags: dict[str, str] = fresh(job)
    tag = policy.safety.protect_tag
    if is_protected(Job(id=job.id, provider=job.provider, scope=job.scope, tags=tags), tag):
        raise StopRefused(f"job {job.id!r} has the protect tag {tag!r} now "
                          f"({tags.get(tag)!r}), read again just before the stop")
    opt_in: tuple[str, str] | None = getattr(source, "stop_tag", None)
    if opt_in is not None and tags.get(opt_in[0]) != opt_in[1]:
        raise StopRefused(f"job {job.id!r} no longer has the opt-in tag "
                          f"{opt_in[0]}={opt_in[1]}, read again just before the stop")
    job.tags = tags
