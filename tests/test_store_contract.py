"""The store contract: every state store the runtimes can pick (the store registry,
``trainguard.lambdas.plugins.stores``: memory, SQLite, DynamoDB on moto in server mode,
Table Storage on Azurite, the ConfigMap on its recorded API server; the cases are in
``tests/contract/stores.py``) passes the same tests:

* the store itself: a memory round-trips whole, compare-and-set refuses a write (or a
  delete) over a memory another view changed, and writes nothing of that call; an audit
  record appended twice is logged once;
* the tick on it: the stop intent is in the store before the stop is made; a failure
  injected at every store call in turn (before the call, and after it succeeded), a
  second tick overlapping the first at every store call, a sink failing at every call,
  and a process dying between the intent and the stop.

Over every single fault the bar is: no job stopped twice, no stop lost, no alarm or
resolve lost, no stop unaudited (and none audited twice), each arriving at the latest
one tick after it would have without the fault.

``FakeSource`` (tests/test_tick.py) stands in for the provider: it is the boundary here
(each adapter's own stop is tested against its service's recorded API elsewhere). It
reports a stopped job as STOPPING on the next listing, as every provider does. The
ConfigMap's API server is a recording (no Kubernetes API server can run here).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.contract.stores import STORES, StoreCase, open_case, store_names
from tests.test_tick import RULES, FakeSource, make_job, policy, set_loss
from trainguard.checker.model import Action, Job
from trainguard.lambdas.state import (
    AuditAction,
    AuditRecord,
    JobMemory,
    StateConflict,
    StateStore,
    StateStoreError,
)
from trainguard.lambdas.tick import AlarmEvent, tick

T0 = 1_750_000_000.0
INTERVAL = 60.0
TICKS = 6
POLICY = policy(cap=5, persist=2, warning=Action.NOTIFY)
SINKS = ("pager", "chat")

Key = tuple[str, str, str]  # job id, alarm kind, rule


@pytest.fixture(params=store_names())
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], StoreCase]:
    """A new, empty backend of the store on each call."""
    return lambda: open_case(request.param, request, tmp_path)


def test_every_registered_store_has_a_case_and_every_case_a_store() -> None:
    assert store_names() == sorted(STORES)
    assert {"memory", "sqlite", "dynamodb", "table", "configmap"} <= set(store_names())


@dataclass
class Clock:
    tick: int = 0
    now: float = T0


class RecordingSink:
    """Records (tick, job, kind, rule) of each alarm taken; refuses call ``fail_at``
    (1-based), or every ``fail_every``-th call, like a webhook that is down."""

    def __init__(self, name: str, clock: Clock, fail_at: int | None = None,
                 fail_every: int | None = None) -> None:
        self.name, self.clock = name, clock
        self.fail_at, self.fail_every = fail_at, fail_every
        self.calls = 0
        self.got: list[tuple[int, str, str, str]] = []

    def send(self, event: AlarmEvent) -> None:
        self.calls += 1
        if self.calls == self.fail_at or (self.fail_every and self.calls % self.fail_every == 0):
            raise ConnectionError(f"{self.name}: connection refused (call {self.calls})")
        job_id = event.job_key.rsplit(":", 1)[-1]
        self.got.append((self.clock.tick, job_id, event.kind, event.memory.rule))


class Faulty:
    """A store whose call number ``at`` (1-based, counting load/save/delete/append) fails
    before or after doing its work; ``hook`` runs just before call ``hook_at``."""

    def __init__(self, inner: StateStore, at: int | None = None, mode: str = "before",
                 hook_at: int | None = None, hook: Callable[[], None] | None = None) -> None:
        self.inner, self.at, self.mode = inner, at, mode
        self.hook_at, self.hook = hook_at, hook
        self.calls = 0

    def _call(self, name: str, fn: Callable[[], Any]) -> Any:
        self.calls += 1
        n = self.calls
        if n == self.hook_at and self.hook is not None:
            self.hook()
        if n == self.at and self.mode == "before":
            raise StateStoreError(f"injected fault before {name} (store call {n})")
        out = fn()
        if n == self.at and self.mode == "after":
            raise StateStoreError(f"injected fault after {name} succeeded (store call {n})")
        return out

    def load_all(self) -> dict[str, JobMemory]:
        out: dict[str, JobMemory] = self._call("load_all", self.inner.load_all)
        return out

    def save(self, memories: list[JobMemory]) -> None:
        self._call("save", lambda: self.inner.save(memories))

    def delete(self, job_keys: list[str]) -> None:
        self._call("delete", lambda: self.inner.delete(job_keys))

    def append_audit(self, records: list[AuditRecord]) -> None:
        self._call("append_audit", lambda: self.inner.append_audit(records))

    def audit_log(self, job_key: str | None = None) -> list[AuditRecord]:
        return self.inner.audit_log(job_key)


@dataclass
class Run:
    calls: int = 0
    stops: list[tuple[int, str]] = field(default_factory=list)  # (tick, job id)
    alarms: dict[str, list[tuple[int, str, str, str]]] = field(default_factory=dict)
    audit: list[AuditRecord] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)


def scenario(new: Callable[[], StoreCase], at: int | None = None, mode: str = "before",
             overlap_at: int | None = None, sink_fail_at: int | None = None) -> Run:
    """Six ticks a minute apart over four jobs: ``stop`` (critical: stopped once the
    finding persisted two ticks), ``warn`` (a warning alarmed, clearing at tick 3),
    ``gone`` (a warning alarmed; the job is no longer listed from tick 2) and ``ok``."""
    clock, run, case = Clock(), Run(), new()
    jobs = {"stop": make_job("stop", 500.0), "warn": make_job("warn", 50.0),
            "gone": make_job("gone", 50.0), "ok": make_job("ok", 1.0)}

    def stopped(job: Job) -> None:
        run.stops.append((clock.tick, job.id))

    src = FakeSource("fake", list(jobs.values()), on_stop=stopped)
    sinks = [RecordingSink(SINKS[0], clock, fail_at=sink_fail_at),
             RecordingSink(SINKS[1], clock)]

    def overlapping() -> None:  # a second watchdog, a second later, on its own view
        try:
            tick([src], POLICY, case.open(), sinks, now=clock.now + 1, rules=RULES,
                 interval_s=INTERVAL)
        except StateStoreError as e:
            run.errors.append((clock.tick, f"overlapping tick: {e}"))

    view = case.open()
    store = Faulty(view, at, mode, overlap_at, overlapping)
    for t in range(TICKS):
        clock.tick, clock.now = t, T0 + INTERVAL * t
        if t == 2:
            src.jobs = [j for j in src.jobs if j.id != "gone"]
        if t == 3:
            set_loss(jobs["warn"], 1.0)
        try:
            tick([src], POLICY, store, sinks, now=clock.now, rules=RULES, interval_s=INTERVAL)
        except StateStoreError as e:
            run.errors.append((t, str(e)))
    run.calls = store.calls
    run.alarms = {s.name: s.got for s in sinks}
    run.audit = view.audit_log()
    return run


def first(entries: list[tuple[int, str, str, str]]) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for t, *key in entries:
        out.setdefault((key[0], key[1], key[2]), t)
    return out


def violations(clean: Run, run: Run) -> list[str]:
    """What the bar forbids, compared with the run without a fault."""
    out: list[str] = []
    counts = Counter(job for _, job in run.stops)
    out += [f"{job} stopped {n} times" for job, n in counts.items() if n > 1]
    clean_stops = {job: t for t, job in clean.stops}
    run_stops: dict[str, int] = {}
    for t, job in run.stops:
        run_stops.setdefault(job, t)
    for job, t in clean_stops.items():
        if job not in run_stops:
            out.append(f"stop of {job} lost")
        elif run_stops[job] > t + 1:
            out.append(f"stop of {job} at tick {run_stops[job]}, not by {t + 1}")
    out += [f"{job} stopped, not in the fault-free run" for job in run_stops
            if job not in clean_stops]
    audited = Counter(a.job_id for a in run.audit if a.action == AuditAction.STOP)
    for job in run_stops:
        if audited[job] != 1:
            out.append(f"stop of {job} audited {audited[job]} times")
    for sink, entries in clean.alarms.items():
        got = first(run.alarms.get(sink, []))
        for key, t in first(entries).items():
            if key not in got:
                out.append(f"{sink}: {key} lost")
            elif got[key] > t + 1:
                out.append(f"{sink}: {key} at tick {got[key]}, not by {t + 1}")
    return out


@pytest.fixture(scope="module")
def reference() -> Run:
    """The fault-free run on the memory store: what every store must do."""
    return scenario(lambda: STORES["memory"](None, Path()))  # type: ignore[arg-type]


def test_the_scenario_stops_alarms_and_resolves(reference: Run) -> None:
    assert reference.errors == []
    assert reference.stops == [(1, "stop")]
    expected = {("stop", "raise", "loss_above"): 0, ("warn", "raise", "loss_above"): 0,
                ("gone", "raise", "loss_above"): 0, ("stop", "resolve", "loss_above"): 2,
                ("gone", "resolve", "loss_above"): 2, ("warn", "resolve", "loss_above"): 3}
    for sink in SINKS:
        assert first(reference.alarms[sink]) == expected
        assert len(reference.alarms[sink]) == len(expected)  # each said once
    assert [a.action for a in reference.audit if a.job_id == "stop"] == [
        AuditAction.SKIP_PERSISTENCE, AuditAction.STOP]


def test_every_store_runs_the_scenario_as_the_memory_store(
        fresh: Callable[[], StoreCase], reference: Run) -> None:
    clean = scenario(fresh)
    assert clean.errors == []
    assert clean.stops == reference.stops
    assert {k: sorted(v) for k, v in clean.alarms.items()} == {
        k: sorted(v) for k, v in reference.alarms.items()}  # in a tick, in store order
    assert sorted((a.time, a.job_id, a.action) for a in clean.audit) == sorted(
        (a.time, a.job_id, a.action) for a in reference.audit)


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_fault_at_every_store_call_loses_and_doubles_nothing(
        fresh: Callable[[], StoreCase], reference: Run, mode: str) -> None:
    """``before``: the call fails and writes nothing; ``after``: it wrote, then failed
    (a timeout after the commit). One run per store call of the fault-free run."""
    points = scenario(fresh).calls
    assert points >= TICKS * 2
    failures: dict[int, list[str]] = {}
    for at in range(1, points + 1):
        run = scenario(fresh, at=at, mode=mode)
        assert run.errors, f"the fault at call {at} was not reported"
        found = violations(reference, run)
        if found:
            failures[at] = found
    assert not failures, f"{fresh().name}, fault {mode} the call: {failures}"


def test_two_overlapping_ticks_stop_each_job_once(fresh: Callable[[], StoreCase],
                                                  reference: Run) -> None:
    """A second tick runs whole just before each store call of the first, on its own
    view of the same store: between the first's load and its save, after its save and
    before its stops, during its alarms."""
    points = scenario(fresh).calls
    failures: dict[int, list[str]] = {}
    lost_races = 0
    for at in range(1, points + 1):
        run = scenario(fresh, overlap_at=at)
        lost_races += sum(1 for _, e in run.errors if "lost the race" in e)
        found = violations(reference, run)
        if found:
            failures[at] = found
    assert not failures, f"{fresh().name}, overlapping ticks: {failures}"
    assert lost_races > 0  # the race was run, and the loser said so


def test_a_sink_failing_at_each_call_hears_everything_next_tick(
        fresh: Callable[[], StoreCase], reference: Run) -> None:
    calls = len(reference.alarms[SINKS[0]])
    failures: dict[int, list[str]] = {}
    for at in range(1, calls + 1):
        run = scenario(fresh, sink_fail_at=at)
        found = violations(reference, run)
        healthy = Counter(run.alarms[SINKS[1]])
        found += [f"{SINKS[1]} heard {k} {n} times" for k, n in healthy.items() if n > 1]
        if found:
            failures[at] = found
    assert not failures, f"{fresh().name}, sink failing: {failures}"


def test_a_flaky_sink_gets_every_raise_and_every_resolve() -> None:
    """The issue's case: a sink failing every other call, ten alarms raised then resolved."""
    from trainguard.lambdas.state import MemoryStore

    clock = Clock()
    flaky = RecordingSink("flaky", clock, fail_every=2)
    jobs = [make_job(f"j{i}", 50.0) for i in range(10)]
    src, store = FakeSource("fake", jobs), MemoryStore()
    for t in range(8):
        clock.tick = t
        if t == 2:
            for job in jobs:
                set_loss(job, 1.0)
        tick([src], POLICY, store, [flaky], now=T0 + INTERVAL * t, rules=RULES)
    got = first(flaky.got)
    assert {k for k in got if k[1] == "raise"} == {(f"j{i}", "raise", "loss_above")
                                                   for i in range(10)}
    assert {k for k in got if k[1] == "resolve"} == {(f"j{i}", "resolve", "loss_above")
                                                     for i in range(10)}
    assert Counter((j, k) for _, j, k, _ in flaky.got).most_common(1)[0][1] == 1


def test_two_watchers_on_one_sqlite_file_at_once_stop_each_job_once(tmp_path: Path) -> None:
    """The issue's case, with real concurrency: two watchers (threads, each its own
    connection, each its own view of the provider, which has not yet shown the other's
    stops) tick at the same moment over 200 bad jobs, ten times over."""
    import threading

    from trainguard.lambdas.sqlite_state import SQLiteStore

    for trial in range(10):
        path = tmp_path / f"watch-{trial}.sqlite"
        sources = [FakeSource("fake", [make_job(f"j{i}", 500.0) for i in range(200)])
                   for _ in range(2)]
        start = threading.Barrier(2, timeout=60)  # a watcher that dies fails, never hangs
        lost: list[str] = []
        crashed: list[BaseException] = []

        def watcher(src: FakeSource, lost: list[str] = lost, path: Path = path,
                    start: threading.Barrier = start,
                    crashed: list[BaseException] = crashed) -> None:
            try:
                store = SQLiteStore(path)  # both open the new file at once
                start.wait()
            except BaseException as e:
                crashed.append(e)
                start.abort()
                return
            try:
                tick([src], policy(cap=200), store, [], now=T0, rules=RULES)
            except StateStoreError as e:
                lost.append(str(e))
            finally:
                store.close()

        threads = [threading.Thread(target=watcher, args=(s,)) for s in sources]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not crashed, f"trial {trial}: {crashed}"
        stops = Counter(job for s in sources for job in s.stops)
        assert len(stops) == 200 and max(stops.values()) == 1, f"trial {trial}"
        check = SQLiteStore(path)
        assert len([a for a in check.audit_log() if a.action == AuditAction.STOP]) == 200
        check.close()


def test_two_watchers_opening_one_new_sqlite_file_at_once_both_open(tmp_path: Path) -> None:
    """Switching a new file to WAL can answer "locked" without waiting; each watcher must
    still open the store (it happened under load in CI: one watcher died at start)."""
    import threading

    from trainguard.lambdas.sqlite_state import SQLiteStore

    for trial in range(20):
        path = tmp_path / f"new-{trial}.sqlite"
        start = threading.Barrier(4, timeout=60)
        errors: list[BaseException] = []

        def opener(path: Path = path, start: threading.Barrier = start,
                   errors: list[BaseException] = errors) -> None:
            try:
                start.wait()
                SQLiteStore(path).close()
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=opener) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        assert errors == [], f"trial {trial}: {errors}"


# --- the store itself ------------------------------------------------------------------


def _memory(key: str, t: float = T0) -> JobMemory:
    """A memory with every part filled in: findings, a stop intent, alarms and records
    still to say and log."""
    from trainguard.lambdas.state import FindingMemory, PendingAlarm, StopRecord

    fm = FindingMemory(f"{key}/loss_above", "loss_above", "critical", "loss 500 > 10 ✓",
                       t - 60, t, consecutive=2, stop_ticks=2, alarmed_at=t,
                       alarmed_severity="critical", last_decision="stop: persisted")
    record = AuditRecord(t, key, key.rsplit(":", 1)[-1], "fake", fm.key, fm.rule, "critical",
                         AuditAction.STOP, "loss 500 > 10", False)
    return JobMemory(key, "fake", key.rsplit(":", 1)[-1], t, findings={fm.key: fm},
                     stop=StopRecord(fm.key, "loss 500 > 10", t, attempts=1, attempt_at=t),
                     outbox=[PendingAlarm("raise", key, t, t - 60, 2, fm, sent=["pager"])],
                     audit_outbox=[record])


def test_a_memory_round_trips_whole(fresh: Callable[[], StoreCase]) -> None:
    """Read back through another view (another process): a long key too."""
    case = fresh()
    memories = [_memory("fake:fake:acct:a"), _memory("fake:fake:acct:" + "b" * 600)]
    case.open().save(memories)
    loaded = case.open().load_all()
    assert {k: m.to_dict() for k, m in loaded.items()} == {
        m.job_key: m.to_dict() for m in memories}


def test_compare_and_set_refuses_a_write_over_a_changed_memory(
        fresh: Callable[[], StoreCase]) -> None:
    """Two views (two ticks) read the same memories; the first writes one; the second's
    write of it, with another memory in the same call, is refused whole; so is its delete
    and its write of a memory the first created since. Read again, it may write."""
    case = fresh()
    first, second = case.open(), case.open()
    a, b = _memory("fake:fake:acct:a"), _memory("fake:fake:acct:b")
    first.load_all()
    first.save([a, b])
    second.load_all()
    first.load_all()
    a.last_seen = T0 + 60
    first.save([a])
    stale_a, new_c = _memory("fake:fake:acct:a", T0 + 120), _memory("fake:fake:acct:c")
    with pytest.raises(StateConflict):
        second.save([new_c, stale_a])
    with pytest.raises(StateConflict):
        second.delete(["fake:fake:acct:a"])
    check = case.open().load_all()
    assert set(check) == {"fake:fake:acct:a", "fake:fake:acct:b"}  # nothing of either call
    assert check["fake:fake:acct:a"].last_seen == T0 + 60
    first.save([new_c])  # created by the first: the second never read it
    with pytest.raises(StateConflict):
        second.save([_memory("fake:fake:acct:c", T0 + 180)])
    second.load_all()
    second.save([stale_a])
    second.delete(["fake:fake:acct:b"])
    check = case.open().load_all()
    assert set(check) == {"fake:fake:acct:a", "fake:fake:acct:c"}
    assert check["fake:fake:acct:a"].last_seen == T0 + 120


def test_an_audit_record_appended_twice_is_logged_once(fresh: Callable[[], StoreCase]) -> None:
    case = fresh()
    first, second = case.open(), case.open()
    records = [_memory(f"fake:fake:acct:{j}", T0 + i).audit_outbox[0]
               for i, j in enumerate("aba")]
    first.append_audit(records[:2])
    second.append_audit(records)  # a retry after a failure that came after the write
    second.append_audit(records[1:])
    log = case.open().audit_log()
    assert [r.id for r in log] == [r.id for r in records]  # oldest first, each once
    assert [r.to_dict() for r in case.open().audit_log("fake:fake:acct:a")] == [
        records[0].to_dict(), records[2].to_dict()]


# --- the tick on the store -------------------------------------------------------------


class Crash(BaseException):
    """The process dies (killed, out of memory): no ``except Exception`` catches it."""


def test_the_stop_intent_is_in_the_store_before_the_stop_is_made(
        fresh: Callable[[], StoreCase]) -> None:
    case = fresh()
    seen: list[JobMemory] = []

    def look(job: Job) -> None:  # at the provider's stop call: what another view reads
        seen.extend(m for m in case.open().load_all().values() if m.job_id == job.id)

    src = FakeSource("fake", [make_job("bad", 500.0)], on_stop=look)
    tick([src], policy(cap=1, persist=1), case.open(), [], now=T0, rules=RULES)
    assert src.stops == ["bad"]
    assert len(seen) == 1 and seen[0].stop is not None
    assert seen[0].stop.done_at is None and seen[0].stop.attempts == 1


@pytest.mark.parametrize("dies", ["before the provider took it", "after the provider took it"])
def test_a_process_dying_between_the_intent_and_the_stop_stops_once(
        fresh: Callable[[], StoreCase], dies: str) -> None:
    """The first watcher writes its intent, then dies in the stop call, before or after
    the provider took the stop. The next tick (a new process, its own view) stops the job
    if it was not stopped, never a second time, and logs the stop once."""
    case = fresh()
    job = make_job("bad", 500.0)
    taken: list[str] = []

    class Dying(FakeSource):
        def stop(self, job: Job, reason: str) -> None:
            if dies.startswith("after"):
                super().stop(job, reason)
            raise Crash("killed")

    first = Dying("fake", [job])
    with pytest.raises(Crash):
        tick([first], policy(), case.open(), [], now=T0, rules=RULES)
    taken += first.stops
    for t in (1, 2, 3):
        src = FakeSource("fake", [job])
        tick([src], policy(), case.open(), [], now=T0 + INTERVAL * t, rules=RULES)
        taken += src.stops
    assert taken == ["bad"]
    stops = [a for a in case.open().audit_log() if a.action == AuditAction.STOP]
    assert len(stops) == 1 and stops[0].job_id == "bad"
