"""``rightsizing``: the job's peak GPU memory and use fit a cheaper instance type.

Anchor: none names a cheaper instance; SageMaker Debugger's LowGPUUtilization gives a
percentage. Here, once a long enough stretch is seen, the job's peak GPU memory (GB per
GPU) and its GPU use (p95, as compute: GPUs x use x the GPU's dense tensor TFLOPS) are
held against every instance type the price book prices in the job's own region (same
cloud): a candidate fits when its GPUs hold the peak with ``headroom``, it has as many
GPUs as the job uses, and, if its GPUs are slower, their compute kept at most
``max_util`` % busy covers what the job uses; the cheapest fit that saves
at least ``min_saving`` of the job's rate is named, with the dollars per hour and over
the remaining run. A job is never spread over more hosts than it runs on. GPUs the
per-GPU data shows unused (peak memory and use both below
``unused_percent``) are not counted as needed; without per-GPU data every GPU is.

A job whose type the book does not know (a Kubernetes node, an on-prem machine) is told
only how many of its GPUs the per-GPU data shows unused, priced per GPU-hour.

Info by default: a policy may raise it (``actions``). Memory from ``gpu_mem_used_gb``
when a source gives bytes (DCGM, ``trainguard.emit`` from
``torch.cuda.max_memory_allocated``), else ``gpu_mem`` (percent) x the type's GB per
GPU; the highest of the job's series and each host's and GPU's own. Linear in a replay:
peaks and a histogram of GPU use are kept in ``ctx.state``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.checker import cost
from trainguard.checker.model import Finding, Job, Series, Severity
from trainguard.checker.prices import DEFAULT_REGION, gpu_spec, lookup, priced_in, provider_of
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param


@dataclass
class RightsizingParams:
    min_window_seconds: float = param(
        7200.0, "GPU memory must have been watched this long before a type is named")
    headroom: float = param(1.25, "a candidate's GPUs must hold the peak memory x this")
    max_util: float = param(80.0, "the candidate's GPUs may be at most this busy (%) doing "
                                  "the job's work (p95 use x its compute)")
    min_saving: float = param(0.1, "name a type only if it saves this fraction of the rate")
    unused_percent: float = param(
        5.0, "a GPU whose peak memory and p95 use are below this % is unused (per-GPU data)")
    memory_metric: str = param("gpu_mem", "GPU memory used, percent of the GPU's memory")
    memory_gb_metric: str = param("gpu_mem_used_gb", "GPU memory used, GB per GPU")
    util_metric: str = param("gpu_util", "GPU utilisation, percent")


@register
class Rightsizing(Rule):
    name = "rightsizing"
    Params = RightsizingParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        p: RightsizingParams = self.params
        if job.clock == "step":
            return []
        state = ctx.state if ctx.state is not None else {}
        seen = _Peaks(state)
        spec = gpu_spec(job.instance_type or "")
        if spec is None or not job.instance_type:
            # no type to compare (a Kubernetes node, an on-prem machine): GPUs asked for
            # and never used are still money, per GPU-hour
            return self._unused_only(job, ctx, seen)
        gpus, model, gb, tflops = spec
        alias = ctx.policy.metrics.get
        pct = seen.peak(job, alias(p.memory_metric, p.memory_metric))
        abs_gb = seen.peak(job, alias(p.memory_gb_metric, p.memory_gb_metric))
        peak_gb = max(abs_gb.peak, pct.peak / 100.0 * gb)
        span = max(abs_gb.span, pct.span)
        if not math.isfinite(peak_gb) or peak_gb <= 0 or span < p.min_window_seconds:
            return []
        util = seen.p95(job, alias(p.util_metric, p.util_metric))
        if util is None:
            return []
        total = gpus * max(job.instance_count, 1)
        unused = seen.unused_gpus(job, p)
        needed = max(total - unused, 1)
        work = total * util / 100.0 * tflops  # TFLOPS the job keeps busy
        rate = cost.hourly_cost(job, ctx.policy)
        if rate is None:
            return []
        region = _region(job, ctx)
        best = None
        for cand in priced_in(region):
            if cand.instance_type.lower() == job.instance_type.lower():
                continue
            cs = gpu_spec(cand.instance_type)
            if cs is None or provider_of(cand.instance_type) != provider_of(job.instance_type):
                continue
            n = math.ceil(needed / cs[0])
            if n > max(job.instance_count, 1):
                continue  # never spread a job over more hosts than it runs on today
            price = ctx.policy.cost.prices.get(cand.instance_type, cand.usd_per_hour) * n
            if cs[2] < peak_gb * p.headroom:
                continue
            # a GPU at least as fast per used GPU keeps up; slower ones must have room
            if cs[3] < tflops and n * cs[0] * cs[3] * p.max_util / 100.0 < work:
                continue
            if price <= rate * (1.0 - p.min_saving) and (best is None or price < best[2]):
                best = (cand.instance_type, n, price, cs)
        if best is None:
            return []
        name, n, price, cs = best
        saving = rate - price
        end = cost.planned_end(job, ctx.now)
        left_h = max(end - ctx.now, 0.0) / 3600.0 if end is not None else None
        if left_h is not None and left_h <= 0:
            left_h = None  # at or past its planned end: nothing left to save on
        run_saving = saving * left_h if left_h is not None else None
        used = f"{peak_gb:.1f} GB of {gb:g} GB per GPU ({peak_gb / gb:.0%})"
        gpu_note = f", {unused} of {total} GPUs unused" if unused else ""
        rest = (f", ${run_saving:,.2f} over the remaining {left_h:.1f} h"
                if run_saving is not None else "")
        return [Finding(
            job_id=job.id, rule=self.name, severity=Severity.INFO,
            message=(f"peak GPU memory {used}, GPU use p95 {util:.0f} %{gpu_note} over "
                     f"{span / 3600:.1f} h on {job.instance_count} x {job.instance_type} "
                     f"({gpus} x {model}): {n} x {name} ({cs[0]} x {cs[1]}, {cs[2]:g} GB) "
                     f"in {region} "
                     f"fits with {p.headroom:g}x headroom at ${price:,.2f}/h instead of "
                     f"${rate:,.2f}/h: saves ${saving:,.2f}/h{rest}"),
            started_at=None, step=None,
            evidence={"kind": "oversized", "peak_gpu_mem_gb": peak_gb, "gpu_mem_gb": gb,
                      "p95_gpu_util": util, "unused_gpus": unused, "watched_hours": span / 3600,
                      "region": region, "suggested_type": name, "suggested_count": n,
                      "usd_per_hour_now": rate, "usd_per_hour_suggested": price,
                      "saving_usd_per_hour": saving, "saving_usd_remaining_run": run_saving},
        )]


    def _unused_only(self, job: Job, ctx: Context, seen: _Peaks) -> list[Finding]:
        """GPUs the per-GPU data shows unused over the window, priced per GPU-hour."""
        p: RightsizingParams = self.params
        unused = seen.unused_gpus(job, p)
        total = job.gpu_count or seen.gpus_seen(job, p)
        if not unused or seen.gpu_span < p.min_window_seconds or total <= unused:
            return []
        rate = cost.hourly_cost(job, ctx.policy)
        per_gpu = ctx.policy.cost.gpu_hour_usd or (rate / total if rate else None)
        saving = unused * per_gpu if per_gpu else None
        money = f": saves ${saving:,.2f}/h" if saving is not None else ""
        return [Finding(
            job_id=job.id, rule=self.name, severity=Severity.INFO,
            message=(f"{unused} of {total} GPUs unused over {seen.gpu_span / 3600:.1f} h "
                     f"(peak memory and p95 use under {p.unused_percent:g} %): ask for "
                     f"{total - unused}{money}"),
            started_at=None, step=None,
            evidence={"kind": "unused_gpus", "unused_gpus": unused, "gpus": total,
                      "watched_hours": seen.gpu_span / 3600,
                      "saving_usd_per_hour": saving},
        )]


def _region(job: Job, ctx: Context) -> str:
    """Where the job is priced: the policy's region, else the region its price came from."""
    found = lookup(job.instance_type or "", ctx.policy.cost.region)
    if found is not None:
        return found.region
    return ctx.policy.cost.region or DEFAULT_REGION.get(provider_of(job.instance_type or "")
                                                        or "", "")


@dataclass
class _Peak:
    peak: float = -math.inf
    span: float = 0.0


class _Peaks:
    """Running peaks and GPU-use histograms of a job's series (the job's, each host's and
    each GPU's), kept in ``ctx.state`` so a replay reads each record once."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.gpu_span = 0.0  # the longest per-GPU series ``unused_gpus`` read

    def _series(self, job: Job, name: str) -> list[tuple[str, Series]]:
        out = []
        s = job.series.get(name)
        if s is not None and len(s):
            out.append(("", s))
        for host, by in sorted(job.hosts.items()):
            for k, hs in by.items():
                if (k == name or k.startswith(name + "/gpu")) and len(hs):
                    out.append((f"{host}:{k}", hs))
        return out

    def _fold(self, key: str, s: Series) -> dict[str, Any]:
        """This series' running max and histogram (1 % bins), extended with its new records."""
        st = self.state.get(key)
        if not st or st["n"] > len(s) or st["t0"] != float(s.time[0]):
            st = self.state[key] = {"n": 0, "t0": float(s.time[0]), "max": -math.inf,
                                    "hist": np.zeros(102, dtype=np.int64)}
        new = s.value[st["n"]:]
        new = new[np.isfinite(new)]
        if len(new):
            st["max"] = max(st["max"], float(new.max()))
            st["hist"] += np.bincount(np.clip(new, 0, 101).astype(np.int64), minlength=102)
        st["n"] = len(s)
        st["span"] = float(s.time[-1] - s.time[0])
        return st

    def peak(self, job: Job, name: str) -> _Peak:
        out = _Peak()
        for where, s in self._series(job, name):
            st = self._fold(f"{name}|{where}", s)
            out.peak, out.span = max(out.peak, st["max"]), max(out.span, st["span"])
        return out

    def p95(self, job: Job, name: str) -> float | None:
        """p95 of the job's own utilisation series (1 % resolution)."""
        s = job.series.get(name)
        if s is None or not len(s):
            return None
        hist = self._fold(f"{name}|", s)["hist"]
        if not hist.sum():
            return None
        return float(np.searchsorted(np.cumsum(hist), 0.95 * hist.sum()))

    def gpus_seen(self, job: Job, p: RightsizingParams) -> int:
        """GPUs with their own memory series."""
        return sum(1 for by in job.hosts.values() for k in by
                   if k.startswith(p.memory_metric + "/gpu"))

    def unused_gpus(self, job: Job, p: RightsizingParams) -> int:
        """GPUs whose per-GPU series show them unused: peak memory and p95 use below
        ``unused_percent``. Without per-GPU series, none."""
        unused = 0
        for host, by in job.hosts.items():
            gpus = {k.split("/gpu", 1)[1] for k in by if "/gpu" in k}
            for g in sorted(gpus):
                mem, use = by.get(f"{p.memory_metric}/gpu{g}"), by.get(f"{p.util_metric}/gpu{g}")
                if mem is None or use is None or not len(mem) or not len(use):
                    continue
                m = self._fold(f"{p.memory_metric}|{host}:{p.memory_metric}/gpu{g}", mem)
                self.gpu_span = max(self.gpu_span, m["span"])
                u = self._fold(f"{p.util_metric}|{host}:{p.util_metric}/gpu{g}", use)["hist"]
                p95 = float(np.searchsorted(np.cumsum(u), 0.95 * u.sum())) if u.sum() else 0.0
                if m["max"] < p.unused_percent and p95 < p.unused_percent:
                    unused += 1
        return unused
