"""Prometheus against a real server (Debian package) loaded with a few jobs' series.

Running means "wrote a sample within Prometheus's lookback (5 min) before ``now``":
``a`` (loss, step, a state metric and two GPUs' DCGM utilisation) and ``b`` (only its
step). ``weird`` went silent an hour ago with its state metric saying ``Hibernating``;
``done`` finished (``Succeeded``); ``broken`` has its loss exported by two instances,
which one job's loss cannot be. Prometheus cannot stop jobs (``can_stop`` is False):
the contract checks that its stop refuses clearly and stops nothing.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

import numpy as np
import pytest

from tests.contract import ContractCase, case
from tests.servers import Samples, Server, openmetrics, prometheus, shared
from trainguard.adapters.prometheus import Mapping, Metrics, PromClient, PrometheusAdapter

STEP_S = 30.0
NS = "ml-team"


def dataset(now: float) -> list[Samples]:
    """The series of the contract's jobs, the latest 30 s before ``now``."""
    recent = now - 1800 + STEP_S * np.arange(60)  # the last half hour
    old = recent - 3600  # ended an hour before now
    older = recent - 7200
    k = np.arange(60.0)
    return [
        # a runs in the namespace ml-team (Prometheus sets the label from the scrape
        # target): a Kubeflow job there reads it, one elsewhere does not
        ("trainguard_step", {"run": "a", "job": "trainguard", "namespace": NS}, recent, k * 10),
        ("trainguard_loss", {"run": "a", "job": "trainguard", "namespace": NS}, recent,
         3.0 - k * 0.01),
        ("trainguard_state", {"run": "a", "state": "Running", "namespace": NS}, recent,
         np.ones(60)),
        ("DCGM_FI_DEV_GPU_UTIL", {"pod": "a-worker-0", "gpu": "0", "namespace": NS}, recent,
         np.full(60, 90.0)),
        ("DCGM_FI_DEV_GPU_UTIL", {"pod": "a-worker-0", "gpu": "1", "namespace": NS}, recent,
         np.full(60, 50.0)),
        # another job's GPU on the same node: must not count towards a's utilisation
        ("DCGM_FI_DEV_GPU_UTIL", {"pod": "b-worker-0", "gpu": "0"}, recent, np.zeros(60)),
        ("trainguard_step", {"run": "b"}, recent, k),
        ("trainguard_step", {"run": "weird"}, old, k),
        ("trainguard_state", {"run": "weird", "state": "Hibernating"}, old, np.ones(60)),
        ("trainguard_step", {"run": "done"}, older, k),
        ("trainguard_state", {"run": "done", "state": "Succeeded"}, older, np.ones(60)),
        ("trainguard_step", {"run": "broken"}, recent, k),
        ("trainguard_loss", {"run": "broken", "instance": "10.0.0.1:9091"}, recent, np.ones(60)),
        ("trainguard_loss", {"run": "broken", "instance": "10.0.0.2:9091"}, recent, np.ones(60)),
    ]


def contract_server(request: pytest.FixtureRequest) -> Server:
    """One Prometheus holding ``dataset`` for the session; ``info["now"]`` is its now."""
    def start() -> AbstractContextManager[Server]:
        now = round(time.time() - 1, 3)
        return prometheus(openmetrics(dataset(now)), info={"now": now})

    return shared(request.config, "prometheus-contract", start)


@case("prometheus")
def make(request: pytest.FixtureRequest) -> ContractCase:
    server = contract_server(request)
    adapter = PrometheusAdapter(Metrics(PromClient(server.url, retries=1), Mapping()),
                                scope="test-cluster/ml")
    return ContractCase(adapter=adapter, now=server.info["now"], running={"a", "b"},
                        with_metrics="a", metric="loss", unknown_state="weird",
                        unknown_raw="Hibernating", broken="broken", stops=lambda: [])
