"""``slowdown``: the job goes on, but well below its own recent speed, for a sustained stretch.

Anchors: NVRx straggler scores (per-rank section timings, 0-1), Falcon/Greyhound
(stragglers slowed jobs 1.34x on average on a 10,000-GPU cluster, lasting from under a
minute to ~10 h, arXiv 2410.12588). Neither prices what the slowdown costs.

Designed from the kind of failure. An evaluation or a checkpoint is a *pause*: short,
periodic, one long gap between two updates among many normal ones. A slowdown (a
straggler host, a throttled GPU, an input pipeline falling behind, a slow shared file
system) is *sustained*: every update comes late. So throughput is measured per block of
``block_seconds`` as the *median* of the block's per-update rates (steps per second
since the last progress record at least ``span_seconds`` before, or the job's own
``throughput`` series): one pause in a block does not move its median. The span is there
for runs that log a few records at one moment (Lightning's epoch-end metrics at step N,
its learning-rate monitor at N+1 two milliseconds later): one step in two milliseconds
is no speed, and blocks of such rates made a baseline of 500 steps/s for a run that does
3. A block is slow when its median is below ``fraction`` x
the baseline, the median of the job's healthy blocks in the last ``baseline_seconds``
before it (a rolling baseline follows a run that speeds up or drifts slowly); the
finding fires once slow blocks have lasted ``sustain_seconds`` with at least
``min_slow_updates`` updates, and clears when a block is back at speed.

Cost: the hours lost so far (the stretch x the share of speed lost) and, when the job
plans its steps, the extra hours to its planned end at the slow speed, times its price.
With per-host data (``Job.hosts``) it compares each host's change from its own baseline:
one host that moved unlike the others is named as the straggler; hosts that all moved
alike slowed together (throttling, the input pipeline, a shared file system).

Linear in a replay: the blocks seen are kept in ``ctx.state`` and only new records are
read at each tick; and as only a record of the next block can change what was judged, a
replay does not call the rule before that block begins (``checker.follow.STABLE_NOW``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.checker import cost
from trainguard.checker.follow import STABLE, STABLE_NOW
from trainguard.checker.model import Finding, Job, Series, Severity
from trainguard.checker.registry import register
from trainguard.checker.rules.base import Context, Rule, param


@dataclass
class SlowdownParams:
    fraction: float = param(0.6, "a block whose median throughput is below this x the "
                                 "baseline is slow")
    sustain_seconds: float = param(480.0, "slow blocks must last this long to fire")
    min_slow_updates: int = param(4, "progress updates needed inside the slow stretch")
    block_seconds: float = param(60.0, "throughput is measured per block of this many "
                                        "seconds (the median rate of its updates)")
    baseline_seconds: float = param(3600.0, "the baseline is the median of the healthy "
                                            "blocks in this much time before")
    min_baseline_blocks: int = param(5, "healthy blocks needed before a baseline is trusted")
    span_seconds: float = param(10.0, "a step rate is measured from the last update at "
                                      "least this long before: two records of one moment "
                                      "(an epoch's end and the next step's start) say "
                                      "nothing of speed")
    warmup_seconds: float = param(300.0, "progress in this much time after the first update "
                                         "(compile, warm-up) is not learnt from")
    metric: str = param("throughput", "a series of samples or tokens per second the job "
                                      "logs; used instead of the step rate when present")
    host_metrics: list[str] = param(
        ["throughput", "step_time", "gpu_util", "sm_clock"],
        "per-host series compared to name a straggler, the first one the hosts have")
    straggler_spread: float = param(
        0.25, "a host whose change differs from the other hosts' by more than this "
              "(log ratio, ~28 %) is the straggler")


@register
class Slowdown(Rule):
    name = "slowdown"
    Params = SlowdownParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        if job.clock == "step":
            return []  # no time axis: no speed
        p: SlowdownParams = self.params
        rated = job.series.get(ctx.policy.metrics.get(p.metric, p.metric))
        src = (rated if rated is not None and len(rated) >= 2
               else cost.progress(job, ctx.state))
        if src is None or len(src) < 2:
            return []
        kind = "rate" if src is rated else "steps"
        state = ctx.state if ctx.state is not None else {}
        scan = state.get("scan")
        if not isinstance(scan, _Scan) or not scan.extends(src, kind):
            scan = state["scan"] = _Scan(p, src, kind)
        scan.feed(src, job)
        fired = scan.fired()
        if ctx.state is not None and (not fired or not job.planned_steps
                                      or scan.kind != "steps"):
            # Only a record of the next block can change the blocks judged, and a cut holds
            # none before that block begins (the steps left to a planned end, priced
            # in a finding, change at every record).
            # (nor one from the warm-up, which is not read)
            ctx.state[STABLE] = {STABLE_NOW: max(scan.t0 + (scan.block + 1) * p.block_seconds,
                                                 scan.t0 + p.warmup_seconds)}
        if not fired:
            return []
        return [self._finding(job, ctx, scan, src)]

    def _finding(self, job: Job, ctx: Context, scan: _Scan, src: Series) -> Finding:
        base, slow = scan.baseline_rate, scan.stretch_rate()
        onset, last = scan.stretch_start, scan.stretch_end
        share = 1.0 - slow / base
        lost_h = (last - onset) * share / 3600.0
        to_end_h = 0.0
        if job.planned_steps and scan.kind == "steps" and scan.last is not None:
            # the steps left at the slow speed instead of the baseline's
            remaining = max(job.planned_steps - scan.last[1], 0.0)
            to_end_h = remaining * (1.0 / slow - 1.0 / base) / 3600.0
        rate = cost.hourly_cost(job, ctx.policy)
        extra = rate * (lost_h + to_end_h) if rate is not None else None
        who, host_ev = self._hosts(job, onset, last)
        unit = "steps/s" if scan.kind == "steps" else f"({src.name})"
        money = ""
        if rate is not None:
            money = (f"; ${rate * lost_h:,.2f} lost so far"
                     + (f", ${rate * to_end_h:,.2f} more by the planned end at this speed"
                        if to_end_h > 0 else ""))
        step = scan.stretch_step
        return Finding(
            job_id=job.id, rule=self.name, severity=Severity.WARNING,
            message=(f"throughput {slow:.3g} {unit}, {slow / base:.0%} of the job's own "
                     f"baseline {base:.3g}, for {(last - onset) / 60:.0f} min: {who}{money}"),
            started_at=onset, step=step,
            evidence={"kind": "slowdown", "baseline_rate": base, "slow_rate": slow,
                      "ratio": slow / base, "measured": scan.kind,
                      "slow_minutes": (last - onset) / 60.0,
                      "lost_hours": lost_h, "extra_hours_to_end": to_end_h,
                      "extra_usd": extra, **host_ev},
        )

    def _hosts(self, job: Job, onset: float, last: float) -> tuple[str, dict[str, Any]]:
        """Which host lags, or that all slowed together; from each host's change against
        its own level before the onset."""
        p: SlowdownParams = self.params
        for metric in p.host_metrics:
            by_host = job.host_series(metric)
            change = {h: c for h, s in by_host.items()
                      if (c := _change(s, onset - p.baseline_seconds, onset, last)) is not None}
            if len(change) < 2:
                continue
            ev: dict[str, Any] = {"host_metric": metric,
                                  "host_change": {h: math.exp(c) for h, c in change.items()}}
            # the host farthest from the others' median change
            dev = {h: abs(c - float(np.median([o for k, o in change.items() if k != h])))
                   for h, c in change.items()}
            worst = max(dev, key=lambda h: (dev[h], abs(change[h])))
            others = [c for h, c in change.items() if h != worst]
            alike = max(others) - min(others) <= p.straggler_spread
            if dev[worst] > p.straggler_spread and alike:
                ev["straggler"] = worst
                return (f"host {worst} is the straggler ({metric} x{math.exp(change[worst]):.2f} "
                        f"against x{math.exp(float(np.median(others))):.2f} on the other "
                        f"{len(others)})", ev)
            if max(change.values()) - min(change.values()) <= p.straggler_spread:
                ev["all_hosts"] = True
                return (f"all {len(change)} hosts slowed together ({metric}): throttling, "
                        "the input pipeline or a shared file system", ev)
            return f"the hosts' {metric} moved unevenly; no single straggler", ev
        return "no per-host data to tell a straggler from a slowdown of all hosts", {}


def _change(s: Series, lo: float, onset: float, last: float) -> float | None:
    """log(mean during [onset, last] / mean over [lo, onset)) of one host's series."""
    i, j = np.searchsorted(s.time, [lo, onset], side="left")
    k = np.searchsorted(s.time, last, side="right")  # none after ``last``: not yet seen then
    before, during = s.value[i:j], s.value[j:k]
    before, during = before[np.isfinite(before)], during[np.isfinite(during)]
    if not len(before) or not len(during):
        return None
    b, d = float(before.mean()), float(during.mean())
    return math.log(d / b) if b > 0 and d > 0 else None


class _Scan:
    """Blocks of throughput over one series, fed in time order; kept between ticks."""

    def __init__(self, p: SlowdownParams, src: Series, kind: str) -> None:
        self.p, self.kind = p, kind
        self.name, self.t0 = src.name, float(src.time[0])
        self.n = 0  # records read
        self.start = self.t0 + p.warmup_seconds  # progress before this is not read
        self.read_to = self.t0  # the time of the last record read
        self.last: tuple[float, float] | None = None  # (time, step) of the last update
        # the updates of the last ``span_seconds`` and the one before them, oldest first
        self.recent: deque[tuple[float, float]] = deque()
        self.block = 0  # index of the open block
        self.rates: list[float] = []  # the open block's per-update rates
        self.healthy: list[tuple[float, float]] = []  # (block start, median), recent
        self.baseline_rate = math.nan
        self.slow: list[tuple[float, float, int]] = []  # (block start, median, updates)
        self.stretch_start = self.stretch_end = math.nan
        self.stretch_step: float | None = None
        self._pending_step: float | None = None

    def extends(self, src: Series, kind: str) -> bool:
        return (kind == self.kind and src.name == self.name and len(src) >= self.n
                and len(src) > 0 and float(src.time[0]) == self.t0)

    def feed(self, src: Series, job: Job | None = None) -> None:
        """Reads the records new since the last feed. Where ``job``'s log says a process
        of the run began or ended between two records (``cost.last_mark``), the time
        between them is the job down, no slow progress (a run
        relaunched from its checkpoint the next evening went 1 epoch in 19.5 hours): a
        slow stretch of the process before ends there, and the new process has a warm-up
        and a baseline of its own."""
        n0 = self.n
        # plain floats: a record at a time, numpy's scalars cost more than the work
        t, v, st = (src.time[n0:].tolist(), src.value[n0:].tolist(),
                    src.step[n0:].tolist())
        span = self.p.span_seconds
        told = job if job is not None and (job.launches or job.finishes) else None
        for i in range(len(t)):
            ti = t[i]
            mark = cost.last_mark(told, self.read_to, ti) if told is not None else None
            if mark is not None:
                self._close()  # the last block of the process before, judged
                # a new process may run on other hosts or another batch size (a detector
                # relaunched at half its speed, a blind set's healthy run): its speed is
                # learnt afresh
                self.slow, self.healthy, self.baseline_rate = [], [], math.nan
                self.start = max(self.start, mark + self.p.warmup_seconds)
            self.read_to = ti
            if self.kind == "rate":
                rate = v[i]
                step = st[i] if math.isfinite(st[i]) else None
            else:
                si = v[i]
                prev, self.last = self.last, (ti, si)
                if prev is None or si < prev[1] or mark is not None:
                    self.recent.clear()
                    self.recent.append((ti, si))
                    # the first record, a resume, an epoch counter wrapping, a relaunch
                    continue
                if si == prev[1] or ti <= prev[0]:
                    self.last = prev  # no progress: the gap goes on
                    continue
                recent = self.recent
                recent.append((ti, si))
                while len(recent) > 2 and recent[1][0] <= ti - span:
                    recent.popleft()
                t_from, s_from = recent[0]
                if t_from > ti - span:
                    continue  # nothing far enough back yet
                rate, step = (si - s_from) / (ti - t_from), prev[1]
            if not math.isfinite(rate) or ti < self.start:
                continue
            block = int((ti - self.t0) // self.p.block_seconds)
            if block != self.block:
                self._close()
                self.block = block
            if not self.rates:
                self._pending_step = step
            self.rates.append(rate)
        self.n = n0 + len(t)

    def _close(self) -> None:
        """The open block is complete: judge it against the baseline, then learn from it."""
        if not self.rates:
            return
        p = self.p
        bstart = self.t0 + self.block * p.block_seconds
        med = statistics.median(self.rates)  # a few dozen: numpy's call costs more
        count = len(self.rates)
        self.rates = []
        if len(self.healthy) >= p.min_baseline_blocks and self.baseline_rate > 0 \
                and med < p.fraction * self.baseline_rate:
            if not self.slow:
                self.stretch_start, self.stretch_step = bstart, self._pending_step
            self.slow.append((bstart, med, count))
            self.stretch_end = bstart + p.block_seconds
            return  # slow blocks are not learnt: the baseline stays the job's own speed
        self.slow = []
        self.healthy.append((bstart, med))
        cut = bstart - p.baseline_seconds
        while self.healthy and self.healthy[0][0] < cut:
            self.healthy.pop(0)
        self.baseline_rate = statistics.median([m for _, m in self.healthy])

    def fired(self) -> bool:
        p = self.p
        return bool(self.slow) and self.stretch_end - self.stretch_start >= p.sustain_seconds \
            and sum(c for _, _, c in self.slow) >= p.min_slow_updates

    def stretch_rate(self) -> float:
        return statistics.median([m for _, m, _ in self.slow])
