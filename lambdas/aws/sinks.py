"""Where the AWS runtime's findings go.

* Metrics in the ``trainguard`` namespace, the ones the stack's CloudWatch alarms and
  dashboard read (keep the names in step with ``stacks/aws.py``; a test checks):
  ``Findings`` (dimensions account, rule, severity: the findings of a tick),
  ``SpendUSDPerHour`` (account: the hourly burn of the running jobs), ``Jobs``
  (account, verdict) and ``SavedUSD`` (account: what the tick's stops saved). In Lambda
  they are EMF lines on stdout (``EmfWriter``, powertools): no API call, no throttling.
  Elsewhere ``PutMetricDataWriter`` sends them.
* ``SnsAlarmSink``: one SNS message a person can act on (``lambdas.message``) for each
  new critical finding, and one when such a finding resolves. Warnings and reminders
  reach people through the CloudWatch alarms on ``Findings`` instead.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from trainguard.checker import cost
from trainguard.checker.model import Finding, Job, JobState, Severity, verdict
from trainguard.checker.policy import Policy
from trainguard.lambdas import plugins
from trainguard.lambdas.message import render
from trainguard.lambdas.tick import AlarmEvent

log = logging.getLogger("trainguard.aws")

NAMESPACE = "trainguard"
FINDINGS = "Findings"
SPEND = "SpendUSDPerHour"
JOBS = "Jobs"
SAVED = "SavedUSD"  # dimensions: account; what the tick's stops kept from being spent


@dataclass(frozen=True)
class Datum:
    name: str
    dimensions: tuple[tuple[str, str], ...]
    value: float
    unit: str  # a CloudWatch unit name: Count, None


def account_of(job: Job) -> str:
    """The account of a SageMaker job's scope ("account/region"); the scope otherwise."""
    return job.scope.split("/", 1)[0]


def tick_metrics(jobs: Sequence[Job], findings: Sequence[Finding], policy: Policy,
                 saved_usd: float = 0.0) -> list[Datum]:
    """The tick as metrics: findings per account, rule and severity; the hourly spend of
    running jobs and the jobs per verdict, per account."""
    account = {j.id: account_of(j) for j in jobs}
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for f in findings:
        if f.severity is not Severity.INFO:
            counts[(account.get(f.job_id, "unknown"), f.rule, f.severity.value)] += 1
    out = [Datum(FINDINGS, (("account", a), ("rule", r), ("severity", s)), float(n), "Count")
           for (a, r, s), n in sorted(counts.items())]
    spend: dict[str, float] = defaultdict(float)
    verdicts: dict[tuple[str, str], int] = defaultdict(int)
    by_job: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_job[f.job_id].append(f)
    for j in jobs:
        a = account_of(j)
        spend.setdefault(a, 0.0)  # an account with no running job burns $0/h, said so
        if j.state is JobState.RUNNING:
            spend[a] += cost.hourly_cost(j, policy) or 0.0
        verdicts[(a, verdict(by_job[j.id]))] += 1
    out += [Datum(SPEND, (("account", a),), round(v, 4), "None") for a, v in sorted(spend.items())]
    out += [Datum(JOBS, (("account", a), ("verdict", v)), float(n), "Count")
            for (a, v), n in sorted(verdicts.items())]
    # one account per deployment: the tick's savings go to the account of its jobs
    out += [Datum(SAVED, (("account", a),), round(saved_usd, 2), "None")
            for a in sorted(spend)[:1]]
    return out


class MetricWriter(Protocol):
    def write(self, data: Iterable[Datum]) -> None: ...


@plugins.sinks.register("emf")
class EmfWriter:
    """Each datum as one EMF line on stdout, through powertools' ``single_metric``."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace

    def write(self, data: Iterable[Datum]) -> None:
        from aws_lambda_powertools.metrics import MetricUnit, single_metric

        for d in data:
            unit = MetricUnit.Count if d.unit == "Count" else MetricUnit.NoUnit
            with single_metric(name=d.name, unit=unit, value=d.value,
                               namespace=self.namespace) as metric:
                for name, value in d.dimensions:
                    metric.add_dimension(name=name, value=value)


@plugins.sinks.register("cloudwatch")
class PutMetricDataWriter:
    """The same metrics through PutMetricData, for a watchdog outside Lambda."""

    BATCH = 1000  # data per PutMetricData call

    def __init__(self, client: Any, namespace: str = NAMESPACE) -> None:
        self.client = client
        self.namespace = namespace

    def write(self, data: Iterable[Datum]) -> None:
        now = datetime.now(UTC)
        items = [{"MetricName": d.name, "Value": d.value, "Unit": d.unit, "Timestamp": now,
                  "Dimensions": [{"Name": k, "Value": v} for k, v in d.dimensions]}
                 for d in data]
        for i in range(0, len(items), self.BATCH):
            self.client.put_metric_data(Namespace=self.namespace,
                                        MetricData=items[i:i + self.BATCH])


def wants_message(event: AlarmEvent) -> bool:
    """A new critical finding (or one that turned critical), or the resolve of one."""
    if event.kind == "raise":
        return event.memory.severity == Severity.CRITICAL.value
    if event.kind == "resolve":
        return event.memory.alarmed_severity == Severity.CRITICAL.value
    return False


@plugins.sinks.register("sns")
class SnsAlarmSink:
    """An ``AlarmSink`` publishing ``lambdas.message`` text to an SNS topic."""

    def __init__(self, client: Any, topic_arn: str, dry_run: bool) -> None:
        self.client = client
        self.topic_arn = topic_arn
        self.dry_run = dry_run
        self.sent: list[str] = []  # message ids, for the invocation's log

    def send(self, event: AlarmEvent) -> None:
        if not wants_message(event):
            return
        msg = render(event, self.dry_run)
        attrs = {k: {"DataType": "String", "StringValue": msg.fields[k]}
                 for k in ("kind", "rule", "severity", "job") if msg.fields.get(k)}
        answer = self.client.publish(TopicArn=self.topic_arn, Subject=msg.subject,
                                     Message=msg.text, MessageAttributes=attrs)
        self.sent.append(str(answer.get("MessageId", "")))
        log.info("alarm sent to SNS", extra={"subject": msg.subject, "kind": event.kind,
                                             "job_key": event.job_key})
