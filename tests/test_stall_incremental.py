"""``stall`` followed tick by tick (a replay) answers as judged afresh (``check``), and
reads each progress record once.

The cadence is learnt from the progress records up to the latest block boundary and
extended one record at a time after it; followed, that work is kept in ``ctx.state`` and
the rule is not called while its silence cannot reach the smallest threshold
(``checker.follow.STABLE_NOW``). The tests hold the followed answer equal to a fresh
check of the same cut on real runs of both shared corpora, as logged and with a stall,
a pause and a heartbeated checkpoint injected, with the default parameters and with
small blocks (so that the record-at-a-time path runs on short real runs too).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest

from trainguard.checker.evaluate import evaluate
from trainguard.checker.follow import Followers
from trainguard.checker.model import Finding, Job, JobState, Series
from trainguard.checker.policy import Policy, RuleConfig
from trainguard.checker.rules.base import Context
from trainguard.checker.rules.stall import Stall
from trainguard.replay import Cuts, record_times


def _seen(found: list[Finding]) -> list[tuple[object, ...]]:
    return sorted((f.key, f.severity.value, f.started_at, f.step, f.message,
                   sorted((k, repr(v)) for k, v in f.evidence.items())) for f in found)


def _ticks(job: Job, limit: int = 1_500) -> list[float]:
    """Every record time (at most ``limit``, evenly picked), the midpoints of the longest
    gaps, and a minute grid for three hours past the last record (a silence)."""
    rec = record_times(job)
    if len(rec) > limit:
        rec = rec[np.linspace(0, len(rec) - 1, limit).astype(int)]
    gaps = np.diff(rec)
    mids = (rec[:-1] + gaps / 2)[np.argsort(gaps)[-20:]] if len(gaps) else np.empty(0)
    tail = rec[-1] + np.arange(60.0, 3 * 3600.0, 60.0)
    return sorted(set(np.concatenate([rec, mids, tail]).tolist()))


def _follow_and_compare(job: Job, rule: Stall, policy: Policy) -> tuple[int, int, int]:
    """(ticks, rule runs, fired ticks compared) over ``_ticks``; every 7th tick and every
    tick with a finding compared with a fresh check of the same cut."""
    cuts, followers = Cuts(job), Followers()
    before: float | None = None
    fired = 0
    ticks = _ticks(job)
    for i, t in enumerate(ticks):
        cut = cuts(t)
        followers.changed = cuts.changed(before, t) if before is not None else None
        got = evaluate([cut], policy, t, rules=[rule], followers=followers)
        before = t
        if got or i % 7 == 0:
            fresh = job.until(t)
            want = rule.check(fresh, Context(now=t, policy=policy, jobs=[fresh]))
            assert _seen(got) == _seen(want), (job.id, t)
            fired += bool(got)
    return len(ticks), followers.runs, fired


@pytest.mark.parametrize("params", [{}, {"max_points": 24, "relearn_parts": 4}])
def test_followed_stall_answers_as_a_fresh_check_on_real_runs(
        curves_dir: Path, params: dict[str, int]) -> None:
    from trainguard.adapters.local import load_run
    from trainguard.bench.inject import inject
    from trainguard.bench.labels import read_labels

    runs = curves_dir.parent / "runs"
    if not (runs / "labels.csv").exists():
        pytest.skip(f"{runs}/labels.csv not found (the shared runs corpus)")
    rows = read_labels(runs / "labels.csv")[::3] + read_labels(curves_dir / "labels.csv")[::25]
    rule = Stall(params)
    policy = Policy(rules={"stall": RuleConfig(params=params)})
    jobs = fired = spared = 0
    for row in rows:
        job = load_run(row.path, definitions=list(row.metrics) or None, fmt=row.format)
        if job.clock == "step":
            continue
        job.state, job.end_time = JobState.RUNNING, None  # judged as it ran
        variants = [job]
        for kind in ("stall", "pause", "heartbeat_pause"):
            with contextlib.suppress(ValueError):  # too few records to inject into
                variants.append(inject(job, kind, seed=jobs).job)
        for v in variants:
            ticks, runs_, n = _follow_and_compare(v, rule, policy)
            jobs += 1
            fired += n
            spared += runs_ < ticks / 2
    assert jobs >= 20 and fired >= 20 and spared >= jobs // 2


def test_each_progress_record_is_read_once_when_followed() -> None:
    """A run of 20,000 records a second apart, judged at every record, then silent: the
    rule is called about once per min_seconds of the run, and it fires in the silence."""
    n = 20_000
    t = np.arange(n, dtype=np.float64)
    job = Job(id="steady", clock="elapsed", state=JobState.RUNNING, start_time=0.0,
              series={"step": Series("step", t, t, t)})
    rule = Stall()
    cuts, followers = Cuts(job), Followers()
    before: float | None = None
    found: list[Finding] = []
    for now in [*t.tolist(), n + 400.0, n + 1_000.0]:
        cut = cuts(now)
        followers.changed = cuts.changed(before, now) if before is not None else None
        found = evaluate([cut], Policy(), now, rules=[rule], followers=followers)
        before = now
    assert followers.runs <= n / rule.params.min_seconds + 5
    assert [f.rule for f in found] == ["stall"]
    state = next(iter(followers.by.values())).state
    assert state["cadence"].seen == n


def test_a_pause_the_job_came_back_from_after_the_learnt_prefix_is_still_learnt() -> None:
    """Past max_points the cadence comes from a prefix, but a pause in the records read
    after it still raises the threshold: the same pause again is no stall, a silence
    well beyond it is."""
    n = 3_000
    t = np.arange(n, dtype=np.float64) * 10.0
    t[2_900:] += 2_000.0  # a 2,000 s evaluation pause the job came back from
    job = Job(id="paused", clock="elapsed", state=JobState.RUNNING, start_time=0.0,
              series={"step": Series("step", t, np.arange(n, dtype=np.float64),
                                     np.arange(n, dtype=np.float64))})
    rule = Stall({"max_points": 1_000, "relearn_parts": 8})
    last = float(t[-1])

    def fired(now: float) -> bool:
        return bool(rule.check(job, Context(now=now, policy=Policy(), jobs=[job])))

    assert not fired(last + 2_050.0)  # as long as the pause it came back from
    assert fired(last + 1.5 * 2_010.0 + 60.0)  # past pause_factor x that pause
