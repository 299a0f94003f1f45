"""The replay engine: ticks, first fire, escalation and the savings arithmetic."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.afresh import histories, judged_afresh
from trainguard.checker.follow import Followers
from trainguard.checker.model import Finding, Job, JobState, Series, Severity
from trainguard.checker.policy import Cost, Policy
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.replay import (
    LIVE_TICK_S,
    MAX_AUTO_TICKS,
    ReplayResult,
    first_record,
    replay,
    tick_times,
)


@dataclass
class _ThresholdParams:
    warn_above: float = param(5.0, "warning when the last loss is above this")


class Threshold(Rule):
    """A rule whose behaviour the test knows exactly: warning while the loss is above
    ``warn_above``, critical from the first non-finite loss on."""

    name = "threshold"
    Params = _ThresholdParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        s = job.series.get("loss")
        if s is None or not len(s):
            return []
        bad = np.flatnonzero(~np.isfinite(s.value))
        if len(bad):
            i = int(bad[0])
            return [Finding(job.id, self.name, Severity.CRITICAL, "loss is not finite",
                            started_at=float(s.time[i]), step=float(s.step[i]),
                            evidence={"kind": "loss"})]
        if s.value[-1] > self.params.warn_above:
            return [Finding(job.id, self.name, Severity.WARNING, "loss is high",
                            started_at=float(s.time[-1]), step=float(s.step[-1]),
                            evidence={"kind": "loss"})]
        return []


def _run(clock: str = "elapsed", high_from: float = 600.0, nan_from: float = 1000.0,
         end: float = 3600.0, every: float = 10.0) -> Job:
    """A run logging every ``every`` s (one step per record): a falling loss, too high
    from ``high_from``, NaN from ``nan_from``, last record at ``end``."""
    t = np.arange(0.0, end + every / 2, every)
    step = t / every
    loss = 4.0 / (1.0 + step / 10)
    loss[t >= high_from] = 7.0
    loss[t >= nan_from] = np.nan
    job = Job(id="run-1", clock=clock, state=JobState.RUNNING)  # type: ignore[arg-type]
    job.series["loss"] = Series("loss", t, step, loss)
    job.series["step"] = Series("step", t, step, step)
    return job


def test_ticks_run_from_first_record_to_one_tick_past_the_last() -> None:
    assert tick_times(100.0, 200.0, 60.0).tolist() == [100.0, 160.0, 220.0]
    assert tick_times(100.0, 220.0, 60.0).tolist() == [100.0, 160.0, 220.0]
    assert tick_times(5.0, 5.0, 60.0).tolist() == [5.0]
    with pytest.raises(ValueError, match="tick"):
        tick_times(0.0, 10.0, 0.0)


def test_first_fire_and_escalation_land_on_the_right_ticks() -> None:
    result = replay(_run(), Policy(), 60.0, rules=[Threshold()])
    assert result.unit == "s"
    assert result.ticks == 61  # 0, 60, ..., 3600
    [h] = result.histories  # one key: warning then critical is one finding escalating
    assert h.key == "run-1/threshold/loss"
    # the loss turns high at t=600, a tick: seen at once, at step 60
    assert (h.first.time, h.first.step, h.first.severity) == (600.0, 60.0, Severity.WARNING)
    # NaN from t=1000: the first tick that sees it is t=1020 (step 102)
    [esc] = h.escalations
    assert (esc.time, esc.step, esc.severity) == (1020.0, 102.0, Severity.CRITICAL)
    assert h.worst is Severity.CRITICAL
    assert h.last_seen.time == 3600.0
    assert h.finding.started_at == 1000.0  # the rule's own onset, kept beside the tick


def test_savings_are_remaining_time_times_price_and_gpus() -> None:
    job = _run()
    job.hourly_price, job.gpus_per_instance, job.instance_count = 3.0, 4, 2
    result = replay(job, Policy(), 60.0, rules=[Threshold()])
    s = result.savings
    assert s is not None
    hours = (3600.0 - 1020.0) / 3600.0  # stopped at the first critical tick, ran to 3600
    assert s.stop_time == 1020.0 and s.end_time == 3600.0
    assert s.remaining_hours == pytest.approx(hours)
    assert s.remaining_steps == 360 - 102
    assert s.hourly_usd == pytest.approx(6.0)  # two instances at $3
    assert s.usd == pytest.approx(6.0 * hours)
    assert s.gpu_hours == pytest.approx(8 * hours)
    assert result.histories[0].savings == s


def test_savings_priced_by_the_policy_when_the_job_has_no_price() -> None:
    policy = Policy(cost=Cost(default_hourly_usd=10.0))
    s = replay(_run(), policy, 60.0, rules=[Threshold()]).savings
    assert s is not None and s.gpu_hours is None
    assert s.usd == pytest.approx(10.0 * (3600.0 - 1020.0) / 3600.0)


def test_a_run_that_never_goes_critical_saves_nothing() -> None:
    result = replay(_run(nan_from=math.inf), Policy(), 60.0, rules=[Threshold()])
    assert [h.worst for h in result.histories] == [Severity.WARNING]
    assert result.savings is None and result.first_critical is None


def test_step_clock_ticks_in_steps_and_saves_steps_not_dollars() -> None:
    job = _run(clock="step", every=1.0, high_from=50.0, nan_from=95.0, end=300.0)
    job.hourly_price = 5.0
    result = replay(job, Policy(), 10.0, rules=[Threshold()])
    assert result.unit == "step"
    [h] = result.histories
    assert h.first.time == 50.0 and h.escalations[0].time == 100.0
    s = result.savings
    assert s is not None
    assert s.remaining_steps == 200.0
    assert s.remaining_hours is None and s.usd is None


def test_replay_with_the_real_rules_catches_a_nan_divergence_soon_after_onset() -> None:
    result = replay(_run(high_from=math.inf), Policy(), 60.0)
    crit = result.first_critical
    assert crit is not None and crit.rule == "divergence"
    fire = crit.first_critical
    assert fire is not None and 1000.0 <= fire.time <= 1000.0 + 3 * 60.0


# --- the schedule and the cost of long runs -----------------------------------------------


def test_by_default_a_run_is_ticked_as_the_live_watchdog_and_fires_timed_back() -> None:
    # records every 10 s: ticks every 60 s (the live cadence), fires on their records
    result = replay(_run(every=10.0, high_from=605.0, nan_from=1005.0), Policy(),
                    rules=[Threshold()])
    assert result.tick == LIVE_TICK_S and result.ticks == 61 and result.timed_back
    [h] = result.histories
    assert (h.first.time, h.escalations[0].time) == (610.0, 1010.0)
    # a run logging every 5 min is ticked at each record
    assert replay(_run(every=300.0), Policy(), rules=[Threshold()]).tick == 300.0
    # on a step clock: every logging interval
    step = replay(_run(clock="step", every=2.0, end=600.0), Policy(), rules=[Threshold()])
    assert step.tick == 2.0 and step.ticks == 301


def _finishes(work: Callable[[], ReplayResult]) -> ReplayResult:
    """``work``'s result; a replay that never ends (the bug this guards against) fails
    the test instead of hanging the suite: it runs in a daemon thread, given 120 s."""
    out: list[ReplayResult] = []
    t = threading.Thread(target=lambda: out.append(work()), daemon=True)
    t.start()
    t.join(120.0)
    assert out, "the replay did not finish"
    return out[0]


def test_a_finding_on_the_first_record_is_timed_to_it_on_a_time_axis() -> None:
    # Timing a fire back halves the silence before its record, down to a second; before
    # the first record there is none, and the halving once never ended there.
    result = _finishes(lambda: replay(_run(every=10.0, high_from=0.0), Policy(),
                                      rules=[Threshold()]))
    [h] = result.histories
    assert (h.first.time, h.first.severity) == (0.0, Severity.WARNING)
    # A YOLO run whose first validation loss is NaN (its first epochs often are) on its
    # elapsed-seconds clock, with the real rules: the warning is on that first record.
    epochs = np.arange(1.0, 31.0)
    yolo = Job(id="yolo", clock="elapsed", state=JobState.RUNNING)  # type: ignore[arg-type]
    yolo.series["train/box_loss"] = Series("train/box_loss", epochs * 90.0, epochs,
                                           1.0 + 1.0 / epochs)
    yolo.series["val/box_loss"] = Series("val/box_loss", epochs * 90.0, epochs,
                                         np.where(epochs <= 2, np.nan, 1.2 + 1.0 / epochs))
    fires = [h for h in _finishes(lambda: replay(yolo, Policy())).histories
             if h.rule == "divergence" and h.first.time == 90.0]
    assert fires and all(h.worst == Severity.WARNING for h in fires)


def test_a_long_run_is_not_refused_its_ticks_are_bounded_and_fires_land_on_their_record() -> None:
    # 50,000 records a second apart, NaN from the 41,234th: one tick per record would be
    # 50 times MAX_AUTO_TICKS
    job = _run(every=1.0, high_from=math.inf, nan_from=41_234.0, end=49_999.0)
    result = replay(job, Policy(), rules=[Threshold()])
    assert result.ticks <= MAX_AUTO_TICKS and result.tick > 1.0
    [h] = result.histories
    assert (h.first.time, h.first.step, h.first.severity) == (41_234.0, 41_234.0,
                                                              Severity.CRITICAL)
    s = result.savings
    assert s is not None and s.stop_time == 41_234.0


def test_a_given_tick_is_honoured_and_its_count_checked_before_any_judging() -> None:
    followers = Followers()
    with pytest.raises(ValueError, match=r"makes 3,600,000,001 ticks.*at most 10,000,000"):
        replay(_run(), Policy(), 1e-6, rules=[Threshold()], followers=followers)
    assert followers.calls == 0
    result = replay(_run(every=1.0, end=9_999.0), Policy(), 1.0, rules=[Threshold()])
    assert result.ticks == 10_000 and not result.timed_back  # more than MAX_AUTO_TICKS: fine


def test_following_the_rules_gives_what_running_them_at_every_tick_gives(
        curves_dir: Path) -> None:
    """On real runs of both corpora, with the default policy."""
    from trainguard.adapters.local import load_run
    from trainguard.bench.labels import read_labels
    from trainguard.config import default_policy

    runs = curves_dir.parent / "runs"
    if not (runs / "labels.csv").exists():
        pytest.skip(f"{runs}/labels.csv not found (the shared runs corpus)")
    rows = read_labels(runs / "labels.csv")
    picked = [r for r in rows if r.label in ("spiky", "diverged", "flat", "overfit")][::3]
    picked += [r for r in read_labels(curves_dir / "labels.csv")][::60]
    policy = default_policy()
    compared = 0
    for row in picked:
        job = load_run(row.path, definitions=list(row.metrics) or None, fmt=row.format)
        first, last = first_record(job), job.last_time()
        if first is None or last is None or last - first > 5_000:
            continue  # the slow way is quadratic: the shorter runs make the point
        compared += 1
        tick = (last - first) / 200 or 1.0
        result = replay(job, policy, tick)
        start, end = first_record(job), job.last_time()
        assert start is not None and end is not None
        assert histories(result) == judged_afresh(
            job, policy, tick_times(start, end, tick).tolist()), row.run
        assert result.rule_runs < result.rule_calls
    assert compared >= 8


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.SUCCEEDED, JobState.STOPPING])
def test_a_cut_is_what_job_until_gives(state: JobState) -> None:
    from trainguard.checker.model import LogLine
    from trainguard.replay import Cuts

    job = _run(end=300.0)
    job.state, job.end_time = state, 300.0
    job.restart_times, job.restarts = [50.0, 250.0], 2
    for logs in ([LogLine(float(x), f"l{x}") for x in range(0, 300, 7)],
                 [LogLine(20.0, "late"), LogLine(10.0, "early")]):  # out of order: filtered
        job.logs = logs
        cuts = Cuts(job)
        for t in (-1.0, 0.0, 55.0, 299.0, 300.0, 1e9):
            want, got = job.until(t), cuts(t)
            assert {k: v for k, v in vars(got).items() if k != "series"} == \
                   {k: v for k, v in vars(want).items() if k != "series"}
            assert got.series.keys() == want.series.keys()
            for k, s in want.series.items():
                assert s.name == got.series[k].name
                for a in ("time", "step", "value"):
                    np.testing.assert_array_equal(getattr(got.series[k], a), getattr(s, a))
