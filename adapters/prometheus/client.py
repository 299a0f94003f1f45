"""The Prometheus HTTP API over plain ``urllib``: instant and range queries, retried on
throttling and server errors, with a timeout on every call.

A heavy client library would add nothing here: the API is two GET endpoints returning
JSON (https://prometheus.io/docs/prometheus/latest/querying/api/).
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainguard.adapters.safe_http import opener, require_https

log = logging.getLogger("trainguard.adapters.prometheus")

#: Prometheus refuses a range query that would return more than 11,000 points a series.
MAX_POINTS = 11_000
#: Statuses worth a retry: throttled, or the server (or a proxy before it) failing.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class PrometheusError(Exception):
    """A query Prometheus refused or could not answer; the message says which and why."""


@dataclass(frozen=True)
class RawSeries:
    """One series of a query result: its labels and its (time, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


def step_for(start: float, end: float, min_step: float = 1.0,
             max_points: int = MAX_POINTS) -> float:
    """The finest step (seconds, whole milliseconds) at or above ``min_step`` that keeps a
    range query within ``max_points`` points a series."""
    span = max(end - start, 0.0)
    needed = math.ceil(span / (max_points - 1) * 1000) / 1000  # both ends count
    return max(min_step, needed, 0.001)


@dataclass
class PromClient:
    """``base_url`` is the server root (``http://prometheus:9090``, or a Thanos querier).

    With ``tenancy`` every query names the job's namespace (``?namespace=NS``), as the
    Thanos querier's tenancy port (9092 on OpenShift) requires: the server then answers
    from that namespace only, whatever the expression says. A client that sends a token
    (``headers`` with Authorization) needs an https URL, and no client follows redirects.
    """

    base_url: str
    timeout: float = 30.0
    retries: int = 4  # attempts after the first
    backoff: float = 0.5  # seconds, doubled each retry
    headers: dict[str, str] = field(default_factory=dict)
    ssl_context: ssl.SSLContext | None = None  # e.g. one trusting the cluster's CA
    sleep: Callable[[float], None] = time.sleep
    calls: int = 0  # HTTP requests made, retries included: for tests and benchmarks
    tenancy: bool = False
    _opener: urllib.request.OpenerDirector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_https(self.base_url, self.headers, "prometheus")
        self._opener = opener(self.ssl_context)

    def query(self, expr: str, at: float | None = None,
              namespace: str | None = None) -> list[RawSeries]:
        """An instant query: one point per series, at ``at`` (default: the server's now)."""
        params = {"query": expr} | ({"time": _ts(at)} if at is not None else {})
        data = self._get("/api/v1/query", self._scoped(params, namespace), expr)
        kind, result = data.get("resultType"), data.get("result") or []
        if kind == "vector":
            return [RawSeries(_labels(r), [_point(r.get("value"), expr)]) for r in result]
        if kind == "matrix":
            return [RawSeries(_labels(r), [_point(v, expr) for v in r.get("values", [])])
                    for r in result]
        if kind == "scalar":
            return [RawSeries({}, [_point(result, expr)])]
        raise PrometheusError(f"query {expr!r}: unexpected result type {kind!r}")

    def query_range(self, expr: str, start: float, end: float,
                    step: float | None = None, namespace: str | None = None,
                    ) -> list[RawSeries]:
        """A range query from ``start`` to ``end``; ``step`` defaults to the finest that
        stays within Prometheus's 11,000 points a series."""
        step = step if step is not None else step_for(start, end)
        params = {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)}
        data = self._get("/api/v1/query_range", self._scoped(params, namespace), expr)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"query {expr!r}: expected a matrix, got "
                                  f"{data.get('resultType')!r}")
        return [RawSeries(_labels(r), [_point(v, expr) for v in r.get("values", [])])
                for r in data.get("result", [])]

    def _scoped(self, params: dict[str, str], namespace: str | None) -> dict[str, str]:
        if not self.tenancy:
            return params
        if not namespace:
            raise PrometheusError(f"{self.base_url} is a tenancy endpoint: a query must "
                                  "name its namespace (give the source a namespace)")
        return params | {"namespace": namespace}

    def _get(self, path: str, params: dict[str, str], expr: str) -> dict[str, Any]:
        url = f"{self.base_url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        request = urllib.request.Request(url, headers={"Accept": "application/json",
                                                       **self.headers})
        delay = self.backoff
        for attempt in range(self.retries + 1):
            self.calls += 1
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    return _payload(response.read(), expr)
            except urllib.error.HTTPError as e:
                body = e.read()
                if 300 <= e.code < 400:  # never followed: the token stays with this server
                    raise PrometheusError(
                        f"query {expr!r}: HTTP {e.code} from {self.base_url}: redirect to "
                        f"{e.headers.get('Location')!r} not followed (point url at the "
                        "server itself)") from e
                if e.code not in RETRY_STATUSES or attempt == self.retries:
                    # 400 (bad expression) and 422 (cannot execute) carry Prometheus's reason
                    raise PrometheusError(f"query {expr!r}: HTTP {e.code} from {self.base_url}: "
                                          f"{_reason(body)}") from e
                wait = _retry_after(e.headers.get("Retry-After"), delay)
                log.warning("prometheus %s: HTTP %d, retrying in %.1fs", self.base_url,
                            e.code, wait)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if attempt == self.retries:
                    raise PrometheusError(f"query {expr!r}: cannot reach {self.base_url}: "
                                          f"{getattr(e, 'reason', e)}") from e
                wait = delay
                log.warning("prometheus %s: %s, retrying in %.1fs", self.base_url, e, wait)
            self.sleep(wait)
            delay *= 2
        raise AssertionError("unreachable")  # the loop returns or raises


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _payload(raw: bytes, expr: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise PrometheusError(f"query {expr!r}: response is not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise PrometheusError(f"query {expr!r}: {_reason(raw)}")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise PrometheusError(f"query {expr!r}: response has no 'data' object")
    return data


def _reason(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        return f"{doc.get('errorType', 'error')}: {doc.get('error', raw[:200].decode())}"
    except ValueError:
        return raw[:200].decode(errors="replace") or "(empty body)"


def _retry_after(header: str | None, default: float) -> float:
    try:
        return min(float(header), 60.0) if header else default
    except ValueError:
        return default


def _labels(result: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (result.get("metric") or {}).items()}


def _point(pair: Any, expr: str) -> tuple[float, float]:
    # Prometheus writes values as strings ("1.5", "NaN", "+Inf") beside float timestamps.
    try:
        t, v = pair
        return float(t), float(v)
    except (TypeError, ValueError) as e:
        raise PrometheusError(f"query {expr!r}: malformed sample {pair!r}") from e
