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

from checker.cost import progress
from checker.model import Finding, Job, Severity
from checker.registry import register
from checker.rules.base import Context, Rule, param
from checker.stats import quantile


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
    busy_util: float = param(50.0, "mean GPU utilisation (%) above which GPUs count as busy")
    idle_util: float = param(10.0, "mean GPU utilisation (%) below which GPUs count as idle")


@register
class Stall(Rule):
    name = "stall"
    Params = StallParams

    def threshold(self, times: np.ndarray) -> tuple[float, dict[str, float]]:
        """The silence that counts as a stall for a job whose progress came at ``times``."""
        p: StallParams = self.params
        gaps = np.diff(times[p.warmup_updates - 1:]) if len(times) > p.warmup_updates else (
            np.empty(0))
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
        if prog is not None and len(prog):
            # A progress update is a record that raised the step beyond all before it.
            best = np.maximum.accumulate(prog.step)
            rises = np.concatenate(([True], best[1:] > best[:-1]))
            times = prog.time[rises]
            last_step = float(best[-1])
        else:
            last = job.last_time()
            if last is None:
                return []
            times = np.array([last])
            last_step = float("nan")
        last = float(times[-1])
        silence = float(ctx.now - last)
        thr, learnt = self.threshold(times)
        if silence <= thr:
            return []
        severity = Severity.CRITICAL if silence > p.critical_factor * thr else Severity.WARNING
        why, util = self._diagnose(job, last, ctx.now)
        evidence: dict[str, object] = {
            "kind": "silence", "silence_s": silence, "threshold_s": thr,
            "last_progress_step": last_step if np.isfinite(last_step) else None,
            "diagnosis": why, **learnt,
        }
        if util is not None:
            evidence["gpu_util_during_silence"] = util
        return [Finding(
            job_id=job.id, rule=self.name, severity=severity,
            message=(f"no progress for {silence / 60:.1f} min (threshold {thr / 60:.1f} min, "
                     f"last step {last_step:g}): {why}"),
            started_at=last, step=last_step if np.isfinite(last_step) else None,
            evidence=evidence,
        )]

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
