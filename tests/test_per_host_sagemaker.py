"""Per-host series from SageMaker (``Host=JOB/algo-N``) on the SageMaker test double
(recorded DescribeTrainingJob answers through botocore's Stubber, CloudWatch on a moto
server), and the rules that read them: the straggler named by ``slowdown``, and the
``rightsizing`` bar on the recorded 2 x ml.p4d.24xlarge job."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.sagemaker_replay import (
    NOW,
    Recordings,
    ReplayStubber,
    adapter_for,
    moto_server,
    put_metrics,
    renamed_event,
    sagemaker_client,
    seed_once,
    stop_moto,
)
from trainguard.checker.evaluate import evaluate
from trainguard.checker.model import Job
from trainguard.checker.policy import Policy
from trainguard.checker.rules.rightsizing import Rightsizing
from trainguard.checker.rules.slowdown import Slowdown

HOSTS = ("algo-1", "algo-2")  # the recording's InstanceCount


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    yield moto_server()
    stop_moto()


def _read(url: str, name: str) -> Job:
    rec = Recordings()
    adapter = adapter_for(ReplayStubber(sagemaker_client(), rec), url)
    adapter.remember_event(renamed_event(rec, "event-llm-pretrain-a-training", name))
    [job] = adapter.read_jobs([name], NOW)
    return job


def _times(minutes: int) -> list[float]:
    return [NOW - 60 * minutes + 60 * i for i in range(minutes)]


def _gpu(per_gpu: float) -> float:
    """GPU metrics as SageMaker publishes them: summed over the instance's 8 GPUs."""
    return 8 * per_gpu


def test_each_host_keeps_its_own_series_beside_the_job_mean(moto_url: str) -> None:
    t = _times(20)
    util = {"algo-1": 90.0, "algo-2": 30.0}
    seed_once(moto_url, "per-host-a", lambda url: put_metrics(
        url, "per-host-a", {"loss": [(x, 2.0) for x in t]},
        hosts={h: {"GPUUtilization": [(x, _gpu(u)) for x in t],
                   "GPUMemoryUtilization": [(x, _gpu(20.0)) for x in t]}
               for h, u in util.items()}))
    job = _read(moto_url, "per-host-a")
    assert sorted(job.hosts) == list(HOSTS)
    for h, u in util.items():
        np.testing.assert_allclose(job.hosts[h]["gpu_util"].value, u)
        np.testing.assert_allclose(job.hosts[h]["gpu_mem"].value, 20.0)
        assert list(job.hosts[h]["gpu_util"].time) == t
    np.testing.assert_allclose(job.series["gpu_util"].value, 60.0)  # the aggregate stays
    # a cut keeps each host's records up to its time
    cut = job.until(t[9])
    assert len(cut.hosts["algo-2"]["gpu_util"]) == 10


def _slow_job_metrics(url: str, name: str, straggler: str | None) -> None:
    """Two hours of 50 steps a minute, then 25 a minute for the last 20 minutes; during
    the slowdown one host's GPUs idle (its input stalls) or all hosts' GPUs drop."""
    t = _times(120)
    slow_from = len(t) - 20
    steps, s = [], 0.0
    for i in range(len(t)):
        s += 25.0 if i >= slow_from else 50.0
        steps.append(s)

    def util(h: str, i: int) -> float:
        if i < slow_from:
            return 92.0
        if straggler is None:
            return 45.0
        return 25.0 if h == straggler else 90.0

    put_metrics(url, name, {"step": list(zip(t, steps, strict=True)),
                            "loss": [(x, 2.0) for x in t]},
                hosts={h: {"GPUUtilization": [(x, _gpu(util(h, i))) for i, x in enumerate(t)]}
                       for h in HOSTS})


@pytest.mark.parametrize("straggler", ["algo-2", None])
def test_slowdown_names_the_lagging_host_or_says_all_slowed(moto_url: str,
                                                            straggler: str | None) -> None:
    name = f"slow-{straggler or 'all'}"
    seed_once(moto_url, name, lambda url: _slow_job_metrics(url, name, straggler))
    job = _read(moto_url, name)
    [f] = evaluate([job], Policy(), NOW, rules=[Slowdown()])
    assert 0.4 < f.evidence["ratio"] < 0.6
    if straggler:
        assert f.evidence["straggler"] == straggler
        assert f"host {straggler} is the straggler" in f.message
    else:
        assert "all 2 hosts slowed together" in f.message


def _memory_job(url: str, name: str, mem: float, util: float) -> None:
    t = _times(150)
    put_metrics(url, name, {"step": [(x, 50.0 * (i + 1)) for i, x in enumerate(t)]},
                hosts={h: {"GPUUtilization": [(x, _gpu(util)) for x in t],
                           "GPUMemoryUtilization": [(x, _gpu(mem)) for x in t]}
                       for h in HOSTS})


def _rightsized(url: str, name: str, mem: float, util: float) -> list[Any]:
    seed_once(url, name, lambda u: _memory_job(u, name, mem, util))
    job = _read(url, name)
    assert job.instance_type == "ml.p4d.24xlarge" and job.instance_count == 2
    return evaluate([job], Policy(), NOW, rules=[Rightsizing()])


def test_rightsizing_names_a_cheaper_type_for_a_job_using_a_quarter_of_its_memory(
        moto_url: str) -> None:
    [f] = _rightsized(moto_url, "rs-quarter", mem=25.0, util=30.0)
    ev = f.evidence
    assert f.severity.value == "info"
    assert ev["peak_gpu_mem_gb"] == pytest.approx(10.0)
    assert ev["suggested_type"] != "ml.p4d.24xlarge"
    assert ev["usd_per_hour_suggested"] < ev["usd_per_hour_now"]
    assert ev["saving_usd_per_hour"] == pytest.approx(
        ev["usd_per_hour_now"] - ev["usd_per_hour_suggested"])
    assert ev["suggested_type"] in f.message and "saves $" in f.message


def test_rightsizing_is_silent_on_a_job_using_most_of_its_memory(moto_url: str) -> None:
    assert _rightsized(moto_url, "rs-most", mem=85.0, util=30.0) == []


def test_rightsizing_is_silent_when_the_gpus_are_busy(moto_url: str) -> None:
    """A quarter of the memory, but GPUs 95 % busy: a slower GPU would slow the job."""
    assert _rightsized(moto_url, "rs-busy", mem=25.0, util=95.0) == []
