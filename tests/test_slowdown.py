"""The ``slowdown`` rule on curves built here: a sustained slowdown is found and priced,
evaluation and checkpoint pauses are not, a straggler host is named, all hosts slowing
together is said, and a replay (the rule's ``ctx.state``) answers as a fresh judgement."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.told import Teller
from trainguard.checker.evaluate import evaluate
from trainguard.checker.follow import Followers
from trainguard.checker.model import Job, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.slowdown import Slowdown

T0 = 1.7e9
ONSET, SLOW_FOR = 5400.0, 1200.0  # throughput halved from 1.5 h for 20 minutes


def _curve(hours: float = 3.0, every: float = 10.0, steps: float = 50.0, seed: int = 0,
           slow: tuple[float, float, float] | None = (ONSET, SLOW_FOR, 2.0),
           pauses: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Update times and steps: one update of ``steps`` steps every ``every`` s (+-10 %);
    ``slow`` = (from, for, x longer); ``pauses`` = (every, long): an evaluation pause."""
    rng = np.random.default_rng(seed)
    t, s, next_pause = [0.0], [0.0], pauses[0] if pauses else np.inf
    while t[-1] < hours * 3600:
        dt = every * rng.uniform(0.9, 1.1)
        if slow and slow[0] <= t[-1] < slow[0] + slow[1]:
            dt *= slow[2]
        if t[-1] >= next_pause:
            dt += pauses[1] if pauses else 0.0
            next_pause += pauses[0] if pauses else 0.0
        t.append(t[-1] + dt)
        s.append(s[-1] + steps)
    return np.array(t) + T0, np.array(s)


def _job(t: np.ndarray, s: np.ndarray, **kw: object) -> Job:
    return Job(id="job-1", start_time=float(t[0]), hourly_price=32.0,
               series={"step": Series("step", t, s, s)}, **kw)  # type: ignore[arg-type]


def _first_fire(job: Job, rule: Slowdown | None = None) -> tuple[float, object] | None:
    """The first update time at which the rule fires, replaying tick by tick with one
    state as a follower does."""
    rule = rule or Slowdown()
    state: dict[str, object] = {}
    times = job.series["step"].time
    for t in times[2:]:
        cut = job.until(float(t))
        found = rule.check(cut, Context(now=float(t), policy=Policy(), jobs=[cut], state=state))
        if found:
            return float(t), found[0]
    return None


def test_halved_throughput_is_found_within_15_minutes_and_priced() -> None:
    t, s = _curve()
    job = _job(t, s, planned_steps=int(s[-1] * 2))
    fire = _first_fire(job)
    assert fire is not None
    when, f = fire
    assert 0 < when - (T0 + ONSET) <= 15 * 60
    assert f.rule == "slowdown" and f.severity.value == "warning"  # type: ignore[attr-defined]
    ev = f.evidence  # type: ignore[attr-defined]
    assert 0.4 < ev["ratio"] < 0.6
    assert ev["extra_hours_to_end"] > 0 and ev["extra_usd"] > 32.0 * ev["extra_hours_to_end"]
    assert "no per-host data" in f.message  # type: ignore[attr-defined]
    assert abs(f.started_at - (T0 + ONSET)) <= 120  # type: ignore[attr-defined]


def test_finding_clears_once_the_job_is_back_at_speed() -> None:
    t, s = _curve()
    job = _job(t, s)
    rule = Slowdown()
    during = job.until(T0 + ONSET + SLOW_FOR - 30)
    after = job.until(T0 + ONSET + SLOW_FOR + 600)
    assert rule.check(during, Context(now=T0 + ONSET + SLOW_FOR, policy=Policy(), jobs=[]))
    assert not rule.check(after, Context(now=T0 + ONSET + SLOW_FOR + 600, policy=Policy(),
                                         jobs=[]))


def test_evaluation_and_checkpoint_pauses_are_not_a_slowdown() -> None:
    # a 4-minute pause every 15 minutes, and a 10-minute checkpoint: short and periodic
    t, s = _curve(slow=None, pauses=(900.0, 240.0))
    assert _first_fire(_job(t, s)) is None
    t, s = _curve(slow=None, pauses=(3600.0, 600.0), seed=3)
    assert _first_fire(_job(t, s)) is None


def test_noisy_healthy_speed_and_slow_logging_are_quiet() -> None:
    rng = np.random.default_rng(7)
    t, s = _curve(slow=None, every=60.0)
    s = np.cumsum(rng.uniform(20, 80, len(s)))  # +-60 % per update, no sustained drop
    assert _first_fire(_job(t, s)) is None


def test_a_slowdown_too_short_to_be_sustained_is_not_found() -> None:
    t, s = _curve(slow=(ONSET, 300.0, 2.0))
    assert _first_fire(_job(t, s)) is None


def test_a_resume_from_a_checkpoint_is_not_a_slowdown() -> None:
    t, s = _curve(slow=None)
    back = len(t) // 2
    s = s.copy()
    s[back:] -= 2000.0  # the step goes back: resumed from a checkpoint 40 updates earlier
    t = t.copy()
    t[back:] += 900.0  # after 15 minutes down
    assert _first_fire(_job(t, s)) is None


def test_step_clock_has_no_speed() -> None:
    t, s = _curve()
    job = _job(t, s)
    job.clock = "step"
    assert Slowdown().check(job, Context(now=float(t[-1]), policy=Policy(), jobs=[])) == []


def _hosts(t_end: float, straggler: str | None,
           every: float = 60.0) -> dict[str, dict[str, Series]]:
    """Four hosts' GPU use: ~90 %; during the slowdown the straggler's GPUs idle (its input
    stalls) while the others barely move, or (no straggler) all drop together."""
    rng = np.random.default_rng(1)
    times = np.arange(T0, t_end, every)
    out = {}
    for h in ("algo-1", "algo-2", "algo-3", "algo-4"):
        v = rng.normal(90, 2, len(times))
        slow = (times >= T0 + ONSET) & (times < T0 + ONSET + SLOW_FOR)
        if straggler is None:
            v[slow] *= 0.5
        elif h == straggler:
            v[slow] = rng.normal(30, 3, int(slow.sum()))
        out[h] = {"gpu_util": Series("gpu_util", times, np.full(len(times), np.nan), v)}
    return out


def test_a_straggler_host_is_named() -> None:
    t, s = _curve()
    job = _job(t, s, hosts=_hosts(float(t[-1]), "algo-3"))
    fire = _first_fire(job)
    assert fire is not None
    f = fire[1]
    assert f.evidence["straggler"] == "algo-3"  # type: ignore[attr-defined]
    assert "host algo-3 is the straggler" in f.message  # type: ignore[attr-defined]


def test_all_hosts_slowing_together_is_said() -> None:
    t, s = _curve()
    job = _job(t, s, hosts=_hosts(float(t[-1]), None))
    fire = _first_fire(job)
    assert fire is not None
    f = fire[1]
    assert "straggler" not in f.evidence  # type: ignore[attr-defined]
    assert "all 4 hosts slowed together" in f.message  # type: ignore[attr-defined]


def test_a_throughput_series_is_used_when_the_job_logs_one() -> None:
    """A job whose batch grows halves its steps per second while its samples per second
    hold: the logged ``throughput`` is what is judged."""
    t, s = _curve()  # the steps slow down ...
    samples = np.random.default_rng(2).normal(4000, 100, len(t))  # ... samples/s do not
    job = _job(t, s)
    job.series["throughput"] = Series("throughput", t, s, samples)
    assert _first_fire(job) is None
    samples[(t >= T0 + ONSET) & (t < T0 + ONSET + SLOW_FOR)] /= 2
    fire = _first_fire(job)
    assert fire is not None and fire[1].evidence["measured"] == "rate"  # type: ignore[attr-defined]


def _followed_as_fresh(job: Job, times: Any, told: bool = False
                      ) -> tuple[list[str], Followers, Slowdown]:
    """Judges ``job`` at each of ``times`` through followers (told what changed between
    ticks, as a replay tells them, with ``told``) and afresh; asserts both give the same
    findings, messages and evidence. Returns the messages followed, the followers and the
    rule."""
    policy, rule, followers = Policy(), Slowdown(), Followers()
    teller = Teller(followers)
    fired: list[str] = []
    for now in times:
        now = float(now)
        cut = teller.cut(job, now) if told else job.until(now)
        followed = [(f.message, repr(f.evidence)) for f in evaluate(
            [cut], policy, now, rules=[rule], followers=followers)]
        assert followed == [(f.message, repr(f.evidence)) for f in evaluate(
            [cut], policy, now, rules=[rule])], now
        fired += [m for m, _ in followed]
    return fired, followers, rule


def test_a_replay_answers_as_judging_each_cut_afresh() -> None:
    """The state kept between ticks (``ctx.state``) changes nothing but the work."""
    t, s = _curve()
    _followed_as_fresh(_job(t, s), T0 + np.arange(ONSET - 600, ONSET + 2400, 97.0))


@pytest.mark.parametrize("nan_steps", [False, True])
def test_progress_read_from_a_loss_series_agrees_followed_and_fresh(nan_steps: bool) -> None:
    """Without a ``step`` series the progress is the longest series with steps, found by
    each record's step once when followed (``cost.progress`` with the rule's state): the
    same findings as judging each cut afresh, where every step is finite and where some
    are not."""
    t, s = _curve()
    steps = s.copy()
    if nan_steps:
        steps[::7] = np.nan  # records that carried no step
    loss = 2.0 + 1.0 / (1.0 + s / 1000.0)
    val = slice(None, None, 25)
    job = Job(id="job-1", start_time=float(t[0]), hourly_price=32.0, series={
        "loss": Series("loss", t, steps, loss),
        "val_loss": Series("val_loss", t[val], steps[val], loss[val] + 0.1)})
    fired, _, _ = _followed_as_fresh(job, T0 + np.arange(ONSET - 600, ONSET + 2400, 61.0))
    assert fired, "the halved throughput is found from the loss series' steps"


@pytest.mark.parametrize("straggler", [None, "algo-3"], ids=["all-hosts", "straggler"])
def test_a_replay_told_what_changed_calls_it_once_a_block_and_answers_as_fresh(
        straggler: str | None) -> None:
    """Told what changed between ticks, as a replay tells its followers, the rule is not
    called before the next block of time begins (no record of it can be in a cut before
    then), and every tick's findings, messages and evidence (the per-host change) are a
    fresh judgement's."""
    t, s = _curve()
    job = _job(t, s, hosts=_hosts(float(t[-1]), straggler))
    fired, followers, rule = _followed_as_fresh(job, t, told=True)  # a tick at every update
    assert fired
    blocks = (t[-1] - t[0]) / rule.params.block_seconds
    assert followers.runs <= blocks + 2 < len(t) / 5


def _epochs(n: int, epoch_s: float = 305.0, val_s: float = 800.0,
            slow_from: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """As Lightning logs to TensorBoard: one record at each epoch's end (step N) and the
    learning-rate monitor's at the next step's start a moment later (step N+1: 1-5 ms,
    one in ten 0.35 s, as a held-out run has them); 1,103 steps an epoch of ``epoch_s``,
    every second epoch ``val_s`` longer (its validation). From epoch ``slow_from`` on,
    every epoch takes twice as long."""
    rng = np.random.default_rng(0)
    t, s, now = [0.0], [0.0], 0.0
    for e in range(1, n + 1):
        took = epoch_s + (val_s if e % 2 == 0 else 0.0)
        now += took * (2.0 if slow_from is not None and e >= slow_from else 1.0)
        t += [now, now + float(rng.choice([0.001, 0.0025, 0.005, 0.005, 0.35]))]
        s += [1103.0 * e, 1103.0 * e + 1]
    return np.array(t) + T0, np.array(s)


def test_records_of_one_moment_are_no_speed() -> None:
    """A held-out Lightning run (one record per epoch, two at its end) got "throughput
    101 steps/s, 20 % of the job's own baseline 499": one step in a few milliseconds was
    read as speed. Measured from the last update at least ``span_seconds`` before, the
    run's speed is its epochs', and its validation epochs are pauses, not a slowdown."""
    t, s = _epochs(120)
    assert _first_fire(_job(t, s)) is None


def test_a_slowdown_of_an_epoch_logged_run_is_still_found() -> None:
    """The control: the same logging with one-minute epochs and no validation, every epoch
    twice as long from epoch 90 on, is found within 15 minutes."""
    t, s = _epochs(120, epoch_s=60.0, val_s=0.0, slow_from=90)
    fired = _first_fire(_job(t, s))
    assert fired is not None
    onset = float(t[2 * 89])  # the end of epoch 89, where the slow epochs begin
    assert onset < fired[0] <= onset + 900
