"""The ``utilization`` finding names the under-used hosts when the source gives each
host's GPU series (``Job.hosts``), or says all hosts are alike."""

from __future__ import annotations

import numpy as np

from trainguard.checker.model import Job, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.utilization import Utilization

T = 1.7e9 + np.arange(0.0, 1800.0, 60.0)


def _s(v: float) -> Series:
    return Series("gpu_util", T, np.full(len(T), np.nan), np.full(len(T), v))


def _job(hosts: dict[str, float]) -> Job:
    mean = float(np.mean(list(hosts.values())))
    return Job(id="j", hourly_price=10.0, series={"gpu_util": _s(mean)},
               hosts={h: {"gpu_util": _s(v)} for h, v in hosts.items()})


def _message(job: Job) -> str:
    [f] = Utilization().check(job, Context(now=float(T[-1]), policy=Policy(), jobs=[job]))
    return f.message


def test_the_idle_host_is_named() -> None:
    msg = _message(_job({"algo-1": 95.0, "algo-2": 2.0, "algo-3": 2.0, "algo-4": 95.0}))
    assert "under-used: algo-2, algo-3 (of 4 hosts)" in msg


def test_all_hosts_alike_is_said() -> None:
    assert "all 2 hosts alike" in _message(_job({"algo-1": 30.0, "algo-2": 30.0}))


def test_without_hosts_the_message_is_as_before() -> None:
    job = _job({"algo-1": 30.0})
    job.hosts = {}
    assert "hosts" not in _message(job)
