"""Per node and per GPU series from the MLflow system metrics an Azure ML run logs, on
the Azure ML test double (recorded ARM and MLflow answers replayed over HTTPS). The
system-metric histories are written here in MLflow's get-history wire shape, with the
key names mlflow's own system-metrics monitor logs (``system/{node}/gpu_{i}_...``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.contract.case_azureml import NOW, RECORDINGS, Replay, adapter_for, start
from trainguard.adapters.azureml.system import per_node
from trainguard.checker.evaluate import evaluate
from trainguard.checker.model import Job, Series
from trainguard.checker.policy import Policy, RuleConfig
from trainguard.checker.rules.rightsizing import Rightsizing

BRIGHT = "bright_river_4k2m9x7q1z"  # 2 nodes x Standard_NC48ads_A100_v4 (2 x A100 80GB)
NODES = ("node_0", "node_1")
MB_80GB = 80_000.0  # an A100 80GB's memory in MLflow's megabytes (bytes / 1e6)


def _used_mb(node: str, gpu: int) -> float:
    """GPU 0 of each node holds 20 GB; GPU 1 sits unused (a job that asked for two)."""
    return 20_000.0 if gpu == 0 else 300.0


def _util(node: str, gpu: int) -> float:
    return 85.0 if gpu == 0 else 0.0


def _history(key: str, times: np.ndarray, values: list[float]) -> dict[str, Any]:
    return {"metrics": [{"key": key, "value": v, "timestamp": int(t * 1000), "step": i}
                        for i, (t, v) in enumerate(zip(times, values, strict=True))]}


def _system_keys() -> dict[str, list[float]]:
    times = NOW - 3000 + 60.0 * np.arange(50)
    out = {}
    for node in NODES:
        for g in range(2):
            used = _used_mb(node, g)
            out[f"system/{node}/gpu_{g}_utilization_percentage"] = [_util(node, g)] * len(times)
            out[f"system/{node}/gpu_{g}_memory_usage_percentage"] = \
                [round(100 * used / MB_80GB, 1)] * len(times)
            out[f"system/{node}/gpu_{g}_memory_usage_megabytes"] = [used] * len(times)
    return out


@pytest.fixture
def replay(request: pytest.FixtureRequest, tmp_path: Path) -> Replay:
    replay = start(request)
    times = NOW - 3000 + 60.0 * np.arange(50)
    mlflow = next(r["path"].rsplit("/runs/get", 1)[0] for r in replay.routes
                  if r["path"].endswith("/runs/get"))
    run = json.loads((RECORDINGS / "mlflow_run_bright_river.json").read_text())
    keys = _system_keys()
    run["run"]["data"]["metrics"] += [{"key": k, "value": v[-1], "timestamp": int(NOW * 1000),
                                       "step": 49} for k, v in keys.items()]
    (tmp_path / "run.json").write_text(json.dumps(run))
    # first in the list: it wins over the recorded run of the same query
    routes = [{"method": "GET", "path": f"{mlflow}/runs/get", "query": {"run_id": BRIGHT},
               "body": str(tmp_path / "run.json")}]
    for i, (k, v) in enumerate(keys.items()):
        (tmp_path / f"h{i}.json").write_text(json.dumps(_history(k, times, v)))
        routes.append({"method": "GET", "path": f"{mlflow}/metrics/get-history",
                       "query": {"run_id": BRIGHT, "metric_key": k},
                       "body": str(tmp_path / f"h{i}.json")})
    replay.routes[:0] = routes
    return replay


def _bright(replay: Replay) -> Job:
    return {j.id: j for j in adapter_for(replay).list_jobs(NOW)}[BRIGHT]


def test_each_node_and_gpu_gets_its_own_series(replay: Replay) -> None:
    job = _bright(replay)
    assert sorted(job.hosts) == list(NODES)
    for node in NODES:
        by = job.hosts[node]
        np.testing.assert_allclose(by["gpu_mem_used_gb/gpu0"].value, 20.0)
        np.testing.assert_allclose(by["gpu_util/gpu1"].value, 0.0)
        np.testing.assert_allclose(by["gpu_util"].value, 42.5)  # the node's mean
    # the job's aggregates: mean use and share, the fullest GPU's GB
    np.testing.assert_allclose(job.series["gpu_util"].value, 42.5)
    np.testing.assert_allclose(job.series["gpu_mem_used_gb"].value, 20.0)
    assert np.isnan(job.series["gpu_util"].step).all(), "system steps are not training steps"
    assert len(job.series["loss"]) == 30, "the run's own metrics are untouched"


def test_rightsizing_pays_only_for_the_gpus_the_job_uses(replay: Replay) -> None:
    job = _bright(replay)
    policy = Policy()
    policy.rules["rightsizing"] = RuleConfig(params={"min_window_seconds": 1800})
    [f] = evaluate([job], policy, NOW, rules=[Rightsizing(policy.rule("rightsizing").params)])
    assert f.evidence["unused_gpus"] == 2
    assert f.evidence["suggested_type"] == "Standard_NC24ads_A100_v4"
    assert f.evidence["suggested_count"] == 2
    assert f.evidence["usd_per_hour_suggested"] < f.evidence["usd_per_hour_now"]


def test_a_single_node_run_and_a_job_logging_its_own_gpu_use() -> None:
    t = np.arange(5.0)
    mine = Series("gpu_util", t, np.full(5, np.nan), np.full(5, 99.0))
    sysm = Series("system/gpu_0_utilization_percentage", t, t, np.full(5, 10.0))
    series, hosts = per_node({"gpu_util": mine,
                              "system/gpu_0_utilization_percentage": sysm})
    assert list(hosts) == ["node"]
    assert series["gpu_util"] is mine  # the job's own series wins
    assert per_node({"loss": mine}) == ({"loss": mine}, {})
