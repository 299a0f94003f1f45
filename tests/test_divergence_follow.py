"""``divergence`` and ``overfit`` followed tick by tick (``checker.follow``): each keeps
what it worked out in ``ctx.state`` and reads only the records new since its last tick,
and says exactly what a fresh ``check`` of the same cut says.

The rules are called through their followers directly, not through ``evaluate``, which
logs and skips a rule that raises: a failure here must fail the test.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.told import Teller
from trainguard.adapters.local import load_run, parse_metric_option
from trainguard.checker.follow import Followers
from trainguard.checker.model import Finding, Job, JobState, Series
from trainguard.checker.policy import Policy
from trainguard.checker.rules import divergence_state
from trainguard.checker.rules.base import Context, Rule
from trainguard.checker.rules.divergence import Divergence
from trainguard.checker.rules.overfit import Overfit

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
RUNS = Path(os.environ.get("TRAINGUARD_RUNS", DATA / "runs"))
CURVES = Path(os.environ.get("TRAINGUARD_CURVES", DATA / "curves"))
#: Ticks at every record up to this many records; past it, this many spread over the run
#: plus every record of a stretch in its middle (the scalar path and the vectorised one).
DENSE = 1_500


def seen(found: list[Finding]) -> list[tuple[Any, ...]]:
    return [(f.rule, f.severity, f.message, f.started_at, f.step, repr(f.evidence))
            for f in found]


def rules() -> list[Rule]:
    return [Divergence(), Overfit()]


def follow_and_compare(job: Job, ticks: np.ndarray, every: int = 1,
                       announce: bool = True) -> int:
    """Judges ``job`` at each tick through followers and, at every ``every``-th tick,
    afresh (no state); asserts both say the same. Returns the number of findings seen.

    With ``announce``, the followers are told what changed since the tick before, as a
    replay tells them (``Followers.changed``): then a rule's word that its findings stand
    (``STABLE``: a record count, a band of values) is taken and the rule not called."""
    policy = Policy()
    followers = Followers()
    followed_rules, fresh = rules(), rules()  # one rule object per kind for all ticks
    findings = 0
    teller = Teller(followers)
    for i, t in enumerate(ticks.tolist()):
        cut = teller.cut(job, t) if announce else job.until(t)
        ctx = Context(now=t, policy=policy, jobs=[cut])
        followed = [f for r in followed_rules for f in followers.check(r, cut, ctx)]
        if i % every == 0 or i == len(ticks) - 1:
            once = [f for r in fresh for f in r.check(cut, Context(now=t, policy=policy,
                                                                   jobs=[cut]))]
            assert seen(followed) == seen(once), (job.id, i, t)
            findings += len(once)
    return findings


def ticks_of(job: Job) -> Any:
    every: np.ndarray = np.unique(np.concatenate([s.time for s in job.series.values()
                                                  if len(s)]))
    times = every[np.isfinite(every)]
    if len(times) <= DENSE:
        return times
    spread = times[np.linspace(0, len(times) - 1, DENSE).astype(int)]
    mid = len(times) // 2
    out: np.ndarray = np.union1d(spread, times[mid: mid + 300])
    return out


def corpus(root: Path) -> list[dict[str, str]]:
    if not (root / "labels.csv").is_file():
        pytest.skip(f"real runs not found at {root} (lay ../shared/data beside the checkout)")
    with open(root / "labels.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def load(root: Path, row: dict[str, str]) -> Job:
    defs = ([parse_metric_option(m) for m in row["metrics"].split(";")]
            if row.get("metrics") else None)
    fmt = "hf" if row["format"] == "json" else row["format"] or None
    return load_run(root / row["run"], defs, fmt=fmt, job_id=row["run"])


@pytest.mark.realdata
def test_real_runs_followed_tick_by_tick_say_what_a_fresh_check_says() -> None:
    """Every run of the runs corpus whose label is not healthy, a third of its healthy
    runs, and of the curves corpus every run not labelled healthy and one healthy
    modded-nanogpt run in forty."""
    chosen = []
    for root in (RUNS, CURVES):
        rows = corpus(root)
        bad = [r for r in rows if r["label"] != "healthy"]
        healthy = [r for r in rows if r["label"] == "healthy"]
        chosen += [(root, r) for r in bad + healthy[:: 3 if root == RUNS else 40]]
    findings = 0
    for root, row in chosen:
        job = load(root, row)
        ticks = ticks_of(job)
        findings += follow_and_compare(job, ticks, every=max(1, len(ticks) // 150))
    assert len(chosen) >= 60
    assert findings > 100  # the comparison saw findings of every kind, not only silence


def built(seed: int) -> Job:
    """A run with a bit of everything the rules tell apart: a falling loss with noise,
    NaN and inf stretches, spikes, a climb, negative values, runs of exact zeros (for
    good, or for a while); a sparse validation loss
    that may climb while training falls; sometimes a second (component) loss."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    t = np.arange(n, dtype=float)

    def curve(m: int) -> np.ndarray:
        v = 2 + 8 / (1 + np.arange(m) / rng.uniform(5, 200)) + rng.normal(
            0, rng.uniform(0.001, 0.5), m)
        for _ in range(int(rng.integers(0, 4))):
            a, w = int(rng.integers(0, m)), int(rng.integers(1, 12))
            kind = int(rng.integers(0, 7))
            if kind == 0:
                v[a:a + w] = np.nan
            elif kind == 1:
                v[a:a + w] = np.inf
            elif kind == 2:
                v[a:a + w] *= rng.uniform(3, 50)
            elif kind == 3:
                v[a:] *= np.geomspace(1, rng.uniform(2, 100), m - a)
            elif kind == 4:
                v[a:a + w] = -v[a:a + w]
            elif kind == 5:  # a collapse to exactly zero, for good or for a while
                v[a:] = 0.0
            else:
                v[a:a + w] = 0.0
        return v

    v = curve(n)
    tv = t[:: int(rng.integers(1, 10))]
    series = {"loss": Series("loss", t, t, v),
              "val_loss": Series("val_loss", tv, tv, np.abs(curve(len(tv))) + 0.01)}
    if rng.random() < 0.3:
        series["train/box_loss"] = Series("train/box_loss", t, t, np.abs(v[::-1]))
        if rng.random() < 0.5:  # components only: the objective is their sum
            series["train/cls_loss"] = Series("train/cls_loss", t, t, v)
            del series["loss"]
    # a series that is no loss, logged between the losses' records: ticks where only it
    # grows leave the rules' input as it was
    tg = t[::2] + 0.5
    series["gpu_util"] = Series("gpu_util", tg, tg, rng.uniform(0, 100, len(tg)))
    return Job(id=f"built-{seed}", clock="step", state=JobState.RUNNING, series=series)


@pytest.mark.parametrize("announce", [True, False], ids=["changes-told", "changes-found"])
@pytest.mark.parametrize("seed", range(60))
def test_built_runs_at_uneven_ticks_say_what_a_fresh_check_says(seed: int,
                                                                announce: bool) -> None:
    """Ticks of one to forty records, so that both the record-by-record path and the
    vectorised one are taken, and a stretch can begin in one and end in the other; with
    the changes told as a replay tells them, and found by the followers themselves."""
    job = built(seed)
    n = max(len(s) for k, s in job.series.items() if k != "gpu_util")
    rng = np.random.default_rng(1000 + seed)
    ends, i = [], 0
    while i < n:
        i = min(n, i + int(rng.choice([1, 1, 1, 2, 3, 9, 17, 40])))
        ends.append(float(i - 1))
    ends += job.series["gpu_util"].time[::3].tolist()
    follow_and_compare(job, np.unique(ends), announce=announce)


@pytest.mark.parametrize("seed", range(0, 60, 3))
def test_records_read_in_parts_say_what_they_say_read_at_once(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long stretch of new records is read in parts (``_CHUNK``, 65,536 records: a replay
    that has not called the rule for long hands it the stretch at once); with parts of 13
    records, stretches and blocks straddle the parts' edges in the built runs, and a
    fresh check reads each run in parts."""
    monkeypatch.setattr(divergence_state, "_CHUNK", 13)
    job = built(seed)
    n = max(len(s) for k, s in job.series.items() if k != "gpu_util")
    follow_and_compare(job, np.unique(np.r_[np.arange(0, n, 50), n - 1]).astype(float))


def test_a_cut_that_does_not_extend_what_was_seen_is_read_afresh() -> None:
    """The rule's state, kept across calls as a follower keeps it, then asked about another
    run (a log rewritten from scratch) and about earlier cuts: each answer is a fresh
    check's. (A follower itself re-runs a rule only when the record counts change.)"""
    t = np.arange(200.0)
    healthy = 2 + 8 / (1 + t / 20)
    broken = healthy.copy()
    broken[120:] = np.nan
    a = Job(id="j", clock="step", series={"loss": Series("loss", t, t, broken)})
    b = Job(id="j", clock="step", series={"loss": Series("loss", t, t, healthy)})
    policy, state, rule = Policy(), {}, Divergence()  # type: ignore[var-annotated]
    for job, at in ((a, 199.0), (b, 199.0), (a, 150.0), (a, 110.0), (a, 199.0)):
        cut = job.until(at)
        followed = rule.check(cut, Context(now=at, policy=policy, jobs=[cut], state=state))
        once = rule.check(cut, Context(now=at, policy=policy, jobs=[cut]))
        assert seen(followed) == seen(once)
    assert seen(followed) and followed[0].step == 120


def test_each_record_is_read_once_over_a_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 5,000-record run judged at every record: the objective's points are each taken
    in once (the work grows with the run, not with its square); judged afresh at every
    record, the same rule takes in the square of the run's length."""
    calls = {"points": 0}
    real_point, real_many = divergence_state.Climbs._point, divergence_state.Climbs._many

    def point(self: Any, at: int, x: float, *rest: Any) -> None:
        calls["points"] += 1
        real_point(self, at, x, *rest)

    def many(self: Any, new: np.ndarray, *rest: Any) -> None:
        calls["points"] += len(new)
        real_many(self, new, *rest)

    monkeypatch.setattr(divergence_state.Climbs, "_point", point)
    monkeypatch.setattr(divergence_state.Climbs, "_many", many)
    t = np.arange(5_000.0)
    loss = 2 + 8 / (1 + t / 100) + np.random.default_rng(0).normal(0, 0.05, len(t))
    job = Job(id="j", clock="step", series={"loss": Series("loss", t, t, loss)})
    policy, followers, rule = Policy(), Followers(), Divergence()
    for x in t.tolist():
        cut = job.until(x)
        followers.check(rule, cut, Context(now=x, policy=policy, jobs=[cut]))
    assert calls["points"] == len(t)
    calls["points"] = 0
    for x in t[::50].tolist():
        cut = job.until(x)
        rule.check(cut, Context(now=x, policy=policy, jobs=[cut]))
    assert calls["points"] == sum(int(x) + 1 for x in t[::50])


def test_overfit_followed_reads_the_training_loss_only_while_validation_climbs() -> None:
    """A run that evaluates every 100 steps: judged at every step, the overfit rule is
    re-run only at new evaluations until validation climbs (then at every step, to see
    whether the training loss still falls), and says what a fresh check says."""
    steps = np.arange(3_000.0)
    train = 0.05 + 2 * np.exp(-steps / 500)
    ev = steps[::100]
    val = np.where(ev < 1_500, 0.9 - 0.4 * ev / 1_500, 0.5 + (ev - 1_500) / 200)
    job = Job(id="j", clock="step", series={"loss": Series("loss", steps, steps, train),
                                            "val_loss": Series("val_loss", ev, ev, val)})
    policy, followers, rule = Policy(), Followers(), Overfit()
    first = None
    for x in steps.tolist():
        cut = job.until(x)
        found = followers.check(rule, cut, Context(now=x, policy=policy, jobs=[cut]))
        assert seen(found) == seen(rule.check(cut, Context(now=x, policy=policy,
                                                           jobs=[cut])))
        if found and first is None:
            first = x
    assert first is not None
    (follower,) = followers.by.values()
    quiet = int(first) // 100 + 1  # the evaluations before it fired, and the first tick
    assert follower.runs <= quiet + (len(steps) - first) + 1
    assert follower.runs < len(steps) // 2
