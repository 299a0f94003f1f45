"""A DescribeTrainingJob document, or the EventBridge "SageMaker Training Job State
Change" event that carries one, turned into a ``Job`` (no metrics or logs yet).

Both shapes go through ``to_job``: boto3 hands back ``datetime`` objects, while the
event's ``detail`` has epoch *milliseconds* as strings or numbers, so every time is
read by ``epoch``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from trainguard.checker.model import Job, JobState
from trainguard.checker.prices import gpus_of

log = logging.getLogger("trainguard.adapters.sagemaker")

PROVIDER = "sagemaker"
EVENT_DETAIL_TYPE = "SageMaker Training Job State Change"

#: TrainingJobStatus -> state. "Deleting" comes after the job ended.
STATES: dict[str, JobState] = {
    "InProgress": JobState.RUNNING,
    "Completed": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
    "Stopping": JobState.STOPPING,
    "Stopped": JobState.STOPPED,
    "Deleting": JobState.STOPPED,
}

#: SecondaryStatus while InProgress. Instances are not up (or not billed) before
#: Downloading, and a spot job Interrupted waits for capacity: those are PENDING, so
#: the stall and utilisation rules do not judge a job that has not started training.
IN_PROGRESS: dict[str, JobState] = {
    "Starting": JobState.PENDING,
    "Pending": JobState.PENDING,
    "LaunchingMLInstances": JobState.PENDING,
    "PreparingTrainingStack": JobState.PENDING,
    "Interrupted": JobState.PENDING,
    "Downloading": JobState.RUNNING,
    "DownloadingTrainingImage": JobState.RUNNING,
    "Training": JobState.RUNNING,
    "Uploading": JobState.RUNNING,
    "Restarting": JobState.RUNNING,
    "Updating": JobState.RUNNING,
}

#: SecondaryStatus values the service documents for the other primary statuses.
OTHER_SECONDARY = frozenset({"Stopping", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded",
                             "Completed", "Failed"})


class MalformedJob(ValueError):
    """A training job document the adapter cannot use; the message names the job, the
    field and the reason."""


def map_state(status: str | None, secondary: str | None) -> JobState:
    """The state for a TrainingJobStatus and SecondaryStatus pair; anything unknown is
    UNKNOWN (the raw words are kept in ``raw_state``), so no rule or stop acts on it."""
    state = STATES.get(status or "")
    if state is None:
        return JobState.UNKNOWN
    if state is JobState.RUNNING:
        return IN_PROGRESS.get(secondary or "", JobState.UNKNOWN)
    if secondary is not None and secondary not in OTHER_SECONDARY:
        log.warning("unknown SecondaryStatus %r under %s: state kept as %s", secondary, status,
                    state.value)
    return state


def epoch(value: Any, where: str) -> float:
    """Seconds since the epoch from a datetime (boto3), epoch seconds or milliseconds
    (number or numeric string, as EventBridge sends), or an ISO 8601 string."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, bool):
        raise MalformedJob(f"{where}: {value!r} is not a time")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise MalformedJob(f"{where}: cannot read {value!r} as a time") from None
    else:
        raise MalformedJob(f"{where}: {type(value).__name__} {value!r} is not a time")
    # Epoch seconds stay below 1e11 until the year 5138; milliseconds are above it.
    return number / 1000.0 if abs(number) >= 1e11 else number


def _time(doc: Mapping[str, Any], key: str, where: str) -> float | None:
    value = doc.get(key)
    return None if value is None else epoch(value, f"{where}: {key}")


def _resources(doc: Mapping[str, Any], where: str) -> tuple[str, int]:
    """Instance type and count. A heterogeneous cluster (InstanceGroups) is priced by
    its group with the most GPUs: the model holds one instance type per job."""
    rc = doc.get("ResourceConfig")
    if not isinstance(rc, Mapping):
        raise MalformedJob(f"{where}: ResourceConfig is missing")
    if rc.get("SelectedInstanceType"):
        # InstancePreferences: SageMaker picked one of the candidates; the count is the
        # one it selected (else the job's, or the chosen preference's).
        chosen = rc["SelectedInstanceType"]
        prefs = [p for p in rc.get("InstancePreferences") or []
                 if isinstance(p, Mapping) and p.get("InstanceType") == chosen]
        count = rc.get("SelectedInstanceCount") or rc.get("InstanceCount") or \
            (prefs[0].get("InstanceCount") if prefs else None) or 1
        if not isinstance(count, int) or count < 1:
            raise MalformedJob(f"{where}: ResourceConfig.SelectedInstanceCount {count!r} is "
                               "not a positive integer")
        return str(chosen), count
    if rc.get("InstancePreferences") and not rc.get("InstanceType"):
        raise MalformedJob(f"{where}: ResourceConfig has InstancePreferences but no "
                           "SelectedInstanceType yet (no instance chosen: no price)")
    if rc.get("InstanceType"):
        count = rc.get("InstanceCount", 1)
        if not isinstance(count, int) or count < 1:
            raise MalformedJob(f"{where}: ResourceConfig.InstanceCount {count!r} is not a "
                               "positive integer")
        return str(rc["InstanceType"]), count
    groups = rc.get("InstanceGroups") or []
    usable = [g for g in groups if isinstance(g, Mapping) and g.get("InstanceType")
              and isinstance(g.get("InstanceCount"), int) and g["InstanceCount"] > 0]
    if not usable:
        raise MalformedJob(f"{where}: ResourceConfig has neither InstanceType nor usable "
                           "InstanceGroups")
    best = max(usable, key=lambda g: ((gpus_of(g["InstanceType"]) or 0) * g["InstanceCount"],
                                      g["InstanceCount"]))
    return str(best["InstanceType"]), int(best["InstanceCount"])


def host_count(doc: Mapping[str, Any]) -> int:
    """Hosts algo-1..algo-N of the job, every instance group included."""
    rc = doc.get("ResourceConfig") or {}
    if rc.get("SelectedInstanceType") or rc.get("InstanceType"):
        return _resources(doc, "hosts")[1]
    return sum(int(g.get("InstanceCount", 0)) for g in rc.get("InstanceGroups") or [])


def tags_of(raw: Any) -> dict[str, str] | None:
    """Tags as ListTags gives them ([{Key, Value}]) or as the event does ({key: value})."""
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items()}
    return {str(t["Key"]): str(t.get("Value", "")) for t in raw}


def scope_of(arn: str, where: str) -> tuple[str, str]:
    """(account, region) from arn:aws:sagemaker:REGION:ACCOUNT:training-job/NAME."""
    parts = arn.split(":")
    if len(parts) < 6 or parts[2] != "sagemaker" or not parts[3] or not parts[4]:
        raise MalformedJob(f"{where}: TrainingJobArn {arn!r} is not a SageMaker ARN")
    return parts[4], parts[3]


def console_url(region: str, name: str) -> str:
    return (f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}"
            f"#/jobs/{name}")


def to_job(doc: Mapping[str, Any], tags: dict[str, str] | None = None) -> Job:
    """A DescribeTrainingJob-shaped document as a Job (series and logs left empty)."""
    name = doc.get("TrainingJobName")
    if not isinstance(name, str) or not name:
        raise MalformedJob("training job document: TrainingJobName is missing")
    where = f"training job {name}"
    arn = doc.get("TrainingJobArn")
    if not isinstance(arn, str):
        raise MalformedJob(f"{where}: TrainingJobArn is missing")
    account, region = scope_of(arn, where)
    status, secondary = doc.get("TrainingJobStatus"), doc.get("SecondaryStatus")
    instance_type, count = _resources(doc, where)
    transitions = doc.get("SecondaryStatusTransitions") or []
    restart_times = sorted(
        epoch(t.get("StartTime"), f"{where}: SecondaryStatusTransitions[{i}].StartTime")
        for i, t in enumerate(transitions) if t.get("Status") == "Restarting")
    stopping = doc.get("StoppingCondition") or {}
    max_runtime = stopping.get("MaxRuntimeInSeconds")
    created = _time(doc, "CreationTime", where)
    return Job(
        id=name, provider=PROVIDER, scope=f"{account}/{region}", name=name,
        state=map_state(status, secondary), raw_state=f"{status}/{secondary}",
        clock="wall",
        start_time=_time(doc, "TrainingStartTime", where) or created,
        end_time=_time(doc, "TrainingEndTime", where),
        instance_type=instance_type, instance_count=count,
        gpus_per_instance=gpus_of(instance_type),
        restarts=len(restart_times), restart_times=restart_times,
        tags=tags if tags is not None else tags_of(doc.get("Tags")) or {},
        console_url=console_url(region, name),
        failure_reason=doc.get("FailureReason") or None,
        max_runtime_s=float(max_runtime) if max_runtime is not None else None,
    )


def unmapped_job(doc: Mapping[str, Any], ref: str, reason: str) -> Job:
    """A job whose document could not be mapped, listed anyway: UNKNOWN (no rule judges
    it, nothing stops it) with the reason, so it is seen rather than silently unwatched."""
    name = doc.get("TrainingJobName") if isinstance(doc.get("TrainingJobName"), str) else ref
    arn = doc.get("TrainingJobArn")
    try:
        account, region = scope_of(arn, ref) if isinstance(arn, str) else ("?", "?")
    except MalformedJob:
        account, region = "?", "?"
    return Job(id=str(name), provider=PROVIDER, scope=f"{account}/{region}", name=str(name),
               state=JobState.UNKNOWN,
               raw_state=f"{doc.get('TrainingJobStatus')}/{doc.get('SecondaryStatus')}",
               console_url=console_url(region, str(name)) if region != "?" else None,
               failure_reason=f"not watched: {reason}")


def metric_names(doc: Mapping[str, Any]) -> list[str]:
    """The names of the job's metric definitions (published to CloudWatch by SageMaker)."""
    spec = doc.get("AlgorithmSpecification") or {}
    return [str(d["Name"]) for d in spec.get("MetricDefinitions") or [] if d.get("Name")]


def parse_event(event: Mapping[str, Any]) -> Job:
    """An EventBridge "SageMaker Training Job State Change" event as a Job.

    Raises MalformedJob naming the event id and the field on anything else."""
    return event_detail(event)[0]


def event_detail(event: Mapping[str, Any]) -> tuple[Job, dict[str, Any]]:
    """The event's Job and its DescribeTrainingJob-shaped ``detail``."""
    where = f"event {event.get('id', '?')}"
    if event.get("detail-type") != EVENT_DETAIL_TYPE:
        raise MalformedJob(f"{where}: detail-type is {event.get('detail-type')!r}, not "
                           f"{EVENT_DETAIL_TYPE!r}")
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        raise MalformedJob(f"{where}: detail is missing or not an object")
    try:
        return to_job(detail), dict(detail)
    except MalformedJob as e:
        raise MalformedJob(f"{where}: {e}") from None
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise MalformedJob(f"{where}: detail is not a training job document "
                           f"({type(e).__name__}: {e})") from None
