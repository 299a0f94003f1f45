"""Azure ML against its recorded responses, replayed over HTTPS on loopback.

The replay server is a ``http.server`` in a thread behind TLS with a certificate made
here for 127.0.0.1 (azure-core will not send a bearer token over plain http to the
compute and MLflow endpoints, and it should not). azure-ai-ml's ``MLClient`` and the
adapter's MLflow reader reach it through their real transports, retry policies and
deserialisers: the adapter's ``endpoint`` option points both at it and ``ca_file`` at
the certificate. Responses come from ``tests/recordings/azureml`` (see its routes.json);
every request is recorded, and ``fail`` queues faults (429, 5xx) ahead of a route.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from azure.core.credentials import AccessToken
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.contract import ContractCase, case
from trainguard.adapters.azureml import AzureMLAdapter, from_options

RECORDINGS = Path(__file__).resolve().parents[1] / "recordings" / "azureml"
SUBSCRIPTION, GROUP, WORKSPACE = (
    "00000000-0000-0000-0000-000000000000", "rg-training", "ws-research")
ARM_HOST = "https://management.azure.com"
#: When the recordings' MLflow runs had been going for an hour (epoch seconds).
NOW = 1_750_003_600.0
RUNNING = {"bright_river_4k2m9x7q1z", "quiet_harbor_8w3n5c2v6b", "sleepy_owl_2p7d4k9m3x"}


class StaticToken:
    """A credential with a fixed token: the replay server checks only that one is sent."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("replay-token", int(time.time()) + 3600)


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    authorization: str | None


@dataclass
class Replay:
    """What the server serves and what it saw."""

    base: str = ""
    ca_file: str = ""
    routes: list[dict[str, Any]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    faults: list[tuple[str, str, int, dict[str, str]]] = field(default_factory=list)
    overrides: dict[tuple[str, str], tuple[int, bytes]] = field(default_factory=dict)

    def fail(self, method: str, path_part: str, status: int,
             headers: dict[str, str] | None = None, times: int = 1) -> None:
        """Answer the next ``times`` requests whose path contains ``path_part`` with
        ``status`` (then the recording)."""
        self.faults += [(method, path_part, status, headers or {})] * times

    def override(self, method: str, path_part: str, status: int, body: Any) -> None:
        """Always answer requests whose path contains ``path_part`` with ``body``."""
        self.overrides[(method, path_part)] = (status, json.dumps(body).encode())

    def calls(self, method: str, path_part: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and path_part in s.path]

    def answer(self, method: str, path: str, query: dict[str, str]
               ) -> tuple[int, dict[str, str], bytes]:
        for i, (m, part, status, headers) in enumerate(self.faults):
            if m == method and part in path:
                del self.faults[i]
                return status, headers, json.dumps({"error": {
                    "code": "TooManyRequests" if status == 429 else "InternalServerError",
                    "message": "injected by the test"}}).encode()
        for (m, part), (status, body) in self.overrides.items():
            if m == method and part in path:
                return status, {}, body
        best: dict[str, Any] | None = None
        for r in self.routes:
            want = r.get("query", {})
            if (r["method"] == method and r["path"] == path
                    and all(query.get(k) == v for k, v in want.items())
                    and (best is None or len(want) > len(best.get("query", {})))):
                best = r
        if best is None:
            return 404, {}, json.dumps({"error": {"code": "NotFound",
                                                  "message": f"no recording for {path}"}}).encode()
        body = b""
        if "body" in best:
            text = (RECORDINGS / best["body"]).read_text().replace(ARM_HOST, self.base)
            body = text.encode()
        headers = {k: v.replace(ARM_HOST, self.base) for k, v in best.get("headers", {}).items()}
        return best.get("status", 200), headers, body


def _certificate(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "replay-cert.pem", folder / "replay-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def _load_routes() -> list[dict[str, Any]]:
    doc = json.loads((RECORDINGS / "routes.json").read_text())
    routes = []
    for r in doc["routes"]:
        path = r["path"]
        for k, v in doc["vars"].items():
            path = path.replace("${" + k + "}", v)
        routes.append({**r, "path": path})
    return routes


def serve(folder: Path) -> Generator[Replay, None, None]:
    """Run the replay server until the generator is closed."""
    replay = Replay(routes=_load_routes())

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            url = urlsplit(self.path)
            query = dict(parse_qsl(url.query))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            replay.seen.append(Seen(self.command, url.path, query,
                                    self.headers.get("Authorization")))
            status, headers, body = replay.answer(self.command, url.path, query)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if body:
                self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    cert, key = _certificate(folder)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    replay.base, replay.ca_file = f"https://127.0.0.1:{server.server_address[1]}", str(cert)
    try:
        yield replay
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def adapter_for(replay: Replay, **opts: str) -> AzureMLAdapter:
    options = {"subscription": SUBSCRIPTION, "resource_group": GROUP, "workspace": WORKSPACE,
               "endpoint": replay.base, "ca_file": replay.ca_file, "retries": "3",
               "backoff": "0.01", **opts}
    return from_options(options, credential=StaticToken())


def start(request: pytest.FixtureRequest) -> Replay:
    """A replay server for one test, stopped when it ends."""
    # azure-ai-ml writes the cloud it was given to AZUREML_CURRENT_CLOUD: restore it after.
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.delenv("AZUREML_CURRENT_CLOUD", raising=False)
    running = serve(request.getfixturevalue("tmp_path"))
    replay = next(running)
    request.addfinalizer(running.close)
    return replay


@case("azureml")
def make(request: pytest.FixtureRequest) -> ContractCase:
    replay = start(request)
    adapter = adapter_for(replay)

    def cancelled() -> list[str]:
        return [s.path.rsplit("/", 2)[-2] for s in replay.calls("POST", "/cancel")]

    return ContractCase(adapter=adapter, now=NOW, running=RUNNING,
                        with_metrics="bright_river_4k2m9x7q1z", metric="loss",
                        unknown_state="odd_sparrow_5t2b9k1w8q", unknown_raw="Hibernating",
                        broken="broken_kite_3x8v1n6m4c", stops=cancelled)
