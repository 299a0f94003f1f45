"""The shared tick's safety rules, one by one.

``FakeSource`` is the boundary here: it stands in for an adapter (SageMaker, Azure ML,
Kubeflow, local files) and records the stops asked of it. Findings come from a small
test-only rule (``LossAbove``: the last ``loss`` is above a limit) so each test controls
exactly when a job looks bad; one test runs the real ``divergence`` rule.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainguard.checker.model import Action, Finding, FloatArray, Job, JobState, Series, Severity
from trainguard.checker.policy import Policy, RuleConfig, Safety
from trainguard.checker.rules.base import Context, Rule, param
from trainguard.lambdas.sqlite_state import SQLiteStore
from trainguard.lambdas.state import AuditAction, MemoryStore, StateStore, StateStoreError
from trainguard.lambdas.tick import AlarmEvent, tick


@dataclass
class LossAboveParams:
    limit: float = param(10.0, "a last loss above this is bad")


class LossAbove(Rule):
    name = "loss_above"
    Params = LossAboveParams

    def detect(self, job: Job, ctx: Context) -> list[Finding]:
        loss = job.series.get("loss")
        if loss is None or not len(loss) or loss.value[-1] <= self.params.limit:
            return []
        sev = Severity.CRITICAL if loss.value[-1] > 100 else Severity.WARNING
        return [Finding(job.id, self.name, sev, f"loss {loss.value[-1]:g}",
                        started_at=float(loss.time[-1]), evidence={"kind": "high"})]


RULES: list[Rule] = [LossAbove()]


def arr(values: list[float] | list[int]) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


def make_job(job_id: str, loss: float, price: float = 10.0, **kw: Any) -> Job:
    return Job(id=job_id, provider="fake", scope="acct", hourly_price=price, start_time=0.0,
               series={"loss": Series("loss", arr([0.0, 1.0]), arr([0, 1]), arr([1.0, loss]))},
               **kw)


def set_loss(job: Job, loss: float) -> None:
    s = job.series["loss"]
    job.series["loss"] = Series("loss", s.time, s.step, arr([s.value[0], loss]))


@dataclass
class FakeSource:
    name: str
    jobs: list[Job]
    stops: list[str] = field(default_factory=list)
    fail_list: bool = False
    on_stop: Callable[[Job], None] | None = None

    def list_jobs(self, now: float) -> list[Job]:
        if self.fail_list:
            raise ConnectionError("provider API unreachable")
        return list(self.jobs)

    def stop(self, job: Job, reason: str) -> None:
        self.stops.append(job.id)
        if self.on_stop:
            self.on_stop(job)
        job.state = JobState.STOPPING


@dataclass
class Sink:
    events: list[AlarmEvent] = field(default_factory=list)

    def send(self, event: AlarmEvent) -> None:
        self.events.append(event)

    def kinds(self, job_id: str | None = None) -> list[str]:
        return [e.kind for e in self.events if job_id is None or e.job_key.endswith(f":{job_id}")]


def policy(dry_run: bool = False, cap: int = 1, persist: int = 1,
           warning: Action = Action.STOP) -> Policy:
    actions = {Severity.INFO: Action.NONE, Severity.WARNING: warning,
               Severity.CRITICAL: Action.STOP}
    return Policy(rules={"loss_above": RuleConfig(actions=actions)},
                  safety=Safety(dry_run=dry_run, max_stops_per_tick=cap, persist_ticks=persist))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore()
    else:
        s = SQLiteStore(tmp_path / "state.sqlite")
        yield s
        s.close()


def test_dry_run_never_stops_but_audits_would_stop_once(store: StateStore) -> None:
    src = FakeSource("fake", [make_job(f"j{i}", 500.0) for i in range(4)])
    pol = policy(dry_run=True, cap=10)
    for t in range(10):
        report = tick([src], pol, store, [], now=100.0 + 60 * t, rules=RULES)
        assert len(report.findings) == 4
    assert src.stops == []
    would = [a for a in store.audit_log() if a.action == AuditAction.WOULD_STOP]
    assert sorted(a.job_id for a in would) == ["j0", "j1", "j2", "j3"]
    assert all(a.dry_run for a in would)


def test_cap_holds_when_every_job_looks_bad_most_expensive_critical_first(
        store: StateStore) -> None:
    jobs = [make_job(f"j{i}", 500.0, price=float(i)) for i in range(6)]
    jobs.append(make_job("pricey-warning", 50.0, price=1000.0))  # warning, still a stop
    src = FakeSource("fake", jobs)
    order: list[list[str]] = []
    for t in range(8):
        before = len(src.stops)
        tick([src], policy(cap=2), store, [], now=100.0 + 60 * t, rules=RULES)
        order.append(src.stops[before:])
        assert len(src.stops) - before <= 2
    assert order[:4] == [["j5", "j4"], ["j3", "j2"], ["j1", "j0"], ["pricey-warning"]]
    skipped = {a.job_id for a in store.audit_log() if a.action == AuditAction.SKIP_CAP}
    assert skipped == {"j0", "j1", "j2", "j3", "pricey-warning"}


@pytest.mark.parametrize(("value", "stopped"), [("true", False), ("", False), ("yes", False),
                                                ("false", True), ("False", True)])
def test_protect_tag(store: StateStore, value: str, stopped: bool) -> None:
    job = make_job("j", 500.0, tags={"trainguard:protect": value})
    src = FakeSource("fake", [job])
    for t in range(5):
        tick([src], policy(cap=5), store, [], now=100.0 + 60 * t, rules=RULES)
    assert src.stops == (["j"] if stopped else [])
    protected = [a for a in store.audit_log() if a.action == AuditAction.SKIP_PROTECTED]
    assert len(protected) == (0 if stopped else 1)  # once, not once per tick


def test_persistence_needs_consecutive_ticks(store: StateStore) -> None:
    job = make_job("j", 500.0)
    src = FakeSource("fake", [job])
    pol = policy(persist=3)
    tick([src], pol, store, [], now=100.0, rules=RULES)
    tick([src], pol, store, [], now=160.0, rules=RULES)
    set_loss(job, 1.0)  # clears: the count starts again
    tick([src], pol, store, [], now=220.0, rules=RULES)
    set_loss(job, 500.0)
    tick([src], pol, store, [], now=280.0, rules=RULES)
    tick([src], pol, store, [], now=340.0, rules=RULES)
    assert src.stops == []
    tick([src], pol, store, [], now=400.0, rules=RULES)
    assert src.stops == ["j"]
    reasons = [a.reason for a in store.audit_log() if a.action == AuditAction.SKIP_PERSISTENCE]
    assert reasons == ["seen 1 of 3 ticks needed", "seen 2 of 3 ticks needed"] * 2


def test_dedup_one_raise_reminders_then_one_resolve(store: StateStore) -> None:
    job = make_job("j", 50.0)
    src = FakeSource("fake", [job])
    sink = Sink()
    pol = policy(warning=Action.NOTIFY)
    t0 = 1_000.0
    for i in range(100):  # 100 five-minute ticks: 8 h 15 min
        tick([src], pol, store, [sink], now=t0 + 300 * i, rules=RULES)
    assert sink.kinds() == ["raise", "remind"]  # the reminder 6 h after the raise
    assert sink.events[1].time == t0 + 6 * 3600
    assert sink.events[1].ticks == 73
    set_loss(job, 1.0)
    for i in range(100, 110):
        tick([src], pol, store, [sink], now=t0 + 300 * i, rules=RULES)
    assert sink.kinds() == ["raise", "remind", "resolve"]
    assert src.stops == []


class DownSink(Sink):
    """A sink that refuses the first ``down`` sends, like an Alertmanager restarting."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    def send(self, event: AlarmEvent) -> None:
        if self.down > 0:
            self.down -= 1
            raise ConnectionError("connection refused")
        super().send(event)


def test_an_undelivered_alarm_is_said_again_next_tick_not_hours_later(
        store: StateStore) -> None:
    job = make_job("j", 50.0)
    src = FakeSource("fake", [job])
    sink, other = DownSink(down=1), Sink()
    pol = policy(warning=Action.NOTIFY)
    report = tick([src], pol, store, [sink, other], now=1_000.0, rules=RULES)
    assert report.sink_errors and sink.events == []
    assert other.kinds() == ["raise"]
    tick([src], pol, store, [sink, other], now=1_300.0, rules=RULES)
    assert sink.kinds() == ["raise"]  # the next tick, not the 6-hour reminder
    assert other.kinds() == ["raise"]  # the sink that had it is not told twice
    tick([src], pol, store, [sink, other], now=1_600.0, rules=RULES)
    assert sink.kinds() == ["raise"]  # and then no more until the reminder


def test_info_findings_raise_no_alarm(store: StateStore) -> None:
    pol = policy(warning=Action.NONE)
    src = FakeSource("fake", [make_job("j", 50.0)])
    sink = Sink()
    for t in range(3):
        tick([src], pol, store, [sink], now=100.0 + 60 * t, rules=RULES)
    assert sink.events == []


def test_crash_between_intent_and_done_is_confirmed_not_stopped_twice(
        store: StateStore) -> None:
    job = make_job("j", 500.0)

    def crash(j: Job) -> None:
        # The process dies right after the provider accepted the stop.
        j.state = JobState.STOPPING
        raise SystemExit("killed mid-tick")

    src = FakeSource("fake", [job], on_stop=crash)
    with pytest.raises(SystemExit):
        tick([src], policy(), store, [], now=100.0, rules=RULES)
    assert src.stops == ["j"]
    src.on_stop = None
    for t in range(1, 5):  # a fresh process, same store
        tick([src], policy(), store, [], now=100.0 + 60 * t, rules=RULES)
    assert src.stops == ["j"]  # the provider says stopping: the intent is confirmed
    assert [(a.action, a.job_id) for a in store.audit_log()] == [(AuditAction.STOP, "j")]
    assert "confirmed: the job is STOPPING" in store.audit_log()[0].reason


def test_an_unconfirmed_stop_is_retried_next_tick(store: StateStore) -> None:
    """The process dies before the stop call reaches the provider: the intent is kept, and
    the next tick makes the stop (not "skip: an intent exists")."""
    job = make_job("j", 500.0)
    calls: list[str] = []

    def crash(_: Job) -> None:
        calls.append("crash")
        raise SystemExit("killed before the call")

    class Dying(FakeSource):
        def stop(self, job: Job, reason: str) -> None:
            if not calls:
                crash(job)
            super().stop(job, reason)

    src = Dying("fake", [job])
    with pytest.raises(SystemExit):
        tick([src], policy(), store, [], now=100.0, rules=RULES)
    assert src.stops == []
    tick([src], policy(), store, [], now=160.0, rules=RULES)
    assert src.stops == ["j"]
    tick([src], policy(), store, [], now=220.0, rules=RULES)
    assert src.stops == ["j"]
    assert [a.action for a in store.audit_log()] == [AuditAction.STOP]


def test_a_failing_stop_is_retried_then_given_up_with_an_alarm(store: StateStore) -> None:
    def refuse(_: Job) -> None:
        raise PermissionError("AccessDenied: not allowed to stop")

    class Refusing(FakeSource):
        def stop(self, job: Job, reason: str) -> None:
            self.stops.append(job.id)
            refuse(job)

    src = Refusing("fake", [make_job("j", 500.0)])
    sink = Sink()
    report = tick([src], policy(), store, [sink], now=100.0, rules=RULES)
    assert [a.action for a in report.audit] == [AuditAction.STOP_FAILED]
    assert "AccessDenied" in report.audit[0].reason
    for t in range(1, 6):
        tick([src], policy(), store, [sink], now=100.0 + 60 * t, rules=RULES)
    assert src.stops == ["j", "j", "j"]  # STOP_ATTEMPTS calls, then no more
    failed = [a for a in store.audit_log() if a.action == AuditAction.STOP_FAILED]
    assert len(failed) == 4 and "gave up" in failed[-1].reason
    gave_up = [e for e in sink.events if e.memory.rule == "stop_failed"]
    assert len(gave_up) == 1 and gave_up[0].kind == "raise"
    assert gave_up[0].memory.severity == "critical"
    assert "AccessDenied" in gave_up[0].memory.message


class BrokenStore(MemoryStore):
    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    def load_all(self) -> dict[str, Any]:
        if self.fail == "load":
            raise sqlite3.OperationalError("database is locked")
        return super().load_all()

    def save(self, memories: list[Any]) -> None:
        if self.fail == "save":
            raise TimeoutError("DynamoDB did not answer")
        super().save(memories)


@pytest.mark.parametrize("fail", ["load", "save"])
def test_store_down_raises_and_stops_nothing(fail: str) -> None:
    src = FakeSource("fake", [make_job("j", 500.0)])
    sink = Sink()
    with pytest.raises(StateStoreError, match=r"database is locked|DynamoDB did not answer"):
        tick([src], policy(), BrokenStore(fail), [sink], now=100.0, rules=RULES)
    assert src.stops == []
    assert sink.events == []


def test_failing_source_is_reported_and_others_proceed(store: StateStore) -> None:
    bad_job = make_job("b", 50.0)
    broken = FakeSource("broken", [bad_job])
    healthy = FakeSource("healthy", [make_job("h", 500.0)])
    sink = Sink()
    pol = policy(warning=Action.NOTIFY)
    tick([broken, healthy], pol, store, [sink], now=100.0, rules=RULES)
    assert sink.kinds("b") == ["raise"]
    broken.fail_list = True
    report = tick([broken, healthy], pol, store, [sink], now=160.0, rules=RULES)
    assert "provider API unreachable" in report.source_errors["broken"]
    assert report.jobs == {"healthy": 1}
    assert healthy.stops == ["h"]
    # Unknown is not fixed: the broken source's finding is not resolved while it is down.
    assert sink.kinds("b") == ["raise"]
    broken.fail_list = False
    broken.jobs = []  # back up, and the job is gone: now it resolves
    tick([broken, healthy], pol, store, [sink], now=220.0, rules=RULES)
    assert sink.kinds("b") == ["raise", "resolve"]


def test_jobs_already_stopping_are_not_stopped(store: StateStore) -> None:
    job = make_job("j", 500.0, state=JobState.STOPPING)

    class EveryState(LossAbove):
        states = frozenset(JobState)

    src = FakeSource("fake", [job])
    tick([src], policy(), store, [], now=100.0, rules=[EveryState()])
    assert src.stops == []
    assert [a.action for a in store.audit_log()] == [AuditAction.SKIP_STOPPING]


def test_real_divergence_rule_stops_a_nan_run(store: StateStore) -> None:
    from trainguard.checker.rules.divergence import Divergence

    steps = list(range(40))
    loss = [2.0 - 0.01 * s for s in steps[:36]] + [float("nan")] * 4
    job = Job(id="nan-run", provider="fake", instance_type="ml.p4d.24xlarge", start_time=0.0,
              series={"loss": Series("loss", arr(steps), arr(steps), arr(loss))})
    src = FakeSource("fake", [job, make_job("fine", 1.0)])
    pol = Policy(safety=Safety(dry_run=False, persist_ticks=1))
    pol.rules["divergence"] = RuleConfig(actions={Severity.CRITICAL: Action.STOP})
    report = tick([src], pol, store, [], now=50.0, rules=[Divergence()])
    assert src.stops == ["nan-run"]
    assert report.stops[0].rule == "divergence"


def test_warning_turning_critical_raises_again_and_persistence_counts_stop_ticks(
        store: StateStore) -> None:
    job = make_job("j", 50.0)  # warning: notify only
    src = FakeSource("fake", [job])
    sink = Sink()
    pol = policy(persist=2, warning=Action.NOTIFY)
    for t in range(3):
        tick([src], pol, store, [sink], now=100.0 + 60 * t, rules=RULES)
    set_loss(job, 500.0)  # the same finding, now critical: stop
    tick([src], pol, store, [sink], now=300.0, rules=RULES)
    assert src.stops == []  # three ticks seen, but only one of them asked for a stop
    tick([src], pol, store, [sink], now=360.0, rules=RULES)
    assert src.stops == ["j"]
    assert [(e.kind, e.memory.severity) for e in sink.events] == [
        ("raise", "warning"), ("raise", "critical")]
    assert [e.stopped for e in sink.events] == [False, False]


def test_a_deployment_without_stop_enabled_runs_any_policy_in_dry_run() -> None:
    from trainguard.config import effective_policy

    allows = policy(dry_run=False)
    assert effective_policy(allows, stop_enabled=False).safety.dry_run is True
    assert effective_policy(allows, stop_enabled=True).safety.dry_run is False
    assert allows.safety.dry_run is False  # the policy itself is left as it was
    assert effective_policy(policy(dry_run=True), stop_enabled=True).safety.dry_run is True


def test_duplicated_invocations_do_not_hurry_a_stop(store: StateStore) -> None:
    """persist_ticks counts time too: N ticks spanning N-1 intervals. The interval is
    learnt from the ticks (here a minute); invocations seconds apart count once."""
    job = make_job("j", 1.0)
    src = FakeSource("fake", [job])
    pol = policy(persist=3)
    for t in (0.0, 60.0, 120.0, 180.0):  # a healthy job: the schedule is learnt
        tick([src], pol, store, [], now=1_000.0 + t, rules=RULES)
    set_loss(job, 500.0)
    for t in (240.0, 241.0, 245.0, 300.0, 301.0):  # retried and duplicated invocations
        tick([src], pol, store, [], now=1_000.0 + t, rules=RULES)
        assert src.stops == [], f"stopped at {t} s"
    tick([src], pol, store, [], now=1_360.0, rules=RULES)
    assert src.stops == ["j"]


def test_a_given_interval_counts_from_the_first_tick(store: StateStore) -> None:
    src = FakeSource("fake", [make_job("j", 500.0)])
    pol = policy(persist=3)
    for t in (0.0, 1.0, 2.0, 60.0):
        tick([src], pol, store, [], now=1_000.0 + t, rules=RULES, interval_s=60.0)
    assert src.stops == []
    tick([src], pol, store, [], now=1_120.0, rules=RULES, interval_s=60.0)
    assert src.stops == ["j"]


def test_an_alarm_a_sink_refuses_for_a_day_is_dropped_and_said_so(store: StateStore) -> None:
    src = FakeSource("fake", [make_job("j", 50.0)])
    down = DownSink(down=10_000)
    pol = policy(warning=Action.NOTIFY)
    for hour in (0, 1, 23):
        report = tick([src], pol, store, [down], now=1_000.0 + 3600 * hour, rules=RULES)
        assert not any("dropped" in w for w in report.warnings)
    report = tick([src], pol, store, [down], now=1_000.0 + 3600 * 25, rules=RULES)
    dropped = [w for w in report.warnings if "dropped" in w]
    assert len(dropped) == 1 and "raise loss_above" in dropped[0] and "DownSink" in dropped[0]
