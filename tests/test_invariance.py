"""Verdicts that do not hang on a run's units: the same findings, fired at the same
records, when a run's loss is in other units (x 1e-3, x 1e3) or its steps are counted
otherwise (logged every 7 optimiser steps instead of every one; a counter resumed at
100,000). A rule with a threshold in the units of one corpus fails here on the other's
runs: both corpora, every run of ``runs`` and every twentieth of ``curves``, replayed.

Loss units leave ``plateau`` out on purpose: a loss at chance level (ln K nats for K
classes) is a fact in nats, and x 1e3 is no longer it. So does the counter resumed at
100,000: a log that begins that far into training does not hold the run's start, and
``plateau`` does not call it *not learning* (``tests/test_rules_general.py``); the
steps x 7 alone hold ``plateau`` too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from tests.corpora import load, rows
from trainguard.checker.model import Job, Series
from trainguard.config import default_policy
from trainguard.replay import replay

Verdict = list[tuple[str, str, str, int]]


_AS_LOGGED: dict[tuple[str, tuple[str, ...]], Verdict] = {}  # each run's, worked out once


def _as_logged(job: Job, leave_out: tuple[str, ...]) -> Verdict:
    key = (job.id, leave_out)
    if key not in _AS_LOGGED:
        _AS_LOGGED[key] = _verdict(job, leave_out)
    return _AS_LOGGED[key]


def _verdict(job: Job, leave_out: tuple[str, ...] = ()) -> Verdict:
    """Per finding: rule, first and worst severity, and the record (its index among all
    the run's record times) at which it first fired."""
    times = np.unique(np.concatenate([s.time for s in job.series.values() if len(s)]))
    result = replay(job, default_policy())
    return sorted((h.rule, h.first.severity.value, h.worst.value,
                   int(times.searchsorted(h.first.time, "right")))
                  for h in result.histories if h.rule not in leave_out)


def _map(job: Job, value: Callable[[str, np.ndarray], np.ndarray],
         step: Callable[[np.ndarray], np.ndarray]) -> Job:
    """``job`` with each series' values and steps mapped; on a step clock the time is the
    step, mapped alike."""
    series = {}
    for name, s in job.series.items():
        t = step(s.time) if job.clock == "step" else s.time
        series[name] = Series(name, t, step(s.step), value(name, s.value))
    out = Job(**{**job.__dict__, "series": series})
    if job.clock == "step":  # and so is every other time of the run

        def at(t: float) -> float:
            return float(step(np.array([t]))[0])

        out.start_time = None if job.start_time is None else at(job.start_time)
        out.end_time = None if job.end_time is None else at(job.end_time)
        out.logs = [dataclasses.replace(line, time=at(line.time)) for line in job.logs]
        out.restart_times = [at(t) for t in job.restart_times]
    return out


def _losses(k: float) -> Callable[[str, np.ndarray], np.ndarray]:
    return lambda name, v: v * k if "loss" in name.lower() else v


def _same(name: str, v: np.ndarray) -> np.ndarray:
    return v


@pytest.mark.realdata
@pytest.mark.parametrize(("what", "value", "step", "leave_out"), [
    ("loss x 1e-3", _losses(1e-3), lambda s: s, ("plateau",)),
    ("loss x 1e3", _losses(1e3), lambda s: s, ("plateau",)),
    # logged every 7 optimiser steps
    ("steps x 7", _same, lambda s: s * 7.0, ()),
    # ... and resumed from a checkpoint at step 100,000
    ("steps x 7 from 100,000", _same, lambda s: s * 7.0 + 100_000.0, ("plateau",)),
], ids=["loss-x1e-3", "loss-x1e3", "steps-x7", "steps-x7-from-100000"])
def test_a_runs_verdict_does_not_hang_on_its_units(
        what: str, value: Callable[[str, np.ndarray], np.ndarray],
        step: Callable[[np.ndarray], np.ndarray], leave_out: tuple[str, ...]) -> None:
    differ, found = [], 0
    for root, row in rows():
        job = load(root, row)
        base = _as_logged(job, leave_out)
        found += len(base)
        if _verdict(_map(job, value, step), leave_out) != base:
            differ.append(row["run"])
    assert found > 25  # the runs gave findings of many kinds to hold equal, not silence
    assert not differ, f"{what} changed the verdict on {differ}"
