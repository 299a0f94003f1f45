"""The in-memory adapter: the reference every other adapter is held to."""

from __future__ import annotations

import numpy as np
import pytest

from tests.contract import ContractCase, case
from trainguard.adapters.memory import MemoryAdapter
from trainguard.checker.model import Job, Series

T0 = 1_750_000_000.0


@case("memory")
def make(request: pytest.FixtureRequest) -> ContractCase:
    t = np.asarray(T0 + np.arange(10) * 60.0, dtype=np.float64)
    loss = Series("loss", t, np.arange(10.0), np.linspace(3, 2, 10))

    def job(**kw: object) -> Job:
        return Job(id="x", start_time=T0, instance_type="ml.g5.xlarge", **kw)  # type: ignore[arg-type]

    adapter = MemoryAdapter({
        "a": {"status": "RUNNING", "job": job(series={"loss": loss})},
        "b": {"status": "RUNNING", "job": job()},
        "c": {"status": "SUCCEEDED", "job": job()},
        "weird": {"status": "Hibernating", "job": job()},
        "broken": {"status": "RUNNING", "job": "not a job"},
    })
    return ContractCase(adapter=adapter, now=T0 + 600, running={"a", "b"}, with_metrics="a",
                        metric="loss", unknown_state="weird", unknown_raw="Hibernating",
                        broken="broken", stops=lambda: adapter.stopped)
