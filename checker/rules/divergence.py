"""``divergence``: NaN/inf, or a blow-up that does not come back.

Anchors: Keras TerminateOnNaN and Debugger exploding_tensor fire on the first
non-finite value; Lightning's divergence_threshold is a fixed number. This rule:

- reports a finite spike that comes back as info, never as critical (large-model runs
  spike and recover: a bad batch, a loss-scale skip), and lets a lone non-finite
  value wait one more logging interval before it counts;
- finds a divergence without NaN: the training objective's level (a median of three
  points, so one bad batch cannot move it) many times its own best sustained level
  for a sustained stretch. A ratio to the run's own best holds at any scale; the best
  is a level the run has reached, so learning-rate warm-up (a loss rising from its
  first value) counts only once it has stayed far above where the run started; an
  objective that goes below zero (a GAN critic, an RL return) is not judged this way,
  and components of an adversarial objective are judged as their sum;
- calls non-finite values in evaluation losses only (validation NaN/inf while the
  training loss is finite) a warning with that diagnosis: the stop is for the
  training objective;
- says, as of the last record, that a divergence the run has since come back from
  (``recover_points`` finite points back near its level) *recovered*, as info with
  when it fired and when it recovered; a replay sees it fire at the time it did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainguard.checker.metrics import is_eval, loss_like, training_objective
from trainguard.checker.metrics import objective as objective_of
from trainguard.checker.model import Finding, FloatArray, Job, Series, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.stats import rolling_median3

_BLOCK = 16  # points per block for the rolling reference level


@dataclass
class DivergenceParams:
    metrics: list[str] | None = param(None, "series to watch; default every series named *loss*")
    nan_points: int = param(2, "consecutive non-finite points that make a divergence")
    blowup_factor: float = param(
        20.0, "a finite point this many reference scales away from the recent level is a blow-up")
    recover_points: int = param(
        5, "a blow-up still there after this many points is a divergence, else a spike")
    abs_limit: float = param(1e12, "a loss beyond this magnitude is a blow-up whatever came before")
    regress_factor: float = param(
        5.0, "the training objective this many times its best level (the lowest median of "
        "3 points so far) is a divergence without NaN; noise near a best is a few-fold")
    regress_points: int = param(
        4, "... when this many points in a row are there: more than a loss spike lasts "
        "(a bad batch or a loss-scale skip is back within three logged points); it has "
        "recovered once recover_points are back")
    regress_lost: float = param(
        0.5, "... and has given back at least this fraction of what it had learnt (its "
        "first level minus its best): a loss near zero bouncing many-fold has lost nothing")


def _reference(values: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per point: the level and scale of the complete blocks before it (NaN where none).

    Block medians keep the cost linear and ignore single outliers; the level is the
    previous block's median, the scale the larger of its magnitude and its spread.
    """
    n = len(values)
    nb = n // _BLOCK
    level = np.full(n, np.nan)
    scale = np.full(n, np.nan)
    if nb == 0:
        return level, scale
    blocks = values[: nb * _BLOCK].reshape(nb, _BLOCK)
    med = np.median(blocks, axis=1)  # NaN where a block holds a NaN: mended below
    mad = np.median(np.abs(blocks - med[:, None]), axis=1)
    # Blocks with NaN in them (a diverging job): their finite points, one block at a time;
    # numpy's nanmedian on the whole array is ten times slower.
    for i in np.flatnonzero(np.isnan(med)):
        finite = blocks[i][~np.isnan(blocks[i])]
        if len(finite):
            med[i] = np.median(finite)
            mad[i] = np.median(np.abs(finite - med[i]))
    sc = np.maximum(np.abs(med), 3 * 1.4826 * mad)
    # Point i sees the block that ended before the block containing i.
    idx = np.arange(n) // _BLOCK - 1
    ok = idx >= 0
    level[ok] = med[idx[ok]]
    scale[ok] = sc[idx[ok]]
    return level, scale


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True."""
    if not mask.any():
        return []
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    return [(int(s), int(e - s)) for s, e in zip(edges[::2], edges[1::2], strict=True)]


@register
class Divergence(Rule):
    name = "divergence"
    Params = DivergenceParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: DivergenceParams = self.params
        series = (
            [job.series[m] for m in p.metrics if m in job.series]
            if p.metrics else loss_like(job)
        )
        finite_training = self._training_finite(job, ctx)
        found = [f for s in series if (f := self._one(job, s, finite_training)) is not None]
        objective = None if p.metrics else (
            training_objective(job, ctx.policy) or objective_of(job, held_out=True))
        if objective is not None and (f := self._regressed(job, objective)) is not None:
            found.append(f)
        if not found:
            return []
        # One finding per job: the worst, earliest.
        found.sort(key=lambda f: (-f.severity.rank, f.started_at if f.started_at is not None
                                  else float("inf")))
        return found[:1]

    def _training_finite(self, job: Job, ctx: Context) -> bool:
        """Whether the training objective is being logged and its latest value is finite:
        then non-finite values in an evaluation loss are the evaluation's problem."""
        train = training_objective(job, ctx.policy)
        return train is not None and len(train) > 0 and bool(np.isfinite(train.value[-1]))

    def _one(self, job: Job, s: Series, finite_training: bool) -> Finding | None:
        p: DivergenceParams = self.params
        v = s.value
        bad = ~np.isfinite(v)
        if not bad.any() and len(v):
            lo, hi = float(v.min()), float(v.max())
            # Exact shortcut: every block's scale is at least its median, which is at least
            # the series' minimum, so a positive series this tight cannot hold a blow-up.
            if lo > 0 and hi - lo <= p.blowup_factor * lo and hi <= p.abs_limit:
                return None
        level, scale = _reference(np.where(bad, np.nan, v))
        with np.errstate(all="ignore"):
            far = np.abs(v - level) > p.blowup_factor * scale
        blown = bad | (np.isfinite(v) & (far | (np.abs(v) > p.abs_limit)))
        if not blown.any():
            return None
        n = len(v)
        eval_only = finite_training and is_eval(s.name)
        first_spike: tuple[int, int] | None = None
        fired: tuple[int, int, int | None, str] | None = None  # start, end, nan_at, what
        for start, length in _runs(blown):
            ends_run = start + length == n
            nonfinite = int(bad[start:start + length].sum())
            nan_at = start + int(np.argmax(bad[start:start + length])) if nonfinite else None
            consecutive_bad = max((ln for _, ln in _runs(bad[start:start + length])), default=0)
            if consecutive_bad >= p.nan_points or length >= p.recover_points:
                what = "diverged" if consecutive_bad else "blew up and stayed up"
                if ends_run or n - (start + length) < p.recover_points:
                    return self._finding(job, s, start, nan_at,
                                         Severity.WARNING if eval_only else Severity.CRITICAL,
                                         what, eval_only)
                if fired is None:
                    fired = (start, start + length, nan_at, what)
                continue
            if ends_run:
                return self._finding(job, s, start, nan_at, Severity.WARNING,
                                     "non-finite, watching" if nonfinite else
                                     "spiking, not yet recovered", eval_only)
            if first_spike is None:
                first_spike = (start, length)
        if fired is not None:
            return self._recovered(job, s, *fired, eval_only=eval_only)
        if first_spike is None:
            return None
        start, length = first_spike
        f = self._finding(job, s, start, None, Severity.INFO, "spiked and recovered", eval_only)
        f.evidence["spike_points"] = length
        return f

    def _recovered(self, job: Job, s: Series, start: int, end: int, nan_at: int | None,
                   what: str, eval_only: bool) -> Finding:
        """A divergence the run came back from: info as of now, saying when it fired."""
        f = self._finding(job, s, start, nan_at, Severity.INFO, what, eval_only)
        back = float(s.step[end]) if np.isfinite(s.step[end]) else None
        f.message += (f"; recovered at {f'step {back:g}' if back is not None else f'record {end}'}"
                      f" ({len(s) - end} finite points since)")
        f.evidence.update(recovered=True, recovered_step=back,
                          recovered_at=float(s.time[end]), fired_step=f.step,
                          fired_at=f.started_at)
        f.evidence["kind"] = "recovered"
        return f

    def _regressed(self, job: Job, s: Series) -> Finding | None:
        """The objective many times its own best level, for a sustained stretch of
        ``regress_points`` points in a row."""
        p: DivergenceParams = self.params
        ok = np.isfinite(s.value)
        v = s.value[ok]
        n = len(v)
        if n < 3 + p.regress_points or float(v.min()) <= 0:
            return None  # too short, or no floor to measure a ratio against
        # best[i]: the lowest level (median of three points) wholly before point i, so a
        # single lucky low point is not a best and point i is not its own reference.
        levels = rolling_median3(v)
        best = np.full(n, np.inf)
        best[3:] = np.minimum.accumulate(levels)[: n - 3]
        first = float(levels[0])
        high = (v >= p.regress_factor * best) & (
            v >= best + p.regress_lost * np.maximum(first - best, 0.0))
        idx = np.flatnonzero(ok)
        out: Finding | None = None
        for start, length in _runs(high):
            if length < p.regress_points:
                continue
            at = int(idx[start])
            ref = float(best[start])
            what = (f"climbed to over {p.regress_factor:g}x its best level ({ref:.4g}) "
                    f"for {length} points in a row")
            evidence = {"best_level": ref, "level": float(np.median(v[start:start + length])),
                        "ratio": float(np.median(v[start:start + length]) / ref)}
            end = start + length
            if n - end < p.recover_points:
                f = self._finding(job, s, at, None, Severity.CRITICAL, what)
                f.evidence.update(kind="regressed", **evidence)
                return f
            out = self._recovered(job, s, at, int(idx[end]), None, what, False)
            out.evidence.update(evidence)
        return out

    def _finding(self, job: Job, s: Series, start: int, nan_at: int | None,
                 severity: Severity, what: str, eval_only: bool = False) -> Finding:
        before = s.value[:start][np.isfinite(s.value[:start])]
        step = float(s.step[start]) if np.isfinite(s.step[start]) else None
        evidence: dict[str, object] = {
            "kind": "nonfinite" if nan_at is not None else "blowup",
            "metric": s.name,
            "value": _num(s.value[start]),
            "last_finite_before": _num(before[-1]) if len(before) else None,
            "best_before": _num(before.min()) if len(before) else None,
        }
        if nan_at is not None:
            evidence["first_nonfinite_step"] = (
                float(s.step[nan_at]) if np.isfinite(s.step[nan_at]) else None)
        where = f"step {step:g}" if step is not None else f"record {start}"
        note = ""
        if eval_only:
            evidence["kind"] = "eval_" + str(evidence["kind"])
            note = " in evaluation only (the training loss is finite): check the evaluation"
        return Finding(
            job_id=job.id, rule=self.name, severity=severity,
            message=f"{s.name} {what} at {where} (value {_fmt(s.value[start])}){note}",
            started_at=float(s.time[start]), step=step, evidence=evidence,
        )


def _num(x: float) -> float | str:
    x = float(x)
    return x if np.isfinite(x) else str(x)


def _fmt(x: float) -> str:
    return f"{float(x):.4g}"
