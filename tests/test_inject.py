"""Fault injection: seeded, labelled, and changing only what the fault changes."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from trainguard.bench.anchors import ANCHORS, KerasTerminateOnNaN
from trainguard.bench.inject import INJECTORS, divergence, inject, pause, spike, stall
from trainguard.bench.injected import Injected
from trainguard.checker.model import Clock, Job, JobState, Series

DT = 30.0  # seconds between steps
END = 199 * DT


def healthy(clock: Clock = "elapsed") -> Job:
    """200 steps, 30 s apart: train loss every step, val loss every 20, GPU use, step counter."""
    steps = np.arange(200, dtype=float)
    times = DT * steps
    val = steps[::20]
    return Job(
        id="run", clock=clock, state=JobState.SUCCEEDED, start_time=0.0,
        end_time=float(times[-1]),
        series={
            "train_loss": Series("train_loss", times, steps, 2.0 + 8.0 * np.exp(-steps / 40)),
            "val_loss": Series("val_loss", DT * val, val, 2.2 + 8.0 * np.exp(-val / 40)),
            "step": Series("step", times, steps, steps),
            "gpu_util": Series("gpu_util", times, steps, np.full(200, 97.0)),
        })


def same(a: Job, b: Job) -> bool:
    if a.series.keys() != b.series.keys():
        return False
    return all(np.array_equal(a.series[k].time, b.series[k].time)
               and np.array_equal(a.series[k].step, b.series[k].step)
               and np.array_equal(a.series[k].value, b.series[k].value, equal_nan=True)
               for k in a.series)


@pytest.mark.parametrize("kind", sorted(INJECTORS))
def test_same_seed_same_fault_and_the_input_is_untouched(kind: str) -> None:
    original = healthy()
    kept = copy.deepcopy(original)
    a, b = inject(original, kind, seed=7), inject(original, kind, seed=7)
    assert same(a.job, b.job)
    assert (a.onset_step, a.onset_time, a.note, a.extra) == (
        b.onset_step, b.onset_time, b.note, b.extra)
    assert same(original, kept) and original.state is JobState.SUCCEEDED
    onsets = {inject(original, kind, seed=s).onset_step for s in range(10)}
    assert len(onsets) > 1  # the seed moves the fault
    assert a.kind == kind and a.job.id == f"run#{kind}" and a.job.tags["injected"] == kind


def test_unknown_fault_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown fault 'oom'; known: stall, pause"):
        inject(healthy(), "oom", seed=1)


# -- stall ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_stall_cuts_every_series_and_leaves_the_job_running(seed: int) -> None:
    out = stall(healthy(), np.random.default_rng(seed))
    assert out.label == "stalled"
    job = out.job
    assert job.state is JobState.RUNNING and job.end_time is None
    assert out.onset_time is not None and job.last_time() == out.onset_time
    assert 0.3 * END - DT <= out.onset_time <= 0.8 * END  # 30-80 % of the run
    for s in job.series.values():
        assert s.time[-1] <= out.onset_time
    assert out.onset_step == job.series["step"].value[-1]
    full = healthy()
    n = len(job.series["train_loss"])
    assert np.array_equal(job.series["train_loss"].value, full.series["train_loss"].value[:n])


def test_stall_is_what_a_stall_watchdog_sees() -> None:
    out = stall(healthy(), np.random.default_rng(3))
    fire = ANCHORS["debugger_stalled_training"]().first_fire(out.job, "train_loss")
    assert fire is not None and fire.time is not None and out.onset_time is not None
    assert 1800 < fire.time - out.onset_time <= 1860
    assert ANCHORS["debugger_stalled_training"]().first_fire(healthy(), "train_loss") is None


# -- pause ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_pause_shifts_later_records_and_keeps_values(seed: int) -> None:
    original = healthy()
    out = pause(original, np.random.default_rng(seed))
    assert out.label == "healthy" and out.onset_time is not None
    gap = out.extra["gap_s"]
    assert 5 * DT <= gap <= 10 * DT  # 5-10x the median interval (above the 120 s floor)
    for k, s in out.job.series.items():
        o = original.series[k]
        assert np.array_equal(s.value, o.value) and np.array_equal(s.step, o.step)
        later = o.time > out.onset_time
        assert later.any() and (~later).any()
        assert np.allclose(s.time[later], o.time[later] + gap)
        assert np.array_equal(s.time[~later], o.time[~later])
    assert out.job.end_time == pytest.approx((original.end_time or 0) + gap)
    assert np.diff(out.job.series["step"].time).max() == pytest.approx(DT + gap)


def test_pause_gap_is_at_least_120_s_on_fast_logs() -> None:
    fast = healthy()
    fast.series = {k: Series(k, s.time / DT, s.step, s.value) for k, s in fast.series.items()}
    out = pause(fast, np.random.default_rng(0))
    assert out.extra["gap_s"] == 120.0


def test_no_pause_is_injected_between_whole_epochs() -> None:
    """A Keras console log's records are whole epochs (step = epoch, one loss each), its
    evaluation inside each: 5-10 epochs of silence is no evaluation or checkpoint pause,
    and is not offered as one that must not fire."""
    epochs = np.arange(1.0, 21.0)
    times = 224.0 * epochs
    job = Job(id="run", clock="elapsed", state=JobState.SUCCEEDED, start_time=0.0,
              end_time=float(times[-1]), series={
                  "loss": Series("loss", times, epochs, 1.0 / epochs),
                  "epoch": Series("epoch", times - 224.0, epochs, epochs)})
    with pytest.raises(ValueError, match=r"cannot inject pause: its records are whole epochs"):
        pause(job, np.random.default_rng(0))
    # the same records with steps of their own are paused as before
    job.series["loss"] = Series("loss", times, 100 * epochs, 1.0 / epochs)
    assert pause(job, np.random.default_rng(0)).extra["gap_s"] >= 5 * 224.0


def test_pause_needs_a_time_axis() -> None:
    with pytest.raises(ValueError, match=r"job 'run': cannot inject pause.*step clock"):
        pause(healthy(clock="step"), np.random.default_rng(0))


# -- divergence -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_divergence_grows_then_turns_nan_where_promised(seed: int) -> None:
    original = healthy()
    out = divergence(original, np.random.default_rng(seed))
    assert out.label == "diverged" and out.onset_step is not None
    k, nan_step = out.onset_step, out.extra["first_nan_step"]
    assert 0.4 * 199 <= k <= 0.8 * 199 + 1
    assert 3 <= nan_step - k <= 8  # 3-8 growing points (one per step here)
    train, before = out.job.series["train_loss"], original.series["train_loss"]
    pre = train.step < k
    assert np.array_equal(train.value[pre], before.value[pre])
    growing = train.value[(train.step >= k) & (train.step < nan_step)]
    ratios = growing[1:] / growing[:-1]
    assert np.all((ratios >= 1.5 - 1e-9) & (ratios <= 3 + 1e-9))
    assert growing[0] > before.value[pre][-1]
    assert np.isnan(train.value[train.step >= nan_step]).all()
    assert np.isfinite(train.value[train.step < nan_step]).all()
    val = out.job.series["val_loss"]
    assert np.isnan(val.value[val.step >= nan_step]).all()
    for name in ("step", "gpu_util"):
        assert np.array_equal(out.job.series[name].value, original.series[name].value)
    fire = KerasTerminateOnNaN().first_fire(out.job, "train_loss")
    assert fire is not None and fire.step == nan_step
    assert out.onset_time == DT * k


# -- spike ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_spike_jumps_then_returns_to_the_original_curve(seed: int) -> None:
    original = healthy()
    out = spike(original, np.random.default_rng(seed))
    assert out.label == "healthy" and out.onset_step is not None
    first, last = out.onset_step, out.extra["last_step"]
    assert 1 <= last - first + 1 <= 3
    for name in ("train_loss", "val_loss"):
        s, o = out.job.series[name], original.series[name]
        hit = (s.step >= first) & (s.step <= last)
        assert np.array_equal(s.value[~hit], o.value[~hit])
        assert np.allclose(s.value[hit] / o.value[hit], out.extra["factor"])
    assert 3 <= out.extra["factor"] <= 10
    assert (out.job.series["train_loss"].step > last).any()  # the curve goes on after it
    assert ANCHORS["keras_terminate_on_nan"]().first_fire(out.job, "train_loss") is None


def test_injectors_refuse_a_run_without_a_loss() -> None:
    job = healthy()
    job.series = {k: s for k, s in job.series.items() if "loss" not in k}
    with pytest.raises(ValueError, match="job 'run': cannot inject divergence: no loss series"):
        divergence(job, np.random.default_rng(0))


# -- real runs --------------------------------------------------------------------------------


@pytest.mark.realdata
def test_injected_faults_on_real_runs(curves_dir: Path) -> None:
    from trainguard.adapters.local import load_run

    stalled = ANCHORS["debugger_stalled_training"]()
    exploding = ANCHORS["debugger_exploding_tensor"]()
    for path in sorted((curves_dir / "modded-nanogpt").glob("*.log"))[:3]:
        loaded: Job = load_run(path)
        # a log cannot say its run is over; these are, so the watchdog stops at the end
        job = dataclasses.replace(loaded, state=JobState.SUCCEEDED, end_time=loaded.last_time())
        assert stalled.first_fire(job, "val_loss") is None, path.name
        assert exploding.first_fire(job, "val_loss") is None, path.name
        for kind in INJECTORS:
            try:
                out: Injected = inject(job, kind, seed=11)
            except ValueError as e:  # a slowdown needs a run longer than some of these
                assert kind in ("slowdown", "straggler") and "too short" in str(e), e
                continue
            assert out.job is not job and out.label in ("stalled", "healthy", "diverged", "slowed")
        cut = inject(job, "stall", seed=11)
        fire = stalled.first_fire(cut.job, "val_loss")
        assert fire is not None and fire.time is not None and cut.onset_time is not None
        assert 1800 < fire.time - cut.onset_time <= 1860, path.name
        paused = inject(job, "pause", seed=11)
        assert stalled.first_fire(paused.job, "val_loss") is None, path.name
        div = inject(job, "divergence", seed=11)
        fire = exploding.first_fire(div.job, "val_loss")
        assert fire is not None and fire.step == div.extra["first_nan_step"], path.name


def test_nanblip_is_one_nonfinite_point_then_the_original_curve() -> None:
    """A lone overflow the loss scaler skipped: healthy, one bad value, the rest intact."""
    from trainguard.bench.inject import inject

    job = _job_for_nanblip()
    out = inject(job, "nanblip", seed=3)
    assert out.label == "healthy" and out.kind == "nanblip"
    before, after = job.series["loss"].value, out.job.series["loss"].value
    bad = ~np.isfinite(after)
    assert bad.sum() == 1
    assert np.array_equal(before[~bad], after[~bad])
    assert inject(job, "nanblip", seed=3).job.series["loss"].value.tobytes() == after.tobytes()


def _job_for_nanblip() -> Job:
    n = 60
    t = np.asarray(1_750_000_000.0 + np.arange(n) * 10.0, dtype=np.float64)
    step = np.arange(n, dtype=float) * 10
    loss = 2 + 8 * np.exp(-step / 150)
    return Job(id="r", start_time=float(t[0]), series={
        "loss": Series("loss", t, step, loss), "step": Series("step", t.copy(), step, step)})


def test_heartbeat_pause_is_excused_by_trainguard_but_not_by_debugger() -> None:
    """A 35-55 min checkpoint with heartbeats: trainguard's stall reads them and stays
    quiet; Debugger's StalledTrainingRule sees no tensor for 30 min and fires."""
    from trainguard.bench.anchors import DebuggerStalledTraining
    from trainguard.checker import Policy, evaluate

    job = _job_for_nanblip()
    out = inject(job, "heartbeat_pause", seed=1)
    assert out.label == "healthy" and 35 * 60 <= out.extra["gap_s"] <= 55 * 60
    beats = out.job.series["heartbeat"]
    assert np.all(np.diff(beats.time) == 30.0)
    mid = float(beats.time[len(beats) // 2])
    finding = [f for f in evaluate([out.job.until(mid)], Policy(), mid) if f.rule == "stall"]
    assert finding == []
    fire = DebuggerStalledTraining().first_fire(out.job, "loss")
    assert fire is not None and out.onset_time is not None
    assert fire.time is not None  # a wall clock
    assert fire.time - out.onset_time >= 1800
