"""Where the Azure Function's findings go.

- ``FindingsMetrics``: after each tick, one Azure Monitor custom metric, namespace
  ``trainguard``, metric ``Findings``, dimensions ``rule`` and ``severity``: per pair, the
  number of findings the policy acts on (notify or stop) open this tick, 0 for a pair
  whose findings resolved this tick, and 0 for every other pair the policy acts on
  (``watched``, from ``acted_pairs``): each tick says every watched series, so a post the
  endpoint refused (a resolve among it) is made good by the next tick's. Posted to the
  custom metrics REST API (``POST https://{region}.monitoring.azure.com{resourceId}/metrics``)
  with a token for ``https://monitoring.azure.com/``; the stacks' metric alerts
  (``Maximum > 0``) send the Action Group's email and webhooks from it.
- ``WebhookSink``: an ``AlarmSink`` posting each alarm event at or above a severity to one
  URL as JSON, with the message a person reads (``lambdas.message``) in ``text`` (the field
  Slack and Teams incoming webhooks show).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from azure.core import PipelineClient
from azure.core.credentials import TokenCredential
from azure.core.pipeline.policies import (
    BearerTokenCredentialPolicy,
    HeadersPolicy,
    RetryPolicy,
    UserAgentPolicy,
)
from azure.core.rest import HttpRequest

from trainguard.checker.model import Action, Severity
from trainguard.checker.policy import Policy
from trainguard.lambdas import plugins
from trainguard.lambdas.message import chat_text, render
from trainguard.lambdas.tick import AlarmEvent, TickReport

METRIC_NAMESPACE = "trainguard"
METRIC_NAME = "Findings"
DIMENSIONS = ("rule", "severity")
#: The token audience must be exactly ``https://monitoring.azure.com/`` (trailing slash):
#: the double slash before ``.default`` keeps it.
MONITOR_SCOPE = "https://monitoring.azure.com//.default"


class SinkError(RuntimeError):
    """An endpoint refused what was sent (after retries)."""


def _pipeline(base: str, policies: list[Any], retries: int, backoff: float,
              verify: bool | str) -> PipelineClient[Any, Any]:
    return PipelineClient(base, policies=[
        HeadersPolicy({"Content-Type": "application/json"}), UserAgentPolicy("trainguard"),
        RetryPolicy(retry_total=retries, retry_backoff_factor=backoff, retry_backoff_max=30.0),
        *policies], connection_verify=verify)


def _post(client: PipelineClient[Any, Any], url: str, body: dict[str, Any],
          what: str, timeout: float) -> None:
    response = client.send_request(HttpRequest("POST", url, json=body),
                                   connection_timeout=timeout, read_timeout=timeout)
    if response.status_code >= 300:  # after the retry policy gave up
        text = " ".join(response.text().split())[:300]
        raise SinkError(f"{what}: HTTP {response.status_code}: {text}")


def acted_pairs(policy: Policy) -> list[tuple[str, str]]:
    """Every (rule, severity) the policy notifies or stops on: the series the stacks'
    metric alerts watch."""
    from trainguard.checker.registry import rule_names

    return [(r, s.value) for r in rule_names() for s in (Severity.CRITICAL, Severity.WARNING)
            if policy.rule(r).enabled
            and policy.rule(r).actions.get(s, Action.NONE) is not Action.NONE]


def metric_document(report: TickReport, watched: Iterable[tuple[str, str]] = (),
                    ) -> dict[str, Any] | None:
    """The custom-metric body for one tick, or None when there is nothing to say."""
    counts = Counter((f.rule, f.severity.value) for f in report.findings
                     if f.action is not Action.NONE)
    for e in report.events:  # resolved pairs drop to 0 so their alert clears promptly
        if e.kind == "resolve":
            counts.setdefault((e.memory.rule, e.memory.severity), 0)
    for pair in watched:  # and so does one whose resolve an earlier post could not say
        counts.setdefault(pair, 0)
    if not counts:
        return None
    when = dt.datetime.fromtimestamp(report.time, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # One sample per tick and pair: min = max = sum = the count, count = 1 sample.
    series = [{"dimValues": [rule, severity], "min": n, "max": n, "sum": n, "count": 1}
              for (rule, severity), n in sorted(counts.items())]
    return {"time": when, "data": {"baseData": {
        "metric": METRIC_NAME, "namespace": METRIC_NAMESPACE,
        "dimNames": list(DIMENSIONS), "series": series}}}


@plugins.sinks.register("azure_metrics")
class FindingsMetrics:
    """Publishes a tick's findings as the ``trainguard/Findings`` custom metric."""

    def __init__(self, resource_id: str, region: str, credential: TokenCredential, *,
                 endpoint: str | None = None, ca_file: str | None = None, retries: int = 3,
                 backoff: float = 0.8, timeout: float = 20.0,
                 watched: Iterable[tuple[str, str]] = ()) -> None:
        """``resource_id`` is the resource the metric belongs to (the metric alerts' scope,
        e.g. the Application Insights component); ``endpoint`` replaces
        ``https://{region}.monitoring.azure.com`` (tests, proxies); ``watched``: the
        (rule, severity) pairs said on every tick, 0 when none is open
        (``acted_pairs(policy)``)."""
        self.watched = list(watched)
        if not resource_id.startswith("/subscriptions/"):
            raise ValueError(f"metrics resource id {resource_id!r} must be a full Azure "
                             "resource id (/subscriptions/.../providers/...)")
        if not endpoint and not region:
            raise ValueError("metrics region is required (the resource's Azure region, "
                             "e.g. westeurope)")
        base = (endpoint or f"https://{region.lower()}.monitoring.azure.com").rstrip("/")
        self.url = f"{base}{resource_id.rstrip('/')}/metrics"
        self.timeout = timeout
        self._client = _pipeline(base, [BearerTokenCredentialPolicy(credential, MONITOR_SCOPE)],
                                 retries, backoff, ca_file or True)

    def publish(self, report: TickReport) -> dict[str, Any] | None:
        """Post the tick's metric; returns what was sent (None: nothing to send)."""
        body = metric_document(report, self.watched)
        if body is not None:
            _post(self._client, self.url, body, f"custom metric {self.url}", self.timeout)
        return body


@plugins.sinks.register("webhook")
class WebhookSink:
    """Posts alarm events to a webhook: ``text`` (the readable message), ``subject``,
    ``fields`` and the raw ``event``."""

    def __init__(self, url: str, dry_run: bool, min_severity: str = "critical", *,
                 ca_file: str | None = None, retries: int = 2, backoff: float = 0.8,
                 timeout: float = 10.0) -> None:
        if not url.lower().startswith(("https://", "http://")):
            raise ValueError(f"webhook URL must be http(s), got {url[:40]!r}")
        try:
            self.min_rank = Severity(min_severity).rank
        except ValueError:
            raise ValueError(f"webhook minimum severity {min_severity!r} is not one of "
                             f"{', '.join(s.value for s in Severity)}") from None
        self.url, self.dry_run, self.timeout = url, dry_run, timeout
        self._client = _pipeline(url, [], retries, backoff, ca_file or True)

    def send(self, event: AlarmEvent) -> None:
        if Severity(event.memory.severity).rank < self.min_rank:
            return
        message = render(event, self.dry_run)
        # Slack and Teams read ``text`` as markup: a job's own words must stay words. The
        # fields are data for programs: one line each (lambdas.message), not escaped.
        body = {"text": chat_text(f"{message.subject}\n\n{message.text}"),
                "subject": chat_text(message.subject), "fields": message.fields,
                "event": _plain(event.to_dict())}
        _post(self._client, self.url, body, "webhook", self.timeout)


def _plain(value: Any) -> Any:
    """``value`` as strict JSON: NaN and infinities (a diverged loss) become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if hasattr(value, "item"):  # a numpy scalar
        return _plain(value.item())
    return str(value)
