"""Attack: a pod in another namespace writes metrics for a job it does not own (issue 16,
finding 1), on a real Prometheus (Debian package) on loopback.

Namespace ``team-a`` runs the PyTorchJob ``bert`` (the Kubernetes API is the recorded
server of ``tests/k8s_replay.py``: no real cluster can run here). Namespace ``evil``
exports ``trainguard_loss{run="bert"}`` = NaN. Before the fix the watchdog selected
``run="bert"`` across every namespace: the forged NaN gave ``team-a/bert`` a critical
divergence and a suspend, and when both namespaces exported, the ambiguity left the job
unwatched. Now every query selects the job's namespace too.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.k8s_configmap import ConfigMapReplay
from tests.k8s_replay import RECORDINGS, serve
from tests.servers import Samples, Server, openmetrics, prometheus
from trainguard.adapters.kubeflow.prometheus_hook import PrometheusHook
from trainguard.adapters.prometheus import Mapping, MappingError, Metrics, PromClient, load_mapping
from trainguard.lambdas.k8s.cronjob import main

NS, EVIL, JOB = "team-a", "evil", "bert"
PTJ = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
N = 120  # samples, one a minute, the last a minute before now


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pytorchjob(started: float) -> dict[str, Any]:
    item: dict[str, Any] = copy.deepcopy(json.loads(
        (RECORDINGS / "pytorchjobs-ml-team.json").read_text())["items"][0])
    item["metadata"]["name"], item["metadata"]["namespace"] = JOB, NS
    item["status"]["startTime"] = iso(started)
    for c in item["status"]["conditions"]:
        c["lastTransitionTime"] = c["lastUpdateTime"] = iso(started)
    return item


def samples(now: float, own: str, forged: bool) -> list[Samples]:
    t = np.round(now - 60 - 60.0 * np.arange(N)[::-1], 3)
    k = np.arange(N, dtype=float)
    out: list[Samples] = []
    if own:  # team-a's job: learning normally, or diverging for real
        loss = 3.0 * np.exp(-k / 60) + 1 if own == "healthy" else np.where(k < N - 5, 2.0, np.nan)
        out += [("trainguard_loss", {"run": JOB, "namespace": NS}, t, loss),
                ("trainguard_step", {"run": JOB, "namespace": NS}, t, k * 10)]
    if forged:  # the attacker's pod: same run label, its own namespace (Prometheus sets it)
        out += [("trainguard_loss", {"run": JOB, "namespace": EVIL}, t, np.full(N, np.nan)),
                ("trainguard_step", {"run": JOB, "namespace": EVIL}, t, k * 10)]
    return out


@dataclass
class Cluster:
    now: float
    prom: Server
    kube: ConfigMapReplay


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    own, forged = request.param
    now = round(time.time(), 3)
    with ExitStack() as stack:
        prom = stack.enter_context(prometheus(openmetrics(samples(now, own, forged))))
        kube = ConfigMapReplay()
        stack.enter_context(serve(kube))
        item = pytorchjob(now - 60 * (N + 1))
        kube.add_json("GET", PTJ, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList",
                                   "metadata": {"resourceVersion": "5"}, "items": [item]},
                      query={"limit": "500"})
        kube.add_json("GET", f"{PTJ}/{JOB}", item)
        kube.add_json("GET", PODS, json.loads((RECORDINGS / "pods-empty.json").read_text()),
                      query={"labelSelector": "training.kubeflow.org/job-name", "limit": "500"})
        kube.add_json("PATCH", f"{PTJ}/{JOB}", item)
        yield Cluster(now, prom, kube)


def tick(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """One CronJob tick with a policy that stops on a critical divergence at once."""
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("series: {loss: trainguard_loss, step: trainguard_step}\n"
                       "state: ''\nhistory: 10800\nmin_step: 60\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: attack\nsafety: {dry_run: false, persist_ticks: 1}\n"
                      "rules:\n  divergence: {actions: {critical: stop}}\n")
    env = {"KUBE_HOST": cluster.kube.host, "NAMESPACES": NS, "KINDS": "pytorchjob",
           "CLUSTER": "lab", "KUBE_RETRIES": "1", "KUBE_BACKOFF": "0",
           "STATE_CONFIGMAP": cluster.kube.ref, "POLICY": str(policy), "STOP_ENABLED": "true",
           "PROMETHEUS_URL": cluster.prom.url, "PROMETHEUS_MAPPING": str(mapping)}
    monkeypatch.delenv("TRAINGUARD_CONFIG", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(f"TRAINGUARD_{k}", v)
    main(["--now", str(cluster.now)])
    return dict(json.loads(capsys.readouterr().out.splitlines()[-1])["tick"])


@pytest.mark.parametrize("cluster", [("", True)], indirect=True)
def test_a_forged_nan_from_another_namespace_neither_finds_nor_stops(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    summary = tick(cluster, tmp_path, monkeypatch, capsys)
    assert cluster.kube.patches() == []  # before the fix: suspend of team-a/bert
    assert summary["metrics"] == {f"{NS}/pytorchjob/{JOB}": []}  # nothing of evil's read
    assert "divergence" not in json.dumps(summary)


@pytest.mark.parametrize("cluster", [("healthy", True)], indirect=True)
def test_a_copy_in_another_namespace_does_not_blind_the_watchdog(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    summary = tick(cluster, tmp_path, monkeypatch, capsys)
    assert cluster.kube.patches() == []
    # Before the fix: "gives 2 series" and the job read without its metrics.
    assert summary["metrics"] == {f"{NS}/pytorchjob/{JOB}": [f"loss:{N}", f"step:{N}"]}
    assert "gives 2 series" not in json.dumps(summary)


@pytest.mark.parametrize("cluster", [("diverging", True)], indirect=True)
def test_the_jobs_own_nan_still_stops_it(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The binding must not blind the rule: team-a's own NaN stops its job, once."""
    tick(cluster, tmp_path, monkeypatch, capsys)
    (patch,) = cluster.kube.patches()
    assert patch.path == f"{PTJ}/{JOB}" and patch.body["spec"]["runPolicy"]["suspend"] is True
    # The tag re-read right before the stop asked the API server for the job itself.
    assert cluster.kube.count("GET", f"{PTJ}/{JOB}") == 1


@pytest.mark.parametrize("cluster", [("healthy", True)], indirect=True)
def test_the_namespace_binding_reads_each_namespace_apart(cluster: Cluster) -> None:
    metrics = Metrics(PromClient(cluster.prom.url, retries=0),
                      load_mapping({"series": {"loss": "trainguard_loss"}, "state": ""}))
    start = cluster.now - 3 * 3600
    assert np.isfinite(metrics.series_for(JOB, start, cluster.now, NS)["loss"].value).all()
    assert np.isnan(metrics.series_for(JOB, start, cluster.now, EVIL)["loss"].value).all()
    assert metrics.series_for(JOB, start, cluster.now, "team-b") == {}


# --- the queries themselves ---------------------------------------------------------


def test_every_query_of_a_namespaced_job_selects_its_namespace() -> None:
    m = Mapping()
    assert m.series_expr("loss", "bert", NS) == 'trainguard_loss{run="bert", namespace="team-a"}'
    gpu = m.series_expr("gpu_util", "bert", NS)
    assert 'namespace="team-a"' in gpu and 'pod=~"bert-[a-z]+-[0-9]+' in gpu
    assert m.expr(m.state or "", "bert", NS).endswith('namespace="team-a"}')


def test_a_regex_matcher_takes_the_job_id_literally() -> None:
    gpu = Mapping().series_expr("gpu_util", "bert.v2", NS)
    # "." escaped for RE2 (\.), and the backslash escaped for the PromQL string (\\.)
    assert 'pod=~"bert\\\\.v2-[a-z]+' in gpu


def test_a_query_that_cannot_select_the_namespace_is_refused_for_kubeflow() -> None:
    unbound = 'avg(DCGM_FI_DEV_GPU_UTIL{pod=~"{job_id}-.*"})'
    mapping = load_mapping({"series": {"gpu_util": unbound}})
    with pytest.raises(MappingError, match=r"series.gpu_util.*namespace"):
        PrometheusHook(Metrics(PromClient("http://127.0.0.1:9"), mapping))
