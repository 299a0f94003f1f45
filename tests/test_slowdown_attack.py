"""A policy may let ``slowdown`` stop a job; its evidence is the job's progress metric,
which on SageMaker any principal allowed ``cloudwatch:PutMetricData`` can write for any
job name. Through the real Lambda handler (CloudWatch, DynamoDB and SNS on moto in
server mode; SageMaker recorded, the boundary moto cannot stand behind): a forged
slowdown is found but never stops the job on its own; the same finding
corroborated by what only SageMaker writes (the job's budget) does."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import test_aws_runtime as aws
from tests.test_aws_runtime import client
from tests.test_security_aws import MetricFleet, Watchdog, lambda_on, policy
from trainguard.lambdas.state import AuditAction

moto_url, table, inbox = aws.moto_url, aws.table, aws.inbox


@dataclass
class StepFleet(MetricFleet):
    """Jobs whose metric definitions include the ``step`` counter."""

    def answer(self, op: str, request: dict[str, Any]) -> dict[str, Any] | None:
        out = super().answer(op, request)
        if op == "DescribeTrainingJob" and out is not None:
            out["AlgorithmSpecification"]["MetricDefinitions"].append(
                {"Name": "step", "Regex": "step=([0-9]+)"})
        return out


@pytest.fixture
def watchdog(moto_url: str, table: str, inbox: aws.Inbox, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Watchdog]:
    job = f"team-b-slow-{uuid.uuid4().hex[:6]}"
    yield from lambda_on(job, StepFleet([job], time.time() - 3 * 3600), moto_url, table, inbox,
                         tmp_path, monkeypatch)


def forge_slowdown(w: Watchdog) -> None:
    """The victim's step counter, one point a minute for two hours, at half its pace for
    the last 20 minutes: written by someone else."""
    cw = client("cloudwatch", w.moto_url)
    now = time.time()
    steps, s = [], 0.0
    for i in range(120):
        s += 25.0 if i >= 100 else 50.0
        steps.append(s)
    data = [{"MetricName": "step", "Dimensions": [{"Name": "TrainingJobName", "Value": w.job}],
             "Timestamp": now - 60 * (len(steps) - i), "Value": v}
            for i, v in enumerate(steps)]
    for i in range(0, len(data), 20):
        cw.put_metric_data(Namespace="/aws/sagemaker/TrainingJobs", MetricData=data[i:i + 20])


STOP_ON_SLOWDOWN = "  slowdown: {actions: {warning: stop}}\n"


def test_a_forged_slowdown_alone_never_stops_the_job(watchdog: Watchdog) -> None:
    watchdog.policy(policy(rules=STOP_ON_SLOWDOWN))
    forge_slowdown(watchdog)
    watchdog.tick()
    assert watchdog.fleet.stopped == []
    (record,) = [a for a in watchdog.audit() if a.rule == "slowdown"]
    assert record.action == AuditAction.SKIP_UNTRUSTED
    assert "rests on metrics" in record.reason


def test_a_slowdown_corroborated_by_the_jobs_state_stops_it(watchdog: Watchdog) -> None:
    watchdog.policy(policy(rules=STOP_ON_SLOWDOWN).replace(
        "cost:", "budget: {per_job_usd: 10}\ncost:"))
    forge_slowdown(watchdog)
    watchdog.tick()
    assert watchdog.fleet.stopped == [watchdog.job]
    assert [a.action for a in watchdog.audit() if a.rule == "slowdown"] == [AuditAction.STOP]
