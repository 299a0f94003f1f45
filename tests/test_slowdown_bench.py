"""The injected slowdowns and stragglers of ``bench --inject`` (``trainguard.bench.
inject_speed``): what they change in a run, and that the ``slowdown`` rule finds them within
15 minutes (naming the straggler) and stays silent on the runs they were injected into,
on a curve built here and on real runs of the shared corpora."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from trainguard.bench.inject import INJECTORS, inject
from trainguard.bench.inject_speed import HOSTS, SLOW_FOR_S, warped
from trainguard.checker.evaluate import evaluate
from trainguard.checker.follow import Followers
from trainguard.checker.model import Finding, Job, JobState, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules.slowdown import Slowdown


def healthy(hours: float = 2.0, every: float = 5.0) -> Job:
    """A steady run: 10 steps every ``every`` s, a loss falling, on a wall clock."""
    t = 1.7e9 + np.arange(0.0, hours * 3600, every)
    steps = np.asarray(10.0 * np.arange(len(t)), dtype=np.float64)
    loss = np.asarray(2.0 + 8.0 * np.exp(-steps / 5000), dtype=np.float64)
    return Job(id="run", state=JobState.SUCCEEDED, start_time=float(t[0]), end_time=float(t[-1]),
               series={"step": Series("step", t, steps, steps),
                       "loss": Series("loss", t, steps, loss)})


def first_slowdown(job: Job) -> tuple[float, Finding] | None:
    """(when, the finding): the first slowdown finding, ticking at every progress record
    as a replay does."""
    rule, followers, policy = Slowdown(), Followers(), Policy()
    for now in job.series["step"].time:
        found = evaluate([job.until(float(now))], policy, float(now), rules=[rule],
                         followers=followers)
        if found:
            return float(now), found[0]
    return None


def test_time_is_stretched_for_20_minutes_then_shifted_by_10() -> None:
    at = 1000.0
    t = np.array([900.0, 1000.0, 1300.0, 1600.0, 2000.0])
    np.testing.assert_allclose(warped(t, at), [900.0, 1000.0, 1600.0, 2200.0, 2600.0])


@pytest.mark.parametrize("kind", ["slowdown", "straggler"])
def test_found_within_15_minutes_of_onset(kind: str) -> None:
    for seed in range(3):
        out = inject(healthy(), kind, seed)
        assert out.label == "slowed" and out.onset_time is not None
        step = out.job.series["step"]
        inside = (step.time > out.onset_time) & (step.time <= out.onset_time + SLOW_FOR_S)
        gaps = np.diff(step.time[inside])
        assert np.median(gaps) == pytest.approx(10.0, rel=0.01)  # 5 s apart before: halved
        first = first_slowdown(out.job)
        assert first is not None, out.note
        when, found = first
        assert 0 < when - out.onset_time <= 15 * 60
        assert abs((found.started_at or 0) - out.onset_time) <= 60  # the onset's block
        if kind == "straggler":
            assert found.evidence["straggler"] in HOSTS
            assert f"host {found.evidence['straggler']} lags" in out.note


def test_the_healthy_run_itself_is_quiet() -> None:
    assert first_slowdown(healthy()) is None


def test_a_run_too_short_to_carry_it_is_refused() -> None:
    with pytest.raises(ValueError, match="too short for 20 slowed minutes"):
        inject(healthy(hours=0.3), "slowdown", 0)
    step_clock = dataclasses.replace(healthy(), clock="step")
    with pytest.raises(ValueError, match="no time axis"):
        inject(step_clock, "straggler", 0)


def test_registered_for_bench_inject() -> None:
    assert {"slowdown", "straggler"} <= set(INJECTORS)


def test_real_runs_slowed_are_found_and_left_alone_healthy(curves_dir: Path) -> None:
    """Three long modded-nanogpt runs (8 x H100 speedruns, tens of minutes each)."""
    from trainguard.adapters.local import load_run

    judged = 0
    for path in sorted((curves_dir / "modded-nanogpt").glob("mng-2-2025-0[4-9]*.log"))[:3]:
        loaded = load_run(path)
        job = dataclasses.replace(loaded, state=JobState.SUCCEEDED, end_time=loaded.last_time())
        assert first_slowdown(job) is None, path.name
        for kind in ("slowdown", "straggler"):
            out = inject(job, kind, 5)
            first = first_slowdown(out.job)
            assert first is not None and out.onset_time is not None, (path.name, kind)
            assert 0 < first[0] - out.onset_time <= 15 * 60, (path.name, kind)
            judged += 1
    assert judged == 6
