"""``plateau``: the objective stopped improving: *not learning* or *converged*.

Anchors: Keras EarlyStopping (patience=0, min_delta=0), Lightning EarlyStopping
(patience=3 checks), Debugger loss_not_decreasing (10 steps, 0.1 %). Those compare
single noisy values a fixed number of checks apart. This rule:

- measures its window in the run's own steps (or seconds), never in points: a run
  that evaluates every 125 steps and then every 5 near its end has a window covering
  the same stretch of training as an evenly logged one; its head and tail are the
  first and last thirds of the window's *span*;
- compares robust levels (medians) of head and tail, and fires only when it is
  confident, given the points' own noise (first differences, robust to the trend),
  that the improvement is below ``min_rel_improvement`` of the level. The margin is
  a Student-t quantile for the points available, so a short run needs strong evidence
  (a loss flat to many digits) while weak evidence on few points is not enough;
- aggregates per epoch where the job logs an ``epoch`` column and several points per
  epoch: per-batch losses that repeat the same pattern each epoch hide the level;
- calls a run whose loss sits at chance level, ln K for a K-class task, *not
  learning* on few points: accuracy near 1/K says what K is; without an accuracy,
  only K up to ``chance_max_classes`` is trusted, and the loss must have started and
  ended there and never gone meaningfully below it;
- judges an RL run by its reward or return (maximised), not its losses, which follow
  moving targets;
- tells *not learning* (the whole run never improved meaningfully: warning) from
  *converged* (it learnt, and improvement per unit of time is now negligible: info,
  with what stopping now would save; whether to stop is the policy's to choose);
- says *not learning* only of a run whose records hold most of its steps: one whose
  log begins far into training (a Lightning version folder or a text log after a
  resume) shows the slow tail of its learning, where a healthy run improves a fraction
  of a percent per thousand steps; at most it has *converged*.

A metric that has gone below zero (a GAN critic's Wasserstein loss) has no floor to
measure improvement against and is not judged.

Its cost does not grow with the square of the run when it is judged at every record (a
replay at one tick per record). Up to ``max_points`` records of the objective it judges
all of them at every new one. Beyond that it judges the run as of its latest block
boundary (a power of two records, at most ``1/rejudge_parts`` of the run: the verdict
trails the last record by less than that share of the run, where its window is half
the run), on the medians of at most ``max_points`` consecutive blocks. ``check`` and a
replay judge the same prefix, so they agree; a follower keeps the judgement in
``ctx.state`` and is not called until the next boundary (``checker.follow.STABLE``), so
a million records cost a few hundred judgements.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from trainguard.checker import cost
from trainguard.checker.follow import STABLE
from trainguard.checker.metrics import (
    accuracy_across,
    accuracy_partner,
    is_eval,
    is_reward,
    per_epoch,
    phase_start,
    primary,
    training_objective,
    warming_up,
)
from trainguard.checker.model import Finding, FloatArray, Job, Series, Severity
from trainguard.checker.policy import Policy
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.stats import (
    diff_sigma,
    measured,
    median,
    resolution,
    rolling_median3,
    span_thirds,
    t_quantile,
)

#: Latest records the logging resolution is read from (4 decimals in Hugging Face logs).
_QUANTUM_POINTS = 64
#: A loss constant to its last digit is judged where it has this many units of it at least.
_UNITS = 100
#: A log whose first record is this many logging intervals into the run begins late.
_LATE_INTERVALS = 20
#: Values within this share of each other are one value: a float32 loss averaged over
#: an epoch differs in its last bits (11.090352058 and 11.090352178, a collapsed DINO run).
_SAME = 1e-6
#: A loss whose logged resolution is this share of its level or less is printed to 6
#: significant digits or more (a progress bar rounds to 3 or 4).
_PRECISE = 1e-5
#: Values in a row that, logged again in the same order, say the model did not change ...
_REPEAT = 6
#: ... where each has this many units of the last logged digit at least (4 digits).
_UNITS_REPEAT = 1000


@dataclass
class PlateauParams:
    metric: str | None = param(
        None, "the objective; default val_loss, eval_loss, ..., loss, train_loss, *loss*")
    mode: Literal["min", "max"] = param(
        "min", "min for a loss, max for an accuracy (an RL run's reward, the default "
        "objective when the run logs one, is always max)")
    window_fraction: float = param(
        0.5, "the window is this later fraction of the run so far, in steps (or seconds)")
    window_steps: float | None = param(None, "a fixed window in steps instead of the fraction")
    window_seconds: float | None = param(None, "a fixed window in seconds instead of the fraction")
    min_points: int = param(
        5, "points needed in the window; few points also widen the margin (Student t)")
    min_rel_improvement: float = param(
        0.01, "improvement below this fraction of the level is flat (over the window, "
        "and over the whole run for 'not learning')")
    z: float = param(
        2.0, "confidence as a normal z (2.0 ~ 97.7 %, one-sided): the improvement plus "
        "the t margin for this confidence must stay below the limit")
    epoch_points: float = param(
        2.0, "with an epoch column, judge per-epoch medians when an epoch holds this many "
        "points on average")
    chance_tolerance: float = param(
        0.01, "chance level: the loss never went below ln K by more than this fraction")
    chance_band: float = param(
        0.05, "chance level: without an accuracy, the loss started and ended within this "
        "fraction above ln K (and improved less than min_rel_improvement between)")
    chance_max_classes: int = param(
        2, "without an accuracy to confirm K, only ln 2 .. ln of this are chance levels: "
        "ln 3 .. ln 10 lie where many language-model losses do")
    chance_min_points: int = param(
        5, "points needed to call a loss at chance level (a run may sit there for its "
        "first few evaluations before it learns)")
    spike_factor: float = param(
        2.0, "latest loss points this many times the best level (median of 3) reached "
        "before them are a spike in progress (set aside) or a climb (left to the "
        "divergence and overfit rules)")
    spike_points: int = param(
        3, "... a spike when at most this many points, a climb when more")
    chance_acc_tolerance: float = param(
        0.15, "chance level: an accuracy within this fraction of 1/K names K")
    max_points: int = param(
        1024, "an objective with more records is judged on the medians of at most this "
        "many consecutive blocks, as of its latest block boundary (cost, not verdicts)")
    rejudge_parts: int = param(
        64, "beyond max_points, the verdict is renewed each time the objective grows by a "
        "block of at most 1/this of its records")
    reward_zero: float = param(
        0.5, "an RL run's reward exactly 0 at more than this fraction of its points (twice "
        "min_points at least), over the whole run and its later half, though some point "
        "was above 0 and none below, is not learning: the policy gets no signal (GRPO's "
        "advantages are all 0 when every completion of a group scores the same)")
    seen_fraction: float = param(
        0.5, "'not learning' is said only of a run whose records cover at least this "
        "fraction of its steps: a log that begins at step 50,000 (a run resumed from a "
        "checkpoint) holds the slow tail of its learning, not its start")


def _has_points(s: Series, n: int) -> bool:
    """``s`` has at least ``n`` finite values (looked at from its end: a replay asks at
    every tick, and a long series has them there)."""
    if len(s) < n:
        return False
    return bool(np.isfinite(s.value[-n:]).all()) or int(np.isfinite(s.value).sum()) >= n


@register
class Plateau(Rule):
    name = "plateau"
    Params = PlateauParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: PlateauParams = self.params
        raw = job.series.get(p.metric) if p.metric else primary(job, ctx.policy, ctx.state)
        if raw is None or len(raw) == 0:
            return []
        held_out: Series | None = None
        if not p.metric and "objective" not in ctx.policy.metrics and is_eval(raw.name) \
                and not _has_points(raw, p.min_points):
            # Too few evaluations to judge (a run of 3 validation epochs, or one whose
            # validation loss is NaN): the training loss logged meanwhile is judged instead,
            # until there are enough.
            train = training_objective(job, ctx.policy, ctx.state)
            if train is not None and _has_points(train, p.min_points):
                held_out, raw = raw, train
        n = len(raw)
        upto, block = judged_prefix(n, p.max_points, p.rejudge_parts)
        if block == 1:
            found = self._judge(job, ctx, raw)
        else:
            # The run as of its latest block boundary: the same prefix whether judged once
            # (check) or followed (replay), so both agree; followed, kept until the next.
            at = float(raw.time[upto - 1])
            # what says the cut extends the prefix judged last (else: judged afresh)
            mark = (raw.name, upto, block, at, float(raw.time[0]), float(raw.value[0]),
                    float(raw.value[upto - 1]))
            kept = ctx.state.get("judged") if ctx.state is not None else None
            if kept is not None and kept[0] == mark:
                found = [replace(f, evidence=dict(f.evidence)) for f in kept[1]]
            else:
                cut = _cut_job(job, _AsOf(job.series, at, raw.name, upto))
                found = self._judge(cut, ctx, _head(raw, upto))
                if ctx.state is not None:
                    ctx.state["judged"] = (mark, [replace(f, evidence=dict(f.evidence))
                                                  for f in found])
            if ctx.state is not None:
                # The next boundary, or where the block doubles (a shorter prefix then).
                ctx.state[STABLE] = {raw.name: min(upto + block, p.rejudge_parts * 2 * block)}
                if held_out is not None:  # its next record may be the one that is enough
                    ctx.state[STABLE][held_out.name] = len(held_out) + 1
        return [self._priced(job, ctx, f) for f in found]

    def _judge(self, job: Job, ctx: Context, raw: Series) -> list[Finding]:
        """The verdict on ``raw`` (the objective) as ``job`` holds it, without money."""
        p: PlateauParams = self.params
        if not np.isfinite(raw.value[-1]):
            return []  # the divergence rule is on it
        if self._rl(raw, ctx.policy) and not (keep := measured(raw.value)).all():
            # a reward logged again unchanged is one measurement (a return written at
            # every step of its episode: 5 records of one episode were "not learning")
            raw = Series(raw.name, raw.time[keep], raw.step[keep], raw.value[keep])
        phase = phase_start(job)
        if phase is not None:
            # judged from where its latest phase began: a run begun late is never called
            # not learning until its records cover half its steps (``_begins_late``)
            job, raw = _cut_job(job, _Since(job.series, phase)), _tail(raw, phase)
            if len(raw) == 0:
                return []
        s = _reduce(per_epoch(job, raw, p.epoch_points, p.min_points), p.max_points)
        keep = np.isfinite(s.value)
        x = _axis(job, s, by_time=p.window_seconds is not None)
        on_steps = x is s.step
        keep &= np.isfinite(x)
        x, v = x[keep], s.value[keep]
        rl = self._rl(s, ctx.policy)
        mode = "max" if rl else p.mode
        if mode == "min" and len(v) >= p.chance_min_points and not v.any():
            # Exactly 0 from its first record on (with grad_norm 0: every label masked, a
            # loss that sees no data): no level to improve on, and nothing is learnt. No
            # warm-up makes a loss 0 (an axolotl run logged loss 0.0 and grad_norm 0.0
            # for its 11 records while its rate rose: judged after the warm-up, never).
            return [self._finding(
                job, s, int(np.flatnonzero(keep)[0]), Severity.WARNING, "flat",
                f"{s.name} is exactly 0 at all {len(v)} points: nothing is learnt (every "
                "label masked, or a loss that sees no data?)",
                {"points": len(v), "all_zero": True})]
        if warming_up(job):
            return []  # the optimiser is not at its rate yet: nothing to judge
        if rl and (nothing := self._zero_reward(job, s, v, keep)) is not None:
            return [nothing]
        if len(v) < p.chance_min_points or (mode == "min" and np.min(v) < 0):
            # Improvement relative to the level needs a floor at zero; a loss that went
            # negative (a GAN critic's Wasserstein loss, a continuous NLL) has none. A
            # reward below zero is a cost (Pendulum's -1500 to -150, MountainCar's -200
            # until it learns): its size is the level, and a reward crossing zero has
            # none, so it is never confidently flat there.
            return []
        idx = np.flatnonzero(keep)
        sign = 1.0 if mode == "min" else -1.0
        trailing = _trailing_spike(v, p.spike_factor) if mode == "min" else 0
        if trailing > p.spike_points:
            # A climb far above the best level reached: the divergence and overfit rules
            # judge it; it is not a plateau.
            return []
        if trailing:  # a spike in progress: judge the points before it
            x, v, idx = x[:-trailing], v[:-trailing], idx[:-trailing]
        x, v, idx = _calm(x, v, idx, sign)
        chance = self._chance(job, raw, v) if mode == "min" else None
        if chance is not None:
            k, ln_k, acc = chance
            # above the band, only with an accuracy at 1/K: worse than chance, not at it
            where = ("sits at" if np.median(v) <= ln_k * (1 + p.chance_band)
                     else "is no better than")
            return [self._finding(
                job, s, int(idx[0]), Severity.WARNING, "chance",
                f"{s.name} {where} chance level ln {k} = {ln_k:.4g} for the whole run"
                + (f" (accuracy {acc:.3g} ~ 1/{k})" if acc is not None else "")
                + ": not learning",
                {"classes": k, "chance_loss": ln_k, "accuracy": acc, "points": len(v)})]
        if mode == "min" and (zero := self._zero_accuracy(job, raw, v)) is not None:
            acc_name, evaluations = zero
            return [self._finding(
                job, s, int(idx[0]), Severity.WARNING, "flat",
                f"{s.name} never improved on its first value {v[0]:.4g} and {acc_name} is 0 "
                f"at all {evaluations} evaluations, worse than chance: not learning (do the "
                "evaluation's labels match the training's?)",
                {"points": len(v), "first": float(v[0]), "accuracy": 0.0,
                 "never_improved": True})]
        if len(v) < p.min_points:
            return []
        lo = self._window_start(job, x)
        # A loss logged to 4 decimals near 0.0002 moves by whole units of 0.0001: a change
        # under one unit is all the window can be confident of (the whole run's test not).
        quantum = resolution(raw.value[-_QUANTUM_POINTS:])
        late = on_steps and self._begins_late(x)
        # a log begun many logging intervals into the run, not merely one whose first
        # record comes after its first few steps (a tqdm postfix printing the loss logged
        # at step 10 again at steps 11, 12, ... stands still until step 20)
        far_in = late and len(x) > 1 and x[0] >= _LATE_INTERVALS * float(np.median(np.diff(x)))
        if mode == "min" and (still := self._unchanged(job, s, raw, v, idx, lo, quantum,
                                                      far_in)):
            return [still]
        if len(v) < _FIRST_EPOCH_POINTS and _in_first_epoch(job, raw):
            return []  # many points, one epoch: the data has not been seen once yet
        win = self._flat(x[lo:], v[lo:], sign, quantum=quantum)
        if win is None or not win[0]:
            if late:
                return []
            return (self._never(job, ctx, s, v, idx, sign)
                    or self._training_says(job, ctx, s, x, v, sign))
        _, improvement, se, level = win
        if late:
            return [self._converged(job, s, int(idx[lo]), v, idx, improvement, se, level,
                                    mode, quantum, begins=float(x[0]))]
        # medians per epoch hide a descent inside the first epoch: the points say it
        raw_learnt = s is not raw and self._raw_learnt_first(
            job, raw, float(x[lo]), sign, p.window_seconds is not None)
        whole = self._flat(x, v, sign, learnt=True)
        if whole is not None and whole[0] and not raw_learnt \
                and not self._early_worse(v, whole[1], level, quantum) \
                and not self._learnt_first(v, lo, sign) and not self._training_learnt(job, ctx, s):
            _, run_improvement, _, _ = whole
            return [self._finding(
                job, s, int(idx[0]), Severity.WARNING, "flat",
                f"{s.name} improved {_rel(run_improvement, level, v)} over the whole run and "
                f"{_rel(improvement, level, v)} over the last {len(v) - lo} points (needs "
                f"{p.min_rel_improvement:.1%}): not learning",
                {"points": len(v) - lo, "rel_improvement": improvement / level,
                 "run_rel_improvement": run_improvement / level, "noise_se": se / level,
                 "level": level})]
        never = None if raw_learnt else self._never(job, ctx, s, v, idx, sign)
        if never:
            return never
        return [self._converged(job, s, int(idx[lo]), v, idx, improvement, se, level, mode,
                                quantum)]

    def _unchanged(self, job: Job, s: Series, raw: Series, v: FloatArray, idx: np.ndarray,
                   lo: int, quantum: float, late: bool) -> Finding | None:
        """*Not learning* for a loss whose model is not changing. In a log that begins far
        into training (``late``: ``_LATE_INTERVALS`` logging intervals at least, where the
        tests below call it converged at most), or printed to 6 significant digits or
        more (``_PRECISE``): one value, to all its logged digits (or ``_SAME``), at every
        point of its window (``min_points`` at least, ``_UNITS`` units of its last digit:
        a loss printed to 2 decimals at 0.69 has 69). In any log:
        its latest ``_REPEAT`` values the very sequence it logged before (``_repeated``:
        the same batches through the same weights, no optimiser step). Learning, or a run
        converged, moves a loss in its last digits from point to point. A log that prints
        its last loss again at every progress update (a tqdm postfix) stands still for a
        while near its start, which the flatness tests below judge on their margins."""
        window = v[lo:]
        level = abs(float(window[0]))
        # printed to 6 significant digits or more, one value is no progress bar's reprint
        # of a rounded loss: a log that begins earlier is judged too
        precise = quantum <= _PRECISE * level
        if (late or precise) and len(window) >= self.params.min_points and level > 0 \
                and level >= _UNITS * quantum \
                and bool((np.abs(window - window[0]) <= _SAME * level).all()):
            return self._finding(
                job, s, int(idx[lo]), Severity.WARNING, "flat",
                f"{s.name} is {window[0]:.10g} at all {len(window)} points of its later half, "
                "to its last logged digit or to a part in a million: the model is not "
                "changing (collapsed to one output, or no optimiser step?): not learning",
                {"points": len(window), "value": float(window[0]), "unchanged": True})
        found = _repeated(raw.value[-self.params.max_points:], quantum,
                          raw.step[-self.params.max_points:])
        if found is None:
            return None
        before, latest = found
        n = len(raw) - min(len(raw), self.params.max_points)
        a, b = raw.step[n + before], raw.step[n + latest]
        where = (f"steps {a:g}-{raw.step[n + before + _REPEAT - 1]:g} and again at "
                 f"{b:g}-{raw.step[n + latest + _REPEAT - 1]:g}"
                 if np.isfinite(a) and np.isfinite(b) else "records apart")
        return self._finding(
            job, s, int(np.flatnonzero(np.isfinite(s.value))[0]), Severity.WARNING, "flat",
            f"{s.name} logged the same {_REPEAT} values in the same order at {where}: the "
            "same batches through the same weights, so the model is not changing (a "
            "learning rate of 0, frozen weights, or an optimiser that never steps?): not "
            "learning",
            {"points": _REPEAT, "repeated": True})

    def _rl(self, s: Series, policy: Policy) -> bool:
        """Whether ``s`` is an RL run's reward, the objective chosen when the policy names
        none: it is maximised, whatever ``mode`` says."""
        named = policy.metrics.get("reward")
        rl = is_reward(s.name) if named is None else bool(named) and s.name == named
        return self.params.metric is None and rl

    def _zero_reward(self, job: Job, s: Series, v: FloatArray, keep: np.ndarray
                     ) -> Finding | None:
        """*Not learning* for a reward exactly 0 at most of its points (``reward_zero``),
        over the whole run and its later half, that was above 0 at some point (so 0 is not
        its best: a goal-reaching task's reward of -1 a step is 0 once solved) and never
        below (a score with 0 as its floor, such as the share of completions right), with
        no confidently larger share of points above 0 in its later half than in its first."""
        p: PlateauParams = self.params
        n = len(v)
        if n < 2 * p.min_points or np.min(v) < 0 or np.max(v) <= 0:
            return None
        zero = v == 0
        if zero.mean() <= p.reward_zero or zero[n // 2:].mean() <= p.reward_zero:
            return None
        # a sparse reward whose share of successes grows (0 on most episodes, fewer of them
        # later) is learning: the later half's share above 0 must not be confidently higher
        first, later = 1.0 - zero[:n // 2].mean(), 1.0 - zero[n // 2:].mean()
        share = 1.0 - zero.mean()
        se = math.sqrt(share * (1 - share) * (1 / (n // 2) + 1 / (n - n // 2)))
        if later - first > p.z * se:
            return None
        at = int(np.flatnonzero(keep)[int(np.argmax(zero))])
        return self._finding(
            job, s, at, Severity.WARNING, "flat",
            f"{s.name} is exactly 0 at {int(zero.sum())} of its {n} points (never above "
            f"{np.max(v):.4g}): the policy gets almost no reward, so no signal to learn "
            "from (GRPO's advantages are all 0 when every completion of a group scores 0): "
            "not learning",
            {"points": n, "zero_points": int(zero.sum()), "max": float(np.max(v)),
             "zero_reward": True})

    # --------------------------------------------------------------------- the tests

    def _flat(self, x: FloatArray, v: FloatArray, sign: float, learnt: bool = False,
              quantum: float = 0.0) -> tuple[bool, float, float, float] | None:
        """(confidently flat?, improvement, its standard error, level) between the first
        and last thirds of the span of ``x``; None when a third holds fewer than two
        points or the level is zero. With ``learnt``, the better of the middle and last
        thirds stands for the end: a run that learnt and then got worse has learnt. Less
        than ``quantum`` (the logging resolution) is flat too, whatever the level."""
        p: PlateauParams = self.params
        if len(v) < p.min_points:
            return None
        head, tail = span_thirds(x)
        kh, kt = int(head.sum()), int(tail.sum())
        if kh < 2 or kt < 2:
            return None
        level = abs(median(v))
        if level == 0:
            return None
        improvement = sign * (median(v[head]) - median(v[tail]))
        middle = ~head & ~tail
        if learnt and middle.sum() >= 2:
            mid_improvement = sign * (median(v[head]) - median(v[middle]))
            if mid_improvement > improvement:
                improvement, kt = mid_improvement, int(middle.sum())
        se = _median_gap_se(diff_sigma(v), kh, kt)
        margin = self._t(len(v)) * se
        # near the last logged digit, 1 % of the level is below what the log can show
        least = max(p.min_rel_improvement * level, quantum)
        return improvement + margin < least, improvement, se, level

    def _t(self, n: int) -> float:
        """The Student-t quantile of confidence ``z`` (as a normal quantile) for a margin
        on ``n`` points."""
        confidence = 0.5 * (1.0 + math.erf(self.params.z / math.sqrt(2.0)))
        return t_quantile(confidence, max(n - 2, 1))

    def _learnt_first(self, v: FloatArray, lo: int, sign: float) -> bool:
        """Whether the run learnt, if only in a stretch too short to move its first third's
        median (a loss falling 7-fold in the first 5 % of its steps), and its window from
        ``lo`` still holds what it learnt: the first points (median of three) stand
        confidently worse than the window, and the window is not confidently worse than
        the best stretch before it (a run that learnt and then rose to sit 1.3 x above its
        best is stuck there, not converged)."""
        p: PlateauParams = self.params
        tail = v[lo:]
        if lo < 3:
            return False
        level, sigma = abs(median(tail)), diff_sigma(v)
        t = self._t(len(v))
        improvement = sign * (median(v[:3]) - median(tail))
        if improvement - t * _median_gap_se(sigma, 3, len(tail)) \
                <= p.min_rel_improvement * level:
            return False
        # the best stretch before the window, in stretches a third of the window long
        k = max(len(tail) // 3, 3)
        best = min(sign * median(v[a:a + k]) for a in range(0, lo - k + 1, k)) \
            if lo >= k else sign * median(v[:lo])
        worse = sign * median(tail) - best
        return bool(worse - t * _median_gap_se(sigma, k, len(tail))
                    <= p.min_rel_improvement * level)

    def _raw_learnt_first(self, job: Job, raw: Series, start: float, sign: float,
                          by_time: bool) -> bool:
        """``_learnt_first`` on the points of a loss judged as per-epoch medians, its
        window from ``start`` (on the judged axis): medians per epoch hide a descent inside
        the first epoch (a loss 0.0517 -> 0.0497 over the first 200 of its 3,060 steps an
        epoch, then still: five epoch medians alike were "not learning" beside the points'
        own "converged")."""
        r = _reduce(raw, self.params.max_points)
        x = _axis(job, r, by_time=by_time)
        ok = np.isfinite(x) & np.isfinite(r.value)
        x, v = x[ok], r.value[ok]
        return len(v) > 0 and self._learnt_first(v, int(np.searchsorted(x, start)), sign)

    def _begins_late(self, steps: FloatArray) -> bool:
        """Whether the judged points' steps begin so far into training that they cover
        less than ``seen_fraction`` of the run's steps: its start is not in them."""
        return bool(steps[0] > 0 and steps[-1] - steps[0] < self.params.seen_fraction * steps[-1])

    def _never(self, job: Job, ctx: Context, s: Series, v: FloatArray, idx: np.ndarray,
               sign: float) -> list[Finding]:
        """*Not learning* for a run that never improved on its first value (and whose
        training loss did not fall either), where the window test found no plateau or
        took it for convergence: its recent trend may be down, recovering part of a loss."""
        never = self._never_improved(v, sign)
        if never is None or self._training_fell(job, ctx, s):
            return []
        improvement, best, level = never
        return [self._finding(
            job, s, int(idx[0]), Severity.WARNING, "flat",
            f"{s.name} never improved on its first value {v[0]:.4g} in {len(v)} points "
            f"(best since {best:.4g}, {_rel(improvement, level, v)}): not learning",
            {"points": len(v), "rel_improvement": improvement / level, "first": float(v[0]),
             "best_since": best, "level": level, "never_improved": True})]

    def _training_says(self, job: Job, ctx: Context, s: Series, x: FloatArray, v: FloatArray,
                       sign: float) -> list[Finding]:
        """*Not learning* from the training loss, for a held-out objective too noisy to
        say either way (neither confidently flat nor confidently improving): the loss the
        model is fit on never improved on its first value (a network whose training loss
        sat at 6.07-6.14 for 100 epochs while its validation loss jumped between 5.8 and
        9). A training loss that learnt and then sat still says nothing here: the window
        tests judge that on the held-out loss. A reward (maximised) is judged by itself:
        an RL run's losses follow moving targets."""
        if sign < 0:
            return []
        if self._improving(x, v, sign) is not False:
            return []  # the held-out objective improves, or is too short to tell
        if (points := self._training_points(job, ctx, s)) is None:
            return []
        train, _, tv = points
        if len(tv) < self.params.min_points or np.min(tv) < 0:
            return []
        never = self._never_improved(tv, 1.0)
        if never is None:
            return []
        improvement, best, level = never
        return [self._finding(
            job, s, int(np.flatnonzero(np.isfinite(s.value))[0]), Severity.WARNING, "flat",
            f"{s.name} too noisy to tell; {train.name} never improved on its first value "
            f"{tv[0]:.4g} in {len(tv)} points (best since {best:.4g}, "
            f"{_rel(improvement, level, tv)}): not learning",
            {"points": len(tv), "rel_improvement": improvement / level, "first": float(tv[0]),
             "best_since": best, "level": level, "never_improved": True,
             "held_out": s.name, "metric_judged": train.name})]

    def _early_worse(self, v: FloatArray, improvement: float, level: float,
                     quantum: float = 0.0) -> bool:
        """A run of fewer than twice ``min_points`` points that got worse by more than
        ``min_rel_improvement`` of its level: moving, not stuck, so weak evidence of not
        learning (a regression loss worse by 2.4 % over its first 5 of 150 epochs, a
        detector's box loss up over its warm-up); its later points tell."""
        p: PlateauParams = self.params
        return len(v) < 2 * p.min_points and improvement < -max(
            p.min_rel_improvement * level, quantum)

    def _never_improved(self, v: FloatArray, sign: float
                        ) -> tuple[float, float, float] | None:
        """(improvement, best since, level) when no later level (median of three) was ever
        confidently better than the first value: a run that got worse from its first
        evaluation and never came back, whatever its recent trend. The first value's noise
        is the margin, so a first point that is merely low by chance does not count; the
        later best is the least of many medians, already biased towards "improved"."""
        p: PlateauParams = self.params
        later = rolling_median3(v[1:]) if len(v) >= 4 else v[1:]
        if len(later) == 0:
            return None
        best = float(np.min(later)) if sign > 0 else float(np.max(later))
        improvement = sign * (float(v[0]) - best)
        level = abs(median(v))
        if level == 0:
            return None
        se = diff_sigma(v)
        margin = self._t(len(v)) * se
        if improvement + margin < p.min_rel_improvement * level \
                and not self._early_worse(v, improvement, level):
            return improvement, best, level
        return None

    def _training_points(self, job: Job, ctx: Context, s: Series
                         ) -> tuple[Series, FloatArray, FloatArray] | None:
        """(series, axis, value) of the training objective's finite points, judged as the
        objective is, when ``s`` is a held-out metric and the job logs a training
        objective."""
        if not is_eval(s.name):
            return None
        train = training_objective(job, ctx.policy, ctx.state)
        if train is None:
            return None
        t = _reduce(per_epoch(job, train, self.params.epoch_points, self.params.min_points),
                    self.params.max_points)
        ok = np.isfinite(t.value)
        return train, _axis(job, t)[ok], t.value[ok]

    def _training_fell(self, job: Job, ctx: Context, s: Series) -> bool:
        """A training loss that fell at all (its last third below its first), for a
        held-out objective: the model learns something, so a held-out loss that never
        improved is overfitting (the ``overfit`` rule's business), not a model that learns
        nothing. Few points are enough here: it only holds a warning back."""
        if (points := self._training_points(job, ctx, s)) is None:
            return False
        _, x, v = points
        if len(v) < 2:
            return False
        head, tail = span_thirds(x)
        if not head.any() or not tail.any():
            return False
        drop = median(v[head]) - median(v[tail])
        return bool(drop > self.params.min_rel_improvement * abs(median(v)))

    def _training_learnt(self, job: Job, ctx: Context, s: Series) -> bool:
        """A held-out metric that never improved while the training loss did: the model
        learns and does not generalise (the ``overfit`` rule's business when it climbs
        many-fold), not a model that learns nothing."""
        if (points := self._training_points(job, ctx, s)) is None:
            return False
        _, x, v = points
        if len(v) < self.params.min_points or np.min(v) < 0:
            return False
        return self._improving(x, v, 1.0) is True

    def _improving(self, x: FloatArray, v: FloatArray, sign: float) -> bool | None:
        """Whether ``v`` confidently improved by ``min_rel_improvement`` of its level, its
        better later third against its first (``_flat`` with ``learnt``); None when it is
        too short to tell."""
        res = self._flat(x, v, sign, learnt=True)
        if res is None:
            return None
        _, improvement, se, level = res
        return bool(improvement - self.params.z * se > self.params.min_rel_improvement * level)

    def _chance(self, job: Job, raw: Series, v: FloatArray
                ) -> tuple[int, float, float | None] | None:
        """(K, ln K, accuracy) when loss ``v`` sits at the chance level of a K-class task."""
        p: PlateauParams = self.params
        if len(v) < p.chance_min_points:
            return None
        best = float(np.min(rolling_median3(v))) if len(v) >= 3 else float(np.min(v))
        head, tail = span_thirds(np.arange(len(v), dtype=float))
        start, end = median(v[head]), median(v[tail])
        # A loss that is still falling is learning, unless it fell *to* ln K and sits
        # there (an untrained head finding the classes' prior): above the band, with an
        # accuracy near 1/K, a 30 % top-1 accuracy is 1/3, and chance only on 3 classes.
        falling = start - end >= p.min_rel_improvement * start
        acc_s = accuracy_partner(job, raw)
        if acc_s is not None:
            a = acc_s.value[np.isfinite(acc_s.value)]
            enough = len(a) >= p.chance_min_points
            # two evaluations at 1/K name K for a loss that sits in ln K's band itself
            if len(a) >= 2 and 0 < median(a) <= 1:
                found = self._chance_confirmed(a, best, end)
                if found is not None and (end <= found[1] * (1 + p.chance_band) or (
                        enough and not falling and not self._learns_across(job, raw, found[0]))):
                    return found
                if enough:
                    return None
        if falling:  # without an accuracy at 1/K, a falling loss is learning
            return None
        # The bands of neighbouring K overlap (ln 9 * 1.05 > ln 10): name the nearest K.
        fits = [k for k in range(2, p.chance_max_classes + 1)
                if best >= math.log(k) * (1 - p.chance_tolerance)
                and all(math.log(k) * (1 - p.chance_tolerance) <= x
                        <= math.log(k) * (1 + p.chance_band) for x in (start, end))]
        if not fits:
            return None
        k = min(fits, key=lambda k: abs(math.log(k) - end))
        return k, math.log(k), None

    def _learns_across(self, job: Job, raw: Series, k: int) -> bool:
        """For K of 3 or more named by an accuracy near 1/K beside a loss above ln K's
        band: the other side's accuracy (the training accuracy beside a held-out loss)
        stands above 1/K, at its latest third, by more than ``chance_acc_tolerance``. An
        accuracy near 1/3 is a third of 3 classes, and 3.3 tenths of 10: a CIFAR-10 model
        at 31 % held-out accuracy, its validation loss unstable at 1.6-9 while it learnt
        to 58 % on its training data, is not at a 3-class task's chance."""
        if k < 3:
            return False
        other = accuracy_across(job, raw)
        if other is None:
            return False
        a = other.value[np.isfinite(other.value)]
        if len(a) < 2 or not 0 < median(a) <= 1:
            return False
        _, tail = span_thirds(np.arange(len(a), dtype=float))
        return bool(median(a[tail]) * k - 1.0 > self.params.chance_acc_tolerance)

    def _zero_accuracy(self, job: Job, raw: Series, v: FloatArray) -> tuple[str, int] | None:
        """(accuracy, evaluations) when the loss's accuracy is exactly 0 at every one of at
        least ``chance_min_points`` evaluations and the loss never improved on its first
        value: below 1/K for any K, whatever the training loss does (a classifier whose
        validation labels are not its training labels: top-1 and top-5 at 0 for 22 epochs
        while its training loss falls 50-fold)."""
        acc = accuracy_partner(job, raw)
        if acc is None:
            return None
        a = acc.value[np.isfinite(acc.value)]
        if len(a) < self.params.chance_min_points or np.any(a != 0):
            return None
        if self._never_improved(v, 1.0) is None:
            return None
        return acc.name, len(a)

    def _chance_confirmed(self, a: FloatArray, best: float, end: float
                          ) -> tuple[int, float, float | None] | None:
        """K from accuracy ``a`` near 1/K (at the start of the run and at its end, within
        the accuracy's own noise), and a loss whose best level ``best`` never went
        meaningfully below ln K: worse than chance is not learning either. Where several
        K are near (an accuracy of 0.0897 is within the tolerance of 1/10, 1/11 and 1/12),
        the loss's latest level ``end`` picks those whose chance band holds it: rounding
        1/0.0897 named 11, and a 10-class loss at ln 10 stood below ln 11."""
        p: PlateauParams = self.params
        m = median(a)
        if not m > 0:
            return None
        tol = p.chance_acc_tolerance
        lo = max(2, math.ceil((1 - tol) / m - 1e-9))
        hi = math.floor((1 + tol) / m + 1e-9)  # the K with |m K - 1| <= tol
        if lo > hi:
            return None
        # of those whose chance band holds the loss's latest level, the accuracy's nearest
        # (a band is 5 % of ln K wide: ln 52 to ln 54 all hold a loss at ln 53); where no
        # band holds it (a loss above chance), the accuracy's nearest of all
        near = (list(range(lo, hi + 1)) if hi - lo <= 64  # K up to some 400
                else [min(max(round(1.0 / m), lo), hi)])
        fits = [n for n in near if math.log(n) * (1 - p.chance_tolerance) <= end
                <= math.log(n) * (1 + p.chance_band)]
        k = min(fits or near, key=lambda n: abs(m * n - 1.0))
        head, tail = span_thirds(np.arange(len(a), dtype=float))
        # Batch accuracies are noisy (a binomial on a few dozen samples): the tolerance
        # widens to the margin of the tail's median.
        se = 1.25 * diff_sigma(a) / math.sqrt(max(int(tail.sum()), 1))
        tol = max(tol, self._t(len(a)) * se * k)
        if any(abs(median(a[part]) * k - 1.0) > tol for part in (head, tail) if part.any()):
            return None
        ln_k = math.log(k)
        if best < ln_k * (1 - p.chance_tolerance):
            return None
        return k, ln_k, median(a[tail]) if tail.any() else m

    # ----------------------------------------------------------------- the findings

    def _priced(self, job: Job, ctx: Context, f: Finding) -> Finding:
        """A converged finding with what stopping now would save (as of ``ctx.now``, on the
        whole job): the only part of the verdict that moves between two judgements. A step
        clock has no hours to count, and the clock is not read there."""
        if f.evidence.get("kind") != "converged" or job.clock == "step":
            return f
        if cost.hourly_cost(job, ctx.policy) is None \
                and not (job.max_runtime_s or job.planned_steps):
            return f  # nothing to price and no planned end: the clock is not read
        now = ctx.now
        spent = cost.spent(job, ctx.policy, now)
        projected = cost.projected(job, ctx.policy, now)
        saving = (projected - spent) if projected is not None and spent is not None else None
        end = cost.planned_end(job, now)
        f.evidence["hours_left"] = cost.hours_between(job, now, end) if end is not None else None
        f.evidence["saving_usd"] = saving
        if saving is not None and saving > 0:
            f.message += f"; stopping now would save ${saving:,.0f}"
        return f

    def _converged(self, job: Job, s: Series, at: int, v: FloatArray, idx: np.ndarray,
                   improvement: float, se: float, level: float, mode: str, quantum: float,
                   begins: float | None = None) -> Finding:
        p: PlateauParams = self.params
        unit = quantum * (1 + 1e-6)  # medians a logged unit apart at most, as printed
        change = (f"no change beyond its last logged digit, {quantum:g},"
                  if abs(improvement) <= unit else _rel(improvement, level, v))
        best_at = int(np.argmin(v)) if mode == "min" else int(np.argmax(v))
        best = float(v[best_at])
        best_step = float(s.step[idx[best_at]]) if np.isfinite(s.step[idx[best_at]]) else None
        if improvement < -max(p.min_rel_improvement * level, unit):
            # A held-out loss getting worse while the training loss learns: past its best.
            where = f" at step {best_step:g}" if best_step is not None else ""
            msg = (f"{s.name} learnt and is now getting worse ({_rel(improvement, level, v)} over "
                   f"the last stretch; best {best:.4g}{where}): past its best, converged")
        elif begins is not None:
            msg = (f"{s.name} has levelled off near {level:.4g} ({change} "
                   f"over the last stretch); its records begin at step {begins:g}, so what it "
                   f"learnt before is not known: converged")
        else:
            msg = (f"{s.name} learnt and has levelled off near {level:.4g} "
                   f"({change} over the last stretch): converged")
        return self._finding(job, s, at, Severity.INFO, "converged", msg, {
            "rel_improvement": improvement / level, "noise_se": se / level, "level": level,
            "best": best, "best_step": best_step, "saving_usd": None, "hours_left": None})

    def _finding(self, job: Job, s: Series, at: int, severity: Severity, kind: str,
                 message: str, evidence: dict[str, object]) -> Finding:
        step = float(s.step[at]) if np.isfinite(s.step[at]) else None
        return Finding(
            job_id=job.id, rule=self.name, severity=severity, message=message,
            started_at=float(s.time[at]), step=step,
            evidence={"kind": kind, "metric": s.name, "window_start_step": step, **evidence})

    def _window_start(self, job: Job, x: FloatArray) -> int:
        """Index of the first point of the window, by span on the run's own axis."""
        p: PlateauParams = self.params
        if p.window_seconds is not None and job.clock != "step":
            edge = x[-1] - p.window_seconds  # x is time (see _axis)
        elif p.window_steps is not None:
            edge = x[-1] - p.window_steps
        else:
            edge = x[-1] - p.window_fraction * (x[-1] - x[0])
        lo = int(np.searchsorted(x, edge, side="left"))
        return min(lo, max(len(x) - p.min_points, 0))


def judged_prefix(n: int, max_points: int, parts: int) -> tuple[int, int]:
    """(records judged, block) for an objective of ``n`` records: all of them up to
    ``max_points``; beyond, the latest multiple of a block, the largest power of two
    records within ``1/parts`` of the run."""
    if n <= max_points:
        return n, 1
    block = 1 << (max(n // max(parts, 1), 1).bit_length() - 1)
    return (n // block) * block, block


class _Cut(Mapping[str, Series]):
    """``job.series`` cut when a series is looked up: what is not looked at is neither cut
    nor marked as read. Subclasses say how one series is cut (``cut``)."""

    def __init__(self, series: Mapping[str, Series]) -> None:
        self._series = series
        self._cut: dict[str, Series] = {}

    def cut(self, key: str, s: Series) -> Series:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Series:
        got = self._cut.get(key)
        if got is None:
            got = self._cut[key] = self.cut(key, self._series[key])
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._series)

    def __len__(self) -> int:
        return len(self._series)

    def __contains__(self, key: object) -> bool:
        return key in self._series


class _AsOf(_Cut):
    """As recorded up to a time (``count`` records of one series)."""

    def __init__(self, series: Mapping[str, Series], at: float, name: str, count: int
                 ) -> None:
        super().__init__(series)
        self._at, self._name, self._count = at, name, count

    def cut(self, key: str, s: Series) -> Series:
        n = self._count if key == self._name else int(s.time.searchsorted(self._at, "right"))
        return s if n == len(s) else _head(s, n)


class _Since(_Cut):
    """From a time on."""

    def __init__(self, series: Mapping[str, Series], since: float) -> None:
        super().__init__(series)
        self._since = since

    def cut(self, key: str, s: Series) -> Series:
        return _tail(s, self._since)


def _head(s: Series, n: int) -> Series:
    head = Series.__new__(Series)  # views of arrays already checked: no re-validation
    head.name, head.time, head.step, head.value = s.name, s.time[:n], s.step[:n], s.value[:n]
    return head


def _tail(s: Series, since: float) -> Series:
    i = int(np.searchsorted(s.time, since, side="left"))
    tail = Series.__new__(Series)  # views, as ``_head``
    tail.name, tail.time, tail.step, tail.value = s.name, s.time[i:], s.step[i:], s.value[i:]
    return tail


def _cut_job(job: Job, view: _Cut) -> Job:
    """A shallow copy of ``job`` whose series are ``view``, cut on demand."""
    cut = object.__new__(Job)
    cut.__dict__.update(job.__dict__)
    cut.__dict__["series"] = view
    return cut


def _reduce(s: Series, max_points: int) -> Series:
    """``s`` as the medians (of finite values) of consecutive blocks of a power of two
    records, each at its last record, when it has more than ``max_points`` records."""
    n = len(s)
    if n <= max_points:
        return s
    block = 1
    while n > block * max_points:
        block *= 2
    starts = np.arange(0, n, block)
    ends = np.minimum(starts + block, n)
    full = n // block * block
    rows = np.sort(s.value[:full].reshape(-1, block), axis=1)  # NaN sort last
    parts = [rows]
    if full < n:  # a last, shorter block: padded with NaN (sorted last, not counted)
        tail = np.full((1, block), np.nan)
        tail[0, : n - full] = np.sort(s.value[full:])
        parts.append(tail)
    rows = np.vstack(parts)
    counts = np.isfinite(rows).sum(axis=1)
    lo, hi = np.maximum(counts - 1, 0) // 2, counts // 2
    r = np.arange(len(rows))
    med = np.where(counts > 0, (rows[r, lo] + rows[r, np.minimum(hi, block - 1)]) / 2, np.nan)
    at = ends - 1
    return Series(f"{s.name} (medians of {block})", s.time[at], s.step[at], med)


def _axis(job: Job, s: Series, by_time: bool = False) -> FloatArray:
    """Where each point lies in training: its step when every point has one and steps
    never go back, else its time (on a step clock, time is the step); its time first
    when the window is given in seconds."""
    st = s.step
    if (not (by_time and job.clock != "step") and len(st) and np.isfinite(st).all()
            and (np.diff(st) >= 0).all() and st[-1] > st[0]):
        return st
    t = s.time
    if len(t) and (np.diff(t) >= 0).all() and t[-1] > t[0]:
        return t
    return np.arange(len(s), dtype=float)


def _repeated(values: FloatArray, quantum: float,
              steps: FloatArray | None = None) -> tuple[int, int] | None:
    """(where, latest): the indices of an earlier stretch of ``_REPEAT`` values equal, in
    order, to the latest ``_REPEAT`` ones and not overlapping them, where those are finite,
    span ``_UNITS`` units of the last logged digit (``quantum``; a part in a million
    where it has none) and are each ``_UNITS_REPEAT`` units at least; else None. Given
    their ``steps``, the latest must begin at a later step than the earlier stretch ends:
    the same values at the same steps are the same records written twice (a notebook's
    output that holds an epoch's progress bar twice), not a second pass."""
    k = _REPEAT
    n = len(values)
    if n < 2 * k:
        return None
    last = values[-k:]
    if not np.isfinite(last).all():
        return None
    # a converged loss moving in its last two digits repeats short stretches by chance
    span = float(np.ptp(last))
    if span < (_UNITS * quantum if quantum > 0 else _SAME * float(np.max(np.abs(last)))):
        return None
    if quantum > 0 and float(np.min(np.abs(last))) < _UNITS_REPEAT * quantum:
        return None
    hits = np.flatnonzero(values[: n - 2 * k + 1] == last[0])
    for h in hits.tolist():
        if np.array_equal(values[h:h + k], last) and (
                steps is None or not steps[n - k] <= steps[h + k - 1]):
            return h, n - k
    return None


def _median_gap_se(sigma: float, a: int, b: int) -> float:
    """Standard error of the difference of two medians of ``a`` and ``b`` points of noise
    ``sigma``: a median of k points has one of about 1.25 sigma / sqrt(k)."""
    return 1.25 * sigma * math.sqrt(1.0 / a + 1.0 / b)


def _trailing_spike(v: FloatArray, factor: float) -> int:
    """How many of the latest points stand ``factor`` times above the best level (median
    of three) reached before them."""
    if len(v) < 4 or float(np.min(v)) <= 0:
        return 0
    best = np.full(len(v), np.inf)
    best[3:] = np.minimum.accumulate(rolling_median3(v))[: len(v) - 3]
    high = v > factor * best
    return len(v) - int(np.flatnonzero(~high)[-1]) - 1 if not high.all() else len(v)


def _calm(x: FloatArray, v: FloatArray, idx: np.ndarray, sign: float
          ) -> tuple[FloatArray, FloatArray, np.ndarray]:
    """Spikes (points far on the bad side of the level, and of the best level the run had
    reached before them) are the divergence rule's business, recovered or not: judge the
    points around them. The level before counts: a run that learnt fast and then sat
    still for most of its length has its whole descent far above the run's median, and
    that descent is what it learnt, not a spike."""
    sigma = diff_sigma(v)
    centre = median(v)
    margin = 8 * sigma + 0.1 * abs(centre)
    u = sign * v  # lower is better
    before = np.full(len(u), np.inf)  # best median of three ending before each point
    if len(u) >= 4:
        before[3:] = np.minimum.accumulate(rolling_median3(u))[: len(u) - 3]
    calm = ~((u - sign * centre > margin) & (u - before > margin))
    if calm.all() or calm.sum() < 3:
        return x, v, idx
    return x[calm], v[calm], idx[calm]


def _rel(change: float, level: float, v: FloatArray) -> str:
    """A change as a share of the level the values stand at, where they all stand on one
    side of 0; else as itself, with that level (a reward between 0 and 1 whose median is
    0.025 fell by 0.61, not by 2,450 %)."""
    if len(v) and (bool((v > 0).all()) or bool((v < 0).all())):
        return f"{change / level:+.2%}"
    return f"{change:+.4g} at a level of {level:.4g}"


#: A loss in its first epoch is judged (flat or converged) from this many points on: a
#: language model's one long epoch is a plateau's to find too.
_FIRST_EPOCH_POINTS = 50


def _in_first_epoch(job: Job, raw: Series) -> bool:
    """Whether a training loss logged several times an epoch has all its points in one
    epoch, the first it logs: the model has not seen its data once (an MMEngine C3D run
    from scratch sat at ln 101 for its first 350 of 26,000 steps, epoch 1 of 79, and was
    warned not learning at step 140). Whole epochs only: the Hugging Face Trainer's
    fractional epoch moves at every record. Strong evidence (chance level, a loss exactly
    0 or not changing) is judged before this."""
    ep = job.series.get("epoch")
    if ep is None or len(ep) < 2 or is_eval(raw.name):
        return False
    e = ep.value[np.isfinite(ep.value)]
    return len(e) >= 2 and bool((e == e[0]).all()) and float(e[0]).is_integer()
