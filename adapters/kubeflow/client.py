"""The Kubernetes API calls the adapter makes, as plain JSON, retried with backoff.

Retries live on the client's urllib3 pool (``Configuration.retries``): throttling
(429, honouring Retry-After) and server errors are retried for reads and for the
idempotent stop calls (a merge patch that sets ``suspend``, a delete).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from urllib3.util.retry import Retry

from trainguard.adapters.kubeflow.kinds import Kind

RETRY_STATUSES = (429, 500, 502, 503, 504)
PAGE = 500


def retry_policy(attempts: int = 5, backoff: float = 0.5) -> Retry:
    return Retry(total=attempts, connect=attempts, read=attempts, status=attempts,
                 backoff_factor=backoff, backoff_max=30.0,
                 status_forcelist=RETRY_STATUSES,
                 allowed_methods=frozenset({"GET", "PATCH", "DELETE"}),
                 respect_retry_after_header=True,
                 raise_on_status=False)  # the last answer reaches the client as an ApiException


def api_client(configuration: client.Configuration, retry: Retry | None = None) -> client.ApiClient:
    configuration.retries = retry if retry is not None else retry_policy()
    return client.ApiClient(configuration)


def describe(e: Exception) -> str:
    """An API error as ``403 Forbidden: <the API server's message>``."""
    if isinstance(e, client.ApiException):
        message = ""
        try:
            message = json.loads(e.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            message = str(e.body or "")[:200]
        return f"{e.status} {e.reason}" + (f": {message}" if message else "")
    return f"{type(e).__name__}: {e}"


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def list_objects(self, kind: Kind, namespace: str | None) -> list[Any]:
        """Every object of ``kind`` in ``namespace`` (None: all namespaces), every page."""
        if namespace is None:
            return _every_page(lambda extra: self.custom.list_cluster_custom_object(
                kind.group, kind.version, kind.plural, **extra))
        return _every_page(lambda extra: self.custom.list_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, **extra))

    def get_object(self, kind: Kind, namespace: str, name: str) -> Any:
        return self.custom.get_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name)

    def list_pods(self, namespace: str, selector: str) -> list[Any]:
        def fetch(extra: dict[str, Any]) -> Any:
            # raw JSON: the same plain dicts as the custom objects, no model round trip
            resp: Any = self.core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False, **extra)
            return json.loads(resp.data)

        return _every_page(fetch)

    def list_namespaces(self) -> list[str]:
        resp: Any = self.core.list_namespace(_preload_content=False)
        return [str(n["metadata"]["name"]) for n in _items(json.loads(resp.data))]

    def patch(self, kind: Kind, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name, body,
            _content_type="application/merge-patch+json")  # CRDs take no strategic merge

    def delete(self, kind: Kind, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name,
            propagation_policy="Background")


def _items(page: Any) -> list[Any]:
    items = page.get("items") if isinstance(page, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"a list response without items: {str(page)[:120]}")
    return items


def _every_page(fetch: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """The items of every page of a Kubernetes list call, following ``continue``."""
    items: list[Any] = []
    token: str | None = None
    while True:
        extra: dict[str, Any] = {"limit": PAGE}
        if token:
            extra["_continue"] = token
        page = fetch(extra)
        items += _items(page)
        token = (page.get("metadata") or {}).get("continue") if isinstance(page, dict) else None
        if not token:
            return items
