"""Attacks on the AWS runtime (issue 16, findings 1, 2 and 3), through the real Lambda
handler, with CloudWatch, CloudWatch Logs, DynamoDB and SNS in moto server mode.

SageMaker is ``Fleet`` over tests/sagemaker_replay.py's ``SageMakerServer`` (moto cannot
stop a training job): the boundary no real server here can stand behind. The attacker
is any principal of the account allowed ``logs:PutLogEvents`` on the training log group
or ``cloudwatch:PutMetricData``: moto does not tell principals apart, so the forged
writes are simply the test's own, under another job's name.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import test_aws_runtime as aws
from tests.sagemaker_replay import SageMakerServer, put_logs
from tests.test_aws_runtime import CREDS_ENV, HANDLER, Context, Fleet, Inbox, client, scheduled
from trainguard.lambdas.aws.dynamodb_state import DynamoDBStore
from trainguard.lambdas.state import AuditAction

# The AWS runtime tests' moto server, state table and SNS inbox, as they set them up.
moto_url, table, inbox = aws.moto_url, aws.table, aws.inbox
OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
FORGED_TAIL = ("\nWhat the watchdog did: STOPPED the job (approved by the platform team)"
               "\nConsole: https://evil.example/login")


@dataclass
class MetricFleet(Fleet):
    """Fleet whose jobs define a ``loss`` and a ``reward`` metric (their
    MetricDefinitions)."""

    def answer(self, op: str, request: dict[str, Any]) -> dict[str, Any] | None:
        out = super().answer(op, request)
        if op == "DescribeTrainingJob" and out is not None:
            out["AlgorithmSpecification"]["MetricDefinitions"] = [
                {"Name": "loss", "Regex": "loss=([0-9.e+-]+)"},
                {"Name": "reward", "Regex": "reward=([0-9.e+-]+)"}]
        return out


@dataclass
class Watchdog:
    job: str  # the victim: team B's job, one name per test (moto outlives a test)
    fleet: MetricFleet
    server: SageMakerServer
    table: str
    moto_url: str
    inbox: Inbox
    policy_file: Path

    def policy(self, text: str) -> None:
        self.policy_file.write_text(text)
        HANDLER.reset()

    def tick(self) -> Any:
        return HANDLER.handler(scheduled(), Context(aws_request_id=uuid.uuid4().hex))

    def audit(self) -> list[Any]:
        return DynamoDBStore(client("dynamodb", self.moto_url), self.table).audit_log()


@pytest.fixture
def watchdog(moto_url: str, table: str, inbox: Inbox, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Watchdog]:
    job = f"team-b-llm-{uuid.uuid4().hex[:6]}"
    yield from lambda_on(job, MetricFleet([job], time.time() - 3600), moto_url, table, inbox,
                         tmp_path, monkeypatch)


def lambda_on(job: str, fleet: MetricFleet, moto_url: str, table: str, inbox: Inbox,
              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Watchdog]:
    """The real Lambda handler set up, as its stack does, over ``fleet`` on a SageMaker
    stand-in, with stops on (a fixture's body: yields once)."""
    with SageMakerServer(fleet.answer) as server:
        policy_file = tmp_path / "policy.yaml"
        for k, v in {**CREDS_ENV, "AWS_ENDPOINT_URL": moto_url,
                     "AWS_ENDPOINT_URL_SAGEMAKER": server.url,
                     "TRAINGUARD_STATE_TABLE": table, "TRAINGUARD_TOPIC_ARN": inbox.topic_arn,
                     "TRAINGUARD_POLICY": str(policy_file), "TRAINGUARD_STOP_ENABLED": "true",
                     "TRAINGUARD_SAGEMAKER_MAX_ATTEMPTS": "1",
                     "AWS_LAMBDA_FUNCTION_NAME": "trainguard-test"}.items():
            monkeypatch.setenv(k, v)
        yield Watchdog(job, fleet, server, table, moto_url, inbox, policy_file)
    HANDLER.reset()


def policy(extra_safety: str = "", persist: int = 1, rules: str = "") -> str:
    return (f"name: attack\nsafety: {{dry_run: false, persist_ticks: {persist}, "
            f"max_stops_per_tick: 5{extra_safety}}}\n"
            "cost: {prices: {ml.p4d.24xlarge: 37.5}}\n"
            "rules:\n  logs: {actions: {critical: stop}}\n  divergence: {actions: "
            "{critical: stop}}\n  plateau: {enabled: false}\n  target: {enabled: false}\n"
            + rules)


def forge_log_line(w: Watchdog) -> None:
    """Anyone with logs:PutLogEvents on the group: a stream named like the victim's."""
    put_logs(w.moto_url, f"{w.job}/algo-1-1750000000", [(time.time() - 60, OOM + FORGED_TAIL)])


def forge_blow_up(w: Watchdog) -> None:
    """Anyone with cloudwatch:PutMetricData: the victim's loss, climbing a thousandfold."""
    cw = client("cloudwatch", w.moto_url)
    now = time.time()
    values = [2.0 - 0.01 * i for i in range(40)] + [10.0 ** (3 + i) for i in range(10)]
    data = [{"MetricName": "loss", "Dimensions": [{"Name": "TrainingJobName", "Value": w.job}],
             "Timestamp": now - 60 * (len(values) - i), "Value": v}
            for i, v in enumerate(values)]
    for i in range(0, len(data), 20):
        cw.put_metric_data(Namespace="/aws/sagemaker/TrainingJobs", MetricData=data[i:i + 20])


# --- finding 2: a forged log stream -------------------------------------------------


def test_a_forged_log_line_raises_an_alarm_but_never_stops_the_job(watchdog: Watchdog) -> None:
    watchdog.policy(policy())
    forge_log_line(watchdog)
    watchdog.tick()
    assert watchdog.fleet.stopped == []  # before the fix: StopTrainingJob on team-b's job
    (record,) = [a for a in watchdog.audit() if a.rule == "logs"]
    assert record.action == AuditAction.SKIP_UNTRUSTED
    assert "rests on logs" in record.reason
    (mail,) = watchdog.inbox.messages()
    assert mail["Subject"] == f"[trainguard] CRITICAL: logs on {watchdog.job}"
    text = mail["Message"]
    # The forged lines stay inside the quoted excerpt: no line of the mail starts with them.
    assert not any(line.startswith(("What the watchdog did: STOPPED", "Console: https://evil"))
                   for line in text.splitlines())
    assert "What the watchdog did: NOT stopped" in text
    assert '"RuntimeError: CUDA out of memory' in text  # the excerpt, quoted


def test_trusting_logs_is_the_accounts_own_statement(watchdog: Watchdog) -> None:
    """The same forged line stops the job once the policy says no one else can write the
    log group (safety.trusted_signals): what the fix refuses by default is real."""
    watchdog.policy(policy(", trusted_signals: [logs]"))
    forge_log_line(watchdog)
    watchdog.tick()
    assert watchdog.fleet.stopped == [watchdog.job]


# --- finding 1: a forged metric -------------------------------------------------------


def test_a_forged_metric_alone_never_stops_the_job(watchdog: Watchdog) -> None:
    watchdog.policy(policy())
    forge_blow_up(watchdog)
    watchdog.tick()
    assert watchdog.fleet.stopped == []
    actions = {a.rule: a.action for a in watchdog.audit()}
    assert actions.get("divergence") == AuditAction.SKIP_UNTRUSTED, actions


def test_a_forged_reward_collapse_alone_never_stops_the_job(watchdog: Watchdog) -> None:
    """A reward written into the victim's metrics (0.8, then 0: what an RL policy's
    collapse looks like, critical by ``divergence``) is metric evidence only."""
    watchdog.policy(policy())
    cw = client("cloudwatch", watchdog.moto_url)
    now = time.time()
    values = [0.8 + 0.025 * (i % 3) for i in range(30)] + [0.0] * 10
    data = [{"MetricName": "reward",
             "Dimensions": [{"Name": "TrainingJobName", "Value": watchdog.job}],
             "Timestamp": now - 60 * (len(values) - i), "Value": v}
            for i, v in enumerate(values)]
    for i in range(0, len(data), 20):
        cw.put_metric_data(Namespace="/aws/sagemaker/TrainingJobs", MetricData=data[i:i + 20])
    watchdog.tick()
    assert watchdog.fleet.stopped == []
    (record,) = [a for a in watchdog.audit() if a.rule == "divergence"]
    assert record.action == AuditAction.SKIP_UNTRUSTED, record
    assert record.severity == "critical" and record.finding_key.endswith("reward_collapse")


def test_a_metric_finding_corroborated_by_the_jobs_state_stops_it(watchdog: Watchdog) -> None:
    """Metric evidence plus a finding resting on what only SageMaker writes (the job's
    own instances and times, priced: its budget) is enough."""
    watchdog.policy(policy().replace("cost:", "budget: {per_job_usd: 10}\ncost:"))
    forge_blow_up(watchdog)
    watchdog.tick()
    assert watchdog.fleet.stopped == [watchdog.job]
    assert [a.action for a in watchdog.audit() if a.rule == "divergence"] == [AuditAction.STOP]


# --- finding 3: the tag race ------------------------------------------------------------


def test_a_protect_tag_added_after_the_listing_is_honoured(watchdog: Watchdog) -> None:
    """Tags are cached for ten minutes; the owner protects the job between two ticks.
    The stop path reads them again, uncached."""
    watchdog.policy(policy(", trusted_signals: [logs]", persist=2))
    forge_log_line(watchdog)
    watchdog.tick()  # seen once: persistence holds the stop back; tags now cached
    watchdog.fleet.tags[watchdog.job] = {"trainguard:protect": "owner says no"}
    before = watchdog.server.calls["ListTags"]
    watchdog.tick()
    assert watchdog.fleet.stopped == []  # before the fix: stopped on the cached tags
    assert watchdog.server.calls["ListTags"] > before
    assert any(a.action == AuditAction.SKIP_PROTECTED and "read again" in a.reason
               for a in watchdog.audit())
