"""``trainguard preflight``: the AWS checks against moto in server mode (its own server,
reset, in a region no other test uses) and recorded SageMaker answers; the OpenShift ones
against a recorded API server (tests/k8s_replay.py) answering with the vendored
references (NVIDIA's DaemonSet, a LokiStack); Azure from the sample file; the command
through its CLI."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from typing import Any, Literal

import boto3
import pytest
import yaml
from typer.testing import CliRunner

from tests.contract.case_azureml import Replay, StaticToken, start
from tests.k8s_replay import K8sReplay, serve
from tests.test_real_services import REFERENCE
from trainguard.cli import app
from trainguard.preflight import (
    CRDS,
    JOB_CRDS,
    LOKI_CRDS,
    SAGEMAKER_LOG_GROUP,
    AwsClients,
    Status,
    arm_client,
    aws_clients,
    k8s_client,
    run,
)
from trainguard.stacks.environment import ROOT, AwsEnvironment, Environment, load_environment
from trainguard.stacks.openshift import DCGM

#: one region per test: moto's state is the process's (the session's shared moto server
#: holds other tests' data in us-east-1), so each test starts in an empty region
REGIONS = iter(["eu-north-1", "eu-south-1", "ap-east-1", "me-south-1", "af-south-1",
                "ap-southeast-3", "eu-central-2", "ap-south-2", "eu-south-2", "ap-southeast-4"])
REGION = "eu-west-3"
ROLE = "arn:aws:iam::123456789012:role/x"


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    monkeypatch.setattr(sys.modules[__name__], "REGION", next(REGIONS))
    yield url
    server.stop()


def env(**training_log_group: Any) -> Environment:
    base = load_environment(ROOT / "environments" / "aws-dev.yaml")
    spec = base.spec.model_copy(update={"region": REGION})
    if training_log_group:
        assert isinstance(spec, AwsEnvironment)
        spec = spec.model_copy(update={"training_log_group": spec.training_log_group.model_copy(
            update=training_log_group)})
    return dataclasses.replace(base, spec=spec)


def client(service: Literal["logs", "kinesis"], url: str) -> Any:
    return boto3.client(service, region_name=REGION, endpoint_url=url)


def statuses(findings: list[Any]) -> dict[str, Status]:
    return {f.check: f.status for f in findings}


def test_a_new_account_has_no_blocker(moto: str) -> None:
    e = env()
    findings = run(e, aws_clients(e, moto))
    assert Status.BLOCKER not in statuses(findings).values()
    assert any("the stack creates it" in f.message for f in findings)


def test_an_existing_log_group_must_be_adopted(moto: str) -> None:
    client("logs", moto).create_log_group(logGroupName=SAGEMAKER_LOG_GROUP)
    [group] = [f for f in run(env(), aws_clients(env(), moto)) if f.check == "log group"]
    assert group.status is Status.BLOCKER and "exists: true" in group.fix
    adopted = env(exists=True)
    found = run(adopted, aws_clients(adopted, moto))
    assert statuses(found)["log group"] is Status.OK
    # kept forever today: the stack's retention would delete older logs
    assert statuses(found)["log retention"] is Status.WARN


def test_an_import_of_a_missing_log_group_is_a_blocker(moto: str) -> None:
    e = env(exists=True)
    [group] = [f for f in run(e, aws_clients(e, moto)) if f.check == "log group"]
    assert group.status is Status.BLOCKER and "does not exist" in group.message


def test_two_subscription_filters_held_by_others_block(moto: str) -> None:
    logs, kinesis = client("logs", moto), client("kinesis", moto)
    logs.create_log_group(logGroupName=SAGEMAKER_LOG_GROUP)
    kinesis.create_stream(StreamName="fanout", ShardCount=1)
    arn = kinesis.describe_stream(StreamName="fanout")["StreamDescription"]["StreamARN"]
    e = env(exists=True)
    for name in ("datadog", "siem"):
        logs.put_subscription_filter(logGroupName=SAGEMAKER_LOG_GROUP, filterName=name,
                                     filterPattern="", destinationArn=arn, roleArn=ROLE)
        found = {f.check: f for f in run(e, aws_clients(e, moto))}
    blocker = found["subscription filters"]
    assert blocker.status is Status.BLOCKER
    assert "datadog, siem" in blocker.message and "at most 2" in blocker.message


def test_jobs_without_metric_definitions_are_named() -> None:
    """SageMaker from recorded DescribeTrainingJob answers (botocore Stubber): moto gives
    every job a built-in algorithm's metric definition, so it cannot hold a bare one."""
    from botocore.stub import Stubber

    from tests.sagemaker_replay import Recordings, parse

    rec = Recordings()
    sm = boto3.client("sagemaker", region_name=REGION, aws_access_key_id="x",
                      aws_secret_access_key="x")
    stub = Stubber(sm)
    names = ["llm-pretrain-a", "broken-c"]
    stub.add_response("list_training_jobs", {"TrainingJobSummaries": [
        {"TrainingJobName": n, "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:1:training-job/{n}",
         "CreationTime": 1750000000, "TrainingJobStatus": "InProgress"} for n in names]})
    for n in names:
        stub.add_response("describe_training_job",
                          parse("DescribeTrainingJob", rec.body(f"describe-{n}")),
                          {"TrainingJobName": n})
    with stub:
        [finding] = [f for f in run(env(), AwsClients(logs=None, sagemaker=sm))
                     if f.check == "metric definitions"]
    assert finding.status is Status.WARN
    assert "1 of the 2 latest jobs" in finding.message and "broken-c" in finding.message


def test_an_unreachable_service_is_a_blocker_not_a_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault: nothing listens there; every check says it could not check."""
    from botocore.config import Config

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    config = Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=1)
    clients = AwsClients(*(boto3.client(service, region_name=REGION, config=config,
                                        endpoint_url="http://127.0.0.1:9")
                           for service in ("logs", "sagemaker")))
    findings = run(env(), clients)
    assert set(statuses(findings).values()) == {Status.BLOCKER}
    assert all("could not check" in f.message for f in findings)


# --- the command --------------------------------------------------------------------------

def test_the_command_exits_1_on_a_blocker_and_0_without(moto: str,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Any) -> None:
    text = (ROOT / "environments" / "aws-dev.yaml").read_text().replace(
        "region: us-east-1", f"region: {REGION}")
    path = tmp_path / "aws-dev.yaml"
    path.write_text(text)
    monkeypatch.chdir(ROOT)  # the policy path is relative to the repository
    runner = CliRunner()
    ok = runner.invoke(app, ["preflight", str(path), "--endpoint-url", moto])
    assert ok.exit_code == 0, ok.output
    assert "log group" in ok.output
    client("logs", moto).create_log_group(logGroupName=SAGEMAKER_LOG_GROUP)
    bad = runner.invoke(app, ["preflight", str(path), "--endpoint-url", moto])
    assert bad.exit_code == 1
    assert "exists: true" in bad.output


# --- Azure, against the recorded Resource Manager (tests/contract/case_azureml.py, TLS) -------

AZURE = load_environment(ROOT / "environments" / "azure-research.yaml")
WORKSPACE = "Microsoft.MachineLearningServices/workspaces/research-ws"
TABLE = "/workspaces/aks-research-insights/tables/ContainerLogV2"


def table_body(*columns: str) -> dict[str, Any]:
    """A Log Analytics table as ARM answers GET .../tables/NAME (standard columns)."""
    return {"name": "ContainerLogV2", "properties": {"schema": {
        "name": "ContainerLogV2", "standardColumns": [
            {"name": c, "type": "dynamic" if c == "LogMessage" else "string"}
            for c in columns]}}}


def azure_findings(replay: Replay) -> dict[str, Any]:
    arm = arm_client(replay.base, replay.ca_file, StaticToken())
    return {f.check: f for f in run(AZURE, arm)}


def test_azure_workspace_and_table_present(request: pytest.FixtureRequest) -> None:
    replay = start(request)
    replay.override("GET", WORKSPACE, 200, {"name": "research-ws", "location": "westeurope"})
    replay.override("GET", TABLE, 200, table_body("TimeGenerated", "LogMessage", "PodName"))
    found = azure_findings(replay)
    assert {k: f.status for k, f in found.items()} == {
        "ML workspace": Status.OK, "log signatures": Status.OK}
    assert all(s.authorization == "Bearer replay-token" for s in replay.seen)


@pytest.mark.parametrize(("routes", "check", "words"), [
    ({TABLE: table_body("TimeGenerated", "LogMessage")}, "ML workspace", "no workspace"),
    ({WORKSPACE: {"name": "research-ws"}}, "log signatures", "no table ContainerLogV2"),
    ({WORKSPACE: {"name": "research-ws"}, TABLE: table_body("TimeGenerated")},
     "log signatures", "no column LogMessage"),
])
def test_azure_each_missing_prerequisite_is_named(request: pytest.FixtureRequest,
                                                  routes: dict[str, Any], check: str,
                                                  words: str) -> None:
    replay = start(request)
    for part, body in routes.items():
        replay.override("GET", part, 200, body)
    finding = azure_findings(replay)[check]
    assert finding.status is Status.BLOCKER and words in finding.message


def test_azure_resource_manager_failing_is_a_blocker(request: pytest.FixtureRequest) -> None:
    replay = start(request)
    replay.override("GET", WORKSPACE, 500, {"error": {"code": "InternalServerError"}})
    replay.override("GET", TABLE, 200, table_body("LogMessage"))
    finding = azure_findings(replay)["ml workspace"]
    assert finding.status is Status.BLOCKER and "could not check" in finding.message


def test_azure_preflight_command_end_to_end(request: pytest.FixtureRequest,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``preflight`` command on the azure-research sample, over the recorded Resource
    Manager (TLS replay). The one stand-in is the Azure AD token: its endpoint cannot be
    reached here, so ``DefaultAzureCredential`` yields the replay's static token."""
    import azure.identity

    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", lambda: StaticToken())
    replay = start(request)
    replay.override("GET", WORKSPACE, 200, {"name": "research-ws", "location": "westeurope"})
    args = ["preflight", "azure-research", "--endpoint-url", replay.base,
            "--ca-file", replay.ca_file]
    bad = CliRunner().invoke(app, args)  # no ContainerLogV2 table in the workspace yet
    assert bad.exit_code == 1, bad.output
    assert "BLOCKER  log signatures" in bad.output and "no table ContainerLogV2" in bad.output
    replay.override("GET", TABLE, 200, table_body("TimeGenerated", "LogMessage", "PodName"))
    ok = CliRunner().invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert "OK       ML workspace" in ok.output
    assert all(s.authorization == "Bearer replay-token" for s in replay.seen)


# --- OpenShift, against a recorded API server built from the vendored references ------------

OPENSHIFT = load_environment(ROOT / "environments" / "openshift-onprem.yaml")
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd(name: str, version: str) -> dict[str, Any]:
    plural, _, group = name.partition(".")
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": plural, "kind": plural.title()},
                     "versions": [{"name": version, "served": True, "storage": True}]}}


def cluster(replay: K8sReplay, skip: str = "", port: str | None = None,
            selector: dict[str, str] | None = None) -> None:
    """A cluster as the stack expects it (the GPU operator's DaemonSet and the LokiStack
    from tests/reference), less what the test takes away."""
    for name, version in {**CRDS, **LOKI_CRDS, JOB_CRDS[0]: "v1"}.items():
        if name != skip:
            replay.add_json("GET", f"{CRD_PATH}/{name}", crd(name, version))
    ds = yaml.safe_load((REFERENCE / "gpu-operator" / "0800_daemonset.yaml").read_text())
    ds["metadata"]["namespace"] = DCGM["namespace"]
    if port:
        ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = port
    replay.add_json("GET", f"/apis/apps/v1/namespaces/{DCGM['namespace']}/daemonsets/"
                           f"{DCGM['app']}", ds)
    loki = yaml.safe_load((REFERENCE / "lokistack" / "lokistack-rules.yaml").read_text())
    if selector is not None:
        loki["spec"]["rules"]["selector"]["matchLabels"] = selector
    replay.add_json("GET", "/apis/loki.grafana.com/v1/namespaces/openshift-logging/"
                           "lokistacks/logging-loki", loki)


def openshift_findings(replay: K8sReplay) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in run(OPENSHIFT, k8s_client(OPENSHIFT, replay.host)):
        out.setdefault(f.check, []).append(f)
    return out


def test_a_ready_cluster_has_no_blocker() -> None:
    with serve() as replay:
        cluster(replay)
        found = openshift_findings(replay)
    assert all(f.status is Status.OK for fs in found.values() for f in fs), found
    assert set(found) == {"CRDs", "GPU metrics", "LokiStack rules"}


@pytest.mark.parametrize(("change", "check", "words"), [
    ({"skip": "alertingrules.loki.grafana.com"}, "CRDs",
     "alertingrules.loki.grafana.com is not installed"),
    ({"port": "gpu-metrics"}, "GPU metrics", "it would scrape nothing"),
    ({"selector": {"team": "ml"}}, "LokiStack rules", "wants {'team': 'ml'}"),
])
def test_each_missing_prerequisite_is_named(change: dict[str, Any], check: str,
                                            words: str) -> None:
    with serve() as replay:
        cluster(replay, **change)
        found = openshift_findings(replay)
    [blocker] = [f for f in found[check] if f.status is Status.BLOCKER]
    assert words in blocker.message
    assert blocker.fix


def test_the_openshift_sample_through_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    with serve() as replay:
        cluster(replay)
        ok = CliRunner().invoke(app, ["preflight", "openshift-onprem", "--kube-api",
                                      replay.host])
        replay.routes.clear()  # nothing installed at all
        bad = CliRunner().invoke(app, ["preflight", "openshift-onprem", "--kube-api",
                                       replay.host])
    assert ok.exit_code == 0, ok.output
    assert bad.exit_code == 1 and "is not installed" in bad.output
    assert "no DaemonSet nvidia-dcgm-exporter" in bad.output


def test_a_bad_environment_file_names_file_and_field(tmp_path: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "aws-dev.yaml"
    path.write_text((ROOT / "environments" / "aws-dev.yaml").read_text().replace(
        'account: "111122223333"', "account: nope"))
    result = CliRunner().invoke(app, ["preflight", str(path)])
    assert result.exit_code == 2
    assert "account" in result.output
