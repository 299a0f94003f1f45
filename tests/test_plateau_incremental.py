"""``plateau`` followed tick by tick (a replay) answers as judged afresh (``check``), and
its cost does not grow with the square of the run.

Beyond ``max_points`` records of its objective the rule judges the run as of its latest
block boundary and keeps that judgement in ``ctx.state`` (``checker.follow.STABLE``); the
tests hold the follower's answer at every cut equal to a fresh check of the same cut, on
real runs of both shared corpora (with the default parameters, and with small blocks so
that the block path runs on short real runs too) and on curves built here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from trainguard.checker.evaluate import evaluate
from trainguard.checker.follow import Followers
from trainguard.checker.model import Finding, Job, JobState, Series
from trainguard.checker.policy import Policy, RuleConfig
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.plateau import Plateau, judged_prefix
from trainguard.replay import Cuts, record_times


def _seen(found: list[Finding]) -> list[tuple[object, ...]]:
    return sorted((f.key, f.severity.value, f.started_at, f.step, f.message,
                   sorted((k, repr(v)) for k, v in f.evidence.items())) for f in found)


def _follow_and_compare(job: Job, rule: Plateau, policy: Policy, samples: int = 25
                        ) -> tuple[int, int, int]:
    """Replays ``job`` with one tick per record time, following ``rule``; at a sample of
    the cuts compares the followed answer with a fresh check of the same cut. Returns
    (ticks, rule runs, cuts compared)."""
    times = record_times(job).tolist()
    pick = set(np.linspace(0, len(times) - 1, min(samples, len(times))).astype(int).tolist())
    cuts, followers = Cuts(job), Followers()
    before: float | None = None
    compared = 0
    for i, t in enumerate(times):
        cut = cuts(t)
        followers.changed = cuts.changed(before, t) if before is not None else None
        got = evaluate([cut], policy, t, rules=[rule], followers=followers)
        before = t
        if i in pick:
            fresh = job.until(t)
            want = rule.check(fresh, Context(now=t, policy=policy, jobs=[fresh]))
            assert _seen(got) == _seen(want), (job.id, t)
            compared += 1
    return len(times), followers.runs, compared


def _long_run(n: int, flat_from: int | None = None, seed: int = 0) -> Job:
    """A training loss on a step clock: falling as 1/(1 + step/1000); from ``flat_from``
    on, it stays where it was (nothing more is learnt)."""
    rng = np.random.default_rng(seed)
    step = np.arange(n, dtype=np.float64)
    level = 2 + 8 / (1 + step / 1000)
    if flat_from is not None:
        level[flat_from:] = level[flat_from]
    loss = level + 0.05 * rng.standard_normal(n)
    return Job(id=f"built-{n}", clock="step", state=JobState.RUNNING, start_time=0.0,
               series={"loss": Series("loss", step, step, loss)})


@pytest.mark.parametrize("params", [{}, {"max_points": 24, "rejudge_parts": 4}])
def test_followed_plateau_answers_as_a_fresh_check_on_real_runs(
        curves_dir: Path, params: dict[str, int]) -> None:
    """Every run of the runs corpus labelled flat, overfit, spiky or diverged, a sample of
    the others, and a sample of the curves corpus; with small blocks, the block path runs
    on them too."""
    from trainguard.adapters.local import load_run
    from trainguard.bench.labels import read_labels

    runs = curves_dir.parent / "runs"
    if not (runs / "labels.csv").exists():
        pytest.skip(f"{runs}/labels.csv not found (the shared runs corpus)")
    rows = read_labels(runs / "labels.csv")
    picked = [r for r in rows if r.label != "healthy"] + [r for r in rows
                                                           if r.label == "healthy"][::4]
    picked += read_labels(curves_dir / "labels.csv")[::40]
    rule = Plateau(params)
    policy = Policy(rules={"plateau": RuleConfig(params=params)})
    compared = blocked = 0
    for row in picked:
        job = load_run(row.path, definitions=list(row.metrics) or None, fmt=row.format)
        job.state, job.end_time = JobState.RUNNING, None  # judged as it ran
        if len(record_times(job)) > 3_000:
            continue  # the fresh checks are the slow part; shorter runs make the point
        ticks, runs_, n = _follow_and_compare(job, rule, policy)
        compared += n
        blocked += runs_ < ticks
    assert compared >= 500
    if params:
        assert blocked >= 10  # the follower was spared calls on many runs


def test_a_long_run_followed_at_every_record_is_judged_a_few_hundred_times() -> None:
    """40,000 records, one tick per record: the rule runs at every record up to
    max_points, then at most ~rejudge_parts times each time the run doubles."""
    job = _long_run(40_000, flat_from=5_000)
    rule = Plateau()
    ticks, runs, compared = _follow_and_compare(job, rule, Policy(), samples=15)
    assert ticks == 40_000 and compared == 15
    p = rule.params
    doublings = math.ceil(math.log2(40_000 / p.max_points))
    assert runs <= p.max_points + 2 * p.rejudge_parts * (doublings + 1)


def test_the_judged_prefix_never_shrinks_and_trails_the_run_by_under_its_block() -> None:
    last = 0
    for n in range(1, 300_000, 7):
        upto, block = judged_prefix(n, 1024, 64)
        assert upto >= last and n - block < upto <= n
        assert n <= 1024 or block <= n / 64
        last = upto


def test_a_long_flat_run_is_found_and_a_long_learning_run_is_not_called_flat() -> None:
    """Judged on block medians: a run that learnt then stopped for most of its length is
    converged (it learnt), one flat from the start is not learning, one still falling is
    neither."""
    rule = Plateau()

    def judge(job: Job) -> list[str]:
        t = float(job.series["loss"].time[-1])
        return [str(f.evidence["kind"]) for f in
                rule.check(job, Context(now=t, policy=Policy(), jobs=[job]))]

    assert judge(_long_run(200_000, flat_from=60_000)) == ["converged"]
    assert judge(_long_run(200_000, flat_from=0)) == ["flat"]
    assert judge(_long_run(200_000)) in ([], ["converged"])  # 1/x: nearly level at the end
    rising = _long_run(200_000, flat_from=0)
    rising.series["loss"].value[:] = 10 - 8 * np.arange(200_000) / 200_000  # still learning
    assert judge(rising) == []


def test_a_state_from_another_run_is_not_taken_for_this_one() -> None:
    """The rule's memory says what prefix it judged; a different run under the same state
    is judged afresh."""
    rule = Plateau({"max_points": 64, "rejudge_parts": 8})
    state: dict[str, object] = {}
    flat, learning = _long_run(3_000, flat_from=0), _long_run(3_000)
    learning.series["loss"].value[:] = 10 - 8 * np.arange(3_000) / 3_000
    for job, want in ((flat, ["flat"]), (learning, []), (flat, ["flat"])):
        ctx = Context(now=2_999.0, policy=Policy(), jobs=[job], state=state)
        assert [f.evidence["kind"] for f in rule.check(job, ctx)] == want
