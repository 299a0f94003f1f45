"""``divergence``: NaN/inf, or a blow-up that does not come back.

Anchors: Keras TerminateOnNaN and Debugger exploding_tensor fire on the first
non-finite value; Lightning's divergence_threshold is a fixed number. Large-model
runs often spike and recover (a bad batch, a loss-scale skip), so a finite spike
that comes back is reported as info, never as critical, and a lone non-finite
value waits one more logging interval before it counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from checker.metrics import loss_like
from checker.model import Finding, FloatArray, Job, Series, Severity
from checker.registry import register
from checker.rules.base import Context, Rule, param

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
        found = [f for s in series if (f := self._one(job, s)) is not None]
        if not found:
            return []
        # One finding per job: the worst, earliest.
        found.sort(key=lambda f: (-f.severity.rank, f.started_at if f.started_at is not None
                                  else float("inf")))
        return found[:1]

    def _one(self, job: Job, s: Series) -> Finding | None:
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
        first_spike: tuple[int, int] | None = None
        for start, length in _runs(blown):
            ends_run = start + length == n
            nonfinite = int(bad[start:start + length].sum())
            nan_at = start + int(np.argmax(bad[start:start + length])) if nonfinite else None
            consecutive_bad = max((ln for _, ln in _runs(bad[start:start + length])), default=0)
            if consecutive_bad >= p.nan_points or length >= p.recover_points:
                return self._finding(job, s, start, nan_at, Severity.CRITICAL,
                                     "diverged" if consecutive_bad else "blew up and stayed up")
            if ends_run:
                return self._finding(job, s, start, nan_at, Severity.WARNING,
                                     "non-finite, watching" if nonfinite else
                                     "spiking, not yet recovered")
            if first_spike is None:
                first_spike = (start, length)
        if first_spike is None:
            return None
        start, length = first_spike
        f = self._finding(job, s, start, None, Severity.INFO, "spiked and recovered")
        f.evidence["spike_points"] = length
        return f

    def _finding(self, job: Job, s: Series, start: int, nan_at: int | None,
                 severity: Severity, what: str) -> Finding:
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
        return Finding(
            job_id=job.id, rule=self.name, severity=severity,
            message=f"{s.name} {what} at {where} (value {_fmt(s.value[start])})",
            started_at=float(s.time[start]), step=step, evidence=evidence,
        )


def _num(x: float) -> float | str:
    x = float(x)
    return x if np.isfinite(x) else str(x)


def _fmt(x: float) -> str:
    return f"{float(x):.4g}"
