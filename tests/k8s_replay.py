"""A small recorded Kubernetes API server for tests.

It serves recorded JSON by method, path and query string over HTTP on a loopback
port (in a thread), so the real ``kubernetes`` client talks to it as to an API
server, and it keeps every request it received (with PATCH and DELETE bodies) for
the test to check. A route may hold several responses, served in turn with the
last one repeated: a 429 then a 200 is how a test throttles the client once.

Anything without a route gets the API server's own 404 ``Status`` body.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

RECORDINGS = Path(__file__).parent / "recordings" / "kubeflow"


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Received:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class Route:
    replies: list[Reply]
    served: int = 0

    def next(self) -> Reply:
        reply = self.replies[min(self.served, len(self.replies) - 1)]
        self.served += 1
        return reply


def status_body(code: int, reason: str, message: str,
                details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``Status`` object the API server answers an error with."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": message, "reason": reason,
                            "code": code}
    if details is not None:
        body["details"] = details
    return body


def _key(method: str, path: str, query: dict[str, str] | None) -> str:
    q = "&".join(f"{k}={v}" for k, v in sorted((query or {}).items()))
    return f"{method.upper()} {path}" + (f"?{q}" if q else "")


@dataclass
class K8sReplay:
    routes: dict[str, Route] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    port: int = 0

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, method: str, path: str, *replies: Reply,
            query: dict[str, str] | None = None) -> None:
        """Serve ``replies`` in turn (the last one repeated) for this request."""
        self.routes[_key(method, path, query)] = Route(list(replies))

    def add_json(self, method: str, path: str, body: Any, status: int = 200,
                 query: dict[str, str] | None = None) -> None:
        self.add(method, path, Reply(status, body), query=query)
        # The API server serves each item of a custom object list at its own path too
        # (the watchdog reads a job again just before stopping it).
        if method == "GET" and status == 200 and path.startswith("/apis/") \
                and isinstance(body, dict) and str(body.get("kind", "")).endswith("List"):
            for item in body.get("items", []):
                name = item.get("metadata", {}).get("name") if isinstance(item, dict) else None
                item_path = f"{path}/{name}"
                if isinstance(name, str) and _key("GET", item_path, None) not in self.routes:
                    self.add("GET", item_path, Reply(200, item))

    def fail_first(self, method: str, path: str, *statuses: int,
                   query: dict[str, str] | None = None, retry_after: str | None = None) -> None:
        """Answer the next requests with these error codes, then as recorded before."""
        key = _key(method, path, query)
        ok = self.routes[key].replies
        headers = (("Retry-After", retry_after),) if retry_after is not None else ()
        faults = [Reply(s, status_body(s, _REASONS.get(s, "InternalError"),
                                       f"injected {s}"), headers) for s in statuses]
        self.routes[key] = Route(faults + ok)

    def load(self, manifest: str = "routes.json") -> None:
        """Load the routes a manifest lists: ``{"GET /path?query": "file.json"}``.

        A namespaced custom object list also serves each of its items at its own path,
        as the API server does (list items carry apiVersion and kind).
        """
        routes: dict[str, str] = json.loads((RECORDINGS / manifest).read_text())
        for key, name in routes.items():
            method, _, target = key.partition(" ")
            parts = urlsplit(target)
            body = json.loads((RECORDINGS / name).read_text())
            self.add_json(method, parts.path, body, query=dict(parse_qsl(parts.query)))
            if method == "GET" and body.get("kind", "").endswith("List") \
                    and parts.path.startswith("/apis/"):
                for item in body.get("items", []):
                    name_ = item.get("metadata", {}).get("name")
                    if isinstance(name_, str):
                        self.add_json("GET", f"{parts.path}/{name_}", item)

    def patches(self) -> list[Received]:
        return [r for r in self.received if r.method in ("PATCH", "DELETE")]

    def count(self, method: str, path: str) -> int:
        return sum(1 for r in self.received if r.method == method and r.path == path)

    def handle(self, method: str, target: str, content_type: str, raw: bytes) -> Reply:
        parts = urlsplit(target)
        query = dict(parse_qsl(parts.query))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.received.append(Received(method, parts.path, query, content_type, body))
        route = self.routes.get(_key(method, parts.path, query))
        if route is None:
            self.unmatched.append(_key(method, parts.path, query))
            return Reply(404, status_body(404, "NotFound",
                                          f"the server could not find the requested resource "
                                          f"({method} {parts.path})"))
        return route.next()


_REASONS = {403: "Forbidden", 404: "NotFound", 429: "TooManyRequests",
            500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


def _handler(replay: K8sReplay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            reply = replay.handle(self.command, self.path,
                                  self.headers.get("Content-Type", ""), raw)
            data = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in reply.headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

    return Handler


@contextmanager
def serve(replay: K8sReplay | None = None) -> Iterator[K8sReplay]:
    """Run ``replay`` on a free loopback port for the duration of the block."""
    replay = replay or K8sReplay()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(replay))
    replay.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield replay
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
