"""A loss that moves to a higher level and stays there (``checker/rules/divergence_shift``).

A language model whose loss collapses from 3.3 to its unigram entropy (7.5 nats) or
doubles, and stays there, has diverged, but it is neither 5 x its best (the ratio test)
nor back where it started, ln 50257 = 10.8 (the undo test): before the shift test it
was found only when its logging was sparse enough for the first level to be low, at one
cadence in three. The curves are those of ``bench/built_shapes.py``; their healthy twins
(warm restarts, a loss hump like a real fine-tune's, warm-ups, a change of data mixture)
are held to "never critical" with every other shape there (``tests/test_built_shapes.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import bench_scripts
from tests.afresh import histories, judged_afresh
from trainguard.checker import Job, Policy, Series, Severity
from trainguard.replay import ReplayResult, replay

BENCH = bench_scripts.load("built_shapes")  # the curves, built as the benchmark builds them
ONSET = 20_000


def language_model(every: int, after: str, n: int = 45_000) -> Job:
    """A power-law loss from 10.8 to about 3.3 (1 % noise), logged every ``every`` steps,
    that from step 20,000 ``after`` does: collapses to 7.5, doubles, or climbs by 3 over
    3,000 steps."""
    job: Job = BENCH.job_of(BENCH.moves_up(every, after, n))
    return job


def criticals(r: ReplayResult) -> list[tuple[str, float | None, str]]:
    return [(h.rule, h.first_critical.step, h.finding.message) for h in r.histories
            if h.first_critical is not None]


@pytest.mark.parametrize("every", [1, 10, 50])
@pytest.mark.parametrize("after", ["collapses", "doubles", "climbs"])
def test_a_language_model_whose_loss_moves_up_and_stays_is_stopped(every: int,
                                                                     after: str) -> None:
    r = replay(language_model(every, after), Policy())
    ((rule, step, message),) = criticals(r)
    assert rule == "divergence" and step is not None
    # found once the loss has stood there for half the steps the run had taken (the
    # climb first reaches 1.5 x its best 1,700 steps in)
    assert ONSET < step <= 1.5 * (ONSET + (1_700 if after == "climbs" else 0)) + 2 * every
    assert any(f.rule == "divergence" and f.severity is Severity.CRITICAL for f in r.final)
    if step > ONSET + 1_000:  # not the undo test (a sparse log's first level is low)
        assert "had not come back down after" in message and "had learnt from" in message


def test_a_run_that_logs_only_its_validation_loss_is_judged_by_it() -> None:
    """A speed-run's log keeps only ``val_loss``: it is the objective, and its collapse is
    found as the training loss's is (where a training loss is logged, a held-out loss
    climbing is the ``overfit`` rule's, a warning)."""
    job = language_model(50, "doubles")
    job.series = {"val_loss": Series("val_loss", job.series["loss"].time,
                                     job.series["loss"].step, job.series["loss"].value)}
    ((rule, step, message),) = criticals(replay(job, Policy()))
    assert rule == "divergence" and step == 30_000 and "val_loss rose to" in message


def test_a_collapse_the_run_comes_back_from_is_info_recovered() -> None:
    job = language_model(10, "collapses", n=40_000)
    loss = job.series["loss"]
    back = loss.step >= 35_000
    loss.value[back] = 3.3 * np.exp(np.random.default_rng(0).normal(0, 0.01, back.sum()))
    r = replay(job, Policy())
    assert [c[0] for c in criticals(r)] == ["divergence"]
    (f,) = [f for f in r.final if f.rule == "divergence"]
    assert f.severity is Severity.INFO and f.evidence["kind"] == "recovered"


@pytest.mark.parametrize("job", [
    language_model(10, "collapses", n=32_000), BENCH.job_of(BENCH.sgdr(1.0, 50), 60.0),
    BENCH.job_of(BENCH.hump())], ids=["collapse", "sgdr", "hump"])
def test_a_replay_that_follows_the_rule_gives_what_judging_afresh_gives(job: Job) -> None:
    """The shift test's band (``Climbs.ceiling``), within which a follower does not call
    the rule again and a replay skips ticks: a replay gives the same fires and
    escalations as running every rule afresh at each of its ticks."""
    loss = next(iter(job.series.values()))
    r = replay(job, Policy(), float(loss.time[-1] - loss.time[0]) / 300)
    assert r.times is not None
    assert histories(r) == judged_afresh(job, Policy(), r.times.tolist())
    assert r.rule_runs < r.rule_calls  # the followers kept answers: the band was used


def test_the_scatter_bound_holds_whatever_values_come() -> None:
    """``_RunningMedian.upper(k)``, which lets a band over a shift stretch span ``k``
    renewals of the point scatter: no ``k`` values lift the median above it, and ``k``
    huge ones reach it."""
    from trainguard.checker.rules.divergence_state import _RunningMedian

    rng = np.random.default_rng(0)
    for _ in range(300):
        seen = rng.random(int(rng.integers(1, 60))).tolist()
        k = int(rng.integers(0, 40))
        med = _RunningMedian()
        for x in seen:
            med.add(x)
        bound = med.upper(k)
        assert bound == sorted(seen + [np.inf] * k)[(len(seen) + k + 1) // 2 - 1]
        later = _RunningMedian()
        for x in seen + (2 * rng.random(k)).tolist():
            later.add(x)
        assert later.value <= bound
