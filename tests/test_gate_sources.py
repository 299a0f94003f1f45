"""``trainguard gate`` end to end on the cloud and cluster sources' test doubles, each stood
up as its contract case does (tests/contract/case_*.py):

* Kubeflow: the recorded Kubernetes API server (``tests/k8s_replay.py``; no real cluster
  runs here) serving PyTorchJobs, their metrics in a real Prometheus; through the CLI.
* SageMaker: DescribeTrainingJob, ListTags and StopTrainingJob answered through botocore's
  Stubber from recordings (checked against the service model; moto cannot hold a running
  job), the metrics in CloudWatch on moto in server mode.
* Azure ML: the recorded workspace replayed over TLS (azure-ai-ml's and MLflow's real
  transports), on the recordings' own clock, the MLflow history replaced by each case's
  curve and the job's status turned Completed for the healthy one.

On each: a healthy job passes (exit 0), a job forecast to miss its target by the deadline
is cancelled (exit 3), a diverging one fails fast (exit 1), and the stop reaches the
source's own stop call (StopTrainingJob, the suspend PATCH, Azure ML's cancel). On
SageMaker, where other principals can write a job's metrics,
forged metrics alone never stop the job (the attack test).
"""

from __future__ import annotations

import copy
import io
import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.k8s_replay import RECORDINGS as K8S_RECORDINGS
from tests.k8s_replay import K8sReplay, Reply, serve
from tests.sagemaker_replay import (
    REGION,
    Recordings,
    ReplayStubber,
    aws_client,
    canonical,
    moto_server,
    put_metrics,
    sagemaker_client,
    stop_moto,
)
from tests.servers import Samples, Server, openmetrics, prometheus
from trainguard.adapters.sagemaker import SageMakerAdapter
from trainguard.adapters.sagemaker.clients import Clients
from trainguard.checker.policy import Policy
from trainguard.cli import app
from trainguard.gate import CANCELLED, FAILED, PASS, GateSpec, run_gate
from trainguard.gate_cmd import adapter_source
from trainguard.lambdas.state import AuditAction

pytestmark = pytest.mark.slow
MINUTES = 40  # of metrics before now, one point a minute


def curves(kind: str, n: int = MINUTES) -> dict[str, list[float]]:
    """loss, val_loss and step per minute: healthy, a plateau above the target, or a
    blow-up (CloudWatch takes no NaN: a loss 1e15 is SageMaker's divergence)."""
    i = np.arange(1, n + 1)
    loss = 2.0 * np.exp(-i / 10) + 0.3
    val = 2.0 * np.exp(-i / 10) + 0.35
    if kind == "plateau":
        val = 1.2 + 0.01 * np.sin(i)
    if kind == "diverge":
        loss[-8:] = 1e15
    return {"loss": list(loss), "val_loss": list(val), "step": list(50.0 * i)}


# ------------------------------------------------------------------------------ Kubeflow

NS = "ml-team"
PTJ = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pytorchjob(name: str, started: float, succeeded: bool = False) -> dict[str, Any]:
    item: dict[str, Any] = copy.deepcopy(json.loads(
        (K8S_RECORDINGS / "pytorchjobs-ml-team.json").read_text())["items"][0])
    item["metadata"]["name"] = name
    item["status"]["startTime"] = iso(started)
    for c in item["status"]["conditions"]:
        c["lastTransitionTime"] = c["lastUpdateTime"] = iso(started)
        c["message"] = c["message"].replace("bert-ft", name)
    if succeeded:
        for c in item["status"]["conditions"]:
            c["status"] = "False"
        item["status"]["conditions"].append({
            "type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
            "message": f"PyTorchJob {NS}/{name} successfully completed.",
            "lastTransitionTime": iso(time.time()), "lastUpdateTime": iso(time.time())})
        item["status"]["completionTime"] = iso(time.time())
    return item


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[K8sReplay, Server, float]]:
    now = time.time()
    started = now - 60 * (MINUTES + 1)
    samples: list[Samples] = []
    times = np.round(now - 60.0 * (MINUTES - np.arange(MINUTES)), 3)
    for kind in ("healthy", "plateau", "diverge"):
        for name, values in curves(kind).items():
            if kind == "diverge" and name == "loss":
                values = [math.nan if v > 1e14 else v for v in values]
            samples.append((f"trainguard_{name}", {"run": f"gate-{kind}", "namespace": NS},
                            times, np.asarray(values)))
    with serve() as kube, prometheus(openmetrics(samples)) as prom:
        pods = json.loads((K8S_RECORDINGS / "pods-empty.json").read_text())
        for kind in ("healthy", "plateau", "diverge"):
            name = f"gate-{kind}"
            running = pytorchjob(name, started)
            replies = [running, pytorchjob(name, started, succeeded=True)] \
                if kind == "healthy" else [running]
            kube.add("GET", f"{PTJ}/{name}", *[Reply(200, r) for r in replies])
            kube.add_json("PATCH", f"{PTJ}/{name}", running)
            kube.add_json("GET", f"/api/v1/namespaces/{NS}/pods", pods, query={
                "labelSelector": f"training.kubeflow.org/job-name={name}", "limit": "500"})
        yield kube, prom, now


def kubeflow_gate(cluster: tuple[K8sReplay, Server, float], kind: str,
                  *args: str) -> tuple[int, str, dict[str, Any]]:
    kube, prom, _ = cluster
    out = Path(f"/tmp/trainguard-gate-kubeflow-{kind}-{id(cluster)}.json")
    result = CliRunner().invoke(app, [
        "gate", f"{NS}/pytorchjob/gate-{kind}", "--source", "kubeflow",
        "--opt", f"host={kube.host}", "--opt", f"namespaces={NS}", "--opt", "retries=1",
        "--opt", f"prometheus_url={prom.url}", "--tick", "0.2", "--json", str(out), *args])
    data = json.loads(out.read_text()) if out.exists() else {}
    out.unlink(missing_ok=True)
    return result.exit_code, result.output, data


def suspended(kube: K8sReplay, kind: str) -> bool:
    return any(r.path == f"{PTJ}/gate-{kind}" and r.body["spec"]["runPolicy"]["suspend"]
               for r in kube.patches())


def test_kubeflow_healthy_job_passes(cluster: Any) -> None:
    code, output, data = kubeflow_gate(cluster, "healthy", "--target", "val_loss<=0.5",
                                       "--forecast-without-prior", "--deadline", "90m")
    assert code == PASS, output
    assert data["state"] == "SUCCEEDED"
    assert not suspended(cluster[0], "healthy")


def test_kubeflow_job_forecast_to_miss_its_target_is_cancelled(cluster: Any) -> None:
    code, output, data = kubeflow_gate(cluster, "plateau", "--target", "val_loss<=0.5",
                                       "--forecast-without-prior", "--deadline", "90m")
    assert code == CANCELLED, output
    assert data["stopped_by"] == "target"
    assert suspended(cluster[0], "plateau")


def test_kubeflow_diverging_job_fails_fast(cluster: Any) -> None:
    code, output, data = kubeflow_gate(cluster, "diverge")
    assert code == FAILED, output
    assert data["stopped_by"] == "divergence" and data["ticks"] <= 5
    assert suspended(cluster[0], "diverge")


# ----------------------------------------------------------------------------- SageMaker

class Turns:
    """Answers given in turn, the last one repeated (a job that finishes)."""

    def __init__(self, *bodies: dict[str, Any]) -> None:
        self.bodies = list(bodies)

    def next(self) -> dict[str, Any]:
        return self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]


class Overrides(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        return value.next() if isinstance(value, Turns) else value


def describe(recordings: Recordings, name: str, started: float,
             status: str = "InProgress") -> dict[str, Any]:
    body = recordings.body("describe-llm-pretrain-a")
    arn = body["TrainingJobArn"].replace("llm-pretrain-a", name)
    body.update(TrainingJobName=name, TrainingJobArn=arn, TrainingJobStatus=status,
                SecondaryStatus="Completed" if status == "Completed" else "Training",
                CreationTime=started - 600, TrainingStartTime=started,
                LastModifiedTime=time.time())
    body["SecondaryStatusTransitions"] = body["SecondaryStatusTransitions"][:3]
    body["SecondaryStatusTransitions"][-1].pop("EndTime", None)
    body["SecondaryStatusTransitions"][-1]["StartTime"] = started
    if status == "Completed":
        body["TrainingEndTime"] = time.time()
    return body


@pytest.fixture(scope="module")
def sagemaker(request: pytest.FixtureRequest) -> Iterator[tuple[str, float]]:
    url = moto_server()
    request.addfinalizer(stop_moto)
    now = time.time()
    t = [now - 60.0 * (MINUTES - i) for i in range(MINUTES)]
    for kind in ("healthy", "plateau", "diverge", "forged"):
        series = curves("diverge" if kind == "forged" else kind)
        put_metrics(url, f"gate-{kind}-{int(now)}",
                    {name: list(zip(t, values, strict=True))
                     for name, values in series.items()},
                    hosts={"algo-1": {"GPUUtilization": [(x, 760.0) for x in t]}})
    yield url, now


def sagemaker_gate(sagemaker: tuple[str, float], kind: str, completes: int = 0,
                   **spec: Any) -> tuple[Any, ReplayStubber]:
    """The gate on a recorded job; ``completes``: it reads Completed after that many
    reads (0: it runs on)."""
    url, now = sagemaker
    name = f"gate-{kind}-{int(now)}"
    recordings = Recordings()
    started = now - 60.0 * (MINUTES + 1)
    running = describe(recordings, name, started)
    answers = Turns(*[running] * completes, describe(recordings, name, started, "Completed")) \
        if completes else running
    arn = running["TrainingJobArn"]
    overrides = Overrides({
        ("DescribeTrainingJob", canonical({"TrainingJobName": name})): answers,
        ("ListTags", canonical({"ResourceArn": arn})):
            recordings.body("list-tags-llm-pretrain-a"),
        ("StopTrainingJob", canonical({"TrainingJobName": name})): {}})
    replay = ReplayStubber(sagemaker_client(), recordings, overrides)
    clients = Clients(sagemaker=replay.client, cloudwatch=aws_client("cloudwatch", url),
                      logs=aws_client("logs", url), region=REGION)
    source = adapter_source("sagemaker", SageMakerAdapter(clients), name,
                            spec.get("deadline_s"))
    result = run_gate(source, Policy(), GateSpec(tick_s=0.2, **spec),
                      Console(file=io.StringIO(), width=120))
    return result, replay


def test_sagemaker_healthy_job_passes(sagemaker: Any) -> None:
    result, replay = sagemaker_gate(sagemaker, "healthy", completes=3,
                                    target=("val_loss", "min", 0.5), without_prior=True,
                                    deadline_s=5400.0, trust_metrics=True)
    assert result.exit_code == PASS, result.reason
    assert result.state == "SUCCEEDED" and replay.stopped() == []


def test_sagemaker_job_forecast_to_miss_its_target_is_cancelled(sagemaker: Any) -> None:
    result, replay = sagemaker_gate(sagemaker, "plateau", target=("val_loss", "min", 0.5),
                                    without_prior=True, deadline_s=5400.0,
                                    trust_metrics=True)
    assert result.exit_code == CANCELLED, result.reason
    assert result.stopped_by == "target"
    assert replay.stopped() == [f"gate-plateau-{int(sagemaker[1])}"]


def test_sagemaker_diverging_job_fails_fast(sagemaker: Any) -> None:
    result, replay = sagemaker_gate(sagemaker, "diverge", trust_metrics=True)
    assert result.exit_code == FAILED, result.reason
    assert result.stopped_by == "divergence" and result.ticks <= 5
    assert replay.stopped() == [f"gate-diverge-{int(sagemaker[1])}"]


def test_sagemaker_forged_metrics_alone_never_stop_the_job(sagemaker: Any) -> None:
    """Attack: anyone allowed cloudwatch:PutMetricData can write a blow-up for any job
    name. Without --trust-metrics the gate says why it does not stop, and the job, which
    then completes, passes."""
    result, replay = sagemaker_gate(sagemaker, "forged", completes=8)
    assert replay.stopped() == []
    assert result.exit_code == PASS, result.reason
    refused = [a for a in result.audit if a.action is AuditAction.SKIP_UNTRUSTED]
    assert refused and all(a.rule == "divergence" for a in refused)
    assert "rests on metrics" in refused[0].reason


# ------------------------------------------------------------------------------ Azure ML

AML_JOB = "bright_river_4k2m9x7q1z"


def history(kind: str, start_ms: float) -> dict[str, Any]:
    """An MLflow metric history (one body for every metric key the reader asks for)."""
    c = curves(kind, 30)
    values = c["val_loss"] if kind == "plateau" else c["loss"]
    if kind == "diverge":
        values = [math.nan if v > 1e14 else v for v in values]
    return {"metrics": [{"key": "loss", "value": v if math.isfinite(v) else "NaN",
                         "timestamp": int(start_ms + 60_000 * i), "step": int(100 * i)}
                        for i, v in enumerate(values)]}


def azureml_gate(request: pytest.FixtureRequest, kind: str, completes_after: int = 0,
                 **spec: Any) -> tuple[Any, Any]:
    """The gate on the recorded workspace, on the job's own clock (the recordings' hour),
    the MLflow history replaced by the kind's curve; ``completes_after``: the job reads
    Completed from that tick on."""
    from tests.contract.case_azureml import NOW, RECORDINGS, adapter_for, start

    replay = start(request)
    if kind != "healthy":
        replay.override("GET", "metrics/get-history", 200,
                        history(kind, (NOW - 1800) * 1000))
    adapter = adapter_for(replay)
    ticks = [NOW]

    def clock() -> float:
        ticks.append(ticks[-1] + 0.2)
        if completes_after and len(ticks) > completes_after:
            done = json.loads((RECORDINGS / "job_bright_river.json").read_text())
            done["properties"]["status"] = "Completed"
            replay.override("GET", f"jobs/{AML_JOB}", 200, done)
        return ticks[-1]

    source = adapter_source("azureml", adapter, AML_JOB, spec.get("deadline_s"))
    result = run_gate(source, Policy(), GateSpec(tick_s=0.2, **spec),
                      Console(file=io.StringIO(), width=120), clock=clock,
                      sleep=lambda s: None)
    return result, [s.path for s in replay.calls("POST", "/cancel")]


def test_azureml_healthy_job_passes(request: pytest.FixtureRequest) -> None:
    result, cancels = azureml_gate(request, "healthy", completes_after=4,
                                   trust_metrics=True)
    assert result.exit_code == PASS, result.reason
    assert result.state == "SUCCEEDED" and cancels == []


def test_azureml_job_forecast_to_miss_its_target_is_cancelled(
        request: pytest.FixtureRequest) -> None:
    result, cancels = azureml_gate(request, "plateau", target=("loss", "min", 0.5),
                                   without_prior=True, deadline_s=2 * 3600.0,
                                   trust_metrics=True)
    assert result.exit_code == CANCELLED, result.reason
    assert result.stopped_by == "target" and len(cancels) == 1


def test_azureml_diverging_job_fails_fast(request: pytest.FixtureRequest) -> None:
    result, cancels = azureml_gate(request, "diverge", trust_metrics=True)
    assert result.exit_code == FAILED, result.reason
    assert result.stopped_by == "divergence" and result.ticks <= 5
    assert len(cancels) == 1 and AML_JOB in cancels[0]
