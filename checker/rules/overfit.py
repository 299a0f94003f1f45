"""``overfit``: the held-out loss climbs many-fold while the training loss falls.

Anchor: SageMaker Debugger's ``overfit`` (patience=1, ratio_threshold=0.1 on the gap
between validation and training loss) and ``overtraining`` (patience_validation=10,
delta=0.01). A gap ratio fires on any model whose validation loss sits above its
training loss, which is most models. This rule asks for the failure itself: the
validation level (a median of three evaluations, so one odd evaluation cannot move
it) at least ``factor`` times its own best for ``points`` evaluations in a row, or a
steady climb (the evaluations since the lowest one rising in rank order, Mann-Kendall,
beyond what noise after a minimum does) that has taken the level ``steady_factor``
times its best and back above where it started, or a longer one (``long_z``) that has
taken it ``long_factor`` times its best and given back half of what it had learnt, or,
in a run too short for either, every evaluation since the lowest above the one before
(at least ``points``) and the last two at ``factor`` times it, where the held-out loss
never rose that far before and came back; each while the training loss is lower than
it was when validation was at its best. It reports
the step of the best validation value (the checkpoint to keep) and, priced by the
checker, what the run has spent since.

Followed tick by tick (``checker.follow``), the rule keeps its running best and the
length of the climb in ``ctx.state`` and reads only the evaluations new since the last
tick; it reads the training loss only while the held-out loss is climbing, so its
follower does not re-run it at every training step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trainguard.checker.metrics import get, objective, training_objective
from trainguard.checker.model import Finding, FloatArray, Job, Series, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.seen import Track, tracked
from trainguard.checker.stats import diff_sigma, median, rolling_median3, trend_z

_TREND = 64  # the most evaluations the trend test reads (it costs their square)
#: The training loss has fallen when its level is lower by this share of its points'
#: scatter: a loss swinging 4-25 at a high learning rate, 1.5 % lower, has not (a SwAV
#: linear evaluation whose held-out loss swung with it was warned overfitting).
_FELL = 0.25
_SCATTER = 1024  # the latest training points that scatter is read from
_BACK = 0.5  # a held-out level below this share of its stretch's top is coming back down
_LOST = 0.1  # the share of what the held-out loss had learnt a climb must give back
#: ... and a long steady climb at ``long_factor``: on the blind sets, a climb giving back
#: less (a text-recognition run's validation loss 1.3 x its best after a 10-fold fall)
#: was a healthy run warned, where half keeps every one found and none warned.
_GIVEN = 0.5


@dataclass
class OverfitParams:
    metric: str | None = param(
        None, "the held-out loss; default val_loss, else the held-out total (eval_loss, "
        "val/loss, or the sum of val/* loss components)")
    train_metric: str | None = param(
        None, "the training loss; default loss/train_loss, or the sum of its components")
    factor: float = param(
        2.0, "the held-out level at least this many times its best is overfitting (a "
        "warning naming the best checkpoint): on the held-out public runs, 3 x left 6 of "
        "10 runs labelled overfit (1.95- to 2.4-fold climbs) unreported, and 2 x warns one "
        "more healthy run of 570. A policy that wants only many-fold climbs (a fine-tune "
        "growing over-confident while its accuracy holds doubles its validation loss "
        "too) sets 3, and steady_factor and long_factor 3")
    points: int = param(3, "... for this many consecutive evaluations")
    steady_factor: float = param(
        1.5, "a held-out level this many times its best, and above its first level (all "
        "it had gained on held-out data given back), is overfitting too when the "
        "evaluations since the lowest one climb steadily (see steady_z): a textbook "
        "overfit rises 1.5- to 2-fold over tens of epochs and never doubles in three")
    steady_z: float = param(
        2.33, "... steadily: the Mann-Kendall statistic of the evaluations after the lowest "
        "one (the last 64 of them) at least this many standard deviations (2.33: one "
        "chance in a hundred for evaluations in random order; six evaluations each above "
        "the one before make 2.6)")
    long_z: float = param(
        3.5, "a climb in rank order this strong (about nine evaluations each above the "
        "one before), is overfitting from long_factor x its best, once it has given back "
        "half of what the held-out loss had learnt: a language model whose validation "
        "loss rose 16 evaluations running, 5.9 -> 7.8, while its training loss fell "
        "8 -> 1.2 (its first evaluation, untrained, at 8.05)")
    long_factor: float = param(
        1.25, "... see long_z; on the blind sets any value from 1.1 to 1.25 finds and "
        "warns the same runs")


class _Held(Track):
    """The held-out loss as far as it has been read: its levels (median of three finite
    evaluations), their running best, how many levels in a row at the end stand at
    ``factor`` times that best, and the best evaluation before the last ``points``."""

    def __init__(self) -> None:
        super().__init__()
        self.nf = 0  # finite evaluations read
        self.low = math.inf
        self.low_at = -1  # the record of the lowest evaluation
        self.first = math.nan  # the first level
        self.after_low = 0  # finite evaluations since the lowest one
        self.up = 0  # finite evaluations at the end, each above the one before
        self.risen = 0.0  # the highest ratio of an evaluation to the lowest before it
        self.shown = 0.0  # ... before the lowest one: a rise the run came back from
        self.z, self.z_at = 0.0, -1  # the trend statistic, and the records it was read at
        self.last: list[tuple[int, float]] = []  # the last two: (record, value)
        self.best = math.inf  # the lowest level
        self.level = math.nan  # the last level
        self.high = 0  # levels in a row at the end at factor x the best
        self.since = -1  # the record where that stretch of levels begins
        # ``points`` levels in a row reached factor x the best (a replay's tick may fall
        # after such a stretch dipped below it again): it stands until a level falls
        # below steady_factor x the best, as an alert clears below where it fires
        self.latched = False
        self.latched_since = -1  # the record where the stretch that latched it begins
        self.peak = 0.0  # the highest level / best while latched
        self.top = 0.0  # the highest level of the stretch at factor x the best at the end
        self.recent: list[tuple[int, float]] = []  # the last ``points`` evaluations
        self.best_value, self.best_at = math.inf, -1  # the lowest before them, and its record

    def read(self, s: Series, p: OverfitParams) -> None:
        def many(n0: int, new: FloatArray) -> None:
            ok = np.isfinite(new)
            self._many((n0 + np.flatnonzero(ok)).tolist(), new[ok].tolist(), p)

        self.read_new(s, lambda i, x: self._many([i], [x], p), many)

    def _many(self, at: list[int], v: list[float], p: OverfitParams) -> None:
        """The next finite evaluations ``v`` (records ``at``), in order."""
        if not v:
            return
        if self.nf == 0:
            self.since = at[0]  # a climb from the first evaluation on
            # The first evaluation is a level of its own: with one neighbour, a median of
            # three never holds it, and a fine-tune that generalised best at its first
            # evaluation (18.4, then 40.5 to 50.6 while training falls) had no best there.
            self.best = v[0]
        pairs = self.last + list(zip(at, v, strict=True))
        if len(pairs) >= 3:
            w = np.array([x for _, x in pairs])
            levels = rolling_median3(w)  # levels[k] has pairs[k + 1] at its middle
            best = np.minimum.accumulate(np.minimum(levels, self.best))
            first = self.first if not math.isnan(self.first) else float(levels[0])
            # and it has given back a share of what the held-out loss had learnt: a
            # validation loss near 0 (5e-6) wobbling a hundredfold has lost nothing
            high = (levels >= p.factor * best) & (
                levels - best >= _LOST * np.maximum(first - best, 0.0))
            self._latch(pairs, levels, best, high, p)
            low = np.flatnonzero(~high)
            if len(low):
                self.high = len(high) - 1 - int(low[-1])
                self.since = pairs[int(low[-1]) + 1][0]  # the middle of the last one below
            else:
                self.high += len(high)
            self.level, self.best = float(levels[-1]), float(best[-1])
            if math.isnan(self.first):
                self.first = float(levels[0])
        self.last = pairs[-2:]
        self.nf += len(v)
        x = np.asarray(v)
        before = [y for _, y in pairs[: len(pairs) - len(v)]][-1:]  # the one before these
        rises = np.diff(np.array(before + list(v))) > 0
        if not before:  # the very first evaluation rises from nothing
            rises = np.concatenate(([False], rises))
        falls = np.flatnonzero(~rises)
        self.up = len(v) - 1 - int(falls[-1]) if len(falls) else self.up + len(v)
        lows = np.minimum.accumulate(np.concatenate(([self.low], x)))[:-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where((lows > 0) & np.isfinite(lows), x / lows, 0.0)
        k = int(np.argmin(v))
        if v[k] < self.low:
            self.low, self.low_at = v[k], at[k]
            self.shown = max(self.risen, float(ratio[:k].max(initial=0.0)))
            self.after_low = len(v) - 1 - k
        else:
            self.after_low += len(v)
        self.risen = max(self.risen, float(ratio.max(initial=0.0)))
        recent = self.recent + pairs[len(pairs) - len(v):]
        if len(recent) > p.points:  # the oldest leave the last ``points``: the best of them
            older = recent[: len(recent) - p.points]
            k = int(np.argmin([x for _, x in older]))  # the first of equal values
            if older[k][1] < self.best_value:
                self.best_at, self.best_value = older[k]
            recent = recent[len(recent) - p.points:]
        self.recent = recent

    def _latch(self, pairs: list[tuple[int, float]], levels: FloatArray, best: FloatArray,
               high: npt.NDArray[np.bool_], p: OverfitParams) -> None:
        """Whether ``points`` levels in a row at factor x the best have been reached since
        the level last fell below steady_factor x the best, after these ``levels``."""
        # consecutive high levels ending at each one, the stretch before them carried in
        run = np.zeros(len(high), dtype=np.int64)
        top = np.zeros(len(high))
        count, most = self.high, self.top
        for k, (h, x) in enumerate(zip(high.tolist(), levels.tolist(), strict=True)):
            count, most = (count + 1, max(most, x)) if h else (0, 0.0)
            run[k], top[k] = count, most
        self.top = most
        # a stretch whose level is back below half its highest is a blow-up coming back
        # down (a validation loss 2,700 x its best for two evaluations, back within
        # three), not a climb: it is overfitting once it stands near its top again
        fired = np.flatnonzero((run >= p.points) & (levels >= _BACK * top))
        cleared = np.flatnonzero(levels < p.steady_factor * best)
        last_clear = int(cleared[-1]) if len(cleared) else -1
        ratio = levels / best
        if len(fired) and int(fired[-1]) > last_clear:
            first = int(fired[fired > last_clear][0])  # the first firing since the clear
            if not (self.latched and last_clear < 0):  # latched afresh
                # where the stretch began: the last level below it (as ``since``), which
                # an earlier read saw if the stretch began before these levels; the peak
                # is the highest since it fired: the same however the levels are read
                start = first - int(run[first]) + 1
                self.latched_since = pairs[start][0] if start >= 1 else self.since
                self.peak = float(np.max(ratio[first:]))
            else:
                self.peak = max(self.peak, float(np.max(ratio)))
            self.latched = True
        elif last_clear >= 0:
            self.latched = False
        elif self.latched:
            self.peak = max(self.peak, float(np.max(ratio)))

    def climbing(self, p: OverfitParams) -> bool:
        """The rule's condition on the held-out loss alone, as of the last evaluation:
        ``points`` levels in a row at factor x the best (each having given back ``_LOST``
        of what it had learnt, the last at least ``_BACK`` of the stretch's highest),
        since when it has not come back below steady_factor x the best."""
        return self.nf >= 2 + p.points and self.low > 0 and self.latched

    def steady(self, s: Series, p: OverfitParams) -> float | None:
        """The trend statistic of the evaluations after the lowest one, when they climb
        steadily and have taken the level to ``steady_factor`` x its best and above its
        first level, or more steadily still (``long_z``) to ``long_factor`` x its best
        and half of what it had learnt; None when not."""
        if not (self.nf >= 2 + p.points and self.low > 0):
            return None
        usual = self.level >= max(p.steady_factor * self.best, self.first)
        long = (self.level >= p.long_factor * self.best and self.level - self.best
                >= _GIVEN * max(self.first - self.best, 0.0))
        if not (usual or long):
            return None
        if self.z_at != self.n:  # once per evaluation, not at each training record after
            after = s.value[self.low_at + 1: self.n]
            self.z, self.z_at = trend_z(after[np.isfinite(after)][-_TREND:]), self.n
        return self.z if self.z >= (p.steady_z if usual else p.long_z) else None

    def rising(self, p: OverfitParams) -> int | None:
        """How many evaluations since the lowest one, when each is above the one before
        (at least ``points``: too few for a trend test, five epochs of a fine-tune), the
        last two at ``factor`` x the lowest, having given back ``_LOST`` of what the
        held-out loss had learnt, in a run whose held-out loss never rose to ``factor``
        x a lower value before and came back (a linear probe's validation loss swinging
        4-42 at a high learning rate rises three evaluations running by chance); None
        when not."""
        if not (p.points <= self.after_low == self.up and self.low > 0
                and self.shown < p.factor and len(self.last) == 2):
            return None
        first = self.first if not math.isnan(self.first) else self.low
        top = min(x for _, x in self.last)
        if top >= p.factor * self.low and top - self.low >= _LOST * max(first - self.low, 0):
            return self.after_low
        return None


class _Finite(Track):
    """Whether a series has held only finite values so far."""

    def __init__(self) -> None:
        super().__init__()
        self.nonfinite = 0

    def read(self, s: Series) -> None:
        if len(s) > self.n:
            self.nonfinite += int((~np.isfinite(s.value[self.n:])).sum())
        self.read_to(s)


@register
class Overfit(Rule):
    name = "overfit"
    Params = OverfitParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: OverfitParams = self.params
        val = (job.series.get(p.metric) if p.metric else
               get(job, "val_loss", ctx.policy) or objective(job, True, ctx.state))
        if val is None:
            return []
        held = tracked(ctx.state, "held:" + val.name, val, _Held)
        held.read(val, p)
        # Only a climb still going on as of the last evaluation; the training loss is not
        # read before there is one.
        climbing = held.climbing(p)
        steady = None if climbing else held.steady(val, p)
        rising = None if climbing or steady is not None else held.rising(p)
        if not climbing and steady is None and rising is None:
            return []
        train = (job.series.get(p.train_metric) if p.train_metric else
                 training_objective(job, ctx.policy, ctx.state))
        if train is None or val is train:
            return []
        best_at = held.best_at
        finite = tracked(ctx.state, "finite:" + train.name, train, _Finite)
        finite.read(train)
        # The training loss lower now than where validation was best, or than where it
        # began to climb: a step that set both back (validation 11 x, training 2.4 x) and
        # after which training falls again while validation climbs on is overfitting too.
        def fell_since(at: int) -> tuple[float, float] | None:
            return _train_fell(train, float(val.step[at]), float(val.time[at]),
                               finite.nonfinite == 0)

        fell = fell_since(best_at)
        if fell is None and (after := _next_finite(val, best_at)) is not None:
            fell = fell_since(after)
        if fell is None:
            return []
        then, now = fell
        best_step = float(val.step[best_at]) if np.isfinite(val.step[best_at]) else None
        where = f"step {best_step:g}" if best_step is not None else f"record {best_at}"
        how = ("climbed to" if steady is None else
               f"climbed steadily, {len(val) - 1 - held.low_at} evaluations since its lowest, "
               "to")
        since = held.since if steady is None else held.low_at + 1
        ratio = held.level / held.best
        if rising is not None:  # too few evaluations for a level: the last one's own
            how = f"rose at each of its {rising} evaluations since its lowest, to"
            since, ratio = held.low_at + 1, held.last[-1][1] / held.low
        elif steady is None and held.high < p.points:  # latched: it reached more before
            since = held.latched_since
            how = f"climbed to {held.peak:.1f}x and stands at"
        return [Finding(
            job_id=job.id, rule=self.name, severity=Severity.WARNING,
            message=(f"{val.name} {how} {ratio:.1f}x its best "
                     f"({float(val.value[best_at]):.4g} at {where}) while {train.name} fell "
                     f"{then:.4g} -> {now:.4g}: overfitting; the best checkpoint is at {where}"),
            started_at=float(val.time[best_at]), step=best_step,
            evidence={"kind": "overfit", "metric": val.name, "train_metric": train.name,
                      "best_value": float(val.value[best_at]), "best_step": best_step,
                      "level": held.level, "ratio": ratio,
                      "climbing_since_step": float(val.step[since]),
                      "steady": steady is not None, "trend_z": steady,
                      "rising": rising,
                      "train_then": then, "train_now": now},
        )]


def _next_finite(s: Series, at: int) -> int | None:
    """The record of the first finite value of ``s`` after record ``at``."""
    after = np.flatnonzero(np.isfinite(s.value[at + 1:]))
    return at + 1 + int(after[0]) if len(after) else None


def _train_fell(train: Series, step: float, time: float,
                all_finite: bool) -> tuple[float, float] | None:
    """(training level around the best evaluation, training level now) when it is lower
    now by more than ``_FELL`` of the scatter of its points since (first differences, of
    the latest ``_SCATTER`` at most); None when it is not, or there is too little to
    tell."""
    t, s, v = train.time, train.step, train.value
    if not all_finite:  # judged on its finite values (all of them: a rare case)
        ok = np.isfinite(train.value)
        t, s, v = t[ok], s[ok], v[ok]
    if len(v) < 3:
        return None
    # Where the best evaluation happened, on the training loss's own records.
    at = int(np.searchsorted(s, step, side="left")) if np.isfinite(step) else int(
        np.searchsorted(t, time, side="left"))
    at = min(at, len(v) - 1)
    if at >= len(v) - 2:
        return None
    then = median(v[max(at - 1, 0): at + 2])
    now = median(v[-3:])
    if not then - now > _FELL * diff_sigma(v[max(at, len(v) - _SCATTER):]):
        return None
    return then, now
