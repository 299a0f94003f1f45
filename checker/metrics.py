"""Which series a rule reads. Names are matched after the policy's aliases.

Logs from different tools spell the same thing differently (``val_loss``,
``eval_loss``, ``val/loss``, ``valid_loss``; ``loss``, ``train_loss_epoch``,
``train/box_loss``), so the helpers here go by the words in a name, not by a list
of spellings alone.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

from trainguard.checker.model import Job, Series
from trainguard.checker.policy import Policy
from trainguard.checker.seen import Track

#: The order in which a "the loss" is looked for when the policy names none: held-out
#: losses first (they say whether the model generalises), then the training loss.
PRIMARY_ORDER = ("val_loss", "eval_loss", "validation_loss", "valid_loss", "val/loss",
                 "eval/loss", "loss", "train_loss", "train/loss", "train_loss_epoch")

#: Words that mark a series as measured on held-out data rather than on the batches
#: the optimiser steps on.
EVAL_WORDS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev"})

#: Words of a reinforcement-learning run's reward or return: its measure of progress, to
#: be maximised. Its losses follow moving targets (the returns, a TD target) and climb
#: as the agent gets better: they say nothing of progress.
REWARD_WORDS = frozenset({"reward", "rewards", "rew", "return", "returns"})
#: ... but not a preference trainer's rewards of a batch (DPO's rewards/chosen,
#: rewards/margins, rewards/accuracies), whose objective is its loss, nor a supervised
#: model's error in predicting returns (``returns_mse``).
_NOT_REWARD = frozenset({"loss", "chosen", "rejected", "margin", "margins", "accuracies",
                         "accuracy", "acc", "mse", "mae", "rmse", "error", "err"})
#: Words of a reward's spread rather than its level (RLlib logs episode_reward_min, _max
#: and _mean): the level is preferred.
_SPREAD = frozenset({"min", "max", "std", "var"})

#: Words that only say where or how often a training loss was measured.
_TRAIN_NOISE = frozenset({"train", "training", "epoch", "step", "avg", "mean", "total"})


_CAMEL = re.compile(r"([a-z])([A-Z])")
_SEPARATORS = re.compile(r"[^a-zA-Z0-9]+")


@lru_cache(maxsize=4096)
def words(name: str) -> tuple[str, ...]:
    """``train/box_loss`` -> (train, box, loss); ``valLoss`` -> (val, loss). Cached (and
    the patterns compiled once): a replay asks about the same few names at every tick."""
    spaced = _CAMEL.sub(r"\1 \2", name)
    return tuple(w for w in _SEPARATORS.split(spaced.lower()) if w)


@lru_cache(maxsize=4096)
def is_eval(name: str) -> bool:
    """True for a held-out metric: ``val_loss``, ``eval/loss``, ``outcome_val_loss``."""
    return not EVAL_WORDS.isdisjoint(words(name))


@lru_cache(maxsize=4096)
def is_reward(name: str) -> bool:
    """True for an RL run's reward or return: ``rollout/ep_rew_mean``,
    ``episode_reward_mean``, ``charts/episodic_return``, ``eval/mean_reward``."""
    w = set(words(name))
    return not w.isdisjoint(REWARD_WORDS) and w.isdisjoint(_NOT_REWARD)


def is_term(name: str) -> bool:
    """True for a training loss that is one term of the objective (``kl_loss``,
    ``aux_loss``, ``train/box_loss``), not the objective however measured (``loss``,
    ``train_loss_step``, ``train_loss_epoch``)."""
    return ("loss" in name.lower() and not is_eval(name)
            and [w for w in words(name) if w not in _TRAIN_NOISE] != ["loss"])


def reward(job: Job, policy: Policy | None = None) -> Series | None:
    """The reward or return an RL run logs, or None: the job is then no RL run. The one
    ``policy.metrics["reward"]`` names (an empty name: no series is an RL reward, for a
    run whose ``returns`` are a forecast's), else the shortest name of those it logs."""
    if policy is not None and "reward" in policy.metrics:
        named = policy.metrics["reward"]
        return get(job, "reward", policy) if named else None
    series = job.series  # read by name: only the rewards are looked at
    found = [series[k] for k in sorted(series) if is_reward(k) and len(series[k])]
    level = [s for s in found if _SPREAD.isdisjoint(words(s.name))]
    return _shortest(level or found) if found else None


def get(job: Job, name: str, policy: Policy) -> Series | None:
    """The series for a well-known name, following ``policy.metrics`` aliases."""
    real = policy.metrics.get(name, name)
    s = job.series.get(real)
    return s if s is not None and len(s) else None


def loss_like(job: Job, held_out: bool | None = None) -> list[Series]:
    """Every series whose name says it is a loss (held-out or training ones only, with
    ``held_out``): the ones NaN and blow-ups matter in. Only those are read (by name), so
    a follower re-runs a rule asking for them when such a loss grows, not when any series
    does (``checker.follow``): a rule after the held-out loss is not re-run at every
    training record."""
    series = job.series
    return [series[k] for k in sorted(series) if "loss" in k.lower()
            and (held_out is None or is_eval(k) == held_out) and len(series[k])]


def primary(job: Job, policy: Policy, state: dict[str, Any] | None = None) -> Series | None:
    """The one metric that says whether the job is learning (``state``: see
    ``objective``): an RL run's reward, else a loss."""
    if "objective" in policy.metrics:
        return get(job, "objective", policy)
    if (r := reward(job, policy)) is not None:
        return r
    for name in PRIMARY_ORDER:
        s = get(job, name, policy)
        if s is not None:
            return s
    return objective(job, True, state) or objective(job, False, state)


def _shortest(series: list[Series]) -> Series:
    return min(series, key=lambda s: (len(words(s.name)), s.name))


def training_objective(job: Job, policy: Policy,
                       state: dict[str, Any] | None = None) -> Series | None:
    """The loss the optimiser minimises, as one series (see ``objective``)."""
    alias = policy.metrics.get("loss")
    if alias and (s := job.series.get(alias)) is not None and len(s):
        return s
    return objective(job, False, state)


def objective(job: Job, held_out: bool, state: dict[str, Any] | None = None) -> Series | None:
    """The total loss on one side (held-out or training), as one series.

    The total when the job logs one (``loss``, ``train_loss``, ``val/loss``; a
    per-epoch form before a per-step one: less noise); else the sum of the loss
    components logged together (Ultralytics' box, cls and dfl losses; a GAN's
    generator and discriminator losses, whose sum does not swing as each side wins in
    turn); else None. One component alone can stall while the model learns.

    A followed rule passes its ``ctx.state``: the sum is then kept there and only the
    records new since its last tick are added (summed afresh at every tick, a replay of
    a GAN's run costs the square of its length).
    """
    side = loss_like(job, held_out)
    if not side:
        return None
    noise = _TRAIN_NOISE | (EVAL_WORDS if held_out else frozenset())
    totals = [s for s in side if [w for w in words(s.name) if w not in noise] == ["loss"]]
    if totals:
        by_name = {s.name: s for s in totals}
        for name in PRIMARY_ORDER:
            if name in by_name:
                return by_name[name]
        epoch = [s for s in totals if "epoch" in words(s.name)]
        return _shortest(epoch or totals)
    first = side[0]
    kept = state.get(_SUM + str(held_out)) if state is not None else None
    if not isinstance(kept, _Sum):
        kept = _Sum()
    same = [s for s in side if len(s) == len(first) and kept.same_steps(s, first)]
    if len(same) < 2:
        return first if len(side) == 1 else None
    total = kept.add(same)
    if state is not None:
        state[_SUM + str(held_out)] = kept
    return total


_SUM = "objective sum:"  # its key in a rule's state


class _Sum:
    """The sum of loss components logged together, kept from tick to tick: the first
    ``n`` records of the components last summed (a ``Track`` each, to tell that a later
    cut extends them), and their total so far in a buffer that grows by doubling."""

    def __init__(self) -> None:
        self.n = 0
        self.names: tuple[str, ...] = ()
        self.tracks: dict[str, Track] = {}
        self.total = np.empty(0)

    def _holds(self, s: Series) -> bool:
        t = self.tracks.get(s.name)
        return t is not None and t.extended_by(s)

    def same_steps(self, s: Series, first: Series) -> bool:
        """``s`` is logged at ``first``'s steps; for two components summed last time and
        extended since, only their new steps are compared (the earlier ones matched)."""
        n0 = self.n if self._holds(s) and self._holds(first) else 0
        if s is first:
            return True
        if len(s) - n0 <= 4:  # a followed rule's tick: a record or two, cheaper in Python
            return all(a == b or (a != a and b != b)  # NaN: a record without a step
                       for a, b in zip(s.step[n0:].tolist(), first.step[n0:].tolist(),
                                       strict=True))
        return np.array_equal(s.step[n0:], first.step[n0:], equal_nan=True)

    def add(self, same: list[Series]) -> Series:
        names, first, n = tuple(s.name for s in same), same[0], len(same[0])
        if names != self.names or not all(self._holds(s) for s in same):
            # other components: summed afresh, in a buffer of their own (series handed
            # out before keep their values)
            self.n, self.names, self.tracks = 0, names, {k: Track() for k in names}
            self.total = np.empty(0)
        n0 = self.n
        if n > len(self.total):
            grown = np.empty(max(n, 2 * len(self.total)))
            grown[:n0] = self.total[:n0]
            self.total = grown
        self.total[n0:n] = np.sum([s.value[n0:n] for s in same], axis=0)
        for s in same:
            self.tracks[s.name].read_to(s)
        self.n = n
        total = Series.__new__(Series)  # views of arrays already checked: no re-validation
        total.name, total.time, total.step = "+".join(names), first.time, first.step
        total.value = self.total[:n]
        return total


def _held_out_metric(name: str) -> bool:
    """``is_eval``, and Ultralytics' ``metrics/accuracy_top1``: it measures its validation
    set under ``metrics/`` (beside ``val/loss``), with no word that says so."""
    return is_eval(name) or (name.startswith("metrics/") and "train" not in words(name))


def _accuracies(job: Job) -> list[Series]:
    series = job.series  # read by name: only the accuracies are looked at
    return [series[k] for k in sorted(series)
            if {"acc", "accuracy"} & set(words(k)) and "loss" not in words(k)
            and len(series[k])]


def accuracy_partner(job: Job, s: Series) -> Series | None:
    """The accuracy measured on the same side (held-out or training) as loss ``s``, else
    the other side's."""
    side = is_eval(s.name)
    found = _accuracies(job)
    same = [a for a in found if _held_out_metric(a.name) == side]
    # else the other side's: both name the same task's K (Ultralytics logs a validation
    # accuracy alone, beside its training loss too)
    return _shortest(same or found) if found else None


def accuracy_across(job: Job, s: Series) -> Series | None:
    """The accuracy measured on the other side from loss ``s`` (the training accuracy
    beside a held-out loss), or None."""
    side = is_eval(s.name)
    other = [a for a in _accuracies(job) if _held_out_metric(a.name) != side]
    return _shortest(other) if other else None


_LR = re.compile(r"lr\d*")


def _is_learning_rate(name: str) -> bool:
    w = words(name)
    return (any(_LR.fullmatch(x) for x in w) or ("learning" in w and "rate" in w)) \
        and not {"loss", "scale", "decay", "finder"} & set(w)


def learning_rate(job: Job) -> Series | None:
    """The optimiser's learning rate as the run logs it (``lr``, ``learning_rate``,
    ``lr-AdamW``, ``train/lr``, Ultralytics' ``x/lr0``): the one of fewest words."""
    series = job.series  # read by name: a replay re-asks only when a rate changes
    found = [series[k] for k in sorted(series) if _is_learning_rate(k) and len(series[k])]
    return _shortest(found) if found else None


def _is_grad_norm(name: str) -> bool:
    w = set(words(name))
    return (bool(w & {"grad", "gradient", "grads"}) and "norm" in w) or bool(
        w & {"gnorm", "gradnorm"})


def grad_norm(job: Job) -> Series | None:
    """The norm of the gradient as the run logs it (``grad_norm``, ``train/grad_norm``,
    ``gradient_norm``, fairseq's ``gnorm``): the one of fewest words and no statistic's
    (``grad_norm_max``), so a total before a per-layer norm."""
    series = job.series
    found = [series[k] for k in sorted(series) if _is_grad_norm(k) and len(series[k])]
    total = [s for s in found if _SPREAD.isdisjoint(words(s.name))]
    return _shortest(total or found) if found else None


def warming_up(job: Job) -> bool:
    """Whether the learning rate is still in its warm-up: it has risen at every record from
    its first to its latest. An optimiser at a small fraction of its rate has not started
    to learn yet: a DPO run's loss at ln 2 for its first 80 of 2,900 steps, its rate rising
    linearly to step 290, is no verdict."""
    lr = learning_rate(job)
    if lr is None or len(lr) < 2:
        return False
    r, n = lr.value, len(lr)
    # Read from the start in growing chunks: a warm-up is a small part of a run, so a
    # replay that asks at every record reads about the warm-up's length, not the run's.
    m = 64
    while True:
        m = min(m, n)
        # a relative margin: a rate printed to a few digits is not rising by its rounding
        if not (r[1:m] > r[:m - 1] * (1 + 1e-6)).all():
            return False
        if m == n:
            return True
        m *= 16


def phase_start(job: Job) -> float | None:
    """When the run's latest phase began: the time of the last record whose ``epoch`` went
    back while its step went on (a trainer built again on new data, or resumed with its
    data loader started over, keeping the global step), else None.

    The loss before it was measured on other data or another schedule: a fine-tune at
    2.12 whose next phase starts at 2.49 has not stopped learning.
    """
    ep = job.series.get("epoch")
    if ep is None or len(ep) < 2:
        return None
    e, st = ep.value, ep.step
    went = np.flatnonzero((e[1:] < e[:-1]) & (st[1:] > st[:-1]))
    return float(ep.time[went[-1] + 1]) if len(went) else None


def per_epoch(job: Job, s: Series, min_per_epoch: float, min_epochs: int = 2) -> Series:
    """``s`` as one point per epoch (the median of each epoch's points, at its last step)
    when the job logs an ``epoch`` column, ``s`` spans at least ``min_epochs`` epochs and
    has at least ``min_per_epoch`` points per epoch on average; else ``s`` unchanged (a
    two-epoch fine-tune's 50 losses are judged as 50 points, not 2).

    Per-batch losses of a loader that serves the same batches in the same order each
    epoch repeat a pattern whose point-to-point swing hides whether the level moves;
    an epoch's median does not swing with it.
    """
    ep = job.series.get("epoch")
    if (ep is None or len(ep) == 0 or is_eval(s.name) or len(s) < 2 * min_per_epoch
            or not np.isfinite(s.step).all()):
        return s  # held-out metrics are measured once per evaluation, not per batch
    ok = np.isfinite(ep.step) & np.isfinite(ep.value)
    e_step, e_val = ep.step[ok], np.floor(ep.value[ok])
    order = np.argsort(e_step, kind="stable")
    e_step, e_val = e_step[order], e_val[order]
    if len(e_val) == 0 or (np.diff(e_val) < 0).any():
        return s  # a restarted or resumed log: epochs do not say where a point lies
    idx = np.searchsorted(e_step, s.step, side="right") - 1
    epoch = np.where(idx >= 0, e_val[np.clip(idx, 0, None)], e_val[0])
    if (np.diff(epoch) < 0).any():
        return s  # steps out of order: epochs do not group the points
    starts = np.flatnonzero(np.r_[True, epoch[1:] != epoch[:-1]])
    if len(starts) < max(2, min_epochs) or len(s) / len(starts) < min_per_epoch:
        return s
    ends = np.r_[starts[1:], len(epoch)]
    # Each epoch's median at once: sort by (epoch, value), non-finite values last within
    # their epoch and left out of the count.
    vals = s.value
    finite = np.isfinite(vals)
    order = np.lexsort((np.where(finite, vals, np.inf), epoch))
    sv = vals[order]
    counts = np.add.reduceat(finite.astype(np.int64), starts)
    lo = starts + np.maximum(counts - 1, 0) // 2
    hi = starts + counts // 2
    med = np.where(counts > 0, (sv[lo] + sv[np.minimum(hi, ends - 1)]) / 2, np.nan)
    at = ends - 1
    return Series(f"{s.name} (per-epoch median)", s.time[at], s.step[at], med)
