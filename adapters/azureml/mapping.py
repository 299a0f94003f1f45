"""An azure-ai-ml ``Job`` entity (what ``MLClient.jobs.list/get`` return) in the model.

Everything here is a pure function of the entity, so a payload that cannot be read
fails with the job, the wire field and the reason; the adapter skips that job.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainguard.adapters.azureml.states import NOT_RESPONDING
from trainguard.checker.model import LogLine, Series


class MalformedJob(ValueError):
    """A job payload with a field this adapter cannot read."""

    def __init__(self, job: str, field: str, reason: str) -> None:
        super().__init__(f"job {job}: {field}: {reason}")


@dataclass
class Fields:
    """What one job entity says, before metrics and compute are added."""

    name: str
    display_name: str
    raw_state: str
    created: float | None
    compute: str | None  # the compute target's name, None for serverless jobs
    instance_type: str | None  # serverless jobs name their VM size themselves
    instance_count: int
    max_runtime_s: float | None
    tags: dict[str, str]
    console_url: str | None
    tracking_uri: str | None


def raw_status(entity: Any) -> str:
    status = getattr(entity, "status", None)
    if status is None:
        return ""
    return str(status.value if isinstance(status, enum.Enum) else status)


def _service(entity: Any, kind: str) -> str | None:
    services = getattr(entity, "services", None) or {}
    svc = services.get(kind)
    endpoint = getattr(svc, "endpoint", None) if svc is not None else None
    return str(endpoint) if endpoint else None


def _time(name: str, field: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):  # the SDK hands an unparseable timestamp through as text
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise MalformedJob(name, field, f"{value!r} is not an ISO 8601 time")


def _count(name: str, value: Any) -> int:
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MalformedJob(name, "properties.resources.instanceCount",
                           f"{value!r} is not a positive whole number")
    return value


def _timeout(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        # A data-binding expression (``${{parent.inputs.timeout}}``) is only known at run time.
        if isinstance(value, str) and value.startswith("${{"):
            return None
        raise MalformedJob(name, "properties.limits.timeout",
                           f"{value!r} is not a positive duration")
    return float(value)


def compute_name(compute: Any) -> str | None:
    """``gpu-a100``, ``azureml:gpu-a100`` or its ARM id -> ``gpu-a100``."""
    if not compute:
        return None
    return str(compute).rsplit("/", 1)[-1].removeprefix("azureml:") or None


def fields(entity: Any) -> Fields:
    name = getattr(entity, "name", None)
    if not isinstance(name, str) or not name:
        raise MalformedJob("?", "name", f"{name!r} is not a job name")
    resources = getattr(entity, "resources", None)
    limits = getattr(entity, "limits", None)
    context = getattr(entity, "creation_context", None)
    tags = getattr(entity, "tags", None) or {}
    if not isinstance(tags, dict):
        raise MalformedJob(name, "properties.tags", f"{tags!r} is not a mapping")
    instance_type = getattr(resources, "instance_type", None)
    return Fields(
        name=name,
        display_name=str(getattr(entity, "display_name", None) or name),
        raw_state=raw_status(entity),
        created=_time(name, "systemData.createdAt", getattr(context, "created_at", None)),
        compute=compute_name(getattr(entity, "compute", None)),
        instance_type=str(instance_type) if instance_type else None,
        instance_count=_count(name, getattr(resources, "instance_count", None)),
        max_runtime_s=_timeout(name, getattr(limits, "timeout", None)),
        tags={str(k): str(v) for k, v in tags.items()},
        console_url=_service(entity, "Studio"),
        tracking_uri=_service(entity, "Tracking"),
    )


def heartbeat_line(raw_state: str, start: float | None,
                   series: dict[str, Series]) -> list[LogLine]:
    """For a NotResponding job, one log line at its last sign of life.

    Azure ML does not say when the heartbeat stopped, so the line is dated at the last
    metric point (or the start, when the job logged none), never at ``now``: the ``stall``
    rule measures silence from a job's last record, and a line dated now would hide
    exactly the silence it should see. A job with metrics is judged by them as before; a
    job with none still gets a last record to measure from, and the ``logs`` rule and a
    reader of the evidence see why.
    """
    if raw_state != NOT_RESPONDING:
        return []
    times = [s.last_time for s in series.values() if s.last_time is not None]
    at = max(times) if times else start
    if at is None:
        return []
    return [LogLine(at, "Azure ML: job is NotResponding: its heartbeat to run history "
                        "was lost (last sign of life)")]
