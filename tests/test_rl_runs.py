"""Reinforcement-learning runs: the losses follow moving targets (the returns, a TD
target) and climb as the agent gets better, so they say nothing of progress; the reward
or return does. Curves built here in the shape of Stable-Baselines3, CleanRL, RLlib and
DQN logs, and a preference trainer's (DPO) whose per-batch "rewards" are no RL reward."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_rules_general import job_of
from trainguard.checker.metrics import is_reward, primary, reward
from trainguard.checker.model import Job, Severity
from trainguard.checker.policy import Policy
from trainguard.config import default_policy
from trainguard.replay import replay

N = 300
STEPS = np.arange(N) * 10.0  # an update every 10 steps (job_of logs every step)


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _learning() -> tuple[np.ndarray, np.ndarray]:
    """(episode return rising 10 -> ~500, a value loss growing with it ~100-fold)."""
    rng = _rng()
    ret = 10 + 490 * (1 - np.exp(-np.arange(N) / 80))
    value_loss = 0.002 * ret ** 2 * (1 + 0.3 * rng.standard_normal(N)) / 50 + 0.1
    return ret, value_loss


def _found(job: Job) -> list[tuple[str, Severity, str]]:
    """Every finding a replay of the run fires, at its worst."""
    return [(h.rule, h.worst, h.finding.message) for h in replay(job, default_policy()).histories]


@pytest.mark.parametrize("names", [
    ("rollout/ep_rew_mean", "train/value_loss", "train/loss"),  # Stable-Baselines3 PPO
    ("charts/episodic_return", "losses/value_loss", "losses/td_loss"),  # CleanRL
    ("episode_reward_mean", "vf_loss", "total_loss"),  # RLlib
    ("episode_reward", "loss", "q_loss"),  # a DQN loop
])
def test_a_learning_agent_whose_losses_climb_is_not_stopped(names: tuple[str, str, str]
                                                            ) -> None:
    ret, value_loss = _learning()
    rew, vloss, total = names
    job = job_of({rew: (STEPS, ret), vloss: (STEPS, value_loss),
                  total: (STEPS, 0.5 * value_loss - 0.01)})
    assert primary(job, Policy()).name == rew  # type: ignore[union-attr]
    assert [f for f in _found(job) if f[1].rank >= Severity.WARNING.rank] == []


def test_without_the_reward_the_same_climb_is_a_divergence() -> None:
    """The same losses logged without a reward: nothing says they follow a moving target,
    and a loss 100-fold its best is a divergence."""
    _, value_loss = _learning()
    job = job_of({"train/value_loss": (STEPS, value_loss),
                  "train/loss": (STEPS, 0.5 * value_loss)})
    assert ("divergence", Severity.CRITICAL) in [f[:2] for f in _found(job)]


def test_a_non_finite_loss_of_an_agent_is_still_critical() -> None:
    ret, value_loss = _learning()
    value_loss[200:] = np.nan
    job = job_of({"rollout/ep_rew_mean": (STEPS, ret), "train/value_loss": (STEPS, value_loss)})
    assert ("divergence", Severity.CRITICAL) in [f[:2] for f in _found(job)]


def test_an_agent_whose_reward_stays_flat_is_not_learning() -> None:
    """Its loss falls (the critic fits a return that never grows): the reward says the
    agent learns nothing."""
    rng = _rng()
    job = job_of({"rollout/ep_rew_mean": (STEPS, 10 + 0.05 * rng.standard_normal(N)),
                  "train/loss": (STEPS, 2 * np.exp(-np.arange(N) / 50) + 0.1)})
    found = _found(job)
    assert ("plateau", Severity.WARNING) in [f[:2] for f in found]
    assert any("rollout/ep_rew_mean" in m and "not learning" in m for _, _, m in found)


def test_an_agent_that_learnt_and_levelled_off_has_converged() -> None:
    rng = _rng()
    ret = 10 + 490 * (1 - np.exp(-np.arange(N) / 20)) + rng.standard_normal(N)
    job = job_of({"rollout/ep_rew_mean": (STEPS, ret),
                  "train/loss": (STEPS, 0.5 + 0.05 * rng.standard_normal(N))})
    found = _found(job)
    assert [f[:2] for f in found] == [("plateau", Severity.INFO)]
    assert "converged" in found[0][2]


def test_a_preference_trainers_rewards_are_no_rl_reward() -> None:
    """DPO logs rewards/chosen, rewards/rejected, rewards/margins and rewards/accuracies of
    each batch; its objective is its loss, and a loss that climbs many-fold and stays is
    a divergence there."""
    rng = _rng()
    loss = 0.69 * np.exp(-np.arange(N) / 40) + 0.05 + 0.005 * rng.standard_normal(N)
    loss[200:] *= 12
    job = job_of({"loss": (STEPS, loss), "rewards/chosen": (STEPS, -np.arange(N) / 100),
                  "rewards/rejected": (STEPS, -np.arange(N) / 50),
                  "rewards/margins": (STEPS, np.arange(N) / 100),
                  "rewards/accuracies": (STEPS, np.full(N, 0.9))})
    assert primary(job, Policy()).name == "loss"  # type: ignore[union-attr]
    assert ("divergence", Severity.CRITICAL) in [f[:2] for f in _found(job)]


@pytest.mark.parametrize(("name", "rl"), [
    ("rollout/ep_rew_mean", True), ("eval/mean_reward", True), ("episode_reward_mean", True),
    ("charts/episodic_return", True), ("env/reward_mean", True), ("returns", True),
    ("rewards/chosen", False), ("rewards/margins", False), ("rewards/accuracies", False),
    ("reward_loss", False), ("val_loss", False), ("returned_items", False),
    ("val_returns_mse", False), ("return_error", False),
])
def test_what_counts_as_an_rl_reward(name: str, rl: bool) -> None:
    assert is_reward(name) is rl


def test_the_level_of_the_reward_is_judged_not_its_spread() -> None:
    """RLlib logs episode_reward_min, _max and _mean: the mean is the agent's level."""
    ret, _ = _learning()
    job = job_of({"episode_reward_max": (STEPS, ret * 2), "episode_reward_min": (STEPS, ret / 2),
                  "episode_reward_mean": (STEPS, ret)})
    assert reward(job).name == "episode_reward_mean"  # type: ignore[union-attr]


def _found_with(job: Job, metrics: str) -> list[tuple[str, Severity, str]]:
    """Every finding a replay fires with the default policy and a ``metrics:`` line, the
    policy read as a user writes it."""
    from trainguard.config import default_policy_text
    from trainguard.config.policy import load_policy_text

    policy = load_policy_text(default_policy_text().replace("metrics: {}", metrics),
                              "team.yaml")
    return [(h.rule, h.worst, h.finding.message) for h in replay(job, policy).histories]


def test_a_reward_the_names_miss_is_named_in_the_policy() -> None:
    """An agent that logs its return as ``score``: nothing in the name says RL, so its
    climbing value loss reads as a divergence, until the policy names the reward. Then
    the losses are judged for NaN and blow-ups only, and the score is maximised: a flat
    one is not learning."""
    ret, value_loss = _learning()
    job = job_of({"score": (STEPS, ret), "value_loss": (STEPS, value_loss)})
    assert ("divergence", Severity.CRITICAL) in [f[:2] for f in _found(job)]
    named = _found_with(job, "metrics: {reward: score}")
    assert [f for f in named if f[1].rank >= Severity.WARNING.rank] == []
    assert primary(job, Policy(metrics={"reward": "score"})).name == "score"  # type: ignore[union-attr]
    rng = _rng()
    flat = job_of({"score": (STEPS, 10 + 0.05 * rng.standard_normal(N)),
                   "value_loss": (STEPS, 2 * np.exp(-np.arange(N) / 50) + 0.1)})
    found = _found_with(flat, "metrics: {reward: score}")
    assert any(r == "plateau" and s is Severity.WARNING and "score" in m and "not learning" in m
               for r, s, m in found)


def test_returns_that_are_no_reward_are_unnamed_in_the_policy() -> None:
    """A forecasting model that logs the ``returns`` it predicts beside its loss reads as
    an RL run by the names, and its loss climbing tenfold is then only judged for NaN and
    blow-ups. ``reward: ""`` says no series is a reward: the climb is a divergence."""
    rng = _rng()
    loss = 0.5 * np.exp(-np.arange(N) / 40) + 0.05 + 0.002 * rng.standard_normal(N)
    loss[200:] *= 10
    job = job_of({"loss": (STEPS, loss), "returns": (STEPS, 0.01 * rng.standard_normal(N))})
    assert ("divergence", Severity.CRITICAL) not in [f[:2] for f in _found(job)]
    assert reward(job, Policy(metrics={"reward": ""})) is None
    found = _found_with(job, 'metrics: {reward: ""}')
    assert ("divergence", Severity.CRITICAL) in [f[:2] for f in found]


@pytest.mark.parametrize(("shape", "want"), [
    ("flat cost", Severity.WARNING),  # MountainCar at -200 until it learns: nothing learnt
    ("learnt cost", Severity.INFO),  # Pendulum: -1500 -> -150 and levels off: converged
    ("crosses zero", None),  # -50 -> +50 and still climbing: learning
])
def test_a_negative_reward_is_judged_by_its_size(shape: str, want: Severity | None) -> None:
    """A reward below zero is a cost; the agent maximises it all the same."""
    rng = _rng()
    t = np.arange(N, dtype=np.float64)
    ret = {"flat cost": -200 + 0.5 * rng.standard_normal(N),
           # levelled off by the later half of its steps, the window (at -t / 25 it was
           # still 2 % short there: called converged only while the spike filter took its
           # rise for spikes and the window began later)
           "learnt cost": -150 - 1350 * np.exp(-t / 15) + rng.standard_normal(N),
           "crosses zero": -50 + t / 3 + rng.standard_normal(N)}[shape]
    job = job_of({"rollout/ep_rew_mean": (STEPS, ret),
                  "train/value_loss": (STEPS, 5 + 0.5 * rng.standard_normal(N))})
    found = [(r, s) for r, s, _ in _found(job)]
    assert found == ([] if want is None else [("plateau", want)])


def _zeros(n: int, seed: int = 3) -> np.ndarray:
    """A GRPO reward logged per step: mostly exactly 0, now and then one or two of a
    group's 16 completions scoring (0.0625, 0.125)."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.15, 0.0625 * rng.integers(1, 3, n), 0.0)


def test_a_reward_exactly_zero_at_most_steps_is_not_learning() -> None:
    """Every completion of a group scoring 0 gives GRPO no advantage to learn from: its
    loss sits near 0 and says nothing; the reward does."""
    n = 100
    steps = np.arange(n) + 1.0
    job = job_of({"reward": (steps, _zeros(n)),
                  "loss": (steps, 1e-5 * np.random.default_rng(4).standard_normal(n))})
    found = _found(job)
    assert ("plateau", Severity.WARNING) in [f[:2] for f in found]
    assert any("reward is exactly 0 at" in m and "no signal" in m for _, _, m in found)


@pytest.mark.parametrize("shape", ["then climbs", "per episode"])
def test_a_reward_zero_at_first_that_then_learns_ends_with_no_warning(shape: str) -> None:
    """A sparse reward, 0 until the agent first succeeds, then climbing; or 1 on a
    successful episode and 0 on the others, successes 5 % -> 60 % of episodes: not
    learning while it is (almost) all 0; nothing is said as of the last record, once its
    share of successes has confidently grown."""
    n = 300 if shape == "then climbs" else 1000
    rng = np.random.default_rng(6)
    ret = (np.concatenate([_zeros(100), 0.2 + 0.6 * (1 - np.exp(-np.arange(200) / 40))])
           if shape == "then climbs" else (rng.random(n) < np.linspace(0.05, 0.6, n)) * 1.0)
    result = replay(job_of({"reward": (np.arange(n) + 1.0, ret)}), default_policy())
    assert any(h.rule == "plateau" and h.worst is Severity.WARNING
               and "exactly 0" in h.finding.message for h in result.histories)
    assert [f for f in result.final if f.severity.rank >= Severity.WARNING.rank] == []


@pytest.mark.parametrize("shape", ["solved", "few points", "a rare zero"])
def test_a_reward_that_is_zero_for_other_reasons_is_not_called_zero(shape: str) -> None:
    """0 as the best a reward can be (-1 a step until the goal, as FetchReach), zeros on
    fewer than ten points, or zeros among a learning reward's points."""
    rng = np.random.default_rng(5)
    ret = {"solved": np.concatenate([np.linspace(-50, -5, 20), np.zeros(180)]),
           "few points": np.array([0.0625, 0.125, 0, 0, 0, 0, 0, 0.0625, 0]),
           "a rare zero": np.where(rng.random(200) < 0.3, 0.0,
                                   np.linspace(0.2, 0.9, 200))}[shape]
    job = job_of({"reward": (np.arange(len(ret)) + 1.0, ret)})
    assert not any("exactly 0" in m for _, _, m in _found(job))
