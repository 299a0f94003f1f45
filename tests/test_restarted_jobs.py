"""A cloud job restarted in place logs its steps again: the points of the new session
replace the ones it logged before, for every source (``checker.sessions.set_aside``, run
by ``Adapter.list_jobs`` and ``get_job``), as the local reader does for files.

The failure class: a managed-spot SageMaker job (or a Kubeflow pod restarted by its
operator) without a usable checkpoint starts again from step 0. Its loss series, in time
order, went 10.9 -> 0.06, and then, after the restart, 10.9 again: judged as one curve a
180-fold climb, a critical divergence, and a stop where a policy allows one, of a job that
is training normally. SageMaker runs on its test double (recorded DescribeTrainingJob
answers through botocore's Stubber, CloudWatch on a moto server); the tick's stop
decisions run on the memory adapter, the reference every adapter's contract test holds
the real ones to.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

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
    stop_moto,
)
from trainguard.adapters.memory import MemoryAdapter
from trainguard.adapters.sagemaker import SageMakerAdapter
from trainguard.checker.model import Action, Job, Series, Severity
from trainguard.checker.policy import Policy, RuleConfig, Safety
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.divergence import Divergence
from trainguard.checker.sessions import set_aside
from trainguard.lambdas.state import MemoryStore
from trainguard.lambdas.tick import tick


def _curve(n: int, start: float, end: float) -> list[float]:
    return [end + (start - end) * math.exp(-i / (n / 6)) for i in range(n)]


FIRST = _curve(40, 10.9, 0.06)  # 40 minutes of training
SECOND = _curve(10, 10.9, 5.0)  # after the restart, from scratch


def _points(restarted: bool) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(loss, step) as SageMaker publishes them: a point a minute, a 10-minute gap (the
    spot interruption), then the second session from step 50 again, or, for the control,
    the same losses with the steps going on."""
    t0 = NOW - 3600
    times = [t0 + 60 * i for i in range(40)] + [t0 + 3000 + 60 * i for i in range(10)]
    steps = [50.0 * (i + 1) for i in range(40)]
    steps += [50.0 * (i + 1) for i in range(10)] if restarted else [
        2000.0 + 50 * (i + 1) for i in range(10)]
    loss = FIRST + SECOND
    return list(zip(times, loss, strict=True)), list(zip(times, steps, strict=True))


@pytest.fixture(scope="module")
def sagemaker() -> Iterator[SageMakerAdapter]:
    url = moto_server()
    rec = Recordings()
    adapter = adapter_for(ReplayStubber(sagemaker_client(), rec), url)
    for name, restarted in (("spot-restarted", True), ("spot-climbing", False)):
        loss, step = _points(restarted)
        put_metrics(url, name, {"loss": loss, "step": step})
        # llm-pretrain-a's event defines the metrics loss and step
        adapter.remember_event(renamed_event(rec, "event-llm-pretrain-a-training", name))
    yield adapter
    stop_moto()


def test_sagemaker_lists_a_restarted_job_with_its_new_session_only(
        sagemaker: SageMakerAdapter) -> None:
    jobs = {j.id: j for j in sagemaker.list_jobs(NOW)}
    restarted, climbing = jobs["spot-restarted"], jobs["spot-climbing"]
    loss = restarted.series["loss"]
    assert loss.value.tolist() == pytest.approx(SECOND)
    assert restarted.superseded == 40
    # the progress keeps both sessions: the restart stays visible to stall and restarts
    assert len(restarted.series["step"]) == 50
    assert climbing.superseded == 0 and len(climbing.series["loss"]) == 50
    found = {j: Divergence().check(jobs[j], _ctx(jobs[j])) for j in jobs}
    assert not any(f.severity is Severity.CRITICAL for f in found["spot-restarted"])
    assert any(f.severity is Severity.CRITICAL for f in found["spot-climbing"])


def _ctx(job: Job) -> Context:
    return Context(now=NOW, policy=Policy(), jobs=[job])


def _job(restarted: bool) -> Job:
    loss, step = _points(restarted)
    t = np.array([p[0] for p in loss])
    s = np.array([p[1] for p in step])
    return Job(id="x", start_time=float(t[0]), instance_type="ml.p4d.24xlarge",
               series={"loss": Series("loss", t, s, np.array([p[1] for p in loss])),
                       "step": Series("step", t, s, s)})


def test_the_tick_stops_the_climbing_job_and_not_the_restarted_one() -> None:
    """Both jobs on the reference adapter, stopping allowed for a critical divergence."""
    source = MemoryAdapter({"restarted": {"status": "RUNNING", "job": _job(True)},
                            "climbing": {"status": "RUNNING", "job": _job(False)}})
    policy = Policy(safety=Safety(dry_run=False, persist_ticks=1, max_stops_per_tick=5))
    policy.rules["divergence"] = RuleConfig(actions={Severity.CRITICAL: Action.STOP})
    tick([source], policy, MemoryStore(), [], now=NOW, rules=[Divergence()])
    assert source.stopped == ["climbing"]


def test_a_job_on_a_step_clock_or_without_a_restart_is_returned_as_it_is() -> None:
    job = _job(False)
    assert set_aside(job) is job
    stepped = _job(True)
    stepped.clock = "step"  # its series are in step order: the local reader's case
    assert set_aside(stepped) is stepped
