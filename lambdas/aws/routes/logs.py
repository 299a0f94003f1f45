"""CloudWatch Logs subscription batch (``awslogs.data``, base64 gzip JSON): lines matching
a failure signature are kept for the next tick's ``logs`` rule, and a critical signature
raises its SNS alarm at once (once per job and signature).

A batch has no event id, so the handler does not wrap it for idempotency: a repeated
batch still alarms once, since each alarm is claimed once per job and signature."""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools import Logger

from trainguard.adapters.sagemaker.mapping import console_url
from trainguard.checker.model import Action, Finding, Job, JobState, Severity
from trainguard.checker.signatures import Signature, match
from trainguard.lambdas.aws.pending import sagemaker_key
from trainguard.lambdas.aws.routes.base import MalformedEvent, Route, register
from trainguard.lambdas.aws.runtime import Runtime
from trainguard.lambdas.aws.settings import SERVICE
from trainguard.lambdas.message import PENDING_TICK
from trainguard.lambdas.state import FindingMemory
from trainguard.lambdas.tick import AlarmEvent

logger = Logger(service=SERVICE)  # the handler's logger: powertools shares it by service

Hit = tuple[float, str, Signature]  # time, the line (trimmed), the signature it matched


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


@register(key="awslogs")
class Logs(Route):
    name = "on_logs"
    idempotent = False

    def handle(self, rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
        payload = decode_logs(event)
        if payload.get("messageType") == "CONTROL_MESSAGE":  # CloudWatch's reachability probe
            return {"route": "logs", "control": True}
        stream, owner = payload.get("logStream"), payload.get("owner")
        lines = payload.get("logEvents")
        if not isinstance(stream, str) or not stream or not isinstance(lines, list):
            raise MalformedEvent("the logs payload has no logStream or logEvents")
        job_name = stream.split("/", 1)[0]  # SageMaker streams are JOB/algo-N-EPOCH
        scope = f"{owner}/{rt.settings.region}"
        hits: list[Hit] = []
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
            summary["alarmed"] = alarm_critical(rt, job_name, scope, hits, now)
        logger.info("log lines read", extra=summary)
        return summary


def alarm_critical(rt: Runtime, job_name: str, scope: str, hits: list[Hit],
                   now: float) -> list[str]:
    """Send the alarm of each critical signature not yet alarmed on; return their names."""
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
        taken = 0
        for sink in rt.sinks():
            try:
                sink.send(alarm)
                taken += 1
            except Exception as e:  # the others still hear it
                logger.error("alarm sink failed", extra={"reason": f"{type(e).__name__}: {e}"})
        if rt.sinks() and not taken:
            # No sink took it: give the claim back, so the next tick raises it (it reads
            # these lines) rather than counting it as said.
            rt.store.release_log_alarm(job_name, name, now)
            continue
        sent.append(name)
    return sent
