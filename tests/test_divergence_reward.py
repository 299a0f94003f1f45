"""An RL policy that collapsed (``divergence_reward``): a reward never below 0 falling to
a tenth of a level it held and staying there, the shape of three GRPO runs in a blind
set (scoring 0.85-1.0, then 0 or 0.025 at every record to their end), told from a
reward that climbs with binomial noise, one that starts at 0 (a sparse reward not yet
found), one that dips and comes back, a sparse one that holds no level (1 success in 16
now and then), and a return that can be negative. Curves are built in the test; the GRPO one is
written as the Hugging Face Trainer's ``trainer_state.json`` and read by the real
reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainguard.checker import Job, Policy, Series, Severity, evaluate
from trainguard.replay import replay

T0 = 1_700_000_000.0


def job_of(reward: np.ndarray, every: float = 5.0) -> Job:
    steps = np.arange(1.0, len(reward) + 1) * every
    t = T0 + steps * 30
    loss = np.zeros(len(reward))  # GRPO's loss sits near 0 by construction
    return Job(id="j", start_time=T0, series={
        "reward": Series("reward", t, steps, reward), "loss": Series("loss", t, steps, loss)})


def criticals(job: Job) -> list[str]:
    result = replay(job, Policy())
    return [h.finding.message for h in result.histories if h.worst is Severity.CRITICAL]


def scores(p: np.ndarray, seed: int, generations: int = 40) -> np.ndarray:
    """A verifier's mean score over ``generations`` answers per record, each right with
    probability ``p``: multiples of 1/40, as the GRPO runs log."""
    rng = np.random.default_rng(seed)
    return np.asarray(rng.binomial(generations, np.clip(p, 0, 1)) / generations, float)


def test_a_grpo_reward_that_collapses_to_zero_is_critical_at_its_fifth_low_point(
        tmp_path: Path) -> None:
    from trainguard.adapters.local import load_run

    reward = np.concatenate([scores(np.full(20, 0.8), 1), scores(np.full(20, 0.005), 2)])
    history = [{"step": 5 * (i + 1), "loss": 0.0, "reward": float(r),
                "learning_rate": 1e-6} for i, r in enumerate(reward)]
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 200, "max_steps": 200,
                                "log_history": history}))
    result = replay(load_run(path), Policy())
    (h,) = [h for h in result.histories if h.rule == "divergence"]
    assert h.worst is Severity.CRITICAL
    # steps 105 ... 125 are the five low points: fired at the fifth, dated at the first
    assert h.first.step == 125 and h.finding.step == 105
    assert "reward fell from a level of 0.8" in h.finding.message
    assert h.finding.evidence["kind"] == "reward_collapse"


@pytest.mark.parametrize("seed", range(20))
def test_a_reward_that_climbs_or_starts_at_zero_is_not_stopped(seed: int) -> None:
    n = 300
    climbing = scores(0.1 + 0.7 * np.arange(n) / n, seed)
    sparse = scores(np.where(np.arange(n) < 100, 0.0, 0.02 + 0.5 * (np.arange(n) - 100) / n),
                    seed + 100)
    noisy = scores(np.full(n, 0.15), seed + 200, generations=8)  # 8 answers a record
    for reward in (climbing, sparse, noisy):
        assert criticals(job_of(reward)) == []


def test_a_reward_that_dips_and_comes_back_is_not_stopped() -> None:
    reward = scores(np.full(120, 0.7), 3)
    reward[60:64] = 0.0  # four records with no reward: one short of a collapse
    assert criticals(job_of(reward)) == []


def test_a_collapse_the_policy_came_back_from_is_info_as_of_its_last_record() -> None:
    reward = scores(np.full(120, 0.7), 4)
    reward[60:70] = 0.0
    job = job_of(reward)
    result = replay(job, Policy())
    fired, back = [h for h in result.histories if h.rule == "divergence"]
    assert fired.worst is Severity.CRITICAL and fired.first.step == 5 * 65  # when it fired
    assert back.worst is Severity.INFO and (back.first.step or 0) > 5 * 65
    now = float(job.series["reward"].time[-1]) + 1
    (f,) = [f for f in evaluate([job], Policy(), now) if f.rule == "divergence"]
    assert f.severity is Severity.INFO and "recovered at step" in f.message
    assert f.evidence["fired_step"] == 5 * 61


def test_a_sparse_reward_at_zero_most_of_the_time_is_no_collapse() -> None:
    """Sixteen answers a record scoring 1 in 16 at a third of its records, 0 at the rest:
    its runs of zeros are what its history makes likely (not learning is the plateau
    rule's to say)."""
    rng = np.random.default_rng(7)
    reward = np.where(rng.random(300) < 0.35, 0.0625, 0.0)
    reward[:9] = [0.0625, 0.125, 0.0, 0.0, 0.0625, 0.0625, 0.0625, 0.0, 0.0625]
    assert criticals(job_of(reward)) == []


def test_a_reward_held_exactly_then_zero_is_a_collapse() -> None:
    """Every answer right (1.0 at every record), then none: no scatter to learn a scale
    from is needed."""
    assert len(criticals(job_of(np.array([1.0] * 30 + [0.0] * 10)))) == 1


def test_a_return_that_can_be_negative_is_not_judged_this_way() -> None:
    """An SB3 return has no floor: a fall from 20 to 1 is not to a tenth of anything."""
    rng = np.random.default_rng(5)
    reward = np.concatenate([rng.normal(-5, 3, 30), rng.normal(20, 3, 40),
                             rng.normal(1, 0.5, 40)])
    assert criticals(job_of(reward)) == []
    assert criticals(job_of(np.abs(reward))) != []  # the same fall, never below 0


def test_a_followed_replay_agrees_with_judging_every_tick() -> None:
    reward = np.concatenate([scores(np.full(50, 0.6), 6), scores(np.full(8, 0.0), 7),
                             scores(np.full(30, 0.6), 8), scores(np.full(30, 0.01), 9)])
    job = job_of(reward)
    fast, slow = replay(job, Policy()), replay(job, Policy(), skip=False)
    assert [(h.rule, h.first, h.escalations) for h in fast.histories] == \
        [(h.rule, h.first, h.escalations) for h in slow.histories]
    assert any(h.rule == "divergence" and h.worst is Severity.CRITICAL
               for h in fast.histories)


def test_a_reward_near_zero_changes_by_its_own_units_not_by_thousands_of_percent() -> None:
    """A reward between 0 and 1 whose median is 0.025 fell by 0.1, not by 400 %: a share
    of a level near 0 (or of one values cross) says nothing; a loss keeps its share."""
    reward = np.concatenate([scores(np.full(3, 0.8), 1), scores(np.full(37, 0.02), 2)])
    job = job_of(reward)
    now = float(job.series["reward"].time[-1]) + 1
    (f,) = [f for f in evaluate([job], Policy(), now) if f.rule == "plateau"]
    assert "never improved on its first value 0.8" in f.message
    assert "-0.1 at a level of 0.025" in f.message and "%" not in f.message
    assert f.evidence["rel_improvement"] == pytest.approx(-4.0)  # the machine form keeps it


def test_a_return_logged_at_every_step_of_its_episode_is_one_measurement() -> None:
    """A CartPole log (a blind set's ``training_log.csv``, 51,165 rows) writes each
    episode's return at every step of it: 248.6 twelve times, then 18.9 twenty-two times,
    then 118.3 ... Read as records, one short episode was 22 low points after 12 high
    ones: a collapse, critical at record 17, and 5 rows of one episode "not learning". A
    value logged again unchanged is one measurement (but a rate's bounds, 0 and 1)."""
    rng = np.random.default_rng(11)
    returns = np.round(np.abs(rng.normal(100, 60, 200)) + np.linspace(0, 300, 200), 5)
    returns[0], returns[1] = 248.60844, 18.93311  # a good first episode, a short second
    steps = rng.integers(8, 30, 200)  # rows per episode
    job = job_of(np.repeat(returns, steps))
    result = replay(job, Policy())
    assert [h.rule for h in result.histories
            if h.rule in ("divergence", "plateau") and h.worst.rank >= Severity.WARNING.rank] \
        == []
