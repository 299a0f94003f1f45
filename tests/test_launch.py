"""Launch helpers on the real SDK objects and real-shaped manifests, without a cloud
account. SageMaker's output is validated by botocore's own model of CreateTrainingJob."""

from __future__ import annotations

import copy
import io
import re
from typing import TYPE_CHECKING, Any, cast

import pytest

from trainguard.adapters.local.emit_format import EMIT_DEFINITIONS
from trainguard.emit import Emitter
from trainguard.launch import azureml, kubeflow
from trainguard.launch import sagemaker as sm

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient


def emitted_line() -> str:
    buf = io.StringIO()
    e = Emitter(interval=0, stream=buf, total_steps=900)
    e.emit(step=120, loss=2.3451, val_loss=2.5, lr=3e-4, grad_norm=0.81, epoch=1.5,
           throughput=512.0)
    return buf.getvalue()


# --- SageMaker ---------------------------------------------------------------------------

def test_metric_definitions_read_emit_lines_as_cloudwatch_would() -> None:
    line = emitted_line()
    got = {}
    for d in sm.metric_definitions():
        m = re.search(d["Regex"], line)  # SageMaker applies each regex to each log line
        if m:
            got[d["Name"]] = float(m.group(1))
    assert got == {"step": 120, "planned_steps": 900, "loss": 2.3451, "val_loss": 2.5,
                   "lr": 3e-4, "grad_norm": 0.81, "epoch": 1.5, "throughput": 512.0}
    assert len(sm.metric_definitions()) == len([d for d in EMIT_DEFINITIONS if not d.time])


def model_trainer() -> Any:
    pytest.importorskip("sagemaker.train", reason="pip install 'trainguard[sagemaker]'")
    from sagemaker.train import ModelTrainer
    from sagemaker.train.configs import MetricDefinition, Tag
    from sagemaker.train.model_trainer import Mode

    # LOCAL_CONTAINER: the SAGEMAKER_TRAINING_JOB mode checks the role with IAM when the
    # trainer is built, which needs an AWS account; nothing else differs for watch()
    return ModelTrainer(
        training_mode=Mode.LOCAL_CONTAINER,
        training_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest",
        role="arn:aws:iam::123456789012:role/SageMakerTraining", base_job_name="tg",
        tags=[Tag(key="team", value="nlp")],
    ).with_metric_definitions([MetricDefinition(name="acc", regex=r"acc=([0-9.]+)")])


def create_training_job_params(trainer: Any) -> dict[str, Any]:
    """The request the SDK sends, built by sagemaker-core's own serialisation."""
    from sagemaker.core.shapes import AlgorithmSpecification
    from sagemaker.core.utils.utils import serialize

    spec = AlgorithmSpecification(training_image=trainer.training_image,
                                  training_input_mode="File",
                                  metric_definitions=trainer._metric_definitions)
    return {
        "TrainingJobName": "tg-2025-01-01",
        "AlgorithmSpecification": serialize(spec),
        "RoleArn": trainer.role,
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
        "ResourceConfig": serialize(trainer.compute._to_resource_config()),
        "StoppingCondition": serialize(trainer.stopping_condition),
        "Tags": serialize(trainer.tags),
    }


def stubbed_create(params: dict[str, Any]) -> None:
    """Send ``params`` through botocore's Stubber, which validates them against the
    SageMaker service model before comparing them with the expected call."""
    import botocore.session
    from botocore.stub import Stubber

    client = cast("SageMakerClient", botocore.session.get_session().create_client(
        "sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"))
    with Stubber(client) as stub:
        stub.add_response("create_training_job",
                          {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:"
                                             "training-job/tg-2025-01-01"}, params)
        client.create_training_job(**params)
        stub.assert_no_pending_responses()


def test_watch_a_model_trainer_passes_botocore_validation() -> None:
    trainer = sm.watch(model_trainer(), policy="research-team")
    params = create_training_job_params(trainer)
    defs = params["AlgorithmSpecification"]["MetricDefinitions"]
    assert defs[0] == {"Name": "acc", "Regex": r"acc=([0-9.]+)"}  # the user's kept, first
    assert defs[1:] == sm.metric_definitions()
    assert params["Tags"] == [{"Key": "team", "Value": "nlp"},
                              {"Key": "trainguard:watch", "Value": "true"},
                              {"Key": "trainguard:policy", "Value": "research-team"}]
    stubbed_create(params)
    # watching twice changes nothing
    assert create_training_job_params(sm.watch(trainer, policy="research-team")) == params


def test_botocore_validation_would_catch_a_bad_definition() -> None:
    from botocore.exceptions import ParamValidationError

    params = create_training_job_params(sm.watch(model_trainer()))
    params["AlgorithmSpecification"]["MetricDefinitions"].append({"Name": "x"})  # no Regex
    with pytest.raises(ParamValidationError, match="Regex"):
        stubbed_create(params)


def test_watch_refuses_a_conflicting_definition_and_a_bad_policy_name() -> None:
    from sagemaker.train.configs import MetricDefinition

    trainer = model_trainer().with_metric_definitions(
        [MetricDefinition(name="loss", regex=r"Loss: (\S+)")])
    with pytest.raises(ValueError, match="metric definition 'loss' is already set"):
        sm.watch(trainer)
    with pytest.raises(ValueError, match="policy name 'my policy!'"):
        sm.watch(model_trainer(), policy="my policy!")
    with pytest.raises(TypeError, match="expected a sagemaker ModelTrainer or Estimator"):
        sm.watch(object())


# --- Azure ML ----------------------------------------------------------------------------

def test_watch_an_azureml_command_job() -> None:
    ml = pytest.importorskip("azure.ai.ml", reason="pip install 'trainguard[azure]'")
    job = ml.command(command="python train.py", environment="azureml:pytorch-env@latest",
                     compute="gpu-cluster", tags={"team": "nlp"},
                     environment_variables={"MLFLOW_ENABLE_ASYNC_LOGGING": "false"})
    azureml.watch(job, policy="research-team", emit_interval=30)
    # what create_or_update sends: the REST object of the job
    props = job._to_job()._to_rest_object().as_dict()["properties"]
    assert props["tags"] == {"team": "nlp", "trainguard:watch": "true",
                             "trainguard:policy": "research-team"}
    assert props["environmentVariables"] == {
        "MLFLOW_ENABLE_ASYNC_LOGGING": "false",  # the user's own setting wins
        "TRAINGUARD_SINKS": "mlflow", "TRAINGUARD_EMIT_INTERVAL": "30"}
    with pytest.raises(TypeError, match=r"expected an azure\.ai\.ml command job"):
        azureml.watch({"command": "python train.py"})


# --- Kubeflow ----------------------------------------------------------------------------

PYTORCHJOB: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
    "metadata": {"name": "bert-ft", "namespace": "ml", "labels": {"team": "nlp"}},
    "spec": {"pytorchReplicaSpecs": {
        role: {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {
            "containers": [{"name": "pytorch", "image": "registry.local/train:1",
                            "command": ["python", "train.py"],
                            "env": [{"name": "TRAINGUARD_SINKS", "value": "prometheus"}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
        for role, n in (("Master", 1), ("Worker", 3))}},
}
TRAINJOB: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
    "metadata": {"name": "llm-sft", "namespace": "ml"},
    "spec": {"runtimeRef": {"name": "torch-distributed"},
             "trainer": {"image": "registry.local/train:1", "command": ["torchrun", "sft.py"],
                         "numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}}},
}
# Kubernetes label syntax: an optional DNS-subdomain prefix and a name; values <= 63
LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*"
                       r"[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def valid_labels(labels: dict[str, str]) -> bool:
    return all(LABEL_KEY.fullmatch(k) and LABEL_VALUE.fullmatch(v) for k, v in labels.items())


def test_watch_a_pytorchjob_adds_labels_env_port_and_a_podmonitor() -> None:
    client = pytest.importorskip("kubernetes.client",
                                 reason="pip install 'trainguard[kubernetes]'")
    original = copy.deepcopy(PYTORCHJOB)
    job, monitor = kubeflow.watch(PYTORCHJOB, policy="research-team")
    assert original == PYTORCHJOB  # the input is not changed
    assert job["metadata"]["labels"] == {"team": "nlp", "trainguard/watch": "true",
                                         "trainguard/policy": "research-team"}
    api = client.ApiClient()
    for role in ("Master", "Worker"):
        template = job["spec"]["pytorchReplicaSpecs"][role]["template"]
        # the pod template must still be a valid PodTemplateSpec
        pod = api._ApiClient__deserialize(template, "V1PodTemplateSpec")
        assert valid_labels(pod.metadata.labels) and pod.metadata.labels["trainguard/watch"]
        assert pod.metadata.annotations == {"prometheus.io/scrape": "true",
                                            "prometheus.io/port": "9400"}
        c = pod.spec.containers[0]
        assert {e.name: e.value for e in c.env} == {
            "TRAINGUARD_SINKS": "prometheus", "TRAINGUARD_JOB_NAME": "bert-ft",
            "TRAINGUARD_METRICS_PORT": "9400"}
        assert [(p.name, p.container_port) for p in c.ports] == [("trainguard", 9400)]
    assert monitor is not None and monitor["kind"] == "PodMonitor"
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"] == {"name": "bert-ft-trainguard", "namespace": "ml",
                                   "labels": {"trainguard/watch": "true"}}
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "training.kubeflow.org/job-name": "bert-ft", "trainguard/watch": "true"}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "trainguard"
    # watching the watched job again adds nothing
    assert kubeflow.watch(job, policy="research-team")[0] == job


def test_watch_a_trainjob_with_a_pushgateway() -> None:
    job, monitor = kubeflow.watch(TRAINJOB, pushgateway="pushgateway.monitoring:9091")
    assert monitor is None
    assert job["spec"]["labels"] == {"trainguard/watch": "true", "trainguard/policy": "default"}
    assert valid_labels(job["metadata"]["labels"])
    assert job["spec"]["trainer"]["env"] == [
        {"name": "TRAINGUARD_SINKS", "value": "prometheus"},
        {"name": "TRAINGUARD_JOB_NAME", "value": "llm-sft"},
        {"name": "TRAINGUARD_PUSHGATEWAY", "value": "pushgateway.monitoring:9091"}]
    _, monitor2 = kubeflow.watch(TRAINJOB)
    assert monitor2 is not None
    assert monitor2["spec"]["selector"]["matchLabels"] == {
        "jobset.sigs.k8s.io/jobset-name": "llm-sft"}


def test_watch_rejects_other_kinds_and_broken_manifests() -> None:
    with pytest.raises(ValueError, match=r"got Deployment \(apps/v1\)"):
        kubeflow.watch({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}})
    broken = copy.deepcopy(PYTORCHJOB)
    del broken["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    with pytest.raises(ValueError, match=r"pytorchReplicaSpecs\.Worker\.template\.spec"):
        kubeflow.watch(broken)
