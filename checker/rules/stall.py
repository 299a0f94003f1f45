"""``stall``: the job is running but its progress stopped.

Anchors: SageMaker Debugger StalledTrainingRule (1800 s fixed), ClearML's
non-responsive watchdog (7200 s), NVRx heartbeats (timeout learnt x5). Here the
threshold is learnt from the job's own update cadence, warm-up and compile gaps
before the first updates are not held against it, pauses the job already came
back from (evaluation, checkpoints) raise the threshold, and the GPU utilisation
during the silence says which kind of stall it is: GPUs busy with no steps is a
hung collective (horovod#3611), GPUs idle is a starved or dead input pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainguard.checker.cost import progress, resumes, update_times
from trainguard.checker.model import Finding, FloatArray, Job, Series, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.stats import quantile


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
    critical_factor: float = param(2.0, "silence past this x the threshold is critical")
    max_pause_seconds: float = param(
        3600.0, "a pause announced by heartbeats (trainguard.emit) excuses silence this long, "
        "or 3 x the longest pause the job finished before, whichever is larger")
    busy_util: float = param(50.0, "mean GPU utilisation (%) above which GPUs count as busy")
    idle_util: float = param(10.0, "mean GPU utilisation (%) below which GPUs count as idle")


@register
class Stall(Rule):
    name = "stall"
    Params = StallParams

    def threshold(self, times: np.ndarray, resumed: np.ndarray | None = None
                  ) -> tuple[float, dict[str, float]]:
        """The silence that counts as a stall for a job whose progress came at ``times``;
        the silences that ended in a resume from a checkpoint (at ``resumed``) were the job
        being down, and are not learnt as the job's own pauses."""
        p: StallParams = self.params
        ts = times[p.warmup_updates - 1:]
        gaps = np.diff(ts) if len(times) > p.warmup_updates else np.empty(0)
        if resumed is not None and len(resumed) and len(gaps):
            gaps = gaps[~np.isin(ts[1:], resumed)]
        if len(gaps) < p.min_updates:
            return max(p.unlearnt_seconds, p.min_seconds), {"learnt": 0.0}
        p99 = quantile(gaps, 0.99)
        longest = float(gaps.max())
        t = max(p.min_seconds, p.factor * p99, p.pause_factor * longest)
        return t, {"learnt": 1.0, "p99_gap_s": p99, "longest_gap_s": longest}

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        if job.clock == "step":
            return []  # no time axis: a silence cannot be measured
        p: StallParams = self.params
        prog = progress(job)
        resumed = None
        if prog is not None and len(prog):
            times = update_times(prog)
            resumed = prog.time[resumes(prog)]
            last_step = float(np.max(prog.step))
        else:
            last = job.last_time()
            if last is None:
                return []
            times = np.array([last])
            last_step = float("nan")
        last = float(times[-1])
        paused = job.series.get("pause_seconds")
        if paused is not None and len(paused) and float(paused.time[-1]) > last:
            last = float(paused.time[-1])  # the loop said it resumed: alive from there
        silence = float(ctx.now - last)
        thr, learnt = self.threshold(times, resumed)
        pauses = _finished_pauses(job)
        if len(pauses):
            # Pauses the job reported finishing (evaluation, checkpoint) are learnt too.
            thr = max(thr, p.pause_factor * float(pauses.max()))
        if silence <= thr:
            return []
        phase, excused = self._open_pause(job, last, ctx.now, pauses)
        if excused:
            return []
        severity = Severity.CRITICAL if silence > p.critical_factor * thr else Severity.WARNING
        why, util = self._diagnose(job, last, ctx.now)
        if phase is not None:
            why = (f"in a '{phase}' pause for {_span(silence)}, longer than a pause may "
                   f"take; {why}")
        evidence: dict[str, object] = {
            "kind": "silence", "silence_s": silence, "threshold_s": thr,
            "last_progress_step": last_step if np.isfinite(last_step) else None,
            "diagnosis": why, **learnt,
        }
        if util is not None:
            evidence["gpu_util_during_silence"] = util
        return [Finding(
            job_id=job.id, rule=self.name, severity=severity,
            message=(f"no progress for {_span(silence)} (threshold {_span(thr)}, "
                     f"last step {last_step:g}): {why}"),
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


def _span(seconds: float) -> str:
    """A silence as a person reads it: seconds below five minutes, then minutes."""
    return f"{seconds:.0f} s" if seconds < 300 else f"{seconds / 60:.1f} min"
