"""EventBridge "SageMaker Training Job State Change": the event is kept (the newest by
LastModifiedTime) so the next tick skips DescribeTrainingJob for that job; a terminal
state resolves the job's open findings at once.

The event is checked before anything is kept: a job name SageMaker could not have made
or a time that is not a finite number is a malformed event (acknowledged, logged, never
retried as a store failure, never left for the next tick to choke on)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools import Logger

from trainguard.adapters.sagemaker.mapping import epoch
from trainguard.checker.model import Job
from trainguard.lambdas.aws.routes.base import MalformedEvent, Route, register
from trainguard.lambdas.aws.runtime import Runtime
from trainguard.lambdas.aws.settings import SERVICE
from trainguard.lambdas.tick import TickReport, job_key, say, send_outbox

logger = Logger(service=SERVICE)  # the handler's logger: powertools shares it by service

STATE_CHANGE = "SageMaker Training Job State Change"
#: ``TrainingJobName`` as botocore's SageMaker model defines it (pattern, 1 to 63 chars);
#: tests/test_aws_routing.py holds this copy to the model.
JOB_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")


def check(event: Mapping[str, Any]) -> None:
    """Raise ``MalformedEvent`` naming the field when the event cannot be a real one."""
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        raise MalformedEvent("detail is missing or not an object")
    name = detail.get("TrainingJobName")
    if not isinstance(name, str) or not JOB_NAME.fullmatch(name):
        shown = f"{name[:40]!r}... ({len(name)} characters)" if isinstance(name, str) \
            and len(name) > 40 else repr(name)
        raise MalformedEvent(f"detail.TrainingJobName {shown} is not a SageMaker training "
                             "job name (1 to 63 letters, digits and hyphens)")
    for key, value in detail.items():
        if key.endswith("Time") and isinstance(value, float | int) \
                and not isinstance(value, bool) and not math.isfinite(value):
            raise MalformedEvent(f"detail.{key} {value!r} is not a finite time")


@register(detail_type=STATE_CHANGE)
class StateChange(Route):
    name = "on_state_change"

    def handle(self, rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
        check(event)  # before the adapter or the store keeps any of it
        detail = event["detail"]
        modified = (epoch(detail["LastModifiedTime"], "detail.LastModifiedTime")
                    if detail.get("LastModifiedTime") is not None else now)
        if not math.isfinite(modified):  # "NaN" as a string reads as a float too
            raise MalformedEvent(f"detail.LastModifiedTime {detail['LastModifiedTime']!r} "
                                 "is not a finite time")
        job = rt.adapter.remember_event(event)  # MalformedJob: acknowledged as malformed
        kept = rt.store.put_event(job.id, dict(event), modified)
        summary: dict[str, Any] = {"route": "state_change", "job": job.id,
                                   "state": job.state.value, "kept": kept, "resolved": []}
        if not kept:
            logger.info("an older state-change event arrived late: the newer one stays",
                        extra=summary)
            return summary
        if job.state.terminal:
            summary["resolved"] = resolve_ended(rt, job, now)
        logger.info("state-change event kept for the next tick", extra=summary)
        return summary


def resolve_ended(rt: Runtime, job: Job, now: float) -> list[str]:
    """A job that ended has nothing left to alarm on: resolve its open findings now,
    written ahead like the tick's alarms (a sink that refuses one hears it next tick)."""
    key = job_key(rt.adapter.name, job)
    mem = rt.store.load_job(key)
    if mem is None or not mem.findings:
        return []
    resolved = [fm for fm in mem.findings.values() if fm.alarmed_at is not None]
    for fm in resolved:
        say(mem, "resolve", fm, now)
    mem.findings = {}
    rt.store.save([mem])  # conditional: a tick that changed it meanwhile wins, we raise
    report = TickReport(time=now)
    send_outbox({key: mem}, {key: (job, [])}, rt.sinks(), report)
    for reason in report.sink_errors:
        logger.error("alarm sink failed; the resolve is sent again next tick",
                     extra={"reason": reason})
    rt.store.save([mem])  # what was said is marked; the rest stays for the next tick
    return [fm.key for fm in resolved]
