"""The replay machinery at one tick per record: cuts made at planned ticks (record counts
found a chunk of ticks at a time) are what ``Job.until`` gives, also when other cuts come
in between (a fire timed back); followers whose input did not change answer together,
each tick with its own copies, in the order the rules run without followers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from trainguard.checker.evaluate import evaluate
from trainguard.checker.follow import Followers
from trainguard.checker.model import Finding, Job, JobState, LogLine, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.rules.base import Context, Rule
from trainguard.replay import Cuts, replay, tick_times


def _job(n: int = 9_000) -> Job:
    t = np.arange(n, dtype=np.float64) * 2.0
    val = np.arange(0, n, 50)
    return Job(id="j", clock="elapsed", state=JobState.SUCCEEDED, start_time=0.0,
               end_time=float(t[-1]),
               series={"loss": Series("loss", t, t, 1.0 / (1.0 + t)),
                       "val_loss": Series("val_loss", t[val], t[val], 2.0 / (1.0 + t[val]))},
               logs=[LogLine(float(x), f"line {x}") for x in t[::7]])


def _same(a: Job, b: Job) -> None:
    assert {k: v for k, v in vars(a).items() if k not in ("series", "logs")} == \
           {k: v for k, v in vars(b).items() if k not in ("series", "logs")}
    assert [line.time for line in a.logs] == [line.time for line in b.logs]
    assert a.series.keys() == b.series.keys()
    for k, s in b.series.items():
        for attr in ("time", "step", "value"):
            np.testing.assert_array_equal(getattr(a.series[k], attr), getattr(s, attr))


def test_planned_cuts_with_other_cuts_between_are_what_until_gives() -> None:
    job = _job()
    times = tick_times(0.0, float(job.series["loss"].time[-1]), 3.0)
    cuts = Cuts(job)
    cuts.CHUNK = 500  # several chunks
    cuts.plan(times)
    rng = np.random.default_rng(0)
    for i, t in enumerate(times.tolist()):
        _same(cuts(t), job.until(t))
        if i % 97 == 0:  # a fire timed back: a cut at an earlier record, off the plan
            back = float(rng.uniform(0.0, t + 1.0))
            _same(cuts(back), job.until(back))


@dataclass
class _NoParams:
    pass


class _Standing(Rule):
    """Warns from t >= 100 on: a finding that stands for the rest of the run."""

    name = "standing"
    Params = _NoParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        s = job.series["val_loss"]
        if len(s) and s.time[-1] >= 100.0:
            return [Finding(job.id, self.name, Severity.WARNING, "stands",
                            evidence={"kind": "x", "n": 1})]
        return []


class _Late(_Standing):
    """Warns at the last records only: run at every tick (it reads the loss)."""

    name = "late"

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        s = job.series["loss"]
        if len(s) and s.time[-1] >= 17_000.0:
            return [Finding(job.id, self.name, Severity.WARNING, "late", evidence={})]
        return []


def test_followers_answer_each_tick_with_their_own_copies_in_rule_order() -> None:
    job = _job()
    rules: list[Rule] = [_Late(), _Standing()]
    policy = Policy()
    cuts, followers = Cuts(job), Followers()
    times = tick_times(0.0, float(job.series["loss"].time[-1]), 2.0)
    cuts.plan(times)
    before: float | None = None
    for t in times.tolist():
        cut = cuts(t)
        followers.changed = cuts.changed(before, t) if before is not None else None
        got = evaluate([cut], policy, t, rules=rules, followers=followers)
        before = t
        want = evaluate([job.until(t)], policy, t, rules=rules)
        assert [(f.rule, f.message, f.evidence) for f in got] == \
               [(f.rule, f.message, f.evidence) for f in want]
        for f in got:  # what a caller does to a finding is not kept for the next tick
            f.evidence["n"] = -1
            f.message = "changed"
    standing = followers.by[(job.id, "standing")]
    assert standing.runs < len(times) / 40  # re-run only at new evaluations


def test_a_standing_finding_is_last_seen_at_the_last_tick() -> None:
    job = _job(2_000)
    result = replay(job, Policy(), 2.0, rules=[_Standing()])
    (h,) = result.histories
    assert h.first.time == 100.0 and h.last_seen.time == float(job.series["loss"].time[-1])


def test_fires_timed_back_by_walking_the_records_land_where_bisection_puts_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default schedule times each fire back to its record: by a follower walking
    the records of the tick interval, or (beyond WALK_RECORDS) by bisection; both give
    the same records, on a run with a late divergence judged by the default rules."""
    from trainguard.checker.evaluate import build_rules
    from trainguard.config import default_policy

    n = 30_000
    t = np.arange(n, dtype=np.float64)
    loss = 2 + 8 / (1 + t / 1000)
    loss[27_000:] *= 1 + 9 * np.minimum((t[27_000:] - 27_000) / 200, 1.0)
    loss[27_200:] = np.nan
    job = Job(id="late", clock="step", state=JobState.SUCCEEDED, start_time=0.0,
              end_time=float(t[-1]), series={"loss": Series("loss", t, t, loss)})
    policy = default_policy()

    def fires() -> list[tuple[str, float, list[float]]]:
        result = replay(job, policy, None, rules=build_rules(policy))
        assert result.timed_back
        return sorted((h.key, h.first.time, [e.time for e in h.escalations])
                      for h in result.histories)

    walked = fires()
    monkeypatch.setattr("trainguard.replay.WALK_RECORDS", 0)
    assert fires() == walked
    assert any("/divergence/" in k for k, _, _ in walked)
