"""The AWS runtime (lambdas/aws) against real parts.

DynamoDB (state, audit, idempotency records), SNS (read back through a subscribed SQS
queue), CloudWatch, CloudWatch Logs and EventBridge run in moto, in server mode over HTTP
on loopback (this module's own server, so its data cannot mix with other tests').
SageMaker, which moto cannot stop, is ``Fleet``: generated jobs in botocore's wire format
served over HTTP by tests/sagemaker_replay.py's ``SageMakerServer`` (botocore's retries
run for real against it, and it counts every call, StopTrainingJob included).
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import importlib
import json
import os
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.sagemaker_replay import REGION, Recordings, SageMakerServer, put_logs

# The shared tick's safety tests, run here on the DynamoDB store (the ``store`` fixture).
from tests.test_tick import (  # noqa: F401
    RULES,
    FakeSource,
    make_job,
    policy,
    test_a_failing_stop_is_retried_then_given_up_with_an_alarm,
    test_an_unconfirmed_stop_is_retried_next_tick,
    test_cap_holds_when_every_job_looks_bad_most_expensive_critical_first,
    test_crash_between_intent_and_done_is_confirmed_not_stopped_twice,
    test_dedup_one_raise_reminders_then_one_resolve,
    test_dry_run_never_stops_but_audits_would_stop_once,
    test_persistence_needs_consecutive_ticks,
    test_protect_tag,
)
from trainguard.checker.model import Action, Severity
from trainguard.lambdas.aws.dynamodb_state import DynamoDBStore, StateConflict, create_table
from trainguard.lambdas.aws.sinks import PutMetricDataWriter, tick_metrics
from trainguard.lambdas.state import AuditAction, StateStore, StateStoreError
from trainguard.lambdas.tick import tick

HANDLER = importlib.import_module("trainguard.lambdas.aws.handler")
ACCOUNT = "123456789012"
OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
ROOT = Path(__file__).resolve().parent.parent


# --- servers and clients --------------------------------------------------------------

@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def client(service: str, url: str) -> Any:
    session: Any = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                 region_name=REGION)
    return session.client(service, endpoint_url=url)


@pytest.fixture
def table(moto_url: str) -> str:
    name = f"state-{uuid.uuid4().hex[:8]}"
    create_table(client("dynamodb", moto_url), name)
    return name


@pytest.fixture
def store(moto_url: str, table: str) -> StateStore:
    return DynamoDBStore(client("dynamodb", moto_url), table)


@dataclass
class Inbox:
    """An SQS queue subscribed to the alarm topic: what an email subscriber would get."""

    sqs: Any
    queue_url: str
    topic_arn: str

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            got = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                           WaitTimeSeconds=0).get("Messages", [])
            if not got:
                return out
            for m in got:
                out.append(json.loads(m["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url,
                                        ReceiptHandle=m["ReceiptHandle"])


@pytest.fixture
def inbox(moto_url: str) -> Inbox:
    sns, sqs = client("sns", moto_url), client("sqs", moto_url)
    topic = sns.create_topic(Name=f"alarms-{uuid.uuid4().hex[:8]}")["TopicArn"]
    queue = sqs.create_queue(QueueName=f"inbox-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    return Inbox(sqs, queue, topic)


@dataclass
class Fleet:
    """Running SageMaker jobs, answered in the wire format; records the stops asked."""

    names: list[str]
    start: float
    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)

    def arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}"

    def answer(self, op: str, request: dict[str, Any]) -> dict[str, Any] | None:
        if op == "ListTrainingJobs":
            return {"TrainingJobSummaries": [
                {"TrainingJobName": n, "TrainingJobArn": self.arn(n), "CreationTime": self.start,
                 "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training"}
                for n in self.names]}
        if op == "DescribeTrainingJob":
            n = request["TrainingJobName"]
            return {"TrainingJobName": n, "TrainingJobArn": self.arn(n),
                    "TrainingJobStatus": "Stopping" if n in self.stopped else "InProgress",
                    "SecondaryStatus": "Stopping" if n in self.stopped else "Training",
                    "CreationTime": self.start, "TrainingStartTime": self.start,
                    "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1,
                                       "VolumeSizeInGB": 100},
                    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
                    "AlgorithmSpecification": {"TrainingInputMode": "File",
                                               "TrainingImage": "img"},
                    "ModelArtifacts": {"S3ModelArtifacts": ""}}
        if op == "ListTags":
            name = request["ResourceArn"].rsplit("/", 1)[-1]
            return {"Tags": [{"Key": k, "Value": v}
                             for k, v in self.tags.get(name, {}).items()]}
        if op == "StopTrainingJob":
            self.stopped.append(request["TrainingJobName"])
            return {}
        return None


POLICY = """
name: aws-test
safety: {{dry_run: {dry_run}, max_stops_per_tick: {cap}, persist_ticks: {persist},
          trusted_signals: [metrics, logs]}}
cost: {{prices: {{ml.p4d.24xlarge: 37.5}}}}
rules:
  logs: {{actions: {{critical: stop}}}}
  plateau: {{enabled: false}}
  target: {{enabled: false}}
"""


@dataclass
class Context:
    """The parts of the Lambda context the handler and powertools read."""

    aws_request_id: str = "req-1"
    function_name: str = "trainguard-test"
    function_version: str = "$LATEST"
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:trainguard-test"
    memory_limit_in_mb: int = 1024

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


@dataclass
class Lambda:
    """The function's environment: moto for AWS, ``Fleet`` behind SageMakerServer."""

    fleet: Fleet
    server: SageMakerServer
    inbox: Inbox
    table: str
    moto_url: str

    def invoke(self, event: Any) -> Any:
        return HANDLER.handler(event, Context(aws_request_id=uuid.uuid4().hex))

    def audit(self) -> list[Any]:
        return DynamoDBStore(client("dynamodb", self.moto_url), self.table).audit_log()


def scheduled() -> dict[str, Any]:
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event",
            "source": "aws.events", "account": ACCOUNT, "region": REGION,
            "time": "2025-06-15T16:40:00Z", "resources": [], "detail": {}}


@pytest.fixture
def make_lambda(moto_url: str, table: str, inbox: Inbox, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    servers: list[SageMakerServer] = []

    def make(names: list[str], cap: int = 2, persist: int = 1, dry_run: bool = False,
             stop_enabled: bool = True, max_attempts: int = 3, **env: str) -> Lambda:
        policy_file = tmp_path / "policy.yaml"
        policy_file.write_text(POLICY.format(dry_run=str(dry_run).lower(), cap=cap,
                                             persist=persist))
        fleet = Fleet(names, time.time() - 3600)
        server = SageMakerServer(fleet.answer).__enter__()
        servers.append(server)
        for k, v in {**CREDS_ENV, "AWS_ENDPOINT_URL": moto_url,
                     "AWS_ENDPOINT_URL_SAGEMAKER": server.url,
                     "TRAINGUARD_STATE_TABLE": table, "TRAINGUARD_TOPIC_ARN": inbox.topic_arn,
                     "TRAINGUARD_POLICY": str(policy_file),
                     "TRAINGUARD_STOP_ENABLED": str(stop_enabled).lower(),
                     "TRAINGUARD_SAGEMAKER_MAX_ATTEMPTS": str(max_attempts),
                     "AWS_LAMBDA_FUNCTION_NAME": "trainguard-test", **env}.items():
            monkeypatch.setenv(k, v)
        HANDLER.reset()
        return Lambda(fleet, server, inbox, table, moto_url)

    yield make
    HANDLER.reset()
    for s in servers:
        s.__exit__(None, None, None)


CREDS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION}


def oom_logs(moto_url: str, names: list[str]) -> None:
    now = time.time()
    for n in names:
        put_logs(moto_url, f"{n}/algo-1-1750000000", [(now - 60, OOM)])


def emf(out: str) -> list[dict[str, Any]]:
    """The EMF documents printed on stdout (what CloudWatch turns into metrics)."""
    docs = []
    for line in out.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            docs.append(json.loads(line))
    return docs


def logs_event(job: str, lines: list[str], owner: str = ACCOUNT) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    payload = {"messageType": "DATA_MESSAGE", "owner": owner,
               "logGroup": "/aws/sagemaker/TrainingJobs",
               "logStream": f"{job}/algo-1-1750000000", "subscriptionFilters": ["sig"],
               "logEvents": [{"id": str(i), "timestamp": now_ms + i, "message": m}
                             for i, m in enumerate(lines)]}
    data = base64.b64encode(gzip.compress(json.dumps(payload).encode())).decode()
    return {"awslogs": {"data": data}}


def state_change(rec: Recordings, name: str, status: str, secondary: str,
                 modified_ms: int) -> dict[str, Any]:
    event = rec.event("event-llm-pretrain-a-training")
    event["id"] = str(uuid.uuid4())
    d = event["detail"]
    d.update(TrainingJobName=name, TrainingJobArn=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:"
             f"training-job/{name}", TrainingJobStatus=status, SecondaryStatus=secondary,
             LastModifiedTime=modified_ms)
    return event


# --- the store -------------------------------------------------------------------------

def test_two_invocations_deciding_the_same_stop_stop_once(moto_url: str, table: str) -> None:
    """B runs a whole tick between A's read and A's write: A's write is refused (the
    version it read is gone), so A raises and stops nothing; the job is stopped once."""
    src_a = FakeSource("fake", [make_job("j1", 500.0)])
    src_b = FakeSource("fake", [make_job("j1", 500.0)])
    b_store = DynamoDBStore(client("dynamodb", moto_url), table)

    class Interleaved(DynamoDBStore):
        def load_all(self) -> Any:
            loaded = super().load_all()
            tick([src_b], policy(), b_store, [], now=100.0, rules=RULES)
            return loaded

    a_store = Interleaved(client("dynamodb", moto_url), table)
    with pytest.raises(StateConflict, match="another invocation changed it first"):
        tick([src_a], policy(), a_store, [], now=100.0, rules=RULES)
    assert src_b.stops == ["j1"] and src_a.stops == []
    assert [a.action for a in b_store.audit_log()] == [AuditAction.STOP]


def test_store_down_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    dead = DynamoDBStore(client("dynamodb", "http://127.0.0.1:9"), "state-table")
    with pytest.raises(StateStoreError, match="DynamoDB table state-table: cannot read job"):
        dead.load_all()
    src = FakeSource("fake", [make_job("j1", 500.0)])
    with pytest.raises(StateStoreError):
        tick([src], policy(), dead, [], now=100.0, rules=RULES)
    assert src.stops == []


def test_audit_records_expire_and_keep_their_order(moto_url: str, table: str) -> None:
    store = DynamoDBStore(client("dynamodb", moto_url), table, audit_ttl_s=3600)
    src = FakeSource("fake", [make_job("j1", 500.0), make_job("j2", 500.0, price=99.0)])
    tick([src], policy(cap=1), store, [], now=1000.0, rules=RULES)
    log = store.audit_log()
    assert [(a.job_id, a.action) for a in log] == [("j1", AuditAction.SKIP_CAP),
                                                   ("j2", AuditAction.STOP)]
    items = client("dynamodb", moto_url).query(
        TableName=table, KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": {"S": "audit"}})["Items"]
    assert {int(i["expires_at"]["N"]) for i in items} == {1000 + 3600}


def test_older_event_never_replaces_a_newer_one(store: DynamoDBStore) -> None:
    assert store.put_event("j1", {"v": "new"}, modified=200.0)
    assert not store.put_event("j1", {"v": "old"}, modified=100.0)
    assert [p.event for p in store.pending_events()] == [{"v": "new"}]


# --- metrics ---------------------------------------------------------------------------

def test_metric_names_match_the_stacks_alarms() -> None:
    from trainguard.lambdas.aws import sinks
    from trainguard.stacks import aws as stack
    assert (sinks.NAMESPACE, sinks.FINDINGS, sinks.SPEND, sinks.JOBS) == (
        stack.NAMESPACE, stack.FINDINGS, stack.SPEND, stack.JOBS)


def test_put_metric_data_fallback_lands_in_cloudwatch(moto_url: str) -> None:
    scope = f"{ACCOUNT}/{REGION}"
    jobs = [dataclasses.replace(make_job("j1", 500.0, price=4.0), scope=scope),
            dataclasses.replace(make_job("j2", 1.0, price=6.0), scope=scope)]
    pol = policy()
    from trainguard.checker.evaluate import evaluate
    findings = evaluate(jobs, pol, 100.0, RULES)
    cw = client("cloudwatch", moto_url)
    PutMetricDataWriter(cw, namespace="trainguard-fallback").write(
        tick_metrics(jobs, findings, pol))
    got = {(m["MetricName"], tuple(sorted((d["Name"], d["Value"]) for d in m["Dimensions"])))
           for m in cw.list_metrics(Namespace="trainguard-fallback")["Metrics"]}
    assert ("Findings", (("account", ACCOUNT), ("rule", "loss_above"),
                         ("severity", "critical"))) in got
    assert ("Jobs", (("account", ACCOUNT), ("verdict", "ok"))) in got
    stats = cw.get_metric_statistics(
        Namespace="trainguard-fallback", MetricName="SpendUSDPerHour",
        Dimensions=[{"Name": "account", "Value": ACCOUNT}], StartTime=time.time() - 600,
        EndTime=time.time() + 600, Period=60, Statistics=["Maximum"])["Datapoints"]
    assert [d["Maximum"] for d in stats] == [10.0]


# --- the handler -----------------------------------------------------------------------

def test_scheduled_tick_stops_at_most_the_cap_and_mails_each_critical_job(
        make_lambda: Any, moto_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    names = [f"oom-{i}" for i in range(5)]
    fn = make_lambda(names, cap=2)
    oom_logs(moto_url, names)
    result = fn.invoke(scheduled())
    assert result["jobs"] == {"sagemaker": 5}
    assert fn.server.calls["StopTrainingJob"] == 2 and len(fn.fleet.stopped) == 2
    actions = sorted(a.action.value for a in fn.audit())
    assert actions == ["skip_cap"] * 3 + ["stop"] * 2
    mails = fn.inbox.messages()
    assert len(mails) == 5
    by_job = {m["MessageAttributes"]["job"]["Value"]: m for m in mails}
    assert set(by_job) == set(names)
    stopped = by_job[fn.fleet.stopped[0]]
    assert stopped["Subject"] == f"[trainguard] CRITICAL: logs on {fn.fleet.stopped[0]}"
    assert "CUDA out of memory" in stopped["Message"]
    assert "STOPPED the job" in stopped["Message"]
    assert f"Console: https://{REGION}.console.aws.amazon.com/sagemaker" in stopped["Message"]
    held = by_job[next(n for n in names if n not in fn.fleet.stopped)]
    assert "max_stops_per_tick" in held["Message"]
    docs = emf(capsys.readouterr().out)
    findings = [d for d in docs if "Findings" in d]
    assert findings and findings[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "trainguard"
    assert findings[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        ["account", "rule", "severity"]]
    assert (ACCOUNT, "logs", "critical", [5.0]) in [
        (d["account"], d["rule"], d["severity"], d["Findings"]) for d in findings]
    spend = [d["SpendUSDPerHour"] for d in docs if "SpendUSDPerHour" in d]
    assert spend == [[5 * 37.5]]  # five p4d jobs burning, priced by the policy
    # the next tick: the three held back are stopped (2, then 1), never the first two again
    fn.invoke(scheduled())
    fn.invoke(scheduled())
    assert sorted(fn.fleet.stopped) == names and fn.server.calls["StopTrainingJob"] == 5


def test_duplicate_delivery_is_processed_once(make_lambda: Any, moto_url: str) -> None:
    names = ["dup-a", "dup-b"]
    fn = make_lambda(names, cap=5)
    oom_logs(moto_url, names)
    event = scheduled()
    first = fn.invoke(event)
    listed = fn.server.calls["ListTrainingJobs"]
    again = fn.invoke(json.loads(json.dumps(event)))
    assert again == first
    assert fn.server.calls["ListTrainingJobs"] == listed, "the tick did not run again"
    assert fn.server.calls["StopTrainingJob"] == 2
    assert len(fn.inbox.messages()) == 2


def test_dry_run_when_stopping_is_not_enabled(make_lambda: Any, moto_url: str) -> None:
    fn = make_lambda(["dry-a"], stop_enabled=False)  # the policy allows stops; the stack not
    oom_logs(moto_url, ["dry-a"])
    fn.invoke(scheduled())
    assert fn.server.calls["StopTrainingJob"] == 0
    assert [a.action for a in fn.audit()] == [AuditAction.WOULD_STOP]
    assert "WOULD HAVE STOPPED" in fn.inbox.messages()[0]["Message"]


def test_stop_tag_opt_in_protects_untagged_jobs(make_lambda: Any, moto_url: str) -> None:
    fn = make_lambda(["tag-yes", "tag-no"], cap=5, TRAINGUARD_STOP_TAG="trainguard:stop=allow")
    fn.fleet.tags["tag-yes"] = {"trainguard:stop": "allow"}
    oom_logs(moto_url, ["tag-yes", "tag-no"])
    fn.invoke(scheduled())
    assert fn.fleet.stopped == ["tag-yes"]
    assert {(a.job_id, a.action) for a in fn.audit()} == {
        ("tag-yes", AuditAction.STOP), ("tag-no", AuditAction.SKIP_PROTECTED)}


def test_sagemaker_throttling_is_retried_then_reported(make_lambda: Any, moto_url: str) -> None:
    fn = make_lambda(["thr-a"], max_attempts=3)
    oom_logs(moto_url, ["thr-a"])
    fn.server.faults["ListTrainingJobs"] = [(400, "ThrottlingException")] * 2
    assert fn.invoke(scheduled())["jobs"] == {"sagemaker": 1}
    assert fn.server.calls["ListTrainingJobs"] == 3
    fn.server.faults["ListTrainingJobs"] = [(400, "ThrottlingException")] * 3
    result = fn.invoke(scheduled())
    assert "ThrottlingException" in result["source_errors"]["sagemaker"]
    assert result["stops"] == [] and result["jobs"] == {}


def test_state_store_down_raises_and_stops_nothing(
        make_lambda: Any, moto_url: str, caplog: pytest.LogCaptureFixture) -> None:
    fn = make_lambda(["down-a"], AWS_ENDPOINT_URL_DYNAMODB="http://127.0.0.1:9",
                     AWS_MAX_ATTEMPTS="1")
    oom_logs(moto_url, ["down-a"])
    with pytest.raises(StateStoreError, match="DynamoDB table"):
        fn.invoke(scheduled())
    assert fn.server.calls["StopTrainingJob"] == 0
    assert "state store failed: nothing was stopped" in caplog.text


def test_state_change_event_spares_describe_and_keeps_the_newer(
        make_lambda: Any, moto_url: str) -> None:
    fn = make_lambda(["ev-a", "ev-b"])
    rec = Recordings()
    newer = state_change(rec, "ev-a", "InProgress", "Training", 1_750_000_200_000)
    older = state_change(rec, "ev-a", "InProgress", "Downloading", 1_750_000_100_000)
    assert fn.invoke(newer)["kept"] is True
    assert fn.invoke(older)["kept"] is False  # out of order: arrived after the newer one
    fn.invoke(scheduled())
    assert fn.server.calls["DescribeTrainingJob"] == 1  # ev-b only
    # the event was used: the tick after that describes both again
    fn.invoke(scheduled())
    assert fn.server.calls["DescribeTrainingJob"] == 3


def test_terminal_state_resolves_open_findings_at_once(make_lambda: Any, moto_url: str) -> None:
    fn = make_lambda(["end-a"], dry_run=True)
    oom_logs(moto_url, ["end-a"])
    fn.invoke(scheduled())
    assert [m["Subject"] for m in fn.inbox.messages()] == ["[trainguard] CRITICAL: logs on end-a"]
    result = fn.invoke(state_change(Recordings(), "end-a", "Failed", "Failed",
                                    int(time.time() * 1000)))
    assert result["resolved"] == ["end-a/logs/cuda_oom"]
    mails = fn.inbox.messages()
    assert [m["Subject"] for m in mails] == ["[trainguard] RESOLVED: logs on end-a"]
    assert "State:      FAILED" in mails[0]["Message"]


def test_log_subscription_alarms_at_once_and_only_once(make_lambda: Any, moto_url: str) -> None:
    fn = make_lambda(["logs-a"], persist=3)
    result = fn.invoke(logs_event("logs-a", ["step 10 loss 2.1", OOM]))
    assert result["matched"] == 1 and result["alarmed"] == ["cuda_oom"]
    mails = fn.inbox.messages()
    assert [m["Subject"] for m in mails] == ["[trainguard] CRITICAL: logs on logs-a"]
    assert "the GPU ran out of memory" in mails[0]["Message"]
    assert "next scheduled tick decides" in mails[0]["Message"]
    assert fn.invoke(logs_event("logs-a", [OOM]))["alarmed"] == []  # the same trouble again
    # The tick sees the delivered lines (none were put in CloudWatch Logs) and does not
    # raise the finding a second time.
    tick_result = fn.invoke(scheduled())
    assert tick_result["findings"] >= 1 and tick_result["events"] == []
    assert fn.inbox.messages() == []
    assert [a.action for a in fn.audit()] == [AuditAction.SKIP_PERSISTENCE]
    # The lines were consumed; no new ones: the next tick resolves the alarm, once.
    fn.invoke(scheduled())
    assert [m["Subject"] for m in fn.inbox.messages()] == [
        "[trainguard] RESOLVED: logs on logs-a"]
    fn.invoke(scheduled())
    assert fn.inbox.messages() == []


def test_a_log_alarm_no_sink_took_is_raised_by_the_next_tick(
        make_lambda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SNS refusing the immediate log alarm (a wrapper refusing in front of the real
    sink: the boundary is SNS being down): the claim is given back, so the next tick
    raises the finding from the kept lines instead of counting it as said."""
    from trainguard.lambdas.aws.runtime import Runtime

    fn = make_lambda(["logs-f"], persist=3)
    real = Runtime.sinks

    class Down:
        def send(self, event: Any) -> None:
            raise ConnectionError("SNS unreachable")

    monkeypatch.setattr(Runtime, "sinks", lambda self: [Down()])
    assert fn.invoke(logs_event("logs-f", [OOM]))["alarmed"] == []
    assert fn.inbox.messages() == []
    monkeypatch.setattr(Runtime, "sinks", real)
    fn.invoke(scheduled())
    assert [m["Subject"] for m in fn.inbox.messages()] == [
        "[trainguard] CRITICAL: logs on logs-f"]


@pytest.mark.parametrize("event", [
    {"hello": "world"},
    "not even an object",
    {"awslogs": {"data": "bm90IGd6aXA="}},
    {"detail-type": "SageMaker Training Job State Change", "id": "e1", "detail": {"x": 1}},
    {"detail-type": "Scheduled Event", "source": "aws.events"},  # no id
])
def test_malformed_event_is_acknowledged_and_stops_nothing(
        make_lambda: Any, event: Any, caplog: pytest.LogCaptureFixture) -> None:
    fn = make_lambda(["m-a"])
    result = fn.invoke(event)
    assert result["status"] == "ignored" and result["reason"]
    assert fn.server.calls["StopTrainingJob"] == 0
    assert "malformed event ignored" in caplog.text


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("LastModifiedTime", float("nan"), "detail.LastModifiedTime nan is not a finite time"),
    ("LastModifiedTime", "NaN", "detail.LastModifiedTime 'NaN' is not a finite time"),
    ("TrainingJobName", "x" * 10_000, "(10000 characters) is not a SageMaker training job"),
])
def test_a_malformed_state_change_is_acknowledged_and_the_next_tick_judges_every_job(
        make_lambda: Any, field: str, value: Any, reason: str) -> None:
    """The issue's cases: reported as malformed (not a store failure, so not retried),
    nothing of it kept, and the next scheduled tick lists and judges every job."""
    fn = make_lambda(["bad-a", "bad-b"])
    event = state_change(Recordings(), "bad-a", "InProgress", "Training", 1_750_000_200_000)
    event["detail"][field] = value
    result = fn.invoke(event)
    assert result["status"] == "ignored" and reason in result["reason"]
    assert DynamoDBStore(client("dynamodb", fn.moto_url), fn.table).pending_events() == []
    tick_result = fn.invoke(scheduled())
    assert tick_result["jobs"] == {"sagemaker": 2}
    assert fn.server.calls["DescribeTrainingJob"] == 2  # no kept event stood in for one


def test_the_job_name_check_is_sagemakers_own() -> None:
    """The route's copy of TrainingJobName's pattern and length is botocore's model."""
    import botocore.session

    from trainguard.lambdas.aws.routes.state_change import JOB_NAME

    shape = botocore.session.get_session().get_service_model("sagemaker").shape_for(
        "TrainingJobName")
    assert JOB_NAME.pattern == shape.metadata["pattern"]
    assert shape.metadata["max"] == 63 and JOB_NAME.fullmatch("a" * 63)
    assert not JOB_NAME.fullmatch("a" * 64)


def test_recorded_malformed_event_is_acknowledged(make_lambda: Any) -> None:
    fn = make_lambda(["m-b"])
    assert fn.invoke(Recordings().event("event-malformed"))["status"] == "ignored"


# --- EventBridge and the package --------------------------------------------------------

def _stack_rules(stacks: dict[str, Any]) -> dict[str, Any]:
    """The EventBridge rules of the synthesised aws-dev stack (the session's one synth)."""
    return dict(stacks["aws-dev"]["resource"]["aws_cloudwatch_event_rule"])


def test_real_events_match_the_stacks_event_pattern(moto_url: str,
                                                    stacks: dict[str, Any]) -> None:
    """The stack's rule, put in moto's EventBridge with a queue as its target: the
    recorded state-change events reach the target, a scheduled event does not."""
    rules = _stack_rules(stacks)
    patterns = [r["event_pattern"] for r in rules.values() if r.get("event_pattern")]
    assert len(patterns) == 1, "one rule for job state changes"
    events, sqs = client("events", moto_url), client("sqs", moto_url)
    queue = sqs.create_queue(QueueName=f"rule-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    name = f"job-state-{uuid.uuid4().hex[:8]}"
    events.put_rule(Name=name, EventPattern=patterns[0])
    events.put_targets(Rule=name, Targets=[{"Id": "q", "Arn": arn}])
    rec = Recordings()
    samples = [rec.event(s) for s in ("event-llm-pretrain-a-training",
                                      "event-resnet-spot-b-failed")]
    entries = [{"Source": e["source"], "DetailType": e["detail-type"],
                "Detail": json.dumps(e["detail"]), "Resources": e["resources"]}
               for e in [*samples, scheduled()]]
    assert events.put_events(Entries=entries)["FailedEntryCount"] == 0
    got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10,
                              WaitTimeSeconds=1).get("Messages", [])
    names = sorted(json.loads(m["Body"])["detail"]["TrainingJobName"] for m in got)
    assert names == ["llm-pretrain-a", "resnet-spot-b"]


@pytest.mark.slow
def test_package_imports_the_handler_with_only_its_zip_and_boto3(tmp_path: Path) -> None:
    from trainguard.stacks import package
    policy_file = ROOT / "config" / "default-policy.yaml"
    try:
        pkg = package.build(policy_file, tmp_path / "lambda.zip")
    except RuntimeError as e:
        pytest.skip(f"the Lambda's wheels are not available offline: {e}")
    assert pkg.size < package.LAMBDA_LIMIT_BYTES
    print(f"Lambda package: {pkg.size:,} bytes ({pkg.size / 2**20:.1f} MiB), {pkg.files} files")
    task = tmp_path / "task"
    with zipfile.ZipFile(pkg.path) as zf:
        zf.extractall(task)
    runtime = tmp_path / "runtime"  # what the Lambda runtime ships: boto3 and its deps
    runtime.mkdir()
    for name in ("boto3", "botocore", "s3transfer", "dateutil", "urllib3"):
        folder = Path(importlib.import_module(name).__file__ or "").parent
        (runtime / name).symlink_to(folder)
    (runtime / "six.py").symlink_to(importlib.import_module("six").__file__ or "")
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "import importlib, trainguard.lambdas.aws as p\n"
            "m = importlib.import_module('trainguard.lambdas.aws.handler')\n"
            "assert callable(p.handler) and p.handler is m.handler\n"
            "assert m.PACKAGE_ROOT.joinpath('policy.yaml').is_file()\n"
            "bad = [n for n in sys.modules if n.split('.')[0] in ('pytest', 'moto')]\n"
            "assert not bad, bad\n"
            "print('ok', m.handler.__module__)\n")
    env = {"PATH": os.environ.get("PATH", ""), "AWS_REGION": REGION}
    done = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(task), str(runtime)],
                          capture_output=True, text=True, env=env, check=False, timeout=120,
                          cwd=tmp_path)  # not the repository: only the zip is importable
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok trainguard.lambdas.aws.handler"


def test_policy_action_for_logs_critical_is_stop_in_the_test_policy(tmp_path: Path) -> None:
    """The fixture's policy is what the handler tests rely on: logs critical -> stop."""
    from trainguard.config import load_policy_text
    pol = load_policy_text(POLICY.format(dry_run="false", cap=2, persist=1))
    assert pol.rule("logs").actions[Severity.CRITICAL] is Action.STOP
