"""``stall``: the job is running but its progress stopped.

Anchors: SageMaker Debugger StalledTrainingRule (1800 s fixed), ClearML's
non-responsive watchdog (7200 s), NVRx heartbeats (timeout learnt x5). Here the
threshold is learnt from the job's own update cadence, warm-up and compile gaps
before the first updates are not held against it, pauses the job already came
back from (evaluation, checkpoints) raise the threshold, and the GPU utilisation
during the silence says which kind of stall it is: GPUs busy with no steps is a
hung collective (horovod#3611), GPUs idle is a starved or dead input pipeline. A
restart the platform reports after the last progress starts the count again, with the
allowance of a start: the new process loads its checkpoint first.

Its cost does not grow with the square of the run when it is judged at every record. The
cadence (the run's typical record gap, the 99th percentile of its update gaps) is learnt
from the progress records up to the latest block boundary (all of them up to
``max_points``; beyond, a power of two records at most ``1/relearn_parts`` of the run),
and the records after it are read once each, in order, for the rest: the last update,
the longest gap, resumes. Followed (a replay), that work is kept in ``ctx.state`` and the
rule is not called again while its silence cannot reach the smallest threshold
(``checker.follow.STABLE_NOW``); ``check`` does the same work at once, so both agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.checker.cost import (
    RESUME_GAP_FACTOR,
    fresh_launch,
    fruitless,
    launched_since,
    logged_again,
    marked,
    progress_source,
    resumes,
    update_times,
)
from trainguard.checker.follow import STABLE, STABLE_NOW
from trainguard.checker.model import Finding, FloatArray, Job, Series, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.rules.plateau import judged_prefix
from trainguard.checker.stats import quantile, t_quantile


@dataclass
class StallParams:
    min_seconds: float = param(300.0, "a silence shorter than this is never a stall")
    factor: float = param(2.5, "threshold = factor x the 99th percentile of the job's update gaps")
    pause_factor: float = param(
        1.5, "threshold >= this x the longest pause the job already recovered from")
    warmup_updates: int = param(
        3, "gaps before this many progress updates (compile, warm-up) are not learnt from")
    min_updates: int = param(10, "updates needed before the cadence is trusted")
    unlearnt_seconds: float = param(
        1800.0, "threshold while the cadence is not learnt yet (Debugger's default)")
    few_updates: int = param(
        3, "with at least this many update gaps (but fewer than min_updates) the threshold is "
        "factor x an upper 99 % prediction bound of the next gap (Student t on their mean "
        "and spread), if below unlearnt_seconds: a short, regular log is judged on its "
        "own cadence, an irregular one waits for more")
    unseen_pause_factor: float = param(
        15.0, "... and at least this many times the median gap: a short log has not shown "
        "its evaluation and checkpoint pauses yet, which last up to some ten update gaps "
        "(and pause_factor 1.5 x a pause is tolerated)")
    critical_factor: float = param(2.0, "silence past this x the threshold is critical")
    critical_seconds: float = param(
        1800.0, "... and past this long (Debugger's StalledTrainingRule default): a pause the "
        "run has not shown before (its first evaluation, its final checkpoint) can last a "
        "quarter of an hour, and a critical finding is what a policy stops on")
    max_pause_seconds: float = param(
        3600.0, "a pause announced by heartbeats (trainguard.emit) excuses silence this long, "
        "or 3 x the longest pause the job finished before, whichever is larger; a log "
        "still being written (lines with no progress, the last within min_seconds: a "
        "final evaluation, a decoding pass, a save) holds a stop off as long")
    busy_util: float = param(50.0, "mean GPU utilisation (%) above which GPUs count as busy")
    idle_util: float = param(10.0, "mean GPU utilisation (%) below which GPUs count as idle")
    max_points: int = param(
        1024, "the cadence is learnt from all progress records up to this many; beyond, from "
        "those up to the latest block boundary (later ones still extend the longest gap)")
    relearn_parts: int = param(
        64, "beyond max_points, the cadence is learnt again each time the run grows by a "
        "block of at most 1/this of its records")

    def critical_after(self, threshold: float) -> float:
        """The silence that is critical for a stall ``threshold`` (the watchdog's and the
        PrometheusRule's alike)."""
        return max(self.critical_factor * threshold, self.critical_seconds)


@register
class Stall(Rule):
    name = "stall"
    Params = StallParams

    def threshold(self, c: Cadence, startup: float = 0.0) -> tuple[float, dict[str, float]]:
        """The silence that counts as a stall for a job of cadence ``c``: the silences that
        ended in a resume from a checkpoint were the job being down, and are not learnt as
        the job's own pauses. ``startup``: how long the job took to its first progress."""
        p: StallParams = self.params
        if c.count < p.min_updates:
            # A silence the job already came back from (its start, a warm-up gap, an epoch
            # of two hours logged once) is no stall: a slow log is not held to 30 minutes.
            unlearnt = max(p.unlearnt_seconds, p.min_seconds,
                           p.pause_factor * max(c.survived, startup))
            if c.count < max(p.few_updates, 2):
                return unlearnt, {"learnt": 0.0}
            gaps = np.asarray(c.few)
            bound = float(gaps.mean() + t_quantile(0.99, len(gaps) - 1)
                          * gaps.std(ddof=1) * math.sqrt(1.0 + 1.0 / len(gaps)))
            t = max(p.min_seconds, p.factor * bound, p.pause_factor * c.longest,
                    p.unseen_pause_factor * float(np.median(gaps)))
            if t >= unlearnt:
                return unlearnt, {"learnt": 0.0}
            return t, {"learnt": 0.5, "gap_bound_s": bound, "longest_gap_s": c.longest}
        p99 = c.p99 if c.p99 is not None else c.longest
        t = max(p.min_seconds, p.factor * p99, p.pause_factor * c.longest)
        return t, {"learnt": 1.0, "p99_gap_s": p99, "longest_gap_s": c.longest}

    def cadence(self, job: Job, state: dict[str, Any] | None) -> Cadence | None:
        """The job's progress so far (``Cadence``), from ``state`` where it extends what
        was read there; None when no series counts steps."""
        p: StallParams = self.params
        src = progress_source(job)
        if src is None:
            return None
        n = len(src)
        upto, block = judged_prefix(n, p.max_points, p.relearn_parts)
        mark = (src.name, upto, block, float(src.time[0]), float(src.time[upto - 1]))
        kept: Cadence | None = state.get("cadence") if state is not None else None
        if kept is None or kept.mark != mark or kept.seen > n \
                or float(src.time[kept.seen - 1]) != kept.seen_time:
            kept = Cadence.learn(job, src, upto, mark, p.warmup_updates)
        kept.read(job, src, p.warmup_updates)
        if state is not None:
            state["cadence"] = kept
        return kept

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        if job.clock == "step":
            return []  # no time axis: a silence cannot be measured
        p: StallParams = self.params
        c = self.cadence(job, ctx.state)
        if c is not None and c.updates:
            last, last_step = c.last_update, c.top
        else:
            c = None
            found = job.last_time()
            if found is None:
                return []
            last, last_step = found, float("nan")
        paused = job.series.get("pause_seconds")
        if paused is not None and len(paused) and float(paused.time[-1]) > last:
            last = float(paused.time[-1])  # the loop said it resumed: alive from there
        restarted = _restart_since(job, last, ctx.now)
        if restarted is not None:
            last = restarted
        silence = float(ctx.now - last)
        thr, learnt = (self.threshold(c, _startup(job, c)) if c is not None
                       else (max(p.unlearnt_seconds, p.min_seconds), {"learnt": 0.0}))
        if restarted is not None:
            # The process restarted after its last progress (a spot interruption, a pod
            # restart): the new one loads its checkpoint and warms up as at the start, so
            # it gets the start's allowance and its silence counts from the restart.
            thr = max(thr, p.unlearnt_seconds, p.pause_factor * _startup(job, c))
            learnt = {**learnt, "restarted_at": restarted}
        pauses = _finished_pauses(job)
        if len(pauses):
            # Pauses the job reported finishing (evaluation, checkpoint) are learnt too.
            thr = max(thr, p.pause_factor * float(pauses.max()))
        if silence <= thr:
            if ctx.state is not None:
                # Every threshold is at least min_seconds, and later records only move the
                # last progress later: no finding before then, whatever arrives.
                ctx.state[STABLE] = {STABLE_NOW: last + p.min_seconds}
            return []
        phase, excused = self._open_pause(job, last, ctx.now, pauses)
        if excused:
            return []
        critical = p.critical_after(thr)
        writing = _writing(job, last, ctx.now, p.min_seconds)
        if writing is not None:
            # The process writes on (a phase that logs lines and no progress records): a
            # hang writes nothing, a stop waits as for a heartbeating pause. A loop that
            # prints a retry forever is still stopped, an hour on.
            critical = max(critical, p.max_pause_seconds)
        finished = next((t for t in job.finishes if last <= t <= ctx.now), None)
        severity = Severity.CRITICAL if silence > critical else Severity.WARNING
        if finished is not None:
            # The loop said training finished (a "Training complete" line, ``Job.finishes``):
            # what is left is a final evaluation (a detector's test set: hours), a save or
            # the exit. A stop there would save little and could lose the evaluation; a
            # hang at exit is warned, not stopped.
            severity = Severity.WARNING
        why, util = self._diagnose(job, last, ctx.now)
        if writing is not None:
            why = (f"{why}; its log goes on ({writing[0]} lines since the last progress, "
                   f"the latest {_span(ctx.now - writing[1])} ago): a phase that logs no "
                   f"progress (an evaluation, a decoding pass, a save)?")
        unknown = restarted is None and _cadence_unknown(job, c)
        if unknown:
            # One progress record and nothing known before it (a file whose first line is
            # its first epoch's record): the job may take hours per record, and no silence
            # it came back from says so yet. A warning until the second record.
            severity = Severity.WARNING
            why = f"{why}; one progress record and no start time: its cadence is unknown"
        if phase is not None:
            why = (f"in a '{phase}' pause for {_span(silence)}, longer than a pause may "
                   f"take; {why}")
        if finished is not None:
            why = (f"its log said training finished {_span(ctx.now - finished)} ago and it "
                   f"has written no progress since (a final evaluation or save, or a hang at "
                   f"exit); {why}")
        done = _ran_its_steps(job, last_step)
        if done:
            # nothing left to learn: a hang in the process group's teardown, or a final
            # save or upload (which may take as long as a checkpoint: the severity stays)
            why = (f"it reached its planned {job.planned_steps} steps and has not exited "
                   f"(a hang at exit, or a final save or upload); {why}")
        evidence: dict[str, object] = {
            "kind": "silence", "silence_s": silence, "threshold_s": thr, "critical_s": critical,
            "last_progress_step": last_step if np.isfinite(last_step) else None,
            "diagnosis": why, **learnt,
        }
        if util is not None:
            evidence["gpu_util_during_silence"] = util
        if unknown:
            evidence["cadence_unknown"] = True
        if writing is not None:
            evidence["log_lines_since"] = writing[0]
            evidence["last_log_line"] = writing[1]
        if done:
            evidence["ran_its_steps"] = True
        if finished is not None:
            evidence["finished_at"] = finished
        loop = ""
        if c is not None and c.loop > 1:
            # each process wrote its checkpoint's record again and got no further
            evidence["resumes_without_progress"] = c.loop
            loop = (f"; its log resumed {c.loop} times without getting past step "
                    f"{c.best:g}: a restart loop")
        return [Finding(
            job_id=job.id, rule=self.name, severity=severity,
            message=(f"no progress for {_span(silence)}"
                     f"{' since its restart' if restarted is not None else ''} "
                     f"(threshold {_span(thr)}, last step {last_step:g}{loop}): {why}"),
            started_at=last, step=last_step if np.isfinite(last_step) else None,
            evidence=evidence,
        )]

    def _open_pause(self, job: Job, last_progress: float, now: float,
                    finished: FloatArray) -> tuple[str | None, bool]:
        """(phase, excused): the pause the job is heartbeating through now, and whether it
        excuses the silence: its last heartbeat is recent and the pause is not longer than
        allowed. A hung evaluation whose heartbeat thread goes on is still caught by the
        cap."""
        p: StallParams = self.params
        beats = job.series.get("heartbeat")
        if beats is None or not len(beats):
            return None, False
        last_beat = float(beats.time[-1])
        ended = job.series.get("pause_seconds")
        if ended is not None and len(ended) and float(ended.time[-1]) >= last_beat:
            return None, False  # the last pause is over
        if last_beat < last_progress:
            return None, False
        phase = "pause"
        for name, s in job.series.items():
            if name.startswith("heartbeat/") and len(s) and float(s.time[-1]) == last_beat:
                phase = name.split("/", 1)[1]
        cap = max(p.max_pause_seconds, 3 * float(finished.max()) if len(finished) else 0.0)
        beating = now - last_beat <= max(p.min_seconds, 5 * _beat_interval(beats))
        return phase, beating and now - last_progress <= cap

    def _diagnose(self, job: Job, since: float, now: float) -> tuple[str, float | None]:
        p: StallParams = self.params
        util = job.series.get("gpu_util")
        if util is None or not len(util):
            return "no GPU metrics to tell a hang from a starved input", None
        during = util.value[(util.time > since) & (util.time <= now)]
        during = during[np.isfinite(during)]
        if not len(during):
            return "GPU metrics stopped too: the process or host may be gone", None
        mean = float(during.mean())
        if mean >= p.busy_util:
            return "GPUs busy with no steps: a hung collective (NCCL) is likely", mean
        if mean <= p.idle_util:
            return "GPUs idle: the input pipeline or the process is stuck", mean
        return "GPUs partly busy with no steps", mean


#: Update gaps a Cadence keeps one by one: enough for any ``few_updates`` < ``min_updates``.
FEW = 64


class Cadence:
    """What the progress records say so far: learnt from a prefix at once (numpy), then
    extended one record at a time, so that a followed rule reads each record once."""

    def __init__(self, mark: tuple[Any, ...]) -> None:
        self.mark = mark
        self.seen = 0  # records of the source read
        self.seen_time = math.nan  # the time of the last of them (the cut extends it?)
        self.typical = 0.0  # the prefix's median record gap: a resume is a silence beyond
        self.p99: float | None = None  # of the prefix's update gaps
        self.count = 0  # update gaps learnt (after warm-up, not ending in a resume)
        self.few: list[float] = []  # the first FEW of them (a short log's cadence)
        self.longest = 0.0
        self.survived = 0.0  # the longest update gap, warm-up ones too (not a resume's)
        self.updates = 0
        self.last_update = math.nan
        self.first_update = math.nan
        self.prev_time = math.nan  # the last record with a step (for its gap)
        self.top = -math.inf  # the highest step so far
        self.best = -math.inf  # the highest step since the last resume
        # resumes since the last step beyond the one resumed at; more than one: the
        # resumes after the first were no progress, and the next update's gap spans them
        self.loop = 0

    @classmethod
    def learn(cls, job: Job, src: Series, upto: int, mark: tuple[Any, ...],
              warmup: int) -> Cadence:
        c = cls(mark)
        ok = np.isfinite(src.step[:upto]) if src.name != "step" else slice(None)
        pre = Series(src.name, src.time[:upto][ok], src.step[:upto][ok], src.step[:upto][ok])
        c.seen, c.seen_time = upto, float(src.time[upto - 1])
        if not len(pre):
            return c
        back = resumes(pre, job)
        times = update_times(pre, job, back)
        resumed = pre.time[back]
        every = np.diff(times)
        if len(resumed) and len(every):
            # a gap with a resume in it spans the time the job was down
            spans = (np.searchsorted(resumed, times[1:], "right")
                     > np.searchsorted(resumed, times[:-1], "right"))
            every = np.where(spans, np.nan, every)
        gaps = every[warmup - 1:] if len(times) > warmup else np.empty(0)
        gaps = gaps[np.isfinite(gaps)]
        if np.isfinite(every).any():
            c.survived = float(np.nanmax(every))
        if len(back):  # as ``read`` would have left them: resumes since the last rise
            alive = np.flatnonzero(~fruitless(pre, back))
            start = int(alive[-1]) + 1 if len(alive) else 0
            # ... or since the last begun after half an hour of nothing (a fresh start)
            fresh = [k for k in range(start, len(back)) if fresh_launch(
                job, float(pre.time[back[k] - 1]), float(pre.time[back[k]]))]
            c.loop = len(back) - (fresh[-1] if fresh else start)
        c.count = len(gaps)
        c.few = gaps[:FEW].tolist()
        if len(gaps):
            c.p99, c.longest = quantile(gaps, 0.99), float(gaps.max())
        c.updates, c.last_update = len(times), float(times[-1])
        c.first_update = float(times[0])
        if len(pre) >= 3:
            c.typical = float(np.median(np.diff(pre.time)))
        c.prev_time = float(pre.time[-1])
        c.top = float(np.max(pre.step))
        c.best = float(np.max(pre.step[int(back[-1]) if len(back) else 0:]))
        return c

    def read(self, job: Job, src: Series, warmup: int) -> None:
        """The records of ``src`` after those already read, one at a time (``job`` tells
        a resume that logs its last step again)."""
        n = len(src)
        if self.seen >= n:
            return
        times, steps = src.time[self.seen:n].tolist(), src.step[self.seen:n].tolist()
        self.seen, self.seen_time = n, float(src.time[n - 1])
        limit = RESUME_GAP_FACTOR * self.typical
        for t, s in zip(times, steps, strict=True):
            if not math.isfinite(s):
                continue
            silent = self.typical > 0 and t - self.prev_time > limit
            resumed = silent and (
                s < self.top or (s == self.top and logged_again(job.series, src, t, s))
                or marked(job, self.prev_time, t))
            fresh = resumed and self.loop and fresh_launch(job, self.prev_time, t)
            self.prev_time = t
            self.top = max(self.top, s)
            if fresh:
                self.loop = 0  # begun after half an hour of nothing: a fresh start
            down = resumed or self.loop > 1  # the gap to this update spans a resume
            if resumed:
                self.best = s
                self.loop += 1
                if self.loop > 1:  # the process resumed before got no further: no start
                    continue
            elif s > self.best:
                self.best = s
                self.loop = 0
            else:
                continue  # no progress
            if self.updates and not down:
                self.survived = max(self.survived, t - self.last_update)
            if self.updates >= warmup and not down:
                gap = t - self.last_update
                self.count += 1
                if len(self.few) < FEW:
                    self.few.append(gap)
                self.longest = max(self.longest, gap)
            if not self.updates:
                self.first_update = t
            self.updates += 1
            self.last_update = t


def _writing(job: Job, last: float, now: float, recent: float) -> tuple[int, float] | None:
    """(lines, time of the latest) of the log lines written after the last progress
    ``last`` and by ``now``, when the latest is within ``recent`` seconds of now: the
    process is writing; None when it is not (or keeps no log)."""
    lines, latest = 0, -math.inf
    for line in reversed(job.logs):  # in time order, as the readers keep them
        if line.time <= last:
            break
        if line.time <= now:
            lines += 1
            latest = max(latest, line.time)
    if not lines or now - latest > recent:
        return None
    return lines, latest


def _restart_since(job: Job, last: float, now: float) -> float | None:
    """The latest restart of the job after ``last`` and by ``now``, if any; else the
    new process its log shows beginning since that the silence counts from
    (``cost.launched_since``)."""
    later = [r for r in job.restart_times if last < r <= now]
    return max(later) if later else launched_since(job, last, now)


def _cadence_unknown(job: Job, c: Cadence | None) -> bool:
    """Whether nothing bounds the job's cadence yet: at most one progress record and no
    start before it (a local file's start is its first record when it names none)."""
    if c is None:
        return job.start_time is None
    return c.updates < 2 and (job.start_time is None or job.start_time >= c.first_update)


def _startup(job: Job, c: Cadence | None) -> float:
    """How long the job took from its start to its first progress (0 when unknown)."""
    if c is None or not c.updates or job.start_time is None:
        return 0.0
    return max(c.first_update - job.start_time, 0.0)


def _finished_pauses(job: Job) -> FloatArray:
    """Lengths (s) of the pauses the job reported finishing (``pause_seconds``)."""
    s = job.series.get("pause_seconds")
    if s is None or not len(s):
        return np.empty(0)
    v = s.value[np.isfinite(s.value)]
    return v[v >= 0]


def _beat_interval(beats: Series) -> float:
    """The heartbeat's own cadence (emit beats every 30 s by default)."""
    t = beats.time
    if len(t) < 2:
        return 30.0
    return float(np.median(np.diff(t[-20:])))


def _ran_its_steps(job: Job, last_step: float) -> bool:
    """Whether the last progress reached the job's planned steps, within one logging
    interval (a loop of 1,000 steps logging every 50 logs step 950 last)."""
    planned = job.planned_steps
    src = progress_source(job)
    if not planned or not math.isfinite(last_step) or src is None:
        return False
    gaps = np.diff(src.step[-9:])
    gaps = gaps[np.isfinite(gaps) & (gaps > 0)]
    return last_step + (float(np.median(gaps)) if len(gaps) else 1.0) >= planned


def _span(seconds: float) -> str:
    """A silence as a person reads it: seconds below five minutes, then minutes."""
    return f"{seconds:.0f} s" if seconds < 300 else f"{seconds / 60:.1f} min"
