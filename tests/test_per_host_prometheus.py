"""Per pod and per GPU series from the DCGM exporter's metrics, read from a real
Prometheus (Debian package) loaded with them: the Prometheus adapter, and the Kubeflow
adapter (recorded Kubernetes API) through its Prometheus hook. No GPU and no DCGM
exporter run here: the series carry the exporter's metric names and labels (``pod``,
``gpu``, ``namespace``, ``UUID``, ``modelName``; FB_USED and FB_FREE in MiB)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests.contract.case_kubeflow import NOW as K8S_NOW
from tests.contract.case_kubeflow import adapter_for, recorded_cluster
from tests.servers import Samples, Server, openmetrics, prometheus
from trainguard.adapters.kubeflow.prometheus_hook import PrometheusHook
from trainguard.adapters.prometheus import (
    Mapping,
    Metrics,
    PromClient,
    PrometheusAdapter,
    load_mapping,
)
from trainguard.checker.evaluate import evaluate
from trainguard.checker.policy import Policy, RuleConfig
from trainguard.checker.rules.rightsizing import Rightsizing
from trainguard.checker.rules.slowdown import Slowdown

NS = "ml-team"
PODS = ("bert-ft-master-0", "bert-ft-worker-0", "bert-ft-worker-1", "bert-ft-worker-2")
GPUS = 2  # per pod, enough to tell one GPU from another
TOTAL_MIB = 40_960.0  # an A100 40GB's frame buffer, FB_USED + FB_FREE


def _used_mib(pod: str, gpu: int) -> float:
    return 10_240.0 + 1024.0 * gpu + (2048.0 if pod.endswith("-2") else 0.0)


def _util(pod: str, k: np.ndarray) -> np.ndarray:
    """90 % everywhere; the last 20 minutes worker-2's GPUs at 25 % (a straggler)."""
    u = np.full(len(k), 90.0)
    if pod == "bert-ft-worker-2":
        u[k >= len(k) - 40] = 25.0
    return u


def dataset(now: float) -> list[Samples]:
    t = now - 7200 + 30.0 * np.arange(240)  # two hours, every 30 s
    k = np.arange(240)
    steps = np.cumsum(np.where(k >= 200, 5.0, 10.0))  # half the steps in the last 20 min
    out: list[Samples] = [
        ("trainguard_step", {"run": "bert-ft", "namespace": NS}, t, steps),
        ("trainguard_loss", {"run": "bert-ft", "namespace": NS}, t, 3.0 - k * 0.001),
    ]
    for pod in PODS:
        for g in range(GPUS):
            labels = {"pod": pod, "gpu": str(g), "namespace": NS, "UUID": f"GPU-{pod}-{g}",
                      "modelName": "NVIDIA A100-SXM4-40GB", "container": "pytorch"}
            used = np.full(len(t), _used_mib(pod, g))
            out += [("DCGM_FI_DEV_GPU_UTIL", labels, t, _util(pod, k)),
                    ("DCGM_FI_DEV_FB_USED", labels, t, used),
                    ("DCGM_FI_DEV_FB_FREE", labels, t, TOTAL_MIB - used)]
    # a job that asked for two GPUs per pod and uses one
    for pod in ("idle-gpus-worker-0", "idle-gpus-worker-1"):
        for g in range(2):
            labels = {"pod": pod, "gpu": str(g), "namespace": NS}
            used = np.full(len(t), 12_288.0 if g == 0 else 0.0)
            out += [("DCGM_FI_DEV_GPU_UTIL", labels, t, np.full(len(t), 95.0 if g == 0 else 0.0)),
                    ("DCGM_FI_DEV_FB_USED", labels, t, used),
                    ("DCGM_FI_DEV_FB_FREE", labels, t, TOTAL_MIB - used)]
    out += [("trainguard_step", {"run": "idle-gpus", "namespace": NS}, t, steps)]
    # a pod of another job on the same node, and one of the same name in another namespace
    other = {"pod": "bert-ft-large-worker-0", "gpu": "0", "namespace": NS}
    forged = {"pod": "bert-ft-worker-0", "gpu": "0", "namespace": "elsewhere"}
    out += [("DCGM_FI_DEV_GPU_UTIL", other, t, np.zeros(len(t))),
            ("DCGM_FI_DEV_GPU_UTIL", forged, t, np.zeros(len(t)))]
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Server, float]]:
    # ``prometheus`` skips, naming the package, when Prometheus is not installed
    now = round(time.time() - 1, 3)
    with prometheus(openmetrics(dataset(now)), info={"now": now}) as s:
        yield s, now


def _metrics(url: str) -> Metrics:
    # the job's own series are labelled run=bert-ft in its namespace
    return Metrics(PromClient(url, retries=1), Mapping(), namespace=NS)


def test_each_pod_and_gpu_keeps_its_own_series(server: tuple[Server, float]) -> None:
    s, now = server
    job = PrometheusAdapter(_metrics(s.url)).read_job("bert-ft", now)
    assert sorted(job.hosts) == sorted(PODS)  # not the other job's pod, not the forged one
    for pod in PODS:
        by = job.hosts[pod]
        for g in range(GPUS):
            mem = by[f"gpu_mem/gpu{g}"].value
            np.testing.assert_allclose(mem, 100 * _used_mib(pod, g) / TOTAL_MIB)
            np.testing.assert_allclose(by[f"gpu_mem_used_gb/gpu{g}"].value,
                                       _used_mib(pod, g) / 1024)
        # the pod's own mean over its GPUs
        np.testing.assert_allclose(by["gpu_mem_used_gb"].value,
                                   np.mean([_used_mib(pod, g) for g in range(GPUS)]) / 1024)
        assert np.isfinite(by["gpu_util"].step).any(), "steps come from the job's step series"
    # the job's aggregates: the mean share of memory, the fullest GPU's GiB
    assert job.series["gpu_mem_used_gb"].value.max() == pytest.approx(
        _used_mib("bert-ft-worker-2", GPUS - 1) / 1024)
    expected_pct = np.mean([100 * _used_mib(p, g) / TOTAL_MIB for p in PODS
                            for g in range(GPUS)])
    np.testing.assert_allclose(job.series["gpu_mem"].value, expected_pct)


def test_the_straggler_pod_is_named(server: tuple[Server, float]) -> None:
    s, now = server
    job = PrometheusAdapter(_metrics(s.url)).read_job("bert-ft", now)
    [f] = evaluate([job], Policy(), now, rules=[Slowdown()])
    assert f.evidence["straggler"] == "bert-ft-worker-2"
    assert "host bert-ft-worker-2 is the straggler" in f.message


def test_kubeflow_jobs_get_their_pods_gpu_series(server: tuple[Server, float]) -> None:
    s, now = server
    hook = PrometheusHook(Metrics(PromClient(s.url, retries=1), Mapping()), "{name}", now)
    with recorded_cluster() as k8s:
        jobs = {j.id: j for j in adapter_for(k8s, metrics=hook).list_jobs(K8S_NOW)}
    bert = jobs["ml-team/pytorchjob/bert-ft"]
    assert sorted(bert.hosts) == sorted(PODS)
    assert "gpu_util/gpu1" in bert.hosts["bert-ft-worker-2"]
    # a job in another namespace reads nothing of ml-team's pods
    assert jobs["research/pytorchjob/vit-sweep"].hosts == {}


def test_devices_can_be_switched_off_and_must_name_labels() -> None:
    assert load_mapping({"devices": {}}).devices == {}
    with pytest.raises(ValueError, match="host_label"):
        load_mapping({"host_label": "not a label"})
    with pytest.raises(ValueError, match="devices"):
        load_mapping({"devices": ["DCGM_FI_DEV_GPU_UTIL"]})




def test_gpus_asked_for_and_unused_are_priced_per_gpu_hour(server: tuple[Server, float]) -> None:
    """A Kubernetes job has no instance type in the price book: rightsizing says how many
    of its GPUs sit unused, at the policy's GPU-hour price; none for a job using them all."""
    s, now = server
    adapter = PrometheusAdapter(_metrics(s.url))
    policy = Policy()
    policy.cost.gpu_hour_usd = 4.0
    policy.rules["rightsizing"] = RuleConfig(params={"min_window_seconds": 3600})
    rule = Rightsizing(policy.rule("rightsizing").params)
    idle = adapter.read_job("idle-gpus", now)
    idle.gpus_per_instance, idle.instance_count = 2, 2
    [f] = evaluate([idle], policy, now, rules=[rule])
    assert (f.evidence["unused_gpus"], f.evidence["gpus"]) == (2, 4)
    assert f.evidence["saving_usd_per_hour"] == pytest.approx(8.0)
    assert "2 of 4 GPUs unused" in f.message and "ask for 2" in f.message
    busy = adapter.read_job("bert-ft", now)
    assert evaluate([busy], policy, now, rules=[rule]) == []
