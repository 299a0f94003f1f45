"""A loss that moves to a higher level and stays there (``checker/rules/divergence_shift``).

A language model whose loss collapses from 3.3 to its unigram entropy (7.5 nats) or
doubles, and stays there, has diverged, but it is neither 5 x its best (the ratio test)
nor back where it started, ln 50257 = 10.8 (the undo test): before the shift test it
was found only when its logging was sparse enough for the first level to be low, at one
cadence in three. Each curve here is built; the healthy twins are the shapes that also
stand far above a best for a long time and come back: warm restarts of the learning
rate, a loss hump like a real fine-tune's, a warm-up on a pretrained model, a change of
data mixture the run then learns.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainguard.checker import Job, Policy, Series, Severity, evaluate
from trainguard.replay import ReplayResult, replay

T0 = 1_750_000_000.0
ONSET = 20_000


def job_of(steps: np.ndarray, loss: np.ndarray, name: str = "loss", dt: float = 1.0) -> Job:
    return Job(id="j", start_time=T0, series={
        name: Series(name, T0 + steps * dt, steps.astype(float), loss),
        "step": Series("step", T0 + steps * dt, steps.astype(float), steps.astype(float))})


def language_model(every: int, after: str, n: int = 45_000) -> Job:
    """A power-law loss from 10.8 to about 3.3 (1 % noise), logged every ``every`` steps,
    that from step 20,000 ``after`` does: collapses to 7.5, doubles, or climbs by 3 over
    3,000 steps."""
    steps = np.arange(0, n, every)
    rng = np.random.default_rng(every)
    loss = (2.8 + 8.0 * (1 + steps / 200) ** -0.6) * np.exp(rng.normal(0, 0.01, len(steps)))
    late = steps >= ONSET
    if after == "collapses":
        loss[late] = 7.5 * np.exp(rng.normal(0, 0.01, late.sum()))
    elif after == "doubles":
        loss[late] *= 2
    else:
        loss[late] += 3.0 * np.clip((steps[late] - ONSET) / 3_000, 0, 1)
    return job_of(steps, loss)


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


def sgdr(jump_to: float, per: int, cycles: int = 4) -> Job:
    """Per-epoch losses under warm restarts: from 2.3 down to 0.02 in each cycle, back up
    to ``jump_to`` at each restart: 30-fold and 50-fold its best, for a whole cycle. (A
    restart that gives back more than half of what the run learnt, to 1.5 of 2.3, is
    critical by the ratio test, before and after the shift test: the README's weakness
    on deliberate phase changes.)"""
    rng = np.random.default_rng(0)
    e = np.arange(per)
    loss = np.concatenate([0.02 + ((2.3 if c == 0 else jump_to) - 0.02) * np.exp(-e / (per / 5))
                           for c in range(cycles)]) * np.exp(rng.normal(0, 0.05, cycles * per))
    return job_of(np.arange(len(loss)) * 100, loss, "train_loss", dt=60.0)


def hump() -> Job:
    """A fine-tune's loss that stands 2.7-fold above its best for a quarter of the steps
    it has taken and comes back, as a real one in the ``runs`` corpus does."""
    steps = np.arange(50, 6_000, 50)
    rng = np.random.default_rng(1)
    loss = 900 + 10_000 * np.exp(-steps / 300)
    loss *= 1 + 1.7 * np.exp(-(((steps - 2_550) / 200) ** 2))  # 2,250 .. 2,850
    return job_of(steps, loss * np.exp(rng.normal(0, 0.04, len(steps))))


def warm_up(rise: float) -> Job:
    """A pretrained model whose loss rises ``rise``-fold in the learning rate's warm-up
    and then learns."""
    steps = np.arange(0, 6_000, 10)
    bump = 1 + (rise - 1) * np.clip(steps / 500, 0, 1) * np.exp(-np.maximum(steps - 500, 0) / 500)
    return job_of(steps, (1.2 - 0.4 * (1 - np.exp(-steps / 1_000))) * bump)


def mixture_change() -> Job:
    """A pre-training run whose data mixture changes at step 20,000 (a harder domain): the
    loss jumps 1.75-fold, to 5.7, and learns the new data slowly, to 5.0 by the end."""
    steps = np.arange(0, 45_000, 10)
    rng = np.random.default_rng(3)
    loss = 2.8 + 8.0 * (1 + steps / 200) ** -0.6
    late = steps >= ONSET
    loss[late] = 4.9 + 0.8 * (1 + (steps[late] - ONSET) / 2_000) ** -0.7
    return job_of(steps, loss * np.exp(rng.normal(0, 0.01, len(steps))))


@pytest.mark.parametrize("job", [
    *[sgdr(j, per) for j in (0.6, 1.0) for per in (10, 20, 50)],
    hump(), warm_up(2.0), warm_up(3.0), mixture_change(),
], ids=[*[f"sgdr-to-{j}-every-{per}" for j in (0.6, 1.0) for per in (10, 20, 50)],
        "hump", "warm-up-2x", "warm-up-3x", "mixture-change"])
def test_what_comes_back_down_or_was_never_learnt_is_not_stopped(
        job: Job) -> None:
    assert criticals(replay(job, Policy())) == []


@pytest.mark.parametrize("job", [language_model(10, "collapses", n=32_000), sgdr(1.0, 50),
                                 hump()], ids=["collapse", "sgdr", "hump"])
def test_a_replay_that_follows_the_rule_gives_what_judging_afresh_gives(job: Job) -> None:
    """The shift test's band (``Climbs.ceiling``), within which a follower does not call
    the rule again and a replay skips ticks: a replay gives the same fires and
    escalations as running every rule afresh at each of its ticks."""
    policy = Policy()
    steps = job.series["step"]
    tick = float(steps.time[-1] - steps.time[0]) / 300
    r = replay(job, policy, tick)
    got = sorted((h.key, h.first.time, h.first.severity.value,
                  [e.time for e in h.escalations]) for h in r.histories)
    first: dict[str, tuple[float, str, list[float]]] = {}
    worst: dict[str, int] = {}
    for t in r.times.tolist() if r.times is not None else []:
        for f in evaluate([job.until(t)], policy, t):
            if f.key not in first:
                first[f.key], worst[f.key] = (t, f.severity.value, []), f.severity.rank
            elif f.severity.rank > worst[f.key]:
                first[f.key][2].append(t)
                worst[f.key] = f.severity.rank
    assert got == sorted((k, t, sev, esc) for k, (t, sev, esc) in first.items())
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
