"""A malformed job is one skipped job: the tick checks each job a source returns at the
boundary, reports the bad one with its reason, and judges and stops the others as usual.
Oversized ids fit every store (hashed past the store's key limit, the full key kept).

``FakeSource`` (tests/test_tick.py) is the boundary: a source that returns what a buggy
or compromised adapter might.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.contract.stores import STORES, StoreCase
from tests.test_tick import RULES, FakeSource, LossAbove, Sink, make_job, policy
from trainguard.checker.model import Finding, Job
from trainguard.checker.rules.base import Context
from trainguard.lambdas.state import AuditAction
from trainguard.lambdas.tick import CLOCK_KEY, MAX_ID_CHARS, invalid_job, tick

POISONS: dict[str, tuple[Callable[[Job], None], str]] = {
    "tags None": (lambda j: setattr(j, "tags", None), "tags: None"),
    "unknown state type": (lambda j: setattr(j, "state", "RUNNING"), "state: 'RUNNING'"),
    "state object": (lambda j: setattr(j, "state", object()), "state: <object"),
    "NaN start": (lambda j: setattr(j, "start_time", float("nan")), "start_time: nan"),
    "id None": (lambda j: setattr(j, "id", None), "id: None"),
    "huge id": (lambda j: setattr(j, "id", "x" * (MAX_ID_CHARS + 1)), "characters, over"),
    "series of text": (lambda j: setattr(j, "series", {"loss": "1,2,3"}), "series:"),
    "tag value not text": (lambda j: setattr(j, "tags", {"team": 7}), "tags:"),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_job_among_good_ones_is_skipped_and_the_good_ones_stopped(
        poison: str) -> None:
    make_bad, reason = POISONS[poison]
    good = [make_job(f"good{i}", 500.0) for i in range(5)]
    bad = make_job("bad", 500.0)
    make_bad(bad)
    src = FakeSource("fake", [good[0], good[1], bad, *good[2:]])
    sink = Sink()
    report = tick([src], policy(cap=10), _memory(), [sink], now=100.0, rules=RULES)
    assert sorted(src.stops) == [f"good{i}" for i in range(5)]
    assert len(report.findings) == 5 and len(sink.events) == 5
    ((ref, why),) = report.skipped.items()
    assert ref.startswith("fake: ") and reason in why
    assert any("skipped, malformed" in w for w in report.warnings)


def test_a_job_the_rules_choke_on_is_not_stopped_and_the_others_are() -> None:
    class Choking(LossAbove):
        def detect(self, job: Job, ctx: Context) -> list[Finding]:
            if job.id == "bad":
                raise ZeroDivisionError("float division by zero")
            return super().detect(job, ctx)

    src = FakeSource("fake", [make_job("bad", 500.0), make_job("good", 500.0)])
    report = tick([src], policy(cap=10), _memory(), [], now=100.0, rules=[Choking()])
    assert src.stops == ["good"]
    assert [f.job_id for f in report.findings] == ["good"]


def test_when_evaluate_itself_fails_the_job_at_fault_is_found_and_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``evaluate`` (account budgets, forecasts) raising on one job of the tick: the tick
    judges the jobs one by one and skips only that one."""
    import trainguard.lambdas.tick as tick_module
    from trainguard.checker.evaluate import evaluate

    def fragile(jobs: list[Job], *args: Any, **kw: Any) -> list[Finding]:
        if any(j.id == "bad" for j in jobs):
            raise OverflowError("math range error")
        return evaluate(jobs, *args, **kw)

    monkeypatch.setattr(tick_module, "evaluate", fragile)
    src = FakeSource("fake", [make_job("bad", 500.0), make_job("good", 500.0)])
    report = tick([src], policy(cap=10), _memory(), [], now=100.0, rules=RULES)
    assert src.stops == ["good"]
    assert "OverflowError: math range error" in report.skipped["fake: 'bad'"]


def test_a_well_formed_job_is_not_flagged() -> None:
    assert invalid_job(make_job("fine", 1.0, tags={"team": "nlp"})) is None


@pytest.fixture(params=sorted(STORES))
def store_case(request: pytest.FixtureRequest, tmp_path: Path) -> StoreCase:
    return STORES[request.param](request, tmp_path)


def test_an_id_past_every_stores_key_limit_is_remembered_and_stopped_once(
        store_case: StoreCase) -> None:
    """3,000 characters: over DynamoDB's 1,024-byte sort key, Table Storage's 1 KiB RowKey
    and a ConfigMap key's 253. Two of them share their first 2,000 characters."""
    ids = ["a" * 2000 + "-" + "b" * 999, "a" * 2000 + "-" + "c" * 999]
    src = FakeSource("fake", [make_job(i, 500.0) for i in ids])
    store = store_case.open()
    for t in range(3):
        tick([src], policy(cap=10, persist=2), store, [], now=100.0 + 60 * t, rules=RULES)
    assert sorted(src.stops) == sorted(ids)  # once each
    memories = store.load_all()
    memories.pop(CLOCK_KEY)
    assert sorted(m.job_id for m in memories.values()) == sorted(ids)  # full ids kept
    stops = [a.job_id for a in store.audit_log() if a.action == AuditAction.STOP]
    assert sorted(stops) == sorted(ids)


def _memory() -> Any:
    from trainguard.lambdas.state import MemoryStore

    return MemoryStore()
