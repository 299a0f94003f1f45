"""The alarm message a person reads, for the events a real tick sends.

Events come from ``lambdas.tick.tick`` over the test-only ``FakeSource`` / ``LossAbove`` rule
of tests/test_tick.py, so every "what the watchdog did" line matches a real decision.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.test_tick import RULES, FakeSource, Sink, make_job, policy
from trainguard.checker.model import Action, Finding, Job, Severity
from trainguard.lambdas.message import SUBJECT_MAX, Message, render
from trainguard.lambdas.state import FindingMemory, MemoryStore
from trainguard.lambdas.tick import AlarmEvent, tick

URL = "https://console.aws.amazon.com/sagemaker/home?region=eu-west-1#/jobs/bert-big"


def run_ticks(jobs: list[Job], ticks: int = 1, **pol: Any) -> tuple[Sink, FakeSource]:
    src = FakeSource("fake", jobs)
    sink = Sink()
    store = MemoryStore()
    p = policy(**pol)
    for t in range(ticks):
        tick([src], p, store, [sink], now=100.0 + 60 * t, rules=RULES)
    return sink, src


def raised(sink: Sink, job_id: str) -> AlarmEvent:
    events = [e for e in sink.events if e.kind == "raise" and e.job_key.endswith(job_id)]
    assert events, f"no raise for {job_id}"
    return events[-1]


def test_message_names_job_problem_evidence_money_link_and_real_stop() -> None:
    job = make_job("bert-big", 500.0, name="bert-big", console_url=URL,
                   instance_type="ml.p4d.24xlarge", instance_count=2)
    sink, src = run_ticks([job])
    assert src.stops == ["bert-big"]
    msg = render(raised(sink, "bert-big"), dry_run=False)
    assert msg.subject == "[trainguard] CRITICAL: loss_above on bert-big"
    assert "loss 500" in msg.text
    assert "2 x ml.p4d.24xlarge" in msg.text
    assert f"Console: {URL}" in msg.text
    assert "STOPPED the job" in msg.text
    assert msg.fields["console_url"] == URL
    assert msg.fields["severity"] == "critical"
    assert msg.fields["rule"] == "loss_above"


def test_dry_run_says_would_stop_and_nothing_was_stopped() -> None:
    sink, src = run_ticks([make_job("j1", 500.0)], dry_run=True)
    assert src.stops == []
    msg = render(raised(sink, "j1"), dry_run=True)
    assert "WOULD HAVE STOPPED" in msg.text and "nothing was stopped" in msg.text
    assert msg.fields["dry_run"] == "true"


def test_protected_job_says_why_it_was_not_stopped() -> None:
    sink, src = run_ticks([make_job("j1", 500.0, tags={"trainguard:protect": "yes"})])
    assert src.stops == []
    assert "is protected" in render(raised(sink, "j1"), dry_run=False).text


def test_capped_job_says_the_cap_held_it_back() -> None:
    sink, src = run_ticks([make_job("cheap", 500.0, price=1.0),
                           make_job("pricey", 500.0, price=100.0)], cap=1)
    assert src.stops == ["pricey"]
    assert "max_stops_per_tick" in render(raised(sink, "cheap"), dry_run=False).text
    assert "STOPPED the job" in render(raised(sink, "pricey"), dry_run=False).text


def test_persistence_says_how_many_ticks_it_has_seen() -> None:
    sink, src = run_ticks([make_job("j1", 500.0)], persist=3)
    assert src.stops == []
    text = render(raised(sink, "j1"), dry_run=False).text
    assert "seen 1 tick(s) in a row" in text and "persist_ticks" in text


def test_notify_only_finding_says_so() -> None:
    sink, _ = run_ticks([make_job("j1", 50.0)], warning=Action.NOTIFY)  # a warning
    msg = render(raised(sink, "j1"), dry_run=False)
    assert msg.subject.startswith("[trainguard] WARNING:")
    assert "Notified only" in msg.text


def test_resolve_message_after_the_finding_clears() -> None:
    job = make_job("j1", 500.0)
    src = FakeSource("fake", [job])
    sink, store = Sink(), MemoryStore()
    tick([src], policy(dry_run=True), store, [sink], now=100.0, rules=RULES)
    job.series["loss"].value[-1] = 1.0
    tick([src], policy(dry_run=True), store, [sink], now=160.0, rules=RULES)
    resolve = [e for e in sink.events if e.kind == "resolve"]
    assert len(resolve) == 1
    msg = render(resolve[0], dry_run=True)
    assert msg.subject == "[trainguard] RESOLVED: loss_above on j1"
    assert "CLEARED" in msg.text and "was critical: loss 500" in msg.text


def test_evidence_and_money_are_formatted_for_people() -> None:
    f = Finding("j9", "stall", Severity.CRITICAL, "no progress for 42.0 min",
                step=1200.0, burnt_usd=123.456, projected_usd=9876.5,
                evidence={"kind": "silence", "silence_s": 2520.0, "examples": ["a", "b"]},
                action=Action.STOP)
    fm = FindingMemory(f.key, "stall", "critical", f.message, 0.0, 0.0)
    event = AlarmEvent("raise", f, Job(id="j9", name="llama-ft" * 20), "sagemaker",
                       "sagemaker:aws:acct:j9", 0.0, 0.0, 1, fm)
    msg = render(event, dry_run=False)
    assert "$123.46 burnt" in msg.text and "$9,876.50 projected" in msg.text
    assert "silence_s: 2520" in msg.text and 'examples: "a"; "b"' in msg.text
    assert "step: 1200" in msg.text
    assert len(msg.subject) <= SUBJECT_MAX and msg.subject.endswith("...")
    assert msg.subject.isascii()


@pytest.mark.parametrize("kind", ["raise", "remind", "resolve"])
def test_every_kind_renders_a_message(kind: str) -> None:
    fm = FindingMemory("j/stall/", "stall", "warning", "slow", 0.0, 0.0)
    f = Finding("j", "stall", Severity.WARNING, "slow") if kind != "resolve" else None
    msg = render(AlarmEvent(kind, f, None, "s", "s:p:a:j", 0.0, 0.0, 2, fm),  # type: ignore[arg-type]
                 dry_run=True)
    assert isinstance(msg, Message) and "j" in msg.subject and msg.text.endswith("\n")
