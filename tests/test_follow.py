"""``checker.follow``: a rule judging one job tick after tick is re-run only when what it
read has changed, and otherwise answers exactly as re-running it would."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from trainguard.checker.evaluate import evaluate
from trainguard.checker.follow import STABLE, Band, Followers
from trainguard.checker.model import Finding, Job, JobState, LogLine, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context, Rule
from trainguard.replay import replay


@dataclass
class _NoParams:
    pass


class _Counting(Rule):
    """A rule that counts its own runs and reports what it saw."""

    Params = _NoParams
    name: ClassVar[str] = "counting"
    runs = 0

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        type(self).runs += 1
        return [Finding(job.id, self.name, Severity.WARNING, self.seen(job, ctx),
                        started_at=0.0, evidence={"kind": "seen"})]

    def seen(self, job: Job, ctx: Context) -> str:
        raise NotImplementedError


class ValOnly(_Counting):
    name = "val_only"

    def seen(self, job: Job, ctx: Context) -> str:
        s = job.series.get("val_loss")
        return f"{len(s) if s is not None else 0} val points"


class Clock(_Counting):
    name = "clock"

    def seen(self, job: Job, ctx: Context) -> str:
        return f"now {ctx.now:g}"


class Every(_Counting):
    name = "every"

    def seen(self, job: Job, ctx: Context) -> str:
        return f"{sum(len(s) for s in job.series.values())} points"


class Logs(_Counting):
    name = "logs"

    def seen(self, job: Job, ctx: Context) -> str:
        return f"{len(job.logs)} lines"


def _job() -> Job:
    """300 s of training: a loss every second, a val_loss every 100 s, a log line every 50 s."""
    t = np.arange(300.0)
    v = np.arange(0.0, 300.0, 100.0)
    return Job(id="run", clock="elapsed", state=JobState.SUCCEEDED, start_time=0.0,
               end_time=299.0, hourly_price=36.0,
               series={"loss": Series("loss", t, t, 1 / (1 + t)),
                       "val_loss": Series("val_loss", v, v, 1 / (1 + v))},
               logs=[LogLine(float(x), f"line {x}") for x in range(0, 300, 50)])


def _tick_by_tick(rules: list[Rule], followers: Followers | None) -> list[list[tuple[str, str]]]:
    job, policy = _job(), Policy()
    out = []
    for t in range(300):
        found = evaluate([job.until(float(t))], policy, float(t), rules=rules,
                         followers=followers)
        out.append([(f.rule, f.message) for f in found])
    return out


@pytest.mark.parametrize(("rule", "runs"), [
    # one run per new val_loss record, and one at the last tick, where the job's end shows
    (ValOnly, 3 + 1),
    (Logs, 6 + 1),  # one per new log line, and the last tick
    (Clock, 300),  # the clock moves at every tick
    (Every, 300),  # a new loss record at every tick
])
def test_a_rule_runs_only_when_what_it_read_changed(rule: type[_Counting], runs: int) -> None:
    rule.runs = 0
    followers = Followers()
    followed = _tick_by_tick([rule()], followers)
    assert rule.runs == runs and followers.runs == runs and followers.calls == 300
    rule.runs = 0
    assert followed == _tick_by_tick([rule()], None)  # the same answers as running it each time
    assert rule.runs == 300


def test_reused_findings_are_priced_afresh_at_each_tick() -> None:
    """evaluate sets money on the findings it returns: a reused finding is a copy, so the
    money spent since its onset keeps growing with the clock."""
    job, policy = _job(), Policy()
    followers = Followers()
    spent = []
    for t in (150.0, 199.0):  # no new val_loss between the two ticks: the rule is not re-run
        [f] = evaluate([job.until(t)], policy, t, rules=[ValOnly()], followers=followers)
        spent.append(f.burnt_usd)
    assert followers.runs == 1
    assert spent[0] == pytest.approx(36 * 150 / 3600) and spent[1] == pytest.approx(36 * 199 / 3600)


def test_a_rule_looking_at_other_jobs_is_always_re_run() -> None:
    class Peers(_Counting):
        name = "peers"

        def seen(self, job: Job, ctx: Context) -> str:
            return f"{len(ctx.jobs)} jobs"

    Peers.runs = 0
    _tick_by_tick([Peers()], Followers())
    assert Peers.runs == 300


def test_a_change_of_state_re_runs_the_rule() -> None:
    """A job that stopped running: the rule is asked again (and, as most rules judge
    running jobs only, says nothing)."""
    ValOnly.runs = 0
    job, policy, followers = _job(), Policy(), Followers()
    running = job.until(250.0)
    assert evaluate([running], policy, 250.0, rules=[ValOnly()], followers=followers)
    stopped = Job(**{**running.__dict__, "state": JobState.STOPPED})
    assert evaluate([stopped], policy, 250.0, rules=[ValOnly()], followers=followers) == []
    assert followers.calls == 2 and followers.runs == 2


class RunningMax(Rule):
    """A rule that keeps, in ``ctx.state``, the loss's maximum over the records it has
    seen, and warns while the last loss is that maximum: linear work over a replay."""

    Params = _NoParams
    name = "running_max"
    touched = 0  # records looked at

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        s = job.series["loss"]
        state = ctx.state if ctx.state is not None else {}
        seen, best = state.get("seen", 0), state.get("best", -np.inf)
        if seen > len(s):  # not a continuation of what was seen: start over
            seen, best = 0, -np.inf
        new = s.value[seen:]
        type(self).touched += len(new)
        if len(new):
            best = max(best, float(new.max()))
        state["seen"], state["best"] = len(s), best
        if len(s) and s.value[-1] >= best:
            return [Finding(job.id, self.name, Severity.WARNING, f"new high {best:g}",
                            evidence={"kind": "max"})]
        return []


def test_a_rule_with_state_does_linear_work_and_answers_as_without() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(5_000.0)
    job = Job(id="run", clock="step", state=JobState.RUNNING,
              series={"loss": Series("loss", t, t, rng.standard_normal(len(t)))})
    policy = Policy()

    def replay(followers: Followers | None) -> list[list[str]]:
        return [[f.message for f in evaluate([job.until(x)], policy, x, rules=[RunningMax()],
                                             followers=followers)] for x in t.tolist()]

    RunningMax.touched = 0
    followed = replay(Followers())
    assert RunningMax.touched == len(t)  # each record looked at once
    RunningMax.touched = 0
    assert replay(None) == followed  # judged once each time: the same answers
    assert RunningMax.touched == len(t) * (len(t) + 1) // 2  # the square of the length


def test_reading_the_log_lines_backwards_counts_as_reading_them() -> None:
    class LastLine(_Counting):
        name = "last_line"

        def seen(self, job: Job, ctx: Context) -> str:
            return next((line.text for line in reversed(job.logs)), "")

    LastLine.runs = 0
    followers = Followers()
    followed = _tick_by_tick([LastLine()], followers)
    assert LastLine.runs == 6 + 1
    assert followed == _tick_by_tick([LastLine()], None)


def test_the_logs_rule_followed_reads_each_line_once_and_finds_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``logs`` rule over a 2,000-line log with failure lines here and there, tick
    by tick: the same findings followed as judged afresh, each line matched once. (The
    signature matcher is wrapped to count its calls; it still does the matching.)"""
    from trainguard.checker.rules import logs as logs_rule
    from trainguard.checker.rules.logs import Logs
    from trainguard.checker.signatures import match as real

    calls = 0

    def counting(text: str) -> Any:
        nonlocal calls
        calls += 1
        return real(text)

    monkeypatch.setattr(logs_rule, "match", counting)
    bad = {300: "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
           900: "Traceback (most recent call last):",
           1500: "RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB"}
    lines = [LogLine(float(i), bad.get(i, f"step {i} loss 1.0")) for i in range(2_000)]
    t = np.arange(2_000.0)
    job = Job(id="run", clock="elapsed", state=JobState.RUNNING, logs=lines,
              series={"loss": Series("loss", t, t, np.ones(len(t)))})
    policy = Policy()

    def replay(followers: Followers | None) -> list[list[tuple[str, str, str]]]:
        return [[(f.severity.value, f.message, repr(f.evidence)) for f in evaluate(
            [job.until(x)], policy, x, rules=[Logs()], followers=followers)]
            for x in range(0, 2_000, 5)]

    followed = replay(Followers())
    assert calls == 1_996  # every line up to the last tick (1,995), matched once
    assert replay(None) == followed
    assert followed[-1] and "2 line(s)" in followed[-1][0][1]


class Banded(_Counting):
    """Says whether any loss so far is outside [1, 10] (or, with ``nonfinite``, finite
    and outside it), and that this cannot change while new losses stay within the band."""

    name = "banded"
    nonfinite = False

    def seen(self, job: Job, ctx: Context) -> str:
        v = job.series["loss"].value
        ok = (v >= 1) & (v <= 10)
        if self.nonfinite:
            ok |= ~np.isfinite(v)
        if ctx.state is not None:
            ctx.state[STABLE] = {"loss": Band(math.inf, 1.0, 10.0, self.nonfinite)}
        return f"{int((~ok).sum())} outside"


class BandedNonfinite(Banded):
    name = "banded_nonfinite"
    nonfinite = True


@pytest.mark.parametrize("rule", [Banded, BandedNonfinite])
def test_a_rule_banding_its_series_runs_only_when_a_value_leaves_the_band(
        rule: type[Banded]) -> None:
    """A replay at one tick per record of a loss within [1, 10] but for a 50 (record 100)
    and a NaN (record 200): the rule runs at its first tick and at each of those records
    (the NaN only without ``nonfinite``), and ends with the findings of a fresh judgement."""
    t = np.arange(300.0)
    loss = 2 + np.sin(t)
    loss[100], loss[200] = 50.0, np.nan
    job = Job(id="run", clock="step", state=JobState.RUNNING, start_time=0.0,
              series={"loss": Series("loss", t, t, loss)})
    rule.runs = 0
    followers = Followers()
    result = replay(job, Policy(), 1.0, rules=[rule()], followers=followers)
    assert result.ticks == 300
    assert rule.runs == 1 + (1 if rule.nonfinite else 2)
    final = [f.message for f in evaluate([job], Policy(), 299.0, rules=[rule()])]
    assert final == (["1 outside"] if rule.nonfinite else ["2 outside"])
    # what the replay said at the end is what a fresh judgement says
    assert [h.finding.message for h in result.histories] == final


class Rate(_Counting):
    name = "rate"

    def seen(self, job: Job, ctx: Context) -> str:
        from trainguard.checker.metrics import learning_rate, warming_up

        lr = learning_rate(job)
        return f"{len(lr) if lr is not None else 0} rates, warming up {warming_up(job)}"


def test_looking_up_the_learning_rate_reads_only_the_rates() -> None:
    """``plateau`` asks for the learning rate at each judgement: looking it up by name
    must not count as reading every series (a replay of a million records re-ran plateau
    at every record, 36 s instead of 3 s, while the lookup read them all). The job logs
    no rate, so a new loss record changes nothing the rule read; a rate would."""
    Rate.runs = 0
    followers = Followers()
    _tick_by_tick([Rate()], followers)
    assert Rate.runs == 1 + 1  # the first tick, and the last (the job's end shows)
