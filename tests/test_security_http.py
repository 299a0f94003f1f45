"""Attack: the ServiceAccount token leaves home (issue 16, finding 4).

The token the CronJob sends to Prometheus and Alertmanager can patch every PyTorchJob
and TrainJob in the watched namespaces. A server (or whoever answers for it) replying
``302 Location: http://elsewhere/`` used to get urllib to carry the ``Authorization``
header to the new host; a plain-http URL sent it in the clear. Both now fail. The
servers are loopback HTTPS/HTTP servers in this file (a self-signed certificate made by
``openssl``): the boundary is the redirect itself, which no Prometheus here would send.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trainguard.adapters.prometheus import PromClient, PrometheusError, client_from_options
from trainguard.checker.model import Finding, Job, Severity
from trainguard.lambdas.k8s.sinks import AlertmanagerError, AlertmanagerSink
from trainguard.lambdas.state import FindingMemory
from trainguard.lambdas.tick import AlarmEvent

TOKEN = "sa-token-that-can-suspend-jobs"


@dataclass
class Seen:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, auth


@contextmanager
def server(status: int, headers: dict[str, str], body: bytes = b"",
           tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, Seen]]:
    seen = Seen()

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.requests.append((self.command, self.path, self.headers.get("Authorization")))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    scheme = "https" if tls else "http"
    try:
        yield f"{scheme}://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ssl.SSLContext]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed (Debian package openssl)")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "cert.pem", d / "key.pem")
    return d / "cert.pem", ctx


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def event() -> AlarmEvent:
    f = Finding("ml/pytorchjob/bert", "stall", Severity.CRITICAL, "no progress")
    fm = FindingMemory(f.key, "stall", "critical", f.message, 0.0, 0.0)
    return AlarmEvent("raise", f, Job(id="ml/pytorchjob/bert", provider="kubeflow"),
                      "kubeflow", "kubeflow:kubeflow:lab/ml:ml/pytorchjob/bert", 0.0, 0.0, 1, fm)


# --- Prometheus -----------------------------------------------------------------------


def test_a_redirect_never_carries_the_prometheus_token(
        cert: tuple[Path, ssl.SSLContext], token_file: Path) -> None:
    ca, tls = cert
    with server(200, {}, b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                ) as (elsewhere, collected), \
            server(302, {"Location": f"{elsewhere}/api/v1/query"}, tls=tls) as (url, seen):
        client = client_from_options({"url": url, "token_file": str(token_file),
                                       "ca_file": str(ca), "retries": "0"})
        with pytest.raises(PrometheusError, match=r"redirect .* not followed"):
            client.query("up")
    assert [auth for _, _, auth in seen.requests] == [f"Bearer {TOKEN}"]  # the server itself
    assert collected.requests == []  # before the fix: GET with the token, in the clear


def test_a_token_is_never_sent_over_plain_http(token_file: Path) -> None:
    with pytest.raises(ValueError, match="only ever sent over https"):
        client_from_options({"url": "http://prometheus:9090", "token_file": str(token_file)})


def test_the_tenancy_endpoint_gets_the_jobs_namespace(cert: tuple[Path, ssl.SSLContext]) -> None:
    ca, tls = cert
    body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    with server(200, {}, body, tls=tls) as (url, seen):
        client = PromClient(url, retries=0, tenancy=True,
                            ssl_context=ssl.create_default_context(cafile=str(ca)))
        client.query("up", namespace="team-a")
        with pytest.raises(PrometheusError, match="must name its namespace"):
            client.query("up")
    ((_, path, _),) = seen.requests
    assert "namespace=team-a" in path


# --- Alertmanager ---------------------------------------------------------------------


def test_a_redirect_never_carries_the_alertmanager_token(
        cert: tuple[Path, ssl.SSLContext], token_file: Path) -> None:
    ca, tls = cert
    with server(200, {}) as (elsewhere, collected), \
            server(302, {"Location": f"{elsewhere}/api/v2/alerts"}, tls=tls) as (url, seen):
        sink = AlertmanagerSink(url, dry_run=True, token_file=str(token_file),
                                ca_file=str(ca), retries=0)
        with pytest.raises(AlertmanagerError, match="not followed"):
            sink.send(event())
    assert len(seen.requests) == 1 and collected.requests == []


def test_the_alertmanager_token_is_never_sent_over_plain_http(token_file: Path) -> None:
    with pytest.raises(ValueError, match="only ever sent over https"):
        AlertmanagerSink("http://alertmanager:9093", dry_run=True, token_file=str(token_file))


def test_without_a_token_plain_http_still_works() -> None:
    with server(200, {}) as (url, seen):
        AlertmanagerSink(url, dry_run=True, retries=0).send(event())
    assert [(m, p) for m, p, _ in seen.requests] == [("POST", "/api/v2/alerts")]
