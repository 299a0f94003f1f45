"""The Kubeflow adapter against a recorded Kubernetes API server: two namespaces,
running PyTorchJobs and a TrainJob whose Trainer reports metrics, a job in an
unknown condition, a malformed one, and the suspend PATCH the server receives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from kubernetes import client

from tests.contract import ContractCase, case
from tests.k8s_replay import RECORDINGS, K8sReplay, serve
from trainguard.adapters.kubeflow import KubeflowAdapter
from trainguard.adapters.kubeflow.client import Kube, api_client, retry_policy

NOW = 1_750_010_400.0  # 2025-06-15T18:00:00Z, just after the recordings


@contextmanager
def recorded_cluster() -> Iterator[K8sReplay]:
    """The recorded cluster, answering a suspend of the TrainJob as the API server does."""
    with serve() as replay:
        replay.load()
        path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml-team/trainjobs/llm-sft"
        job = json.loads((RECORDINGS / "trainjobs-ml-team.json").read_text())["items"][0]
        replay.add_json("PATCH", path, dict(job, spec=dict(job["spec"], suspend=True)))
        yield replay


def adapter_for(replay: K8sReplay, namespaces: list[str] | None = None,
                **kw: object) -> KubeflowAdapter:
    cfg = client.Configuration(host=replay.host)
    kube = Kube(api_client(cfg, retry_policy(attempts=3, backoff=0.0)))
    return KubeflowAdapter(kube, cluster="lab", namespaces=namespaces or ["ml-team", "research"],
                           **kw)  # type: ignore[arg-type]


def stopped(replay: K8sReplay) -> list[str]:
    """Ids of the jobs the server was asked to suspend or delete."""
    out = []
    for r in replay.patches():
        parts = r.path.strip("/").split("/")  # apis/GROUP/VERSION/namespaces/NS/PLURAL/NAME
        out.append(f"{parts[4]}/{parts[5].removesuffix('s')}/{parts[6]}")
    return out


@case("kubeflow")
def make(request: pytest.FixtureRequest) -> ContractCase:
    stack = ExitStack()
    request.addfinalizer(stack.close)
    replay = stack.enter_context(recorded_cluster())
    return ContractCase(
        adapter=adapter_for(replay), now=NOW,
        running={"ml-team/pytorchjob/bert-ft", "ml-team/trainjob/llm-sft",
                 "research/pytorchjob/vit-sweep"},
        with_metrics="ml-team/trainjob/llm-sft", metric="loss",
        unknown_state="ml-team/pytorchjob/llama-hib", unknown_raw="Hibernating",
        broken="ml-team/pytorchjob/broken-job", stops=lambda: stopped(replay))
