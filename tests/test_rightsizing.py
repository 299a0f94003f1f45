"""The ``rightsizing`` rule and the price book's GPU memory, on jobs built here: what fits
is named with the dollars it saves, nothing is named when nothing cheaper fits, GPUs the
per-GPU data shows unused are not paid for, and a replay answers as a fresh judgement."""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.checker.evaluate import evaluate
from trainguard.checker.follow import Followers
from trainguard.checker.model import Action, Job, Series, Severity
from trainguard.checker.policy import Policy, RuleConfig
from trainguard.checker.prices import GPUS, gpu_spec, lookup
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.rightsizing import Rightsizing

T0 = 1.7e9
NAN = float("nan")


def _s(name: str, t: np.ndarray, v: float | np.ndarray) -> Series:
    return Series(name, t, np.full(len(t), NAN), np.broadcast_to(v, t.shape).astype(float))


def _job(instance: str, count: int, mem: float, util: float, hours: float = 3.0,
         **series: float) -> Job:
    t = T0 + np.arange(0, hours * 3600, 60.0)
    gpus = gpu_spec(instance)
    assert gpus is not None
    out = {"gpu_mem": _s("gpu_mem", t, mem), "gpu_util": _s("gpu_util", t, util)}
    out |= {k: _s(k, t, v) for k, v in series.items()}
    return Job(id="j", provider="sagemaker" if instance.startswith("ml.") else "azureml",
               instance_type=instance, instance_count=count, gpus_per_instance=gpus[0],
               start_time=T0, max_runtime_s=24 * 3600, series=out)


def _check(job: Job, policy: Policy | None = None) -> list:  # type: ignore[type-arg]
    now = float(job.series["gpu_mem"].time[-1])
    return Rightsizing().check(job, Context(now=now, policy=policy or Policy(), jobs=[job]))


def test_every_gpu_type_of_the_book_has_its_memory_and_compute() -> None:
    for instance in GPUS:
        spec = gpu_spec(instance)
        assert spec is not None, instance
        assert spec[2] in (24.0, 40.0, 80.0) and spec[3] > 100
    assert gpu_spec("ml.p4de.24xlarge")[2] == 80.0  # type: ignore[index]
    assert gpu_spec("Standard_ND96asr_v4")[2] == 40.0  # type: ignore[index]
    assert gpu_spec("ml.m5.xlarge") is None


def test_a_job_using_a_quarter_of_its_memory_is_told_the_cheaper_type_and_the_saving() -> None:
    job = _job("ml.p4d.24xlarge", 2, mem=25.0, util=30.0)
    [f] = _check(job)
    ev = f.evidence
    rate = 2 * lookup("ml.p4d.24xlarge").usd_per_hour  # type: ignore[union-attr]
    assert ev["usd_per_hour_now"] == pytest.approx(rate)
    suggested = gpu_spec(ev["suggested_type"])
    assert suggested is not None
    # it holds the peak with headroom, and is the cheapest that does in the same region
    assert suggested[2] >= 10.0 * 1.25
    assert ev["region"] == lookup("ml.p4d.24xlarge").region  # type: ignore[union-attr]
    assert ev["saving_usd_per_hour"] > 0.1 * rate
    # the remaining run: 21 h to the max runtime
    assert ev["saving_usd_remaining_run"] == pytest.approx(ev["saving_usd_per_hour"] * 21.0,
                                                           rel=0.01)
    assert f.severity.value == "info"


def test_silent_when_the_job_uses_most_of_its_memory_or_its_gpus() -> None:
    assert _check(_job("ml.p4d.24xlarge", 2, mem=85.0, util=30.0)) == []
    assert _check(_job("ml.p4d.24xlarge", 2, mem=25.0, util=95.0)) == []


def test_silent_until_the_window_is_long_enough() -> None:
    assert _check(_job("ml.p4d.24xlarge", 2, mem=25.0, util=30.0, hours=1.0)) == []


def test_absolute_memory_wins_over_the_percent() -> None:
    """``gpu_mem_used_gb`` (DCGM, ``trainguard.emit``) shows a peak the percent missed."""
    job = _job("ml.p4d.24xlarge", 2, mem=25.0, util=30.0, gpu_mem_used_gb=36.0)
    assert _check(job) == []  # 36 GB x 1.25 fits nothing cheaper


def test_a_cheaper_type_with_the_same_gpus() -> None:
    """4 x A10G at 20 % memory and light use: the g5.12xlarge's GPUs on a cheaper type."""
    job = _job("ml.g5.24xlarge", 1, mem=20.0, util=40.0)
    [f] = _check(job)
    assert f.evidence["suggested_type"] in ("ml.g5.12xlarge", "ml.g6.12xlarge")


def test_unused_gpus_from_per_gpu_data_are_not_paid_for() -> None:
    """Azure 4 x A100 80GB, only GPU 0 in use (12 GB): one A100 80GB is enough."""
    job = _job("Standard_NC96ads_A100_v4", 1, mem=4.0, util=25.0)
    t = job.series["gpu_mem"].time
    node: dict[str, Series] = {}
    for g in range(4):
        used = g == 0
        node[f"gpu_mem/gpu{g}"] = _s(f"gpu_mem/gpu{g}", t, 15.0 if used else 0.5)
        node[f"gpu_util/gpu{g}"] = _s(f"gpu_util/gpu{g}", t, 99.0 if used else 0.0)
    job.hosts = {"node-0": node}
    [f] = _check(job)
    assert f.evidence["unused_gpus"] == 3
    assert f.evidence["suggested_type"] == "Standard_NC24ads_A100_v4"
    assert "3 of 4 GPUs unused" in f.message


def test_without_per_gpu_data_every_gpu_counts() -> None:
    job = _job("Standard_NC96ads_A100_v4", 1, mem=4.0, util=25.0)
    assert _check(job) == []  # 4 A100 80GB: nothing cheaper in eastus has 4 such GPUs


def test_policy_prices_and_severity() -> None:
    job = _job("ml.p4d.24xlarge", 2, mem=25.0, util=30.0)
    policy = Policy()
    policy.rules["rightsizing"] = RuleConfig(actions={Severity.INFO: Action.NOTIFY})
    [f] = evaluate([job], policy, float(job.series["gpu_mem"].time[-1]),
                   rules=[Rightsizing()])
    assert f.action is Action.NOTIFY
    # a policy price makes every candidate dearer than the job: nothing to name
    policy.cost.prices.update({t: 1000.0 for t in GPUS if t.startswith("ml.")
                               and t != "ml.p4d.24xlarge"})
    assert evaluate([job], policy, float(job.series["gpu_mem"].time[-1]),
                    rules=[Rightsizing()]) == []


def test_a_replay_answers_as_judging_each_cut_afresh() -> None:
    job = _job("ml.p4d.24xlarge", 2, mem=25.0, util=30.0)
    rule, followers, policy = Rightsizing(), Followers(), Policy()
    for now in T0 + np.arange(1800, 3 * 3600, 600.0):
        cut = job.until(float(now))
        followed = [f.message for f in evaluate([cut], policy, float(now), rules=[rule],
                                                followers=followers)]
        assert followed == [f.message for f in evaluate([cut], policy, float(now),
                                                        rules=[rule])]
