"""Recorded SageMaker, and CloudWatch on moto, for the SageMaker adapter's tests, its
contract case and the scale benchmark.

* ``Recordings``: ``tests/recordings/sagemaker/*.json``, each one call: the operation,
  the request, and the response body exactly as the service sends it on the wire
  (awsJson 1.1: timestamps as epoch seconds). Bodies are decoded by botocore's own
  parser, so a recording that is not in the wire shape fails to load.
* ``ReplayStubber``: botocore's Stubber fed, call by call, with the recording whose
  request equals the call's parameters. The Stubber validates every response against
  botocore's service model; the client validates every request. A call nobody
  recorded raises and is listed in ``missing``.
* ``SageMakerServer``: the same recordings (or generated jobs) over HTTP, for the
  retry tests (botocore's retries run only on real HTTP: a Stubber answer skips
  them) and the benchmark. It can answer the first calls with a fault.
* ``moto_server()``: one moto server on loopback for the test session (CloudWatch
  metrics and CloudWatch Logs), and ``seed`` to load metrics and log lines into it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, TypedDict

import boto3
import botocore.parsers
import botocore.session
from botocore import xform_name
from botocore.stub import Stubber

from trainguard.adapters.sagemaker import SageMakerAdapter
from trainguard.adapters.sagemaker.clients import Clients

RECORDINGS = Path(__file__).resolve().parent / "recordings" / "sagemaker"
REGION = "us-east-1"


class Creds(TypedDict):
    aws_access_key_id: str
    aws_secret_access_key: str
    region_name: str


CREDS: Creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
                "region_name": REGION}
_SM_MODEL = botocore.session.get_session().get_service_model("sagemaker")


def canonical(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def parse(operation: str, body: dict[str, Any], service_model: Any = _SM_MODEL) -> dict[str, Any]:
    """A wire body decoded as botocore decodes it for ``operation``."""
    shape = service_model.operation_model(operation).output_shape
    parser = botocore.parsers.create_parser("json")
    parsed: dict[str, Any] = parser.parse(
        {"body": json.dumps(body).encode(), "headers": {}, "status_code": 200}, shape)
    parsed.pop("ResponseMetadata", None)
    return parsed


class Recordings:
    def __init__(self, folder: Path = RECORDINGS) -> None:
        self.files: dict[str, dict[str, Any]] = {
            p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
        self.by_call: dict[tuple[str, str], dict[str, Any]] = {
            (r["operation"], canonical(r["request"])): r
            for r in self.files.values() if "operation" in r}

    def body(self, stem: str) -> dict[str, Any]:
        return copy.deepcopy(self.files[stem]["response"])

    def event(self, stem: str) -> dict[str, Any]:
        return copy.deepcopy(self.files[stem])


class ReplayStubber:
    """Answers each SageMaker call from the recording of that exact request."""

    def __init__(self, client: Any, recordings: Recordings,
                 overrides: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.client = client
        self.recordings = recordings
        self.overrides = overrides or {}  # (operation, request) -> wire body
        self.stubber = Stubber(client)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.missing: list[tuple[str, dict[str, Any]]] = []
        client.meta.events.register("provide-client-params.sagemaker.*", self._queue)
        self.stubber.activate()

    def _queue(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        key = (model.name, canonical(params))
        self.calls.append((model.name, dict(params)))
        if key in self.overrides:
            body = self.overrides[key]
        elif key in self.recordings.by_call:
            body = self.recordings.by_call[key]["response"]
        else:
            self.missing.append((model.name, dict(params)))
            raise AssertionError(f"no recording of {model.name} {params}")
        self.stubber.add_response(xform_name(model.name), parse(model.name, body),
                                  expected_params=params)

    def count(self, operation: str) -> int:
        return sum(1 for op, _ in self.calls if op == operation)

    def stopped(self) -> list[str]:
        return [p["TrainingJobName"] for op, p in self.calls if op == "StopTrainingJob"]


def sagemaker_client(endpoint_url: str | None = None, **config: Any) -> Any:
    from botocore.config import Config
    return boto3.Session(**CREDS).client("sagemaker", endpoint_url=endpoint_url,
                                         config=Config(**config) if config else None)


# --- SageMaker over HTTP ------------------------------------------------------------------

Answer = Callable[[str, dict[str, Any]], dict[str, Any] | None]


class SageMakerServer:
    """A loopback HTTP server speaking SageMaker's awsJson 1.1 from an ``answer``
    function (operation, request) -> wire body, None for an unrecorded call (400).

    ``faults`` maps an operation to a list of (status, error code) returned, in order,
    before the real answers."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.faults: dict[str, list[tuple[int, str]]] = {}
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                op = self.headers.get("X-Amz-Target", "").split(".")[-1]
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                with outer.lock:
                    outer.calls[op] += 1
                    queue = outer.faults.get(op) or []
                    fault = queue.pop(0) if queue else None
                if fault is not None:
                    self._send(fault[0], {"__type": fault[1], "message": "injected fault"})
                    return
                body = outer.answer(op, request)
                if body is None:
                    self._send(400, {"__type": "ValidationException",
                                     "message": f"no recording of {op} {request}"})
                else:
                    self._send(200, body)

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-amzn-RequestId", "00000000-0000-0000-0000-000000000000")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> SageMakerServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def recorded_answer(recordings: Recordings) -> Answer:
    def answer(op: str, request: dict[str, Any]) -> dict[str, Any] | None:
        rec = recordings.by_call.get((op, canonical(request)))
        return None if rec is None else rec["response"]
    return answer


# --- moto --------------------------------------------------------------------------------

_MOTO: dict[str, Any] = {}
_SEEDED: set[tuple[str, str]] = set()
#: the tests' clock: CloudWatch Logs (and moto) take only lines from the last 14 days
NOW = float(int(time.time()) // 60 * 60)


def moto_server() -> str:
    """The URL of the session's moto server, started on first use on loopback."""
    if "url" not in _MOTO:
        from moto.server import ThreadedMotoServer
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        _MOTO.update(server=server, url=f"http://{host}:{port}")
    return str(_MOTO["url"])


def stop_moto() -> None:
    server = _MOTO.pop("server", None)
    _MOTO.pop("url", None)
    _SEEDED.clear()
    if server is not None:
        server.stop()


def aws_client(service: Literal["cloudwatch", "logs"], url: str) -> Any:
    return boto3.Session(**CREDS).client(service, endpoint_url=url)


def put_metrics(url: str, job: str, values: dict[str, list[tuple[float, float]]],
                hosts: dict[str, dict[str, list[tuple[float, float]]]] | None = None) -> None:
    """Metric definition values (dimension TrainingJobName) and host metrics (dimension
    Host = job/algo-N), as SageMaker publishes them."""
    cw = aws_client("cloudwatch", url)
    data = [{"MetricName": name, "Dimensions": [{"Name": "TrainingJobName", "Value": job}],
             "Timestamp": datetime.fromtimestamp(t, UTC), "Value": v}
            for name, points in values.items() for t, v in points]
    data += [{"MetricName": name, "Dimensions": [{"Name": "Host", "Value": f"{job}/{host}"}],
              "Timestamp": datetime.fromtimestamp(t, UTC), "Value": v, "Unit": "Percent"}
             for host, by_name in (hosts or {}).items()
             for name, points in by_name.items() for t, v in points]
    for i in range(0, len(data), 500):
        cw.put_metric_data(Namespace="/aws/sagemaker/TrainingJobs", MetricData=data[i:i + 500])


def put_logs(url: str, stream: str, lines: list[tuple[float, str]]) -> None:
    logs = aws_client("logs", url)
    group = "/aws/sagemaker/TrainingJobs"
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_group(logGroupName=group)
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[
        {"timestamp": int(t * 1000), "message": m} for t, m in lines])


def seed_once(url: str, key: str, fn: Callable[[str], None]) -> None:
    """Load data into moto once per server (tests share it)."""
    if (url, key) not in _SEEDED:
        fn(url)
        _SEEDED.add((url, key))


def adapter_for(replay: ReplayStubber, url: str, **kw: Any) -> SageMakerAdapter:
    """A SageMaker adapter on the recorded answers of ``replay`` and CloudWatch/logs on the
    moto server at ``url``."""
    clients = Clients(sagemaker=replay.client, cloudwatch=aws_client("cloudwatch", url),
                      logs=aws_client("logs", url), region=REGION)
    return SageMakerAdapter(clients, **kw)


def renamed_event(rec: Recordings, stem: str, name: str, **detail: Any) -> dict[str, Any]:
    """The recorded EventBridge event ``stem`` as if of the job ``name`` (its metric
    definitions and resources kept), with ``detail`` fields replaced."""
    event = rec.event(stem)
    d = event["detail"]
    d["TrainingJobName"] = name
    d["TrainingJobArn"] = d["TrainingJobArn"].rsplit("/", 1)[0] + "/" + name
    d.update(detail)
    return event
