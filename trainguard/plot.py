"""A run's curves with each finding marked at its onset, as a PNG.

matplotlib is imported here only, lazily, and without pyplot: no GUI backend, no
global state, so ``check --plot`` works on a headless box and costs nothing when unused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.checker import cost
from trainguard.checker.model import Finding, FloatArray, Job, Series, Severity
from trainguard.replay import ReplayResult, first_record

_COLOUR = {Severity.INFO: "tab:blue", Severity.WARNING: "tab:orange",
           Severity.CRITICAL: "tab:red"}


@dataclass(frozen=True)
class Marker:
    time: float  # on the job's clock
    label: str
    severity: Severity


def markers_from_findings(findings: list[Finding]) -> list[Marker]:
    return [Marker(f.started_at, f"{f.rule} ({f.severity.value})", f.severity)
            for f in findings if f.started_at is not None]


def markers_from_replay(result: ReplayResult) -> list[Marker]:
    """Each finding where the replay first saw it, and again where it escalated."""
    out = []
    for h in result.histories:
        for fire in (h.first, *h.escalations):
            out.append(Marker(fire.time, f"{h.rule} ({fire.severity.value})", fire.severity))
    return out


def _axis(job: Job) -> tuple[float, float, str]:
    """(origin, divisor, label) turning the job's clock into a readable x axis."""
    start = first_record(job) or 0.0
    if job.clock == "step":
        return 0.0, 1.0, "step"
    span = (job.last_time() or start) - start
    if span > 3 * 3600:
        return start, 3600.0, "hours since first record"
    if span > 3 * 60:
        return start, 60.0, "minutes since first record"
    return start, 1.0, "seconds since first record"


def _rate(job: Job) -> Series | None:
    """Steps per second over time, lightly smoothed: the job's pulse."""
    prog = cost.progress(job)
    if prog is None or job.clock == "step" or len(prog) < 3:
        return None
    dt, ds = np.diff(prog.time), np.diff(prog.step)
    ok = dt > 0
    if ok.sum() < 2:
        return None
    rate = ds[ok] / dt[ok]
    k = max(1, min(25, len(rate) // 50))
    # edge-padded so the ends are not dragged towards zero by the window
    padded = np.pad(rate, (k // 2, k - 1 - k // 2), mode="edge")
    smooth: FloatArray = np.convolve(padded, np.ones(k) / k, mode="valid")
    return Series("steps/s", prog.time[1:][ok], prog.step[1:][ok], smooth)


def plot_run(job: Job, markers: list[Marker], path: Path, title: str | None = None) -> None:
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    origin, div, xlabel = _axis(job)

    def x(t: FloatArray) -> FloatArray:
        return (t - origin) / div

    lower = job.series.get("gpu_util") or _rate(job)
    # a series recognised as ``loss``/``val_loss`` is also under its own name: draw it once
    unique = list({s.name: s for _, s in sorted(job.series.items())}.values())
    losses = [s for s in unique if "loss" in s.name.lower() and len(s)]
    if not losses:  # no loss: show whatever the job logged that is not its progress
        losses = [s for s in unique if s.name != "step" and len(s)][:4]

    fig = Figure(figsize=(11, 6.5 if lower is not None else 4.5), layout="constrained")
    axes: list[Any] = (list(fig.subplots(2, 1, sharex=True, height_ratios=[2.2, 1]))
                       if lower is not None else [fig.subplots()])
    top = axes[0]
    bad_x: list[float] = []
    finite_values: list[FloatArray] = []
    for s in losses:
        finite = np.isfinite(s.value)
        bad_x += x(s.time[~finite]).tolist()
        finite_values.append(s.value[finite])
        few = int(finite.sum()) < 3  # a lone point is invisible as a line
        top.plot(x(s.time[finite]), s.value[finite], lw=1, label=s.name,
                 marker="o" if few else None)
    values = np.concatenate(finite_values) if finite_values else np.empty(0)
    # Losses span decades (and a blow-up many more): log when all positive, else symlog
    # so a GAN's negative critic loss still shows.
    if len(values) and (values > 0).all():
        top.set_yscale("log")
        top.set_ylabel("value (log)")
    elif len(values) and np.ptp(values) > 1e3:
        top.set_yscale("symlog", linthresh=1.0)
        top.set_ylabel("value (symlog)")
    else:
        top.set_ylabel("value")
    trans = blended_transform_factory(top.transData, top.transAxes)
    if bad_x:  # NaN and inf cannot be drawn: mark where they were along the top edge
        bad_x = bad_x[:: max(1, len(bad_x) // 400)]  # a row of marks, not a solid bar
        top.scatter(bad_x, np.full(len(bad_x), 0.98), transform=trans, marker="x", s=12,
                    color="black", label="NaN/inf", zorder=3)
    if losses:
        top.legend(loc="best", fontsize=8)
    top.set_title(title or job.id, fontsize=10)
    top.grid(alpha=0.3)

    if lower is not None:
        ax = axes[1]
        ax.plot(x(lower.time), lower.value, lw=1, color="tab:green")
        ax.set_ylabel(lower.name)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(xlabel)
    first, last = first_record(job), job.last_time()
    if first is not None and last is not None and last > first:
        # the whole run, NaN stretches included: they are where the trouble is
        pad = 0.01 * (last - first) / div
        axes[-1].set_xlim((first - origin) / div - pad, (last - origin) / div + pad)

    # One line per onset; labels staggered so findings close in time stay readable.
    for i, m in enumerate(sorted(markers, key=lambda m: m.time)):
        mx = (m.time - origin) / div
        for ax in axes:
            ax.axvline(mx, color=_COLOUR[m.severity], lw=1.2, ls="--", alpha=0.8)
        top.text(mx, 0.92 - 0.08 * (i % 5), f" {m.label}", transform=trans, fontsize=8,
                 color=_COLOUR[m.severity], ha="left", va="top",
                 bbox={"facecolor": "white", "alpha": 0.7, "lw": 0, "pad": 1})
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
