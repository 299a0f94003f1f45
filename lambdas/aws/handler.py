"""The AWS Lambda entry point: ``lambdas.aws.handler`` (or ``lambdas.aws.handler.handler``).

One function, routed by the event's shape (``ROUTES``):

* EventBridge "Scheduled Event": a full tick over SageMaker (``adapters.sagemaker``),
  state in DynamoDB, findings as EMF metrics, new critical findings to SNS. Events and
  log lines left by the invocations below are folded in first.
* EventBridge "SageMaker Training Job State Change": the event is kept (newest by
  LastModifiedTime) so the next tick skips DescribeTrainingJob for that job; a terminal
  state resolves the job's open findings at once.
* CloudWatch Logs subscription (``awslogs.data``, base64 gzip JSON): lines matching a
  failure signature are kept for the next tick's ``logs`` rule, and a critical signature
  raises its SNS alarm at once (once per job and signature).

EventBridge deliveries are idempotent (powertools, DynamoDB persistence, keyed on the
event id): a duplicate delivery is processed once. A malformed event is logged and
acknowledged (a retry would fail the same way), never a stop. A state store failure
raises ``StateStoreError`` with no stop made, so Lambda retries the delivery.

Environment: see ``Settings.from_env`` and docs/alarms-aws.md.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import gzip
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyPersistenceLayerError,
)

from adapters.sagemaker import MalformedJob, SageMakerAdapter, from_options
from adapters.sagemaker.mapping import console_url, epoch
from checker.model import Action, Finding, Job, JobState, LogLine, Severity
from checker.policy import Policy
from checker.signatures import Signature, match
from lambdas.aws.dynamodb_state import DynamoDBStore, PendingLogs
from lambdas.aws.sinks import NAMESPACE, EmfWriter, SnsAlarmSink, tick_metrics
from lambdas.message import PENDING_TICK
from lambdas.state import FindingMemory, JobMemory, StateStoreError
from lambdas.tick import AlarmEvent, AlarmSink, is_protected, job_key, tick
from trainguard.policy import load_policy

logger = Logger(service="trainguard")
metrics = Metrics(namespace=NAMESPACE, service="trainguard")

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the zip's root: policy.yaml lies there
SCHEDULED = "Scheduled Event"
STATE_CHANGE = "SageMaker Training Job State Change"
SAGEMAKER_OPTION = "TRAINGUARD_SAGEMAKER_"  # TRAINGUARD_SAGEMAKER_MAX_ATTEMPTS=3 -> max_attempts


class MalformedEvent(ValueError):
    """An event this function cannot use; the message says which part and why."""


class ConfigError(ValueError):
    """A missing or bad environment variable; the message names it."""


@dataclass(frozen=True)
class Settings:
    table: str  # TRAINGUARD_STATE_TABLE: state, audit and idempotency records
    topic_arn: str | None  # TRAINGUARD_TOPIC_ARN: direct alarms (none: metrics only)
    region: str  # AWS_REGION (set by Lambda)
    policy_path: Path  # TRAINGUARD_POLICY, relative to the package root
    stop_enabled: bool  # TRAINGUARD_STOP_ENABLED: false forces dry run whatever the policy
    stop_tag: tuple[str, str] | None  # TRAINGUARD_STOP_TAG "key=value": only these stop
    environment: str  # TRAINGUARD_ENVIRONMENT, for the logs
    sagemaker: dict[str, str] = field(default_factory=dict)  # TRAINGUARD_SAGEMAKER_*
    idempotency_ttl_s: int = 3600  # TRAINGUARD_IDEMPOTENCY_TTL_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        table = env.get("TRAINGUARD_STATE_TABLE", "").strip()
        if not table:
            raise ConfigError("TRAINGUARD_STATE_TABLE is not set (the DynamoDB state table)")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
        if not region:
            raise ConfigError("AWS_REGION is not set")
        stop = env.get("TRAINGUARD_STOP_ENABLED", "false").strip().lower()
        if stop not in ("true", "false"):
            raise ConfigError(f"TRAINGUARD_STOP_ENABLED={stop!r}: must be true or false")
        tag = env.get("TRAINGUARD_STOP_TAG", "").strip()
        stop_tag = None
        if tag:
            key, sep, value = tag.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"TRAINGUARD_STOP_TAG={tag!r}: must be KEY=VALUE")
            stop_tag = (key.strip(), value.strip())
        policy = Path(env.get("TRAINGUARD_POLICY") or "policy.yaml")
        ttl = env.get("TRAINGUARD_IDEMPOTENCY_TTL_S", "3600")
        if not ttl.isdigit() or int(ttl) <= 0:
            raise ConfigError(f"TRAINGUARD_IDEMPOTENCY_TTL_S={ttl!r}: must be a positive "
                              "whole number of seconds")
        opts = {k[len(SAGEMAKER_OPTION):].lower(): v for k, v in env.items()
                if k.startswith(SAGEMAKER_OPTION)}
        return cls(table=table, topic_arn=env.get("TRAINGUARD_TOPIC_ARN") or None,
                   region=region,
                   policy_path=policy if policy.is_absolute() else PACKAGE_ROOT / policy,
                   stop_enabled=stop == "true", stop_tag=stop_tag,
                   environment=env.get("TRAINGUARD_ENVIRONMENT", ""),
                   sagemaker={"region": region, **opts}, idempotency_ttl_s=int(ttl))


class Runtime:
    """What one Lambda container keeps between invocations: clients, policy, store."""

    def __init__(self, settings: Settings, session: boto3.Session | None = None) -> None:
        self.settings = settings
        session = session or boto3.Session(region_name=settings.region)
        policy = load_policy(settings.policy_path)
        if not settings.stop_enabled and not policy.safety.dry_run:
            logger.warning("the policy allows stops but TRAINGUARD_STOP_ENABLED is false: "
                           "running in dry run")
            policy = dataclasses.replace(
                policy, safety=dataclasses.replace(policy.safety, dry_run=True))
        self.policy: Policy = policy
        dynamodb = session.client("dynamodb", region_name=settings.region)
        self.store = DynamoDBStore(dynamodb, settings.table)
        self.adapter: SageMakerAdapter = from_options(settings.sagemaker)
        self.sns = (session.client("sns", region_name=settings.region)
                    if settings.topic_arn else None)
        self.metrics = EmfWriter()
        self.idempotency = IdempotencyConfig(event_key_jmespath="id",
                                             raise_on_no_idempotency_key=True,
                                             expires_after_seconds=settings.idempotency_ttl_s)
        self.persistence = DynamoDBPersistenceLayer(
            table_name=settings.table, key_attr="pk", sort_key_attr="sk",
            static_pk_value="idempotency", expiry_attr="expires_at", boto3_client=dynamodb)

    def sinks(self) -> list[AlarmSink]:
        if self.sns is None or self.settings.topic_arn is None:
            return []
        return [SnsAlarmSink(self.sns, self.settings.topic_arn, self.policy.safety.dry_run)]


_RUNTIME: dict[str, Runtime] = {}


def runtime() -> Runtime:
    if "rt" not in _RUNTIME:
        _RUNTIME["rt"] = Runtime(Settings.from_env(os.environ))
    return _RUNTIME["rt"]


def reset() -> None:
    """Forget the container's runtime (tests; a changed environment)."""
    _RUNTIME.clear()


# --- the tick ------------------------------------------------------------------------


class TickSource:
    """The SageMaker adapter as the tick sees it in Lambda: log lines a subscription
    delivered are added to their jobs, and with a stop opt-in tag configured a job
    without it is protected (the IAM policy would refuse its stop anyway)."""

    def __init__(self, adapter: SageMakerAdapter, logs: list[PendingLogs],
                 stop_tag: tuple[str, str] | None, protect_tag: str) -> None:
        self.adapter = adapter
        self.name = adapter.name
        self.logs = {p.job_name: p for p in logs}
        self.stop_tag = stop_tag
        self.protect_tag = protect_tag
        self.jobs: list[Job] = []

    def list_jobs(self, now: float) -> list[Job]:
        self.jobs = self.adapter.list_jobs(now)
        for job in self.jobs:
            kept = self.logs.get(job.id)
            if kept is not None:
                seen = {(line.time, line.text) for line in job.logs}
                extra = [LogLine(t, text) for t, text in kept.lines if (t, text) not in seen]
                job.logs = sorted([*job.logs, *extra], key=lambda line: line.time)
            if self.stop_tag is not None and not is_protected(job, self.protect_tag):
                key, value = self.stop_tag
                if job.tags.get(key) != value:
                    job.tags[self.protect_tag] = f"no opt-in tag {key}={value}"
        return self.jobs

    def stop(self, job: Job, reason: str) -> None:
        self.adapter.stop(job, reason)


class SeededStore:
    """The store, with the log alarms already sent between ticks added to the memory the
    tick loads: the tick then counts those findings on instead of raising them again."""

    def __init__(self, store: DynamoDBStore, seeds: dict[str, list[FindingMemory]],
                 source: str) -> None:
        self.store = store
        self.seeds = seeds  # job_key -> findings alarmed on at once
        self.source = source

    def load_all(self) -> dict[str, JobMemory]:
        memories = self.store.load_all()
        for key, found in self.seeds.items():
            mem = memories.get(key)
            if mem is None:
                job_id = key.rsplit(":", 1)[-1]
                mem = memories[key] = JobMemory(key, self.source, job_id, found[0].first_seen)
            for fm in found:
                mem.findings.setdefault(fm.key, fm)
        return memories

    def save(self, memories: list[JobMemory]) -> None:
        self.store.save(memories)

    def delete(self, job_keys: list[str]) -> None:
        self.store.delete(job_keys)

    def append_audit(self, records: list[Any]) -> None:
        self.store.append_audit(records)

    def audit_log(self, job_key: str | None = None) -> list[Any]:
        return self.store.audit_log(job_key)


def sagemaker_key(source: str, name: str, scope: str) -> str:
    return job_key(source, Job(id=name, provider="sagemaker", scope=scope))


def _seeds(logs: list[PendingLogs], source: str) -> dict[str, list[FindingMemory]]:
    from checker.signatures import BY_NAME

    out: dict[str, list[FindingMemory]] = {}
    for p in logs:
        for sig_name, at in p.alarmed.items():
            sig = BY_NAME.get(sig_name)
            if sig is None:
                continue
            fm = FindingMemory(f"{p.job_name}/logs/{sig_name}", "logs", sig.severity.value,
                               sig.meaning, at, at, alarmed_at=at,
                               alarmed_severity=sig.severity.value)
            out.setdefault(sagemaker_key(source, p.job_name, p.scope), []).append(fm)
    return out


def on_schedule(rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
    store = rt.store
    for p in store.pending_events():
        try:
            rt.adapter.remember_event(p.event)
        except MalformedJob as e:
            logger.error("dropping a kept state-change event", extra={"reason": str(e)})
            store.consume_event(p)
    events = store.pending_events()
    logs = store.pending_logs()
    source = TickSource(rt.adapter, logs, rt.settings.stop_tag, rt.policy.safety.protect_tag)
    sinks = rt.sinks()
    report = tick([source], rt.policy, SeededStore(store, _seeds(logs, source.name),
                                                   source.name), sinks, now)
    for p in events:
        store.consume_event(p)
    for q in logs:
        store.consume_logs(q)
    rt.metrics.write(tick_metrics(source.jobs, report.findings, rt.policy))
    for err in rt.adapter.errors:
        logger.warning("job unreadable this tick", extra={"job": err.ref, "reason": err.reason})
    for name, reason in report.source_errors.items():
        logger.error("source failed this tick: no job of it was judged or stopped",
                     extra={"source": name, "reason": reason})
    for reason in report.sink_errors:
        logger.error("alarm sink failed", extra={"reason": reason})
    stops = [a.to_dict() for a in report.stops]
    for a in stops:
        logger.warning("stop" if not a["dry_run"] else "would stop (dry run)", extra=a)
    metrics.add_metric(name="Ticks", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="Stops", unit=MetricUnit.Count,
                       value=sum(1 for a in stops if not a["dry_run"]))
    metrics.add_metric(name="SourceErrors", unit=MetricUnit.Count,
                       value=len(report.source_errors))
    summary = {"route": "schedule", "jobs": report.jobs, "findings": len(report.findings),
               "events": [f"{e.kind} {e.job_key} {e.memory.rule}" for e in report.events],
               "stops": [f"{a['action']} {a['job_id']}" for a in stops],
               "source_errors": report.source_errors, "sink_errors": report.sink_errors}
    logger.info("tick done", extra=summary)
    return summary


# --- state-change events ---------------------------------------------------------------


def on_state_change(rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
    job = rt.adapter.remember_event(event)  # MalformedJob: acknowledged as malformed
    detail = event["detail"]
    modified = (epoch(detail["LastModifiedTime"], "detail.LastModifiedTime")
                if detail.get("LastModifiedTime") is not None else now)
    kept = rt.store.put_event(job.id, dict(event), modified)
    summary: dict[str, Any] = {"route": "state_change", "job": job.id,
                               "state": job.state.value, "kept": kept, "resolved": []}
    if not kept:
        logger.info("an older state-change event arrived late: the newer one stays",
                    extra=summary)
        return summary
    if job.state.terminal:
        summary["resolved"] = _resolve_ended(rt, job, now)
    logger.info("state-change event kept for the next tick", extra=summary)
    return summary


def _resolve_ended(rt: Runtime, job: Job, now: float) -> list[str]:
    """A job that ended has nothing left to alarm on: resolve its open findings now."""
    key = job_key(rt.adapter.name, job)
    mem = rt.store.load_job(key)
    if mem is None or not mem.findings:
        return []
    events = [AlarmEvent("resolve", None, job, rt.adapter.name, key, now, fm.first_seen,
                         fm.consecutive, fm)
              for fm in mem.findings.values() if fm.alarmed_at is not None]
    mem.findings = {}
    rt.store.save([mem])  # conditional: a tick that changed it meanwhile wins, we raise
    for sink in rt.sinks():
        for e in events:
            sink.send(e)
    return [e.memory.key for e in events]


# --- CloudWatch Logs subscription ------------------------------------------------------


def decode_logs(event: Mapping[str, Any]) -> dict[str, Any]:
    data = event.get("awslogs", {}).get("data")
    if not isinstance(data, str):
        raise MalformedEvent("awslogs.data is missing or not a string")
    try:
        payload = json.loads(gzip.decompress(base64.b64decode(data, validate=True)))
    except (binascii.Error, OSError, EOFError, ValueError) as e:
        raise MalformedEvent(f"awslogs.data is not base64 gzip JSON: {e}") from None
    if not isinstance(payload, dict):
        raise MalformedEvent("awslogs.data does not hold a JSON object")
    return payload


def on_logs(rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
    payload = decode_logs(event)
    if payload.get("messageType") == "CONTROL_MESSAGE":  # CloudWatch's own reachability probe
        return {"route": "logs", "control": True}
    stream, owner = payload.get("logStream"), payload.get("owner")
    lines = payload.get("logEvents")
    if not isinstance(stream, str) or not stream or not isinstance(lines, list):
        raise MalformedEvent("the logs payload has no logStream or logEvents")
    job_name = stream.split("/", 1)[0]  # SageMaker streams are JOB/algo-N-EPOCH
    scope = f"{owner}/{rt.settings.region}"
    hits: list[tuple[float, str, Signature]] = []
    for i, line in enumerate(lines):
        try:
            t, text = float(line["timestamp"]) / 1000.0, str(line["message"])
        except (KeyError, TypeError, ValueError) as e:
            raise MalformedEvent(f"logEvents[{i}]: {type(e).__name__}: {e}") from None
        sig = match(text)
        if sig is not None:
            hits.append((t, text.strip()[:300], sig))
    summary: dict[str, Any] = {"route": "logs", "job": job_name, "lines": len(lines),
                               "matched": len(hits), "alarmed": []}
    if hits:
        rt.store.add_log_lines(job_name, scope, [(t, text) for t, text, _ in hits])
        summary["alarmed"] = _alarm_critical(rt, job_name, scope, hits, now)
    logger.info("log lines read", extra=summary)
    return summary


def _alarm_critical(rt: Runtime, job_name: str, scope: str,
                    hits: list[tuple[float, str, Signature]], now: float) -> list[str]:
    source = rt.adapter.name
    key = sagemaker_key(source, job_name, scope)
    by_sig: dict[str, list[tuple[float, str]]] = {}
    sigs: dict[str, Signature] = {}
    for t, text, sig in hits:
        if sig.severity is Severity.CRITICAL:
            by_sig.setdefault(sig.name, []).append((t, text))
            sigs[sig.name] = sig
    if not by_sig:
        return []
    mem = rt.store.load_job(key)
    region = scope.partition("/")[2]
    job = Job(id=job_name, provider="sagemaker", scope=scope, name=job_name,
              state=JobState.UNKNOWN, raw_state="not read yet: alarmed on its log lines",
              console_url=console_url(region, job_name))
    sent = []
    for name, lines in by_sig.items():
        sig = sigs[name]
        fkey = f"{job_name}/logs/{name}"
        known = mem.findings.get(fkey) if mem is not None else None
        if known is not None and known.alarmed_at is not None:
            continue  # the tick already raised it
        if not rt.store.claim_log_alarm(job_name, name, now):
            continue  # an earlier batch of lines raised it
        action = rt.policy.rule("logs").actions.get(Severity.CRITICAL, Action.NOTIFY)
        finding = Finding(job_name, "logs", Severity.CRITICAL,
                          f"{sig.meaning} ({len(lines)} line(s) like: {lines[0][1][:120]})",
                          started_at=lines[0][0],
                          evidence={"kind": name, "count": len(lines),
                                    "examples": [text for _, text in lines[:3]]},
                          action=action)
        fm = FindingMemory(fkey, "logs", "critical", finding.message, now, now,
                           alarmed_at=now, alarmed_severity="critical",
                           last_decision=PENDING_TICK)
        alarm = AlarmEvent("raise", finding, job, source, key, now, now, 1, fm)
        for sink in rt.sinks():
            sink.send(alarm)
        sent.append(name)
    return sent


# --- routing ---------------------------------------------------------------------------

Route = Callable[[Runtime, Mapping[str, Any], float], dict[str, Any]]


def _is_scheduled(e: Mapping[str, Any]) -> bool:
    return e.get("detail-type") == SCHEDULED


def _is_state_change(e: Mapping[str, Any]) -> bool:
    return e.get("detail-type") == STATE_CHANGE


def _is_logs(e: Mapping[str, Any]) -> bool:
    return isinstance(e.get("awslogs"), Mapping)


#: (recognise, handle, idempotent on the EventBridge event id)
ROUTES: list[tuple[Callable[[Mapping[str, Any]], bool], Route, bool]] = [
    (_is_scheduled, on_schedule, True),
    (_is_state_change, on_state_change, True),
    (_is_logs, on_logs, False),  # a subscription batch has no id; its effects are idempotent
]


def describe(event: Any) -> str:
    if not isinstance(event, Mapping):
        return f"a {type(event).__name__}, not an object"
    return (f"detail-type {event.get('detail-type')!r}, id {event.get('id')!r}, "
            f"keys {sorted(map(str, event))[:8]}")


def _run(rt: Runtime, event: Mapping[str, Any], route: Route, idempotent: bool,
         context: Any) -> dict[str, Any]:
    now = time.time()
    if not idempotent:
        return route(rt, event, now)
    if not isinstance(event.get("id"), str) or not event["id"]:
        raise MalformedEvent("an EventBridge event without an id")
    if context is not None:
        rt.idempotency.register_lambda_context(context)

    def run(event: dict[str, Any]) -> dict[str, Any]:
        return route(rt, event, now)

    once: Callable[..., dict[str, Any]] = idempotent_function(
        run, data_keyword_argument="event", persistence_store=rt.persistence,
        config=rt.idempotency, key_prefix=f"trainguard.{route.__name__}")

    try:
        result: dict[str, Any] = once(event=dict(event))
    except IdempotencyAlreadyInProgressError:
        logger.info("a duplicate delivery of an event still being processed: acknowledged")
        return {"route": route.__name__, "duplicate": True}
    except IdempotencyPersistenceLayerError as e:
        raise StateStoreError(f"DynamoDB table {rt.settings.table}: the idempotency record "
                              f"failed: {e}") from e
    return result


@metrics.log_metrics
def handler(event: Any, context: Any) -> dict[str, Any]:
    """The Lambda entry point."""
    correlation = (event.get("id") if isinstance(event, Mapping) else None) or getattr(
        context, "aws_request_id", None)
    logger.set_correlation_id(correlation)
    metrics.add_metric(name="Invocations", unit=MetricUnit.Count, value=1)
    found = [(r, i) for recognise, r, i in ROUTES
             if isinstance(event, Mapping) and recognise(event)]
    if not found:
        return _malformed(f"no route for this event ({describe(event)})")
    route, idempotent = found[0]
    try:
        return _run(runtime(), event, route, idempotent, context)
    except (MalformedEvent, MalformedJob) as e:
        return _malformed(f"{route.__name__}: {e}")
    except StateStoreError as e:
        metrics.add_metric(name="StateStoreErrors", unit=MetricUnit.Count, value=1)
        logger.error("state store failed: nothing was stopped; the delivery will be retried",
                     extra={"reason": str(e), "table": runtime().settings.table})
        raise


def _malformed(reason: str) -> dict[str, Any]:
    """Logged and acknowledged: retrying a malformed event would fail the same way."""
    metrics.add_metric(name="MalformedEvents", unit=MetricUnit.Count, value=1)
    logger.error("malformed event ignored (nothing was stopped)", extra={"reason": reason})
    return {"status": "ignored", "reason": reason}
