"""A replay that skips the ticks at which no rule has anything new to read
(``checker.skip``) gives exactly what judging every tick gives: every finding's first
fire, escalations, last sighting, message, evidence and money, and the findings at the
last tick. Held so on both real corpora and on built runs with everything that changes a
job between ticks besides its records: restarts, log lines (in time order and not), an
end, a resume from a checkpoint, per-host series, and silences that only the clock sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from tests.corpora import load, rows
from trainguard.checker.follow import STABLE, Band
from trainguard.checker.model import Finding, Job, JobState, LogLine, Series, Severity
from trainguard.checker.rules.base import Context, Rule
from trainguard.config import default_policy
from trainguard.replay import ReplayResult, first_record, logging_interval, replay


def _said(r: ReplayResult) -> list[Any]:
    """Everything a replay reports about its findings."""
    hist = [(h.key, h.rule, h.first, h.last_seen, h.escalations, h.savings,
             h.finding.severity, h.finding.message, repr(h.finding.evidence),
             h.finding.burnt_usd, h.finding.projected_usd, h.finding.action)
            for h in r.histories]
    final = [(f.key, f.severity, f.message, repr(f.evidence), f.burnt_usd, f.action)
             for f in r.final]
    return [hist, final, r.ticks, r.rule_runs]  # as many rule runs: none skipped


def _both(job: Job, tick: float | None) -> tuple[ReplayResult, ReplayResult]:
    policy = default_policy()
    return replay(job, policy, tick), replay(job, policy, tick, skip=False)


def _built(clock: str = "elapsed", ordered_logs: bool = True, hosts: bool = False,
           resume: bool = True) -> Job:
    """A run logging its loss every 10 s (a validation loss every 500 s) that goes quiet
    for two hours and resumes from a checkpoint (its step goes back), later hangs for 90
    minutes and goes on, is restarted twice, writes log lines with an OOM among them, and
    ends with NaN."""
    rng = np.random.default_rng(3)
    t = np.concatenate([np.arange(0.0, 6_000.0, 10.0),  # then down for two hours
                        np.arange(13_200.0, 17_000.0, 10.0),  # then hung for 90 minutes
                        np.arange(22_400.0, 29_000.0, 10.0)])
    step = np.arange(len(t), dtype=np.float64)
    if resume:  # back to a checkpoint 200 steps earlier
        step[600:] -= 200
    loss = 2 + 6 / (1 + step / 100) + 0.05 * rng.standard_normal(len(t))
    loss[-150:] *= np.linspace(1, 30, 150)
    loss[-20:] = np.nan
    val = np.arange(0, len(t), 50)
    job = Job(id="built", clock=clock, state=JobState.FAILED,  # type: ignore[arg-type]
              start_time=0.0, end_time=float(t[-1]), restart_times=[3_000.0, 15_000.0],
              restarts=2, instance_type="ml.p4d.24xlarge", gpus_per_instance=8)
    job.series = {"step": Series("step", t, step, step),
                  "loss": Series("loss", t, step, loss),
                  "val_loss": Series("val_loss", t[val], step[val], loss[val] + 0.2)}
    lines = [LogLine(float(x), f"step {i} loss {loss[i]:.3f}") for i, x in enumerate(t[::25])]
    lines.insert(40, LogLine(float(t[1_000]), "torch.OutOfMemoryError: CUDA out of memory"))
    job.logs = lines if ordered_logs else lines[::-1]
    if hosts:
        util = 90 + 5 * rng.standard_normal(len(t))
        job.hosts = {h: {"gpu_util": Series("gpu_util", t, step, util - 40 * k)}
                     for k, h in enumerate(("algo-1", "algo-2"))}
    return job


@pytest.mark.parametrize("ordered_logs", [True, False])
@pytest.mark.parametrize("clock", ["elapsed", "step"])
def test_skipping_changes_nothing_on_a_run_with_every_kind_of_change(
        clock: str, ordered_logs: bool) -> None:
    job = _built(clock, ordered_logs)
    tick = 10.0 if clock == "elapsed" else 1.0  # one tick per record
    fast, slow = _both(job, tick)
    assert _said(fast) == _said(slow)
    rules = {h.rule for h in fast.histories}
    assert "divergence" in rules and "logs" in rules  # what the run was built to show
    if clock == "elapsed":
        assert "stall" in rules
    assert slow.judged == slow.ticks
    # on a time axis ``slowdown`` is judged as each 60 s block begins (every 6th record
    # here), and the tick before it too; on a step clock only records out of the ordinary
    # and the validation losses are
    assert fast.judged < fast.ticks * (0.6 if clock == "elapsed" else 0.2)


def test_per_host_series_are_never_skipped_over() -> None:
    """A follower does not note reads of per-host series, so none of their ticks is
    skipped: the same findings, every tick judged."""
    fast, slow = _both(_built(hosts=True), 10.0)
    assert _said(fast) == _said(slow)
    assert fast.judged == fast.ticks


def test_the_default_schedule_and_its_timing_back_are_unchanged() -> None:
    fast, slow = _both(_built(), None)
    assert _said(fast) == _said(slow) and fast.timed_back


def test_skipping_changes_nothing_on_the_real_corpora() -> None:
    """Every run of ``runs`` and every twentieth of ``curves``, at one tick per logging
    interval (given, so fires stay at their ticks; at most 5,000 ticks a run: judging
    every tick of the longest run takes a minute) and on the default schedule."""
    compared = skipped = 0
    for root, row in rows():
        job = load(root, row)
        every, first, last = logging_interval(job), first_record(job), job.last_time()
        if every and first is not None and last is not None:
            every = max(every, (last - first) / 5_000)
        for tick in ([every] if every else []) + [None]:
            fast, slow = _both(job, tick)
            assert _said(fast) == _said(slow), (row["run"], tick)
            compared += 1
            skipped += fast.ticks - fast.judged
    assert compared > 100 and skipped > 0


class _Counting(Rule):
    """A rule whose message counts its own runs (its state), and whose findings it says
    stand while the series ``a`` (read) and ``b`` (never read) stay within [0, 1]: a
    replay must run it at the same ticks whether it skips quiet ticks or not."""

    name = "counting"

    @dataclass
    class Params:
        pass

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        assert ctx.state is not None
        ctx.state["runs"] = ctx.state.get("runs", 0) + 1
        a = job.series["a"]
        ctx.state[STABLE] = {"a": Band(math.inf, 0.0, 1.0), "b": Band(math.inf, 0.0, 1.0)}
        return [Finding(job.id, self.name, Severity.WARNING, f"run {ctx.state['runs']}",
                        started_at=float(a.time[0]), evidence={"kind": "count"})]


def test_a_band_on_a_series_the_rule_does_not_read_is_kept_alike() -> None:
    """The skipping's band bookkeeping for a rule that bands a series it does not read
    (no rule of the default policy does): the same runs, at the same ticks, both ways."""
    t = np.arange(0.0, 2_000.0, 10.0)
    a = np.full(len(t), 0.5)
    a[120] = 3.0  # one record of ``a`` out of its band
    b = np.full(len(t), 0.5)
    b[60:70] = 2.0  # ten records of ``b`` out of its band
    job = Job(id="banded", clock="elapsed", start_time=0.0,
              series={"a": Series("a", t, t, a), "b": Series("b", t, t, b)})
    fast = replay(job, default_policy(), 10.0, rules=[_Counting()])
    slow = replay(job, default_policy(), 10.0, rules=[_Counting()], skip=False)
    assert _said(fast) == _said(slow)
    assert fast.judged < fast.ticks
    (h,) = fast.histories
    assert h.finding.message == "run 12"  # once, then at each record out of a band
