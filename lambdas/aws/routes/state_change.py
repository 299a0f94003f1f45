"""EventBridge "SageMaker Training Job State Change": the event is kept (the newest by
LastModifiedTime) so the next tick skips DescribeTrainingJob for that job; a terminal
state resolves the job's open findings at once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools import Logger

from adapters.sagemaker.mapping import epoch
from checker.model import Job
from lambdas.aws.routes.base import Route, register
from lambdas.aws.runtime import Runtime
from lambdas.aws.settings import SERVICE
from lambdas.tick import AlarmEvent, job_key

logger = Logger(service=SERVICE)  # the handler's logger: powertools shares it by service

STATE_CHANGE = "SageMaker Training Job State Change"


@register(detail_type=STATE_CHANGE)
class StateChange(Route):
    name = "on_state_change"

    def handle(self, rt: Runtime, event: Mapping[str, Any], now: float) -> dict[str, Any]:
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
            summary["resolved"] = resolve_ended(rt, job, now)
        logger.info("state-change event kept for the next tick", extra=summary)
        return summary


def resolve_ended(rt: Runtime, job: Job, now: float) -> list[str]:
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
