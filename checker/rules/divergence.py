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
- finds, in a run that had learnt, a loss that moved 1.5-fold above its best, far
  beyond its noise, and stays there without coming back down for half as many steps
  as the run had taken (``divergence_shift``): a language model collapsing to its
  unigram entropy is 2-fold, neither 5-fold nor back where it started;
- finds, in a run whose logged gradient norm was positive, a norm exactly 0 for
  ``recover_points`` records while the objective stands at ``dead_factor`` times its best
  (``divergence_dead``): a dead gradient, from which no optimiser step brings it back;
- calls a finite blow-up in a term of the objective (a VAE's KL term waking up, an MoE's
  balancing loss stepping up), while the objective is fine, a warning naming the term;
- calls non-finite values in evaluation losses only (validation NaN/inf while the
  training loss is finite) a warning with that diagnosis: the stop is for the
  training objective;
- does not judge the losses of an RL run (one that logs a reward or return) this way:
  they follow moving targets (returns, TD targets) and climb as the agent improves;
  its reward, where it is never below 0, collapsing to a tenth of a level it held for
  ``recover_points`` points is a divergence (``divergence_reward``);
- says, as of the last record, that a divergence the run has since come back from
  (``recover_points`` finite points back near its level) *recovered*, as info with
  when it fired and when it recovered; a replay sees it fire at the time it did.
"""


from __future__ import annotations

import math
import sys

import numpy as np

from trainguard.checker.follow import STABLE, Band
from trainguard.checker.metrics import (
    grad_norm,
    is_eval,
    is_term,
    loss_like,
    reward,
    training_objective,
)
from trainguard.checker.metrics import objective as objective_of
from trainguard.checker.model import Finding, Job, Series, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule
from trainguard.checker.rules.divergence_dead import Dead, nan_gradient, nan_gradient_bands
from trainguard.checker.rules.divergence_reward import Collapse
from trainguard.checker.rules.divergence_shift import Shifted
from trainguard.checker.rules.divergence_state import (
    Before,
    Blowup,
    Blowups,
    Climbs,
    DivergenceParams,
)
from trainguard.checker.seen import tracked

_MAX = sys.float_info.max  # a band that holds every finite value


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
        train = _training(job, ctx)
        # Non-finite values in an evaluation loss while the training objective is logged and
        # its latest value finite are the evaluation's problem.
        finite_training = train is not None and len(train) > 0 and bool(
            np.isfinite(train.value[-1]))
        found = []
        bands: dict[str, Band] | None = {}
        for s in series:
            track = tracked(ctx.state, "blowups:" + s.name, s, Blowups)
            track.read(s, p)
            # a term of the objective (a VAE's KL, an MoE's balancing loss) can jump by
            # orders of magnitude while the objective is fine: its finite blow-up is not a
            # stop (the objective's own is, and its climbs are judged below)
            term = (not p.metrics and train is not None and s.name != train.name
                    and is_term(s.name))
            if (f := self._blowup(job, s, track, finite_training, term)) is not None:
                found.append(f)
            bands = _add(bands, s.name, track.band(s, p))
        # An RL run's losses follow moving targets and climb as the agent improves: only
        # their non-finite values and blow-ups are judged.
        rl = None if p.metrics else reward(job, ctx.policy)
        objective = None if p.metrics or rl is not None else (
            train or objective_of(job, True, ctx.state))
        if rl is not None:
            fall = tracked(ctx.state, "collapse:" + rl.name, rl, Collapse)
            fall.read(rl, p)
            if (f := self._reward_fell(job, rl, fall)) is not None:
                found.append(f)
            bands = _add(bands, rl.name, fall.band(p))
        if objective is not None:
            climbs = tracked(ctx.state, "climbs:" + objective.name, objective, Climbs)
            climbs.read(objective, p)
            if (f := self._climbed(job, objective, climbs)) is not None:
                found.append(f)
            if (f := self._collapsed(job, objective, climbs)) is not None:
                found.append(f)
            bands = _climb_band(bands, job, objective, climbs, p)
            if objective is train and (g := grad_norm(job)) is not None:
                dead = tracked(ctx.state, "dead:" + g.name, g, Dead)
                dead.read(g, objective, p)
                if (f := self._dead(job, objective, g, dead, climbs)) is not None:
                    found.append(f)
                bands = _add(bands, g.name, dead.band(p))
                nan = self._nan_gradient(job, objective, g, climbs)
                if nan is not None:
                    found.append(nan)
                norm_band, objective_band = nan_gradient_bands(g, nan is not None)
                bands = _add(bands, g.name, norm_band)
                if objective_band is not None and bands is not None:
                    bands = _add(bands, objective.name, objective_band)
        if train is not None and train is not objective:
            # only whether its last value is finite is read
            bands = _add(bands, train.name, Band(math.inf, -_MAX, _MAX)
                         if job.series.get(train.name) is train else None)
        if ctx.state is not None and bands:
            ctx.state[STABLE] = bands
        if not found:
            return []
        # One finding per job: the worst, earliest.
        found.sort(key=lambda f: (-f.severity.rank, f.started_at if f.started_at is not None
                                  else float("inf")))
        return found[:1]

    def _blowup(self, job: Job, s: Series, t: Blowups, finite_training: bool,
                term: bool) -> Finding | None:
        p: DivergenceParams = self.params
        eval_only = finite_training and is_eval(s.name)
        spike = t.spike
        for ended in t.pending:  # ended, but too lately to say it is over
            if ended.sustained(p):
                return self._sustained(job, s, t, ended, eval_only, term)
            spike = spike or ended
        if (now := t.open) is not None:  # going on at the last record
            if now.sustained(p):
                return self._sustained(job, s, t, now, eval_only, term)
            return self._finding(job, s, t, now.start, now.nan_at, Severity.WARNING,
                                 "non-finite, watching" if now.nan_at is not None else
                                 "spiking, not yet recovered", eval_only)
        if (fired := t.fired) is not None:
            return self._recovered(job, s, t, fired.start, fired.end, fired.nan_at,
                                   fired.what(), eval_only)
        if spike is None:
            return None
        f = self._finding(job, s, t, spike.start, None, Severity.INFO, "spiked and recovered",
                          eval_only)
        f.evidence["spike_points"] = spike.length
        return f

    def _sustained(self, job: Job, s: Series, t: Blowups, b: Blowup, eval_only: bool,
                   term: bool) -> Finding:
        """A blow-up that did not come back: critical, but a warning in an evaluation loss
        (the training loss finite) or, finite, in a term of the objective."""
        if term and b.nan_at is None:
            f = self._finding(job, s, t, b.start, None, Severity.WARNING, b.what())
            f.message += (" in a term of the loss, not in the objective itself: check "
                          "that term")
            f.evidence["kind"] = "term_blowup"
            return f
        return self._finding(job, s, t, b.start, b.nan_at,
                             Severity.WARNING if eval_only else Severity.CRITICAL,
                             b.what(), eval_only)

    def _climbed(self, job: Job, s: Series, t: Climbs) -> Finding | None:
        """The objective many times its own best level, for ``regress_points`` points in a
        row."""
        p: DivergenceParams = self.params
        c = t.verdict(p)
        if c is None:
            return None
        level = float(np.median(c.head))
        first, wide = c.wide
        evidence = {"best_level": c.best, "level": level, "ratio": level / c.best}
        if isinstance(c, Shifted):
            what = (f"rose to {level / c.best:.1f}x its best level ({c.best:.4g}; it had "
                    f"learnt from {first:.4g}) and had not come back down after "
                    f"{c.ready_length} points")
            evidence.update(first_level=first, shift=True)
        elif level >= p.regress_factor * c.best or not np.isfinite(first - wide):
            what = (f"climbed to over {p.regress_factor:g}x its best level ({c.best:.4g}) "
                    f"for {c.length} points in a row")
        else:  # the undo test
            undone = (level - wide) / (first - wide)
            what = (f"gave back {min(undone, 1.0):.0%} of what it had learnt (from {first:.4g} "
                    f"down to {wide:.4g}, back up to {level:.4g}) for {c.length} points in a row")
            evidence.update(first_level=first, best_wide_level=wide, undone=undone)
        if c.back is None or t.nf - c.end < p.recover_points:
            f = self._finding(job, s, t, c.at, None, Severity.CRITICAL, what)
            f.evidence.update(kind="regressed", **evidence)
            return f
        f = self._recovered(job, s, t, c.at, c.back, None, what, False)
        f.evidence.update(evidence)
        return f

    def _collapsed(self, job: Job, s: Series, t: Climbs) -> Finding | None:
        """The objective dropped to exactly zero from a level it was learning at, and
        stayed there (``divergence_zero``), or got stuck on one exact value far above its
        lowest (``divergence_stuck``)."""
        p: DivergenceParams = self.params
        if (c := t.zeros.verdict()) is not None:
            what = (f"dropped to exactly 0 from {c.level:.4g} and stayed there for "
                    f"{p.recover_points} points: nothing is learnt (an fp16 overflow, or "
                    "every label masked? its grad_norm says)")
            evidence = {"level_before": c.level, "kind": "collapsed"}
        elif (c := t.stuck.verdict()) is not None:
            value = t.stuck.value
            what = (f"stuck at exactly {value:.6g} for {p.recover_points} points, "
                    f"{value / c.level:.3g}x its lowest value {c.level:.4g}: the model "
                    "collapsed to a constant output (ln V is a uniform guess over V tokens "
                    "or classes)")
            evidence = {"level_before": c.level, "stuck_at": value, "kind": "collapsed"}
        else:
            return None
        if c.back is None or t.nf - c.end < p.recover_points:
            f = self._finding(job, s, t, c.at, None, Severity.CRITICAL, what)
            f.evidence.update(evidence)
            return f
        f = self._recovered(job, s, t, c.at, c.back, None, what, False)
        f.evidence["level_before"] = c.level
        return f

    def _dead(self, job: Job, s: Series, g: Series, t: Dead, climbs: Climbs) -> Finding | None:
        """The gradient norm, positive before, exactly 0 for ``recover_points`` records while
        the objective stands far above its best (``divergence_dead``)."""
        p: DivergenceParams = self.params
        d = t.verdict(g, s, climbs.best, p)
        if d is None:
            return None
        what = (f"stands at {d.level / d.best:.1f}x its best level ({d.best:.4g}) with "
                f"{g.name} exactly 0 for {d.length} records (positive before): the gradient "
                "died, the optimiser no longer moves the model and the loss cannot come back")
        evidence = {"kind": "dead_gradient", "grad_metric": g.name, "best_level": d.best,
                    "level": d.level, "ratio": d.level / d.best, "zero_records": d.length}
        if not d.ended or d.after < p.recover_points:
            f = self._finding(job, s, climbs, d.at, None, Severity.CRITICAL, what)
            f.evidence.update(evidence)
            return f
        back = min(int(np.searchsorted(s.time, g.time[d.back], side="left")), len(s) - 1)
        f = self._recovered(job, s, climbs, d.at, back, None, what, False)
        f.evidence.update(evidence, kind="recovered")
        return f

    def _nan_gradient(self, job: Job, s: Series, g: Series, climbs: Climbs) -> Finding | None:
        """The objective exactly 0 while the gradient norm is not finite, for
        ``recover_points`` norms in a row (``divergence_dead.nan_gradient``)."""
        p: DivergenceParams = self.params
        found = nan_gradient(g, s, p.recover_points)
        if found is None:
            return None
        at, _ = found  # its length grows while the finding stands: said as the threshold
        f = self._finding(job, s, climbs, at, None, Severity.CRITICAL,
                          f"is exactly 0 with {g.name} not finite for {p.recover_points} "
                          "records in a row: the gradients overflow (fp16?) and nothing is "
                          "learnt")
        f.evidence.update(kind="nan_gradient", grad_metric=g.name)
        return f

    def _reward_fell(self, job: Job, s: Series, t: Collapse) -> Finding | None:
        """An RL reward never below 0 at a tenth of a level it held, for
        ``recover_points`` points (``divergence_reward``)."""
        p: DivergenceParams = self.params
        fell = t.fell
        if fell is None:
            return None
        step = float(s.step[fell.at]) if np.isfinite(s.step[fell.at]) else None
        where = f"step {step:g}" if step is not None else f"record {fell.at}"
        what = (f"{s.name} fell from a level of {fell.level:.4g} to at most "
                f"{fell.level / p.collapse_factor:.4g} for {fell.points} points from "
                f"{where}: the policy collapsed and no longer earns what it did (where every "
                "reward is alike, GRPO's advantages are all 0 and nothing brings it back)")
        f = Finding(job_id=job.id, rule=self.name,
                    severity=Severity.CRITICAL if fell.back is None else Severity.INFO,
                    message=what, started_at=float(s.time[fell.at]), step=step,
                    evidence={"kind": "reward_collapse", "metric": s.name,
                              "level_before": fell.level, "value": _num(s.value[fell.at])})
        return f if fell.back is None else _came_back(f, s, fell.back)

    def _recovered(self, job: Job, s: Series, t: Blowups | Climbs, start: int, end: int,
                   nan_at: int | None, what: str, eval_only: bool) -> Finding:
        """A divergence the run came back from: info as of now, saying when it fired."""
        return _came_back(self._finding(job, s, t, start, nan_at, Severity.INFO, what,
                                        eval_only), s, end)

    def _finding(self, job: Job, s: Series, t: Blowups | Climbs, start: int, nan_at: int | None,
                 severity: Severity, what: str, eval_only: bool = False) -> Finding:
        last_before, best_before = _before(t.before, s, start)
        step = float(s.step[start]) if np.isfinite(s.step[start]) else None
        evidence: dict[str, object] = {
            "kind": "nonfinite" if nan_at is not None else "blowup",
            "metric": s.name,
            "value": _num(s.value[start]),
            "last_finite_before": last_before,
            "best_before": best_before,
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


def _came_back(f: Finding, s: Series, end: int) -> Finding:
    """``f`` (info) saying the run came back at record ``end`` of ``s``, and when it
    fired. No count of the points since: it stands unchanged while the run goes on."""
    back = float(s.step[end]) if np.isfinite(s.step[end]) else None
    f.message += f"; recovered at {f'step {back:g}' if back is not None else f'record {end}'}"
    f.evidence.update(kind="recovered", recovered=True, recovered_step=back,
                      recovered_at=float(s.time[end]), fired_step=f.step,
                      fired_at=f.started_at)
    return f


def _add(bands: dict[str, Band] | None, name: str, band: Band | None) -> dict[str, Band] | None:
    """``bands`` with ``band`` for series ``name`` (both kept where they overlap); None, no
    band at all (something can change at the next record), once any is None."""
    if bands is None or band is None:
        return None
    if (had := bands.get(name)) is not None:
        band = Band(min(had.until, band.until), max(had.lo, band.lo), min(had.hi, band.hi),
                    had.nonfinite and band.nonfinite)
    bands[name] = band
    return bands


def _climb_band(bands: dict[str, Band] | None, job: Job, objective: Series, climbs: Climbs,
                p: DivergenceParams) -> dict[str, Band] | None:
    """``bands`` with the objective's: a sum of components (not a series of the job) has
    none; its floor is its blow-up band's, else half its lowest point."""
    if bands is None or job.series.get(objective.name) is not objective:
        return None
    had = bands.get(objective.name)
    floor = had.lo if had is not None and had.lo > 0 else climbs.low / 2
    return _add(bands, objective.name, climbs.ceiling(floor, p))


def _training(job: Job, ctx: Context) -> Series | None:
    """``metrics.training_objective``, whose choice among named series depends only on
    which loss series (and the policy's alias) are non-empty: a followed rule keeps the
    name it chose while those stay the same (a sum of components is summed afresh). Only
    those series are read, as ``training_objective`` reads them (``checker.follow``)."""
    if ctx.state is None:
        return training_objective(job, ctx.policy)
    series = job.series
    alias = ctx.policy.metrics.get("loss")
    key = (alias, alias is not None and alias in series and len(series[alias]) > 0,
           [(k, len(series[k]) > 0) for k in series if "loss" in k.lower()])
    kept = ctx.state.get("training")
    if kept is not None and kept[0] == key:
        return job.series[kept[1]] if kept[1] is not None else None
    s = training_objective(job, ctx.policy, ctx.state)
    if s is None or job.series.get(s.name) is s:
        ctx.state["training"] = (key, None if s is None else s.name)
    else:
        ctx.state.pop("training", None)
    return s


def _before(cache: Before, s: Series, start: int) -> tuple[float | str | None,
                                                            float | str | None]:
    """(last finite value, lowest finite value) before record ``start``, worked out once
    per start and kept on the track (a finding lasts many ticks)."""
    if start not in cache:
        before = s.value[:start][np.isfinite(s.value[:start])]
        cache[start] = (_num(before[-1]), _num(before.min())) if len(before) else (None, None)
    return cache[start]


def _num(x: float) -> float | str:
    x = float(x)
    return x if np.isfinite(x) else str(x)


def _fmt(x: float) -> str:
    return f"{float(x):.4g}"
