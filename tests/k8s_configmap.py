"""A ConfigMap the recorded API server (``tests.k8s_replay``) keeps, with the API
server's optimistic concurrency: a ``PUT`` must carry the current
``metadata.resourceVersion`` or it gets 409 Conflict, and each accepted write bumps it.

No real API server can run here, so this small stateful route is the boundary for the
ConfigMap store; it speaks the real wire format (the ``kubernetes`` client talks to it
over HTTP) and answers errors with the API server's ``Status`` bodies. ``faults`` queues
error statuses per method (``"GET"``/``"PUT"``), served before the ConfigMap is touched.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from tests.k8s_replay import _REASONS, K8sReplay, Received, Reply, status_body


@dataclass
class ConfigMapReplay(K8sReplay):
    namespace: str = "trainguard"
    name: str = "trainguard-state"
    version: int = 100
    data: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name":
                                                             "trainguard"})
    faults: dict[str, list[int]] = field(default_factory=dict)
    writes: int = 0
    conflicts: int = 0

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def obj(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": str(self.version),
                             "uid": "0b1c2d3e-0000-4000-8000-00000000c0f1",
                             "labels": dict(self.labels)},
                "data": copy.deepcopy(self.data)}

    def handle(self, method: str, target: str, content_type: str, raw: bytes) -> Reply:
        if target.split("?")[0] != self.path:
            return super().handle(method, target, content_type, raw)
        body: Any = json.loads(raw) if raw else {}
        self.received.append(Received(method, self.path, {}, content_type, body))
        queued = self.faults.get(method)
        if queued:
            code = queued.pop(0)
            return Reply(code, status_body(code, _REASONS.get(code, "InternalError"),
                                           f"injected {code}"))
        if method == "GET":
            return Reply(200, self.obj())
        if method != "PUT":
            return Reply(405, status_body(405, "MethodNotAllowed", f"{method} not allowed"))
        sent = str((body.get("metadata") or {}).get("resourceVersion", ""))
        if sent != str(self.version):
            self.conflicts += 1
            return Reply(409, status_body(
                409, "Conflict", f'Operation cannot be fulfilled on configmaps "{self.name}": '
                "the object has been modified; please apply your changes to the latest "
                "version and try again", {"name": self.name, "kind": "configmaps"}))
        if (body.get("metadata") or {}).get("labels") != self.labels:
            return Reply(422, status_body(422, "Invalid", "the store dropped the labels"))
        self.data = dict(body.get("data") or {})
        self.version += 1
        self.writes += 1
        return Reply(200, self.obj())
