"""The sink contract: one factory per sink of the sink registry
(``trainguard.lambdas.plugins.sinks``), each building the sink against a real or
stand-in endpoint it can switch to refusing. ``tests/test_sink_contract.py`` holds every
one to the same behaviour; a registered sink with no factory here fails that suite.

What stands behind each sink:

* ``sns``: SNS on moto (server mode), an SQS queue subscribed to the topic reads what was
  published. Refusing: the topic is deleted (SNS answers NotFound), then made again.
* ``cloudwatch``: CloudWatch on moto (server mode); ``GetMetricData`` reads it back.
  Refusing: ``Gate``, a loopback proxy in front of moto answering 503 while down (moto
  cannot be told to refuse a valid call).
* ``emf``: the Lambda's metrics, EMF lines on stdout that CloudWatch Logs turns into
  metrics (no CloudWatch Logs can run here): stdout is a stream that fails with EIO while
  down, and the lines are read back as CloudWatch would, by their ``_aws`` directive.
* ``alertmanager``: a real Alertmanager (Debian), behind the ``Gate`` to refuse.
* ``pushgateway``: a real Pushgateway (Debian), behind the ``Gate`` to refuse.
* ``webhook`` (Azure's direct webhook: Teams, Slack, any relay) and ``azure_metrics``
  (Azure Monitor's custom metrics REST API): no real service can run here; both post to
  the loopback receiver of tests/test_azure_runtime.py (HTTPS with a test CA for the
  metrics, whose bearer token is stood in; it refuses a body the documented format does
  not allow), which answers 503 while down.
* ``console`` (the local loop's): a rich ``Console`` on a stream that fails with EIO
  while down (a terminal that hung up; a closed pipe is not a refusal there: rich ends
  the process, as ``| head`` expects); what it printed is read.

Each case says what the endpoint holds now, by rule: ``firing`` or ``resolved``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.contract import Cases
from tests.servers import alertmanager, pushgateway, shared
from trainguard.checker.model import Job
from trainguard.lambdas.tick import AlarmSink, TickReport

Said = dict[str, str]  # rule -> "firing" or "resolved", as the endpoint holds it


@dataclass
class SinkCase:
    name: str
    down: Callable[[bool], None]  # True: the endpoint refuses; False: it takes again
    said: Callable[[], Said]
    alarm: AlarmSink | None = None  # an alarm sink: given to the tick
    publish: Callable[[TickReport, list[Job]], None] | None = None  # a metrics sink


Factory = Callable[[pytest.FixtureRequest, Path], SinkCase]


CASES: Cases[Factory] = Cases("sink", "tests/contract/sinks.py", "sinks")
SINKS, sink, sink_names = CASES.factories, CASES.register, CASES.names


def open_case(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    return CASES.factory(name)(request, tmp_path)


# --- a switchable gate in front of an HTTP endpoint -----------------------------------

@dataclass
class Gate:
    """A loopback proxy: forwards every request to ``upstream`` while up, answers 503
    with a JSON error while down (an endpoint that is up but refusing)."""

    upstream: str
    is_down: bool = False
    url: str = ""

    def down(self, value: bool) -> None:
        self.is_down = value


@contextlib.contextmanager
def serve_gate(upstream: str) -> Iterator[Gate]:
    gate = Gate(upstream)

    class Handler(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if gate.is_down:
                self._answer(503, b'{"error": "service unavailable (the test gate is down)"}',
                             {"Content-Type": "application/json"})
                return
            skip = {"host", "content-length", "connection", "transfer-encoding"}
            request = urllib.request.Request(
                gate.upstream + self.path, data=body or None, method=self.command,
                headers={k: v for k, v in self.headers.items() if k.lower() not in skip})
            try:
                with urllib.request.urlopen(request, timeout=20) as r:
                    self._answer(r.status, r.read(), dict(r.headers))
            except urllib.error.HTTPError as e:
                self._answer(e.code, e.read(), dict(e.headers))

        def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in headers.items():
                if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                     "date", "server"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _forward

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    gate.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield gate
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _gate(request: pytest.FixtureRequest, upstream: str) -> Gate:
    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    return stack.enter_context(serve_gate(upstream))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


# --- AWS on moto ------------------------------------------------------------------------

def _aws(request: pytest.FixtureRequest, service: str, url: str | None = None) -> Any:
    import boto3
    from botocore.config import Config

    from tests.contract.stores import _moto

    url = url or shared(request.config, "moto-server", _moto).url
    session: Any = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                 region_name="us-east-1")
    return session.client(service, endpoint_url=url,
                          config=Config(retries={"total_max_attempts": 1}))


@sink("sns")
def sns(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    from trainguard.lambdas.aws.sinks import SnsAlarmSink

    client, sqs = _aws(request, "sns"), _aws(request, "sqs")
    name = f"alarms-{uuid.uuid4().hex[:8]}"
    queue = sqs.create_queue(QueueName=f"inbox-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]

    def make_topic() -> str:
        arn: str = client.create_topic(Name=name)["TopicArn"]
        client.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
        return arn

    topic = make_topic()
    state: Said = {}

    def down(value: bool) -> None:
        if value:
            client.delete_topic(TopicArn=topic)
        else:
            make_topic()

    def said() -> Said:
        while got := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10,
                                         WaitTimeSeconds=0).get("Messages", []):
            for m in got:
                attrs = json.loads(m["Body"])["MessageAttributes"]
                kind = attrs["kind"]["Value"]
                state[attrs["rule"]["Value"]] = "resolved" if kind == "resolve" else "firing"
                sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
        return dict(state)

    return SinkCase("sns", down, said, alarm=SnsAlarmSink(client, topic, dry_run=True))


@sink("cloudwatch")
def cloudwatch(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    """A namespace of its own per case; the tick's ``Findings`` datum for a rule is there
    while it fires and absent once it resolves (the stack's alarms treat missing data as
    not breaching), so the last publish of each rule says which."""
    from tests.contract.stores import _moto
    from trainguard.checker.policy import Policy
    from trainguard.lambdas.aws.sinks import FINDINGS, PutMetricDataWriter, tick_metrics

    gate = _gate(request, shared(request.config, "moto-server", _moto).url)
    client = _aws(request, "cloudwatch", gate.url)
    reader = _aws(request, "cloudwatch")
    writer = PutMetricDataWriter(client, namespace=f"tg-{uuid.uuid4().hex[:8]}")
    published: list[set[str]] = []  # the rules of each publish that went through

    def publish(report: TickReport, jobs: list[Job]) -> None:
        data = tick_metrics(jobs, report.findings, Policy())
        writer.write(data)
        published.append({dict(d.dimensions)["rule"] for d in data if d.name == FINDINGS})

    def said() -> Said:
        metrics = reader.list_metrics(Namespace=writer.namespace, MetricName=FINDINGS)
        ever = {dict((d["Name"], d["Value"]) for d in m["Dimensions"])["rule"]
                for m in metrics["Metrics"]}
        last = published[-1] if published else set()
        return {rule: "firing" if rule in last else "resolved" for rule in ever}

    return SinkCase("cloudwatch", gate.down, said, publish=publish)


@sink("emf")
def emf(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    from trainguard.checker.policy import Policy
    from trainguard.lambdas.aws.sinks import FINDINGS, EmfWriter, tick_metrics

    stdout = _Pipe()
    published: list[set[str]] = []  # the rules of each publish that went through

    def publish(report: TickReport, jobs: list[Job]) -> None:
        before = len(stdout.text)
        with contextlib.redirect_stdout(stdout):  # type: ignore[type-var]
            EmfWriter().write(tick_metrics(jobs, report.findings, Policy()))
        published.append({doc["rule"] for line in stdout.text[before:].splitlines()
                          if (doc := json.loads(line)).get(FINDINGS) is not None
                          and any(m["Name"] == FINDINGS for d in doc["_aws"]["CloudWatchMetrics"]
                                  for m in d["Metrics"])})

    def said() -> Said:
        ever = set().union(*published) if published else set()
        last = published[-1] if published else set()
        return {rule: "firing" if rule in last else "resolved" for rule in ever}

    return SinkCase("emf", stdout.down, said, publish=publish)


# --- Alertmanager and Pushgateway (real, Debian) ---------------------------------------

@sink("alertmanager")
def alertmanager_case(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    from trainguard.lambdas.k8s.sinks import AlertmanagerSink

    server = shared(request.config, "alertmanager", lambda: alertmanager(
        "route: {receiver: none}\nreceivers: [{name: none}]\n"))
    gate = _gate(request, server.url)
    env = uuid.uuid4().hex[:8]  # this case's alerts only, on the shared server
    am = AlertmanagerSink(gate.url, dry_run=True, labels={"environment": env}, retries=0)
    state: Said = {}

    def said() -> Said:
        alerts = json.loads(_get(f"{server.url}/api/v2/alerts"))
        firing = {a["labels"]["rule"] for a in alerts if a["labels"].get("environment") == env}
        for rule in list(state) + sorted(firing):
            state[rule] = "firing" if rule in firing else "resolved"
        return dict(state)

    return SinkCase("alertmanager", gate.down, said, alarm=am)


@sink("pushgateway")
def pushgateway_case(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    from prometheus_client.parser import text_string_to_metric_families

    from trainguard.lambdas.k8s.sinks import PushgatewaySink

    server = shared(request.config, "pushgateway", pushgateway)
    gate = _gate(request, server.url)
    env = uuid.uuid4().hex[:8]
    push = PushgatewaySink(gate.url, grouping={"environment": env})
    state: Said = {}

    def said() -> Said:
        text = _get(f"{server.url}/metrics").decode()
        firing = {s.labels["rule"] for fam in text_string_to_metric_families(text)
                  if fam.name == "trainguard_findings" for s in fam.samples
                  if s.labels.get("environment") == env and s.value > 0}
        for rule in list(state) + sorted(firing):
            state[rule] = "firing" if rule in firing else "resolved"
        return dict(state)

    def publish(report: TickReport, jobs: list[Job]) -> None:
        push.publish(report, seconds=0.1, finished=time.time())

    return SinkCase("pushgateway", gate.down, said, publish=publish)


# --- Azure: the webhook and the custom metrics API (loopback stand-ins) ----------------

@dataclass
class _Receiving:
    receiver: Any
    state: Said = field(default_factory=dict)

    def down(self, value: bool) -> None:
        # the receiver answers each queued status once: enough 503s for one tick
        self.receiver.fail[:] = [503] * 50 if value else []


def _receiver(request: pytest.FixtureRequest, tls: Path | None,
              check: Callable[[Any], str | None] | None = None) -> Any:
    from tests.test_azure_runtime import Receiver, _serve

    receiver = Receiver(check=check) if check else Receiver()
    gen = _serve(receiver, tls)
    got = next(gen)
    request.addfinalizer(lambda: next(gen, None))
    return got


@sink("webhook")
def webhook(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    from trainguard.lambdas.azure.sinks import WebhookSink

    on = _Receiving(_receiver(request, None))

    def said() -> Said:
        for post in on.receiver.posts:
            event = post.body["event"]
            on.state[event["rule"]] = "resolved" if event["kind"] == "resolve" else "firing"
        on.receiver.posts.clear()
        return dict(on.state)

    hook = WebhookSink(on.receiver.url, dry_run=True, retries=0)
    return SinkCase("webhook", on.down, said, alarm=hook)


@sink("azure_metrics")
def azure_metrics(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    """The token credential is stood in (no Azure AD here); the receiver refuses a body
    the documented custom-metrics format does not allow."""
    from tests.test_azure_runtime import RESOURCE_ID, custom_metric_problem
    from trainguard.lambdas.azure.sinks import FindingsMetrics

    class Token:
        def get_token(self, *scopes: str, **kw: Any) -> Any:
            from azure.core.credentials import AccessToken

            return AccessToken("replay-token", int(time.time()) + 3600)

    tls = tmp_path / "metrics-tls"
    tls.mkdir()
    on = _Receiving(_receiver(request, tls, custom_metric_problem))
    # the pairs the tick's policy acts on (acted_pairs(policy) in the Function; the test
    # rule is not among the registered rules it would read)
    watched = [("loss_above", "critical"), ("loss_above", "warning")]
    metrics = FindingsMetrics(RESOURCE_ID, "westeurope", Token(), endpoint=on.receiver.url,
                              ca_file=on.receiver.ca_file, retries=0, watched=watched)

    def said() -> Said:
        assert not on.receiver.refused, on.receiver.refused
        for post in on.receiver.posts:
            series = post.body["data"]["baseData"]["series"]
            for rule in {s["dimValues"][0] for s in series}:
                firing = any(s["max"] > 0 for s in series if s["dimValues"][0] == rule)
                on.state[rule] = "firing" if firing else "resolved"
        on.receiver.posts.clear()
        return dict(on.state)

    def publish(report: TickReport, jobs: list[Job]) -> None:
        metrics.publish(report)

    return SinkCase("azure_metrics", on.down, said, publish=publish)


# --- the local loop's console -----------------------------------------------------------

class _Pipe:
    """A text stream that fails writes with EIO (a hung-up terminal) while ``closed_now``."""

    def __init__(self) -> None:
        self.text, self.closed_now = "", False

    def write(self, text: str) -> int:
        if self.closed_now:
            raise OSError(errno.EIO, "Input/output error (the test hung the terminal up)")
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def down(self, value: bool) -> None:
        self.closed_now = value


@sink("console")
def console(request: pytest.FixtureRequest, tmp_path: Path) -> SinkCase:
    from rich.console import Console

    from trainguard.lambdas.local import ConsoleSink

    pipe = _Pipe()
    state: Said = {}

    def down(value: bool) -> None:
        pipe.closed_now = value

    def said() -> Said:
        for line in pipe.text.splitlines():  # "   1.0s critical bad: loss_above loss 500"
            words = line.replace(":", " ").split()
            if RULE_WORD in words:
                state[RULE_WORD] = "resolved" if "cleared" in words else "firing"
        pipe.text = ""
        return dict(state)

    out = Console(file=pipe, width=200, color_system=None, force_terminal=False)  # type: ignore[arg-type]
    return SinkCase("console", down, said, alarm=ConsoleSink(out, started=time.time()))


RULE_WORD = "loss_above"  # the tests' rule, as the console prints it
