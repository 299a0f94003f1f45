"""The Azure runtime: the Function invoked as the Functions host would, its state on Azurite,
Azure ML through the recorded TLS replay server, and its alarm outputs.

Real parts: Table Storage is Azurite (npm, started on loopback by ``tests.servers``);
Azure ML is its recorded responses in the real wire format (``case_azureml``), reached
through azure-ai-ml's own transport. Boundaries with no local server: Entra ID (a static
token, ``StaticToken``: the servers check a bearer token is sent), Azure Monitor's
custom-metrics endpoint (a loopback TLS server that checks each body against the
documented format and answers like the service) and the webhook receiver (a loopback
server recording what a chat tool would get).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import ssl
import threading
import typing
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.functions import meta
from azure.functions.timer import TimerRequestConverter

import tests.test_tick as tick_tests
from tests.contract.case_azureml import (
    GROUP,
    NOW,
    SUBSCRIPTION,
    WORKSPACE,
    Replay,
    StaticToken,
    _certificate,
    adapter_for,
    start,
)
from tests.servers import Server, azurite, azurite_connection, azurite_table
from trainguard.checker.policy import Policy
from trainguard.config import PolicyError, load_policy_text
from trainguard.lambdas.azure import function_app
from trainguard.lambdas.azure.sinks import (
    METRIC_NAME,
    METRIC_NAMESPACE,
    WebhookSink,
    metric_document,
)
from trainguard.lambdas.azure.table_state import TableStore
from trainguard.lambdas.state import AuditAction, JobMemory, StateStoreError
from trainguard.lambdas.tick import TickReport, tick

__all__ = ["azurite"]  # the session fixture, imported for pytest

LIST = "/workspaces/ws-research/jobs"
BRIGHT = "bright_river_4k2m9x7q1z"  # running, stalled for 30 min: stall critical
# running, silent 48 min; its 5 records, 2.75 min apart, learn no cadence under 30 min: warning
OWL = "sleepy_owl_2p7d4k9m3x"
RESOURCE_ID = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/trainguard-research/providers/"
               "microsoft.insights/components/trainguard-research")

STALL_STOPS = """
name: stall-stops
safety: {dry_run: false, max_stops_per_tick: 1, persist_ticks: 1, trusted_signals: [metrics]}
rules:
  stall: {actions: {critical: stop}}
"""
NOTIFY_ONLY = "name: notify-only\nsafety: {dry_run: false, persist_ticks: 1}\n"
# A policy mistake: a $1 budget per job with stop makes every running job look bad at once.
BAD_BUDGET = """
name: bad-budget
safety: {dry_run: false, max_stops_per_tick: CAP, persist_ticks: 1}
budget: {per_job_usd: 1}
rules:
  budget: {actions: {warning: stop, critical: stop}}
  stall: {enabled: false}
"""


# --- loopback receivers -------------------------------------------------------------

@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Receiver:
    """An HTTP(S) server on loopback recording JSON posts; ``check`` returns an error
    message for a body the real service would refuse (answered 400), and ``fail`` queues
    status codes to answer before the next good ones."""

    url: str = ""
    ca_file: str = ""
    posts: list[Received] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    fail: list[int] = field(default_factory=list)
    check: Callable[[Received], str | None] = lambda _: None


def _serve(receiver: Receiver, tls_dir: Path | None) -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            got = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            status, answer = 200, b"{}"
            if receiver.fail:
                status = receiver.fail.pop(0)
                answer = b'{"error": {"code": "ServiceUnavailable", "message": "injected"}}'
            elif (problem := receiver.check(got)) is not None:
                receiver.refused.append(problem)
                status = 400
                answer = json.dumps({"error": {"code": "BadRequest",
                                               "message": problem}}).encode()
            else:
                receiver.posts.append(got)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    scheme = "http"
    if tls_dir is not None:
        cert, key = _certificate(tls_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme, receiver.ca_file = "https", str(cert)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def custom_metric_problem(got: Received) -> str | None:
    """What Azure Monitor's custom metrics API would refuse in this request (the format of
    learn.microsoft.com's "Send custom metrics ... using the REST API", as telegraf's
    azure_monitor output sends it), or None."""
    if got.path != f"{RESOURCE_ID}/metrics":
        return f"path {got.path!r} is not {{resourceId}}/metrics"
    if got.headers.get("authorization") != "Bearer replay-token":
        return "no bearer token"
    if not got.headers.get("content-type", "").startswith("application/json"):
        return "content type is not JSON"
    doc = got.body
    if not isinstance(doc, dict) or set(doc) != {"time", "data"}:
        return "the document is not {time, data}"
    if not isinstance(doc["time"], str) or not _TIME.match(doc["time"]):
        return f"time {doc['time']!r} is not an ISO 8601 UTC time"
    base = doc["data"].get("baseData") if isinstance(doc["data"], dict) else None
    if not isinstance(base, dict) or set(base) != {"metric", "namespace", "dimNames", "series"}:
        return "data.baseData is not {metric, namespace, dimNames, series}"
    names = base["dimNames"]
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        return "dimNames is not a list of strings"
    if not isinstance(base["series"], list) or not base["series"]:
        return "series is empty"
    for s in base["series"]:
        if set(s) != {"dimValues", "min", "max", "sum", "count"}:
            return f"series entry {s} has the wrong fields"
        values = s["dimValues"]
        if len(values) != len(names) or not all(isinstance(v, str) and v for v in values):
            return f"dimValues {values} do not match dimNames {names}"
        if not isinstance(s["count"], int) or s["count"] < 1:
            return f"count {s['count']!r} is not a positive integer"
        lo, hi, total = s["min"], s["max"], s["sum"]
        if not (lo <= hi and lo * s["count"] <= total <= hi * s["count"]):
            return f"min/max/sum {lo}/{hi}/{total} are inconsistent"
    return None


@pytest.fixture
def metrics_api(tmp_path: Path) -> Iterator[Receiver]:
    tls = tmp_path / "metrics-tls"
    tls.mkdir()
    yield from _serve(Receiver(check=custom_metric_problem), tls)


@pytest.fixture
def webhook() -> Iterator[Receiver]:
    yield from _serve(Receiver(), None)


@pytest.fixture
def replay(request: pytest.FixtureRequest) -> Replay:
    return start(request)


# --- Table Storage on Azurite: the tick's safety tests on this store ----------------------

def new_table() -> str:
    return f"tg{uuid.uuid4().hex[:16]}"


@pytest.fixture
def connection(azurite: Server) -> str:
    return azurite_connection(azurite)


@pytest.fixture
def store(connection: str) -> Iterator[TableStore]:
    """Overrides ``tests/test_tick.py``'s store for the tests imported below."""
    s = TableStore.from_connection_string(connection, new_table(), retries=1, backoff=0.01)
    yield s
    s.close()


# Every safety test of the shared tick that takes a store runs here on Table Storage.
for _name, _test in inspect.getmembers(tick_tests, inspect.isfunction):
    if _name.startswith("test_") and "store" in inspect.signature(_test).parameters:
        globals()[_name] = _test


def test_memory_and_audit_round_trip_with_awkward_keys_and_long_memory(store: TableStore
                                                                        ) -> None:
    from trainguard.lambdas.state import AuditRecord, FindingMemory

    key = "azureml:azureml:sub/rg/ws:job#1?%"  # RowKeys may not hold / # ?
    mem = JobMemory(key, "azureml", "job#1?%", 5.0)
    for i in range(400):  # far beyond one string property's 64 KiB
        mem.findings[f"f{i}"] = FindingMemory(f"f{i}", "logs", "warning", "x" * 200, 1.0, 2.0)
    other = JobMemory("azureml:azureml:sub/rg/ws:other", "azureml", "other", 5.0)
    store.load_all()
    store.save([mem, other])
    fresh = TableStore(store.client, create=False)
    loaded = fresh.load_all()
    assert loaded[key] == mem and loaded[other.job_key] == other
    records = [AuditRecord(10.0 + i, k, "j", "azureml", "f", "stall", "critical",
                           AuditAction.WOULD_STOP, f"r{i}", True)
               for i, k in enumerate([key, other.job_key, key])]
    store.append_audit(records[:2])
    store.append_audit(records[2:])
    assert [r.reason for r in fresh.audit_log()] == ["r0", "r1", "r2"]
    assert [r.reason for r in fresh.audit_log(key)] == ["r0", "r2"]
    store.delete([key])
    assert list(fresh.load_all()) == [other.job_key]


def test_a_second_writer_conflicts_instead_of_overwriting(connection: str) -> None:
    table = new_table()
    a = TableStore.from_connection_string(connection, table, retries=1, backoff=0.01)
    b = TableStore.from_connection_string(connection, table, retries=1, backoff=0.01)
    mem = JobMemory("azureml:azureml:s/r/w:j", "azureml", "j", 1.0)
    a.load_all()
    b.load_all()
    a.save([mem])
    with pytest.raises(StateStoreError, match=r"'azureml:azureml:s/r/w:j' was created by "
                                              r"another watchdog run.*HTTP 409"):
        b.save([mem])
    b.load_all()
    a.save([mem])  # a's ETag is still current; b's read is now stale
    with pytest.raises(StateStoreError, match=r"was changed by another watchdog run.*412"):
        b.save([mem])


def test_a_malformed_entity_is_named(connection: str) -> None:
    table = new_table()
    s = TableStore.from_connection_string(connection, table)
    TableClient.from_connection_string(connection, table).create_entity(
        {"PartitionKey": "job", "RowKey": "x", "job_key": "x", "data": "{not json"})
    with pytest.raises(StateStoreError, match="job memory is not JSON"):
        s.load_all()


# --- the Function, invoked as the host does ------------------------------------------

@functools.cache
def indexed() -> list[Any]:
    """The app's functions, indexed once (as the host does: a second indexing of the same
    app is refused)."""
    return list(function_app.app.get_functions())


@dataclass
class Azure:
    """One Function App's world: settings, and what reached each service."""

    replay: Replay
    connection: str
    table: str
    metrics: Receiver
    webhook: Receiver
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    env: dict[str, str] = field(default_factory=dict)

    def configure(self, policy: str, stop_enabled: bool = True, **extra: str) -> None:
        path = self.tmp / "policy.yaml"
        path.write_text(policy)
        self.env = {
            "TRAINGUARD_SCHEDULE": "0 */10 * * * *",
            "TRAINGUARD_SUBSCRIPTION": SUBSCRIPTION, "TRAINGUARD_ML_RESOURCE_GROUP": GROUP,
            "TRAINGUARD_ML_WORKSPACE": WORKSPACE, "TRAINGUARD_ML_ENDPOINT": self.replay.base,
            "TRAINGUARD_ML_CA_FILE": self.replay.ca_file, "TRAINGUARD_ML_RETRIES": "2",
            "TRAINGUARD_ML_BACKOFF": "0.01", "TRAINGUARD_POLICY": str(path),
            "TRAINGUARD_STOP_ENABLED": "true" if stop_enabled else "false",
            "TRAINGUARD_STATE_CONNECTION": self.connection, "TRAINGUARD_STATE_TABLE": self.table,
            "TRAINGUARD_METRICS_RESOURCE_ID": RESOURCE_ID,
            "TRAINGUARD_METRICS_ENDPOINT": self.metrics.url,
            "TRAINGUARD_METRICS_CA_FILE": self.metrics.ca_file,
            "TRAINGUARD_WEBHOOK_URL": self.webhook.url + "/hook",
            "TRAINGUARD_WEBHOOK_MIN_SEVERITY": "warning", **extra}

    def invoke(self, now: float = NOW) -> None:
        """Index the app and call its timer function with a host-decoded timer payload."""
        for k, v in self.env.items():
            self.monkeypatch.setenv(k, v)
        self.monkeypatch.setattr(function_app, "credential", StaticToken)
        self.monkeypatch.setattr(function_app, "clock", lambda: now)
        (fn,) = indexed()
        trigger = fn.get_trigger()
        assert trigger is not None and trigger.get_binding_name() == "timerTrigger"
        assert trigger.get_dict_repr()["schedule"] == "%TRAINGUARD_SCHEDULE%"
        payload = {"Schedule": {"AdjustForDST": True}, "IsPastDue": False, "ScheduleStatus": {
            "Last": "0001-01-01T00:00:00", "Next": "2025-06-15T16:10:00+00:00",
            "LastUpdated": "0001-01-01T00:00:00"}}
        timer = TimerRequestConverter.decode(meta.Datum(json.dumps(payload), "json"),
                                             trigger_metadata={})
        user = fn.get_user_function()
        # The worker resolves the annotations (string ones too) and checks the trigger's.
        hints = typing.get_type_hints(user)
        assert TimerRequestConverter.check_input_type_annotation(hints["timer"])
        user(timer)

    def cancels(self) -> list[str]:
        return [s.path.rsplit("/", 2)[-2] for s in self.replay.calls("POST", "/cancel")]

    def state(self) -> TableStore:
        return TableStore.from_connection_string(self.connection, self.table, retries=1,
                                                 backoff=0.01)

    def messages(self) -> list[dict[str, Any]]:
        return [p.body for p in self.webhook.posts]

    def findings_series(self, index: int = -1) -> dict[tuple[str, str], float]:
        base = self.metrics.posts[index].body["data"]["baseData"]
        return {tuple(s["dimValues"]): s["max"] for s in base["series"]}


@pytest.fixture
def azure(replay: Replay, connection: str, metrics_api: Receiver, webhook: Receiver,
          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Azure:
    return Azure(replay, connection, new_table(), metrics_api, webhook, tmp_path, monkeypatch)


def test_a_stalled_job_is_stopped_once_alarmed_and_published(azure: Azure) -> None:
    azure.configure(STALL_STOPS)
    azure.invoke()
    assert azure.cancels() == [BRIGHT]
    stops = [a for a in azure.state().audit_log() if a.action == AuditAction.STOP]
    assert [(a.job_id, a.rule) for a in stops] == [(BRIGHT, "stall")]
    # The person reading the webhook learns what happened and where to look.
    by_job = {m["fields"]["job_id"]: m for m in azure.messages()}
    assert set(by_job) == {BRIGHT, OWL}
    bright = by_job[BRIGHT]
    assert bright["subject"].startswith("[trainguard] CRITICAL: stall on ")
    assert "STOPPED the job" in bright["text"] and "no progress for 30" in bright["text"]
    assert "ml.azure.com" in bright["fields"]["console_url"]
    assert bright["event"]["kind"] == "raise" and bright["event"]["stopped"] is True
    assert "Notified only" in by_job[OWL]["text"]
    # The metric the alerts watch: one series per rule and severity.
    assert azure.metrics.refused == []
    doc = azure.metrics.posts[0].body
    assert doc["data"]["baseData"]["namespace"] == METRIC_NAMESPACE == "trainguard"
    assert doc["data"]["baseData"]["metric"] == METRIC_NAME == "Findings"
    assert doc["data"]["baseData"]["dimNames"] == ["rule", "severity"]
    assert {k: v for k, v in azure.findings_series().items() if v} == {
        ("stall", "critical"): 1, ("stall", "warning"): 1}  # the other watched pairs: 0

    azure.invoke(NOW + 600)  # ten minutes on: the job still shows Running in Azure ML
    assert azure.cancels() == [BRIGHT]  # never twice
    assert len(azure.messages()) == 2  # no repeat alarm before the reminder interval
    assert len(azure.metrics.posts) == 2  # the metric keeps the alert firing


def test_without_stop_enabled_the_policy_runs_dry(azure: Azure) -> None:
    azure.configure(STALL_STOPS, stop_enabled=False)
    azure.invoke()
    assert azure.cancels() == []
    actions = [a.action for a in azure.state().audit_log()]
    assert actions == [AuditAction.WOULD_STOP]
    (bright,) = [m for m in azure.messages() if m["fields"]["job_id"] == BRIGHT]
    assert "WOULD HAVE STOPPED" in bright["text"] and bright["fields"]["dry_run"] == "true"


def test_a_job_azure_ml_cannot_describe_is_reported_and_the_rest_watched(
        azure: Azure, caplog: pytest.LogCaptureFixture) -> None:
    azure.configure(NOTIFY_ONLY)
    with caplog.at_level("INFO", logger="trainguard.azure"):
        azure.invoke()
    (line,) = [r.getMessage() for r in caplog.records if "trainguard tick" in r.getMessage()]
    summary = json.loads(line.split(": ", 1)[1])
    assert summary["jobs"] == {"azureml": 3}
    assert any("broken_kite_3x8v1n6m4c" in w and "instanceCount" in w
               for w in summary["warnings"])
    assert {m["fields"]["job_id"] for m in azure.messages()} == {BRIGHT, OWL}


def test_bad_settings_name_the_setting(azure: Azure) -> None:
    azure.configure(NOTIFY_ONLY)
    del azure.env["TRAINGUARD_ML_WORKSPACE"]
    azure.monkeypatch.delenv("TRAINGUARD_ML_WORKSPACE", raising=False)
    with pytest.raises(function_app.ConfigError, match="TRAINGUARD_ML_WORKSPACE is required"):
        azure.invoke()
    azure.configure(NOTIFY_ONLY, TRAINGUARD_METRICS_ENDPOINT="", TRAINGUARD_METRICS_CA_FILE="")
    with pytest.raises(function_app.ConfigError, match="TRAINGUARD_METRICS_REGION is required"):
        azure.invoke()
    azure.configure("safety: {max_stops_per_tick: -1}\n")
    with pytest.raises(PolicyError, match=r"policy\.yaml.*max_stops_per_tick"):
        azure.invoke()
    assert azure.replay.calls("GET", LIST) == []  # nothing was asked of Azure ML


# --- faults ---------------------------------------------------------------------------

def test_throttling_is_waited_out(azure: Azure) -> None:
    azure.configure(STALL_STOPS)
    azure.replay.fail("GET", LIST, 429, {"Retry-After": "1"})
    azure.invoke()
    assert len(azure.replay.calls("GET", LIST)) >= 2  # the 429, then the listing
    assert azure.cancels() == [BRIGHT]


def test_a_listing_that_keeps_failing_fails_the_invocation_and_resolves_nothing(
        azure: Azure) -> None:
    azure.configure(NOTIFY_ONLY)
    azure.invoke()
    raised = len(azure.messages())
    assert raised == 2
    azure.replay.fail("GET", LIST, 503, times=10)
    with pytest.raises(function_app.TickFailed, match=r"cannot list jobs.*InternalServerError"):
        azure.invoke(NOW + 600)
    # Unknown is not fixed: no "resolved" message while Azure ML cannot be read.
    assert len(azure.messages()) == raised
    azure.replay.faults.clear()
    azure.invoke(NOW + 1200)  # back: the same findings, nothing resolved in between
    sent = [(m["event"]["kind"], m["fields"]["job_id"], m["fields"]["severity"])
            for m in azure.messages()]
    assert all(kind == "raise" for kind, _, _ in sent)
    assert len(set(sent)) == len(sent)  # a raise again only if a finding got worse


def test_a_cancel_azure_ml_refuses_is_retried_then_given_up_with_an_alarm(
        azure: Azure) -> None:
    azure.configure(STALL_STOPS)
    azure.replay.fail("POST", "/cancel", 500, times=100)
    azure.invoke()
    tried = len(azure.cancels())
    assert tried >= 1
    audit = azure.state().audit_log()
    assert [a.action for a in audit] == [AuditAction.STOP_FAILED]
    (bright,) = [m for m in azure.messages() if m["fields"]["job_id"] == BRIGHT]
    assert "stop call FAILED" in bright["text"] and "tries again" in bright["text"]
    for i in range(1, 5):  # two more attempts, then the tick gives up
        azure.invoke(NOW + 600 * i)
    # each attempt with the SDK's own retries; then no more
    assert azure.cancels().count(BRIGHT) == 3 * tried
    failed = [a for a in azure.state().audit_log()
              if a.action == AuditAction.STOP_FAILED and a.job_id == BRIGHT]
    assert len(failed) == 4 and "gave up" in failed[-1].reason
    gave_up = [m for m in azure.messages() if m["fields"]["rule"] == "stop_failed"
               and m["fields"]["job_id"] == BRIGHT]
    assert len(gave_up) == 1 and gave_up[0]["fields"]["severity"] == "critical"


def test_the_metric_endpoint_failing_once_is_retried(azure: Azure) -> None:
    azure.configure(NOTIFY_ONLY)
    azure.metrics.fail = [503]
    azure.invoke()
    assert azure.metrics.fail == [] and len(azure.metrics.posts) == 1
    assert {k: v for k, v in azure.findings_series().items() if v} == {
        ("stall", "critical"): 1, ("stall", "warning"): 1}  # the other watched pairs: 0


def test_an_alarm_the_webhook_did_not_take_is_sent_on_the_next_tick(
        azure: Azure, caplog: pytest.LogCaptureFixture) -> None:
    azure.configure(NOTIFY_ONLY, TRAINGUARD_WEBHOOK_MIN_SEVERITY="critical")
    azure.webhook.fail = [503] * 10  # down for the whole first tick, retries included
    with caplog.at_level("INFO", logger="trainguard.azure"):
        azure.invoke()
    assert azure.messages() == []
    assert any("WebhookSink" in r.getMessage() and "HTTP 503" in r.getMessage()
               for r in caplog.records)
    azure.webhook.fail = []
    azure.invoke(NOW + 600)
    assert [(m["event"]["kind"], m["fields"]["job_id"]) for m in azure.messages()] == [
        ("raise", BRIGHT)]


@pytest.mark.parametrize("cap", [1, 2])
def test_every_job_bad_at_once_stops_at_most_the_cap(azure: Azure, cap: int) -> None:
    azure.configure(BAD_BUDGET.replace("CAP", str(cap)))
    azure.replay.override("POST", "/cancel", 202, {})
    per_tick = []
    for i in range(3):
        before = len(azure.cancels())
        azure.invoke(NOW + 600 * i)
        per_tick.append(len(azure.cancels()) - before)
    assert all(n <= cap for n in per_tick)
    assert per_tick[0] == cap
    assert sorted(azure.cancels()) == sorted([BRIGHT, OWL, "quiet_harbor_8w3n5c2v6b"])
    capped = [a for a in azure.state().audit_log() if a.action == AuditAction.SKIP_CAP]
    assert len({a.job_id for a in capped}) == 3 - cap


def test_table_storage_stopped_mid_run_raises_and_sends_no_cancel(replay: Replay) -> None:
    with azurite_table() as server:
        class DiesAfterLoad(TableStore):
            def load_all(self) -> dict[str, JobMemory]:
                memory = super().load_all()
                server.process.terminate()  # Azurite goes away between read and write
                server.process.wait(timeout=10)
                return memory

        store = DiesAfterLoad.from_connection_string(azurite_connection(server), new_table(),
                                                     retries=1, backoff=0.01, timeout=3)
        with pytest.raises(StateStoreError, match=r"state table .*cannot save job memory"):
            tick([adapter_for(replay)], policy(STALL_STOPS), store, [], NOW)
    assert replay.calls("POST", "/cancel") == []


@pytest.mark.parametrize("first_sight", [True, False])
def test_two_overlapping_runs_cancel_a_job_exactly_once(replay: Replay, connection: str,
                                                        first_sight: bool) -> None:
    """Runner B reads the state, then runner A runs a whole tick (and stops the job) before
    B writes: B's write meets A's ETag, fails, and B sends no cancel."""
    table = new_table()
    pol = policy(STALL_STOPS)
    if not first_sight:  # the job's memory exists: the second tick is the one that stops
        pol.safety.persist_ticks = 2
        seed = TableStore.from_connection_string(connection, table)
        tick([adapter_for(replay)], pol, seed, [], NOW - 1)  # critical already: 30 min
        assert replay.calls("POST", "/cancel") == []
    a = TableStore.from_connection_string(connection, table)

    class Overlapped(TableStore):
        def load_all(self) -> dict[str, JobMemory]:
            memory = super().load_all()
            tick([adapter_for(replay)], pol, a, [], NOW)  # A, start to finish
            return memory

    b = Overlapped.from_connection_string(connection, table)
    with pytest.raises(StateStoreError, match="ETag conflict"):
        tick([adapter_for(replay)], pol, b, [], NOW)
    assert [s.path.rsplit("/", 2)[-2] for s in replay.calls("POST", "/cancel")] == [BRIGHT]
    stops = [x for x in a.audit_log() if x.action == AuditAction.STOP]
    assert [x.job_id for x in stops] == [BRIGHT]


# --- the sinks on their own -------------------------------------------------------------

def test_resolved_findings_drop_the_metric_to_zero(azure: Azure) -> None:
    azure.configure(NOTIFY_ONLY)
    azure.invoke()
    # The stalled job has ended: Azure ML no longer lists it as running.
    azure.replay.override("GET", LIST, 200, {"value": []})
    azure.invoke(NOW + 600)
    assert {("stall", "critical"), ("stall", "warning")} <= set(azure.findings_series())
    assert set(azure.findings_series().values()) == {0}
    resolved = [m for m in azure.messages() if m["event"]["kind"] == "resolve"]
    assert {m["fields"]["job_id"] for m in resolved} == {BRIGHT, OWL}
    assert all(m["subject"].startswith("[trainguard] RESOLVED") for m in resolved)


def test_a_quiet_tick_posts_every_watched_pair_at_zero(azure: Azure) -> None:
    """Each tick says every pair the policy acts on, so an alert a refused post left
    firing ends at the next tick (tests/test_sink_contract.py)."""
    azure.configure(NOTIFY_ONLY)
    azure.replay.override("GET", LIST, 200, {"value": []})
    azure.invoke()
    assert azure.metrics.refused == []
    assert ("stall", "critical") in azure.findings_series()
    assert set(azure.findings_series().values()) == {0}
    assert metric_document(TickReport(time=NOW)) is None  # nothing watched, nothing open


def test_the_webhook_sends_from_its_severity_up(azure: Azure) -> None:
    azure.configure(NOTIFY_ONLY, TRAINGUARD_WEBHOOK_MIN_SEVERITY="critical")
    azure.invoke()
    assert [m["fields"]["job_id"] for m in azure.messages()] == [BRIGHT]
    with pytest.raises(ValueError, match="'severe' is not one of info, warning, critical"):
        WebhookSink(azure.webhook.url, dry_run=True, min_severity="severe")


def policy(text: str) -> Policy:
    return load_policy_text(text, "test-policy.yaml")
