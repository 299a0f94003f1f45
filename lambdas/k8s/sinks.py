"""Where the CronJob's tick reports: alarms to Alertmanager, its own metrics to a
Pushgateway.

``AlertmanagerSink`` posts each alarm event to Alertmanager's v2 API
(``POST /api/v2/alerts``). An alert's labels are its identity, so they are built from the
job key and the finding alone (never from what this tick happened to read), and a
resolve posts the same labels with ``endsAt`` set. Alertmanager ends an alert by itself
once ``endsAt`` passes, so a firing alert carries an ``endsAt`` just past the next
reminder, and the tick's reminders post it again: if the watchdog stops running, its
alerts end instead of firing forever (the ``trainguard_last_tick_timestamp_seconds``
metric is what tells that the watchdog itself stopped).

``push_tick_metrics`` pushes the tick's own metrics with prometheus-client.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from trainguard.adapters.safe_http import opener, require_https
from trainguard.checker.model import Severity
from trainguard.lambdas import plugins
from trainguard.lambdas.message import chat_text, render
from trainguard.lambdas.tick import REMIND_EVERY_S, AlarmEvent, TickReport

log = logging.getLogger("trainguard.k8s")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: a firing alert ends this long after the next reminder is due unless posted again
GRACE_S = 1800.0


class AlertmanagerError(RuntimeError):
    """Alertmanager refused or did not answer; the message says which and why."""


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parts(job_key: str) -> tuple[str, str]:
    """(namespace, job name) from a job key ``SOURCE:PROVIDER:SCOPE:ID``; a Kubeflow id is
    ``NAMESPACE/KIND/NAME`` and its scope ``CLUSTER/NAMESPACE``."""
    head, _, job_id = job_key.rpartition(":")
    scope = head.split(":", 2)[-1] if head.count(":") >= 2 else ""
    namespace = scope.rsplit("/", 1)[-1] if "/" in scope else ""
    return namespace, job_id.rsplit("/", 1)[-1]


def alert_labels(event: AlarmEvent, severity: str | None = None,
                 extra: dict[str, str] | None = None) -> dict[str, str]:
    m = event.memory
    namespace, job = _parts(event.job_key)
    labels = {
        "alertname": "Trainguard" + "".join(w.title() for w in m.rule.split("_")),
        "rule": m.rule,
        "trainguard_rule": m.rule,  # what the stack's AlertmanagerConfig routes on
        "severity": severity or m.severity,
        "job": job,
        "job_id": event.job_key.rpartition(":")[2],
        "source": event.source,
        **(extra or {}),
    }
    if namespace:
        labels["namespace"] = namespace
    return labels


@plugins.sinks.register("alertmanager")
class AlertmanagerSink:
    def __init__(self, url: str, dry_run: bool, expire_after_s: float = REMIND_EVERY_S + GRACE_S,
                 labels: dict[str, str] | None = None, timeout: float = 10.0,
                 retries: int = 3, backoff: float = 0.5, token_file: str | None = None,
                 ca_file: str | None = None) -> None:
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.dry_run = dry_run
        self.expire_after_s = expire_after_s
        self.labels = dict(labels or {})
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.headers = {"Content-Type": "application/json"}
        if token_file:
            try:
                token = Path(token_file).read_text().strip()
            except OSError as e:
                raise ValueError(f"alertmanager token file {token_file}: {e}") from e
            self.headers["Authorization"] = f"Bearer {token}"
        # The token can suspend jobs: https only, and no redirect may carry it elsewhere.
        require_https(self.url, self.headers, "alertmanager")
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._opener = opener(self.context)
        self.posted: list[dict[str, Any]] = []  # every alert posted, for the run's summary
        self.failed: list[AlarmEvent] = []  # events Alertmanager did not take

    def alerts(self, event: AlarmEvent) -> list[dict[str, Any]]:
        """The alerts one event posts: the alert itself (firing, or ended on a resolve),
        and, when a finding got worse, the end of its alerts at lower severities."""
        msg = render(event, self.dry_run)
        # Alertmanager's Slack and Teams receivers put annotations into markup unescaped.
        annotations = {"summary": chat_text(msg.subject), "description": chat_text(msg.text)}
        for key in ("action", "burnt_usd", "projected_usd", "console_url", "what"):
            if msg.fields.get(key):
                annotations[key] = chat_text(msg.fields[key])
        # Alertmanager ignores an end still in its future when the alert fires with a later
        # one: an end is put at least a minute in the past (clocks drift) but never before
        # the alert started.
        ended = max(event.first_seen, min(event.time, time.time()) - 60.0)
        resolve = event.kind == "resolve"
        alert: dict[str, Any] = {
            "labels": alert_labels(event, extra=self.labels), "annotations": annotations,
            "startsAt": _rfc3339(event.first_seen),
            "endsAt": _rfc3339(ended if resolve else event.time + self.expire_after_s)}
        if event.job is not None and event.job.console_url:
            alert["generatorURL"] = event.job.console_url
        out = [alert]
        if event.kind == "raise" and event.ticks > 1:
            rank = Severity(event.memory.severity).rank
            for lower in (s for s in Severity if s.rank < rank):
                out.append({"labels": alert_labels(event, lower.value, self.labels),
                            "annotations": annotations, "startsAt": _rfc3339(event.first_seen),
                            "endsAt": _rfc3339(ended)})
        return out

    def send(self, event: AlarmEvent) -> None:
        alerts = self.alerts(event)
        try:
            self._post(alerts)
        except AlertmanagerError:
            self.failed.append(event)
            raise
        self.posted.extend(alerts)

    def _post(self, alerts: list[dict[str, Any]]) -> None:
        body = json.dumps(alerts).encode()
        delay = self.backoff
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url, data=body, headers=self.headers,
                                             method="POST")
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    response.read()
                    return
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode(errors="replace")
                if 300 <= e.code < 400:
                    detail = f"redirect to {e.headers.get('Location')!r} not followed"
                if e.code not in RETRY_STATUSES or attempt == self.retries:
                    raise AlertmanagerError(f"POST {self.url}: HTTP {e.code}: {detail}") from e
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if attempt == self.retries:
                    raise AlertmanagerError(f"POST {self.url}: cannot reach Alertmanager: "
                                            f"{getattr(e, 'reason', e)}") from e
            log.warning("alertmanager %s: attempt %d failed, retrying in %.1fs", self.url,
                        attempt + 1, delay)
            time.sleep(delay)
            delay *= 2


class PushError(RuntimeError):
    """The Pushgateway refused the watchdog's metrics or did not answer."""


def tick_registry(report: TickReport, seconds: float, finished: float) -> CollectorRegistry:
    """The tick's own metrics: findings by rule and severity, jobs listed per source, how
    long the tick took and when it ended."""
    registry = CollectorRegistry()
    findings = Gauge("trainguard_findings", "findings in the last tick",
                     ["rule", "severity"], registry=registry)
    for (rule, severity), n in Counter((f.rule, f.severity.value)
                                       for f in report.findings).items():
        findings.labels(rule, severity).set(n)
    jobs = Gauge("trainguard_jobs", "jobs listed in the last tick", ["source"],
                 registry=registry)
    for source, n in report.jobs.items():
        jobs.labels(source).set(n)
    errors = Gauge("trainguard_tick_errors", "errors in the last tick", ["kind"],
                   registry=registry)
    errors.labels("source").set(len(report.source_errors))
    errors.labels("sink").set(len(report.sink_errors))
    stops = Gauge("trainguard_stops", "stops (or, dry run, would-be stops) in the last tick",
                  ["dry_run"], registry=registry)
    for a in report.stops:
        stops.labels(str(a.dry_run).lower()).inc()
    Gauge("trainguard_tick_seconds", "how long the last tick took",
          registry=registry).set(seconds)
    # the fleet at a glance (lambdas/fleet.py), what the dashboards draw
    Gauge("trainguard_spend_usd_per_hour", "hourly cost of the running jobs",
          registry=registry).set(report.fleet.burn_usd_per_hour)
    verdicts = Gauge("trainguard_jobs_by_verdict", "jobs per verdict in the last tick",
                     ["verdict"], registry=registry)
    for name, n in report.fleet.verdicts.items():
        verdicts.labels(name).set(n)
    dry = str(bool(report.stops) and all(a.dry_run for a in report.stops)).lower()
    Gauge("trainguard_saved_usd", "projected spend the last tick's stops kept from being "
          "spent (dry run: would have)", ["dry_run"], registry=registry
          ).labels(dry).set(report.fleet.saved_usd)
    Gauge("trainguard_last_tick_timestamp_seconds", "when the last tick ended",
          registry=registry).set(finished)
    return registry


def push_tick_metrics(gateway: str, report: TickReport, seconds: float, finished: float,
                      grouping: dict[str, str] | None = None, timeout: float = 10.0) -> None:
    """Replace the watchdog's group on the Pushgateway (``job="trainguard"``) with this
    tick's metrics, so a rule or severity no longer found is no longer reported."""
    try:
        push_to_gateway(gateway, job="trainguard", registry=tick_registry(report, seconds,
                                                                           finished),
                        grouping_key=grouping or {}, timeout=timeout)
    except Exception as e:
        raise PushError(f"Pushgateway {gateway}: {type(e).__name__}: {e}") from e


@plugins.sinks.register("pushgateway")
class PushgatewaySink:
    """The tick's own metrics to a Pushgateway (``push_tick_metrics``), each tick's push
    replacing the last: what resolved is gone from the next push."""

    def __init__(self, url: str, grouping: dict[str, str] | None = None,
                 timeout: float = 10.0) -> None:
        self.url, self.grouping, self.timeout = url, dict(grouping or {}), timeout

    def publish(self, report: TickReport, seconds: float, finished: float) -> None:
        push_tick_metrics(self.url, report, seconds, finished, self.grouping, self.timeout)
