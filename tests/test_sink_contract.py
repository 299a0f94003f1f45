"""The sink contract: every sink the runtimes can pick (the sink registry,
``trainguard.lambdas.plugins.sinks``; what stands behind each is in
``tests/contract/sinks.py``) behaves the same way for the user:

* delivered: a critical finding raised by the tick reaches the endpoint;
* refused: while the endpoint answers an error, the tick (an alarm sink) or the publish
  (a metrics sink) reports it, naming the sink or the endpoint, and nothing is lost;
* said again: at the next tick after the refusal, the finding reaches the endpoint;
* resolve delivered: when the finding clears, the endpoint says it is resolved.

``FakeSource`` (tests/test_tick.py) stands in for the provider (its adapters are tested
against their services elsewhere); the ticks run on the memory store (the stores have
their own contract, tests/test_store_contract.py) at the wall clock's time, since
Alertmanager ends alerts by the real clock.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.contract.sinks import SINKS, SinkCase, open_case, sink_names
from tests.test_tick import RULES, FakeSource, make_job, policy, set_loss
from trainguard.checker.model import Action, Severity
from trainguard.lambdas.state import MemoryStore
from trainguard.lambdas.tick import TickReport, tick

RULE = "loss_above"
POLICY = policy(dry_run=True, warning=Action.NOTIFY)


@pytest.fixture(params=sink_names())
def case(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    return open_case(request.param, request, tmp_path)


class Watch:
    """Ticks over one job on one store, handing the case's sink what it takes."""

    def __init__(self, case: SinkCase) -> None:
        self.case, self.store = case, MemoryStore()
        self.job = make_job("bad", 500.0)  # critical for loss_above
        self.src = FakeSource("fake", [self.job])
        # ticks a minute apart, ending before the wall clock's now: Alertmanager takes
        # an alert's end only once it is past
        self.now = time.time() - 600.0

    def tick(self) -> tuple[TickReport, list[str]]:
        """One tick; the problems it reported (an alarm sink's, or the publish's)."""
        self.now += 60.0
        sinks = [self.case.alarm] if self.case.alarm is not None else []
        report = tick([self.src], POLICY, self.store, sinks, now=self.now, rules=RULES)
        problems = list(report.sink_errors)
        if self.case.publish is not None:
            try:
                self.case.publish(report, list(self.src.jobs))
            except Exception as e:
                problems.append(f"{type(e).__name__}: {e}")
        return report, problems


def test_every_registered_sink_has_a_case_and_every_case_a_sink() -> None:
    assert sink_names() == sorted(SINKS)
    assert {"sns", "cloudwatch", "webhook", "azure_metrics", "alertmanager",
            "pushgateway", "console", "emf"} <= set(sink_names())


def test_delivered_then_resolve_delivered(case: SinkCase) -> None:
    watch = Watch(case)
    report, problems = watch.tick()
    assert [f.severity.value for f in report.findings] == ["critical"]
    assert problems == []
    assert case.said() == {RULE: "firing"}
    set_loss(watch.job, 1.0)
    _, problems = watch.tick()
    assert problems == []
    assert case.said() == {RULE: "resolved"}


def test_refused_then_said_again_next_tick(case: SinkCase) -> None:
    watch = Watch(case)
    case.down(True)
    _, problems = watch.tick()
    assert len(problems) == 1, problems
    assert any(w in problems[0] for w in ("503", "NotFound", "ServiceUnavailable",
                                          "service unavailable", "Input/output")), problems[0]
    assert case.said() == {}  # nothing reached it
    case.down(False)
    _, problems = watch.tick()
    assert problems == []
    assert case.said() == {RULE: "firing"}
    set_loss(watch.job, 1.0)
    _, problems = watch.tick()
    assert problems == [] and case.said() == {RULE: "resolved"}


def test_a_refused_resolve_is_said_next_tick(case: SinkCase) -> None:
    """(The Azure custom metric failed this before it said every watched pair each tick.)"""
    watch = Watch(case)
    watch.tick()
    assert case.said() == {RULE: "firing"}
    set_loss(watch.job, 1.0)
    case.down(True)
    _, problems = watch.tick()
    assert len(problems) == 1, problems
    assert case.said() == {RULE: "firing"}  # the endpoint still holds the alarm
    case.down(False)
    _, problems = watch.tick()
    assert problems == [] and case.said() == {RULE: "resolved"}


def test_the_azure_metric_watches_every_pair_the_policy_acts_on() -> None:
    """What the Function passes as ``watched``: a disabled rule, and a severity a rule
    does nothing on, are not said; every other pair is, at 0 when none is open."""
    from trainguard.checker.policy import Policy, RuleConfig
    from trainguard.checker.registry import rule_names
    from trainguard.lambdas.azure.sinks import acted_pairs, metric_document

    quiet = {Severity.WARNING: Action.NONE, Severity.CRITICAL: Action.NOTIFY}
    chosen = Policy(rules={"stall": RuleConfig(enabled=False),
                           "plateau": RuleConfig(actions=quiet)})
    pairs = acted_pairs(chosen)
    assert ("stall", "critical") not in pairs and ("stall", "warning") not in pairs
    assert ("plateau", "critical") in pairs and ("plateau", "warning") not in pairs
    others = set(rule_names()) - {"stall", "plateau"}  # default actions: notify on both
    assert {p for p in pairs if p[0] in others} == {
        (r, s) for r in others for s in ("critical", "warning")}
    doc = metric_document(TickReport(time=time.time()), pairs)
    assert doc is not None
    series = doc["data"]["baseData"]["series"]
    assert sorted(tuple(s["dimValues"]) for s in series) == sorted(pairs)
    assert all(s["max"] == 0 for s in series)


def test_the_console_keeps_for_the_summary_only_what_it_printed(tmp_path: Path) -> None:
    """The local watch's summary is built from ``ConsoleSink.events``: an alarm the
    terminal refused and the next tick said again is one event, not two."""
    case = open_case("console", None, tmp_path)  # type: ignore[arg-type]
    watch = Watch(case)
    case.down(True)
    watch.tick()
    case.down(False)
    watch.tick()
    assert case.said() == {RULE: "firing"}
    assert [e.kind for e in case.alarm.events] == ["raise"]  # type: ignore[union-attr]
