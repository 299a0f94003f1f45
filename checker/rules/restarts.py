"""``restarts``: a crash or restart loop that makes no progress between restarts.

Anchors: the Training Operator's backoffLimit counts restarts whatever they
achieved; NVRx stops after max_no_progress_cycles=3. Here a restart that was
followed by progress resets the count, and the reason is read from the job's
failure reason and log lines (OOMKilled, exit 137, NCCL timeout...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainguard.checker.cost import progress
from trainguard.checker.follow import STABLE
from trainguard.checker.model import Finding, Job, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.checker.signatures import match


@dataclass
class RestartsParams:
    warn_after: int = param(2, "restarts in a row without progress that warn")
    max_no_progress: int = param(3, "restarts in a row without progress that are critical (NVRx)")


@register
class Restarts(Rule):
    name = "restarts"
    Params = RestartsParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: RestartsParams = self.params
        times = sorted(job.restart_times)
        if not times and job.restarts < p.warn_after:
            return []
        stuck = self._restarts_without_progress(job, times) if times else job.restarts
        step = job.series.get("step")
        if stuck == 0 and ctx.state is not None and step is not None and len(step):
            # progress since the last restart: no record can undo it, only another restart
            # (a change of the job a follower sees) can change this verdict (counted on the
            # ``step`` series: without it, which series counts steps may change)
            ctx.state[STABLE] = {}
        if stuck < p.warn_after:
            return []
        severity = Severity.CRITICAL if stuck >= p.max_no_progress else Severity.WARNING
        reasons = self._reasons(job)
        why = ", ".join(reasons) if reasons else "reason unknown"
        return [Finding(
            job_id=job.id, rule=self.name, severity=severity,
            message=f"{stuck} restarts in a row with no progress between them ({why})",
            started_at=times[-stuck] if len(times) >= stuck else job.start_time,
            step=None,
            evidence={"kind": "loop", "restarts_total": max(job.restarts, len(times)),
                      "restarts_without_progress": stuck, "reasons": reasons},
        )]

    def _restarts_without_progress(self, job: Job, times: list[float]) -> int:
        """How many of the latest restarts in a row were not followed by a new best step
        before the next restart (or by the latest record, for the last one: a record
        stamped after the watchdog's clock still counts as progress)."""
        prog = progress(job)
        if prog is None or not len(prog):
            return len(times)
        best = np.maximum.accumulate(prog.step)

        def best_at(t: float) -> float:
            i = int(np.searchsorted(prog.time, t, side="right")) - 1
            return float(best[i]) if i >= 0 else -np.inf

        stuck = 0
        for k in range(len(times) - 1, -1, -1):
            until = times[k + 1] if k + 1 < len(times) else math.inf
            if best_at(until) > best_at(times[k]):
                break
            stuck += 1
        return stuck

    def _reasons(self, job: Job) -> list[str]:
        found: list[str] = []
        texts = [job.failure_reason or "", job.raw_state] + [ln.text for ln in job.logs[-2000:]]
        for text in texts:
            sig = match(text) if text else None
            if sig is not None and sig.name not in found and sig.name != "traceback":
                found.append(sig.name)
        return found
