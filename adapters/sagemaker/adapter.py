"""SageMaker training jobs as the checker sees them, and StopTrainingJob.

One tick: ListTrainingJobs (InProgress, every page); DescribeTrainingJob for each job
whose state did not arrive by EventBridge event since the last tick; ListTags at
most every ``tags_ttl_s`` per job; GetMetricData for all jobs at once (500 queries a
call); one FilterLogEvents scan of the log group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from trainguard.adapters.base import Adapter, JobError
from trainguard.adapters.sagemaker import mapping, metrics
from trainguard.adapters.sagemaker.clients import Clients
from trainguard.adapters.sagemaker.logs import LogTail
from trainguard.checker.model import Job, JobState
from trainguard.checker.sessions import set_aside

log = logging.getLogger("trainguard.adapters.sagemaker")


@dataclass
class Described:
    """A job and what its metric queries need from its document."""

    job: Job
    definitions: list[str]
    hosts: int
    modified: float = 0.0  # LastModifiedTime: the newer of two events wins


class SageMakerAdapter(Adapter):
    provider = "sagemaker"
    STATES: ClassVar[dict[str, JobState]] = mapping.STATES
    #: Signals principals other than the job can write (lambdas/trust.py): any role with
    #: ``cloudwatch:PutMetricData`` can put metrics in ``/aws/sagemaker/TrainingJobs`` (the
    #: host GPU metrics too: only ``AWS/`` namespaces are reserved) under any job's name,
    #: and any role with ``logs:PutLogEvents`` on the group can make a stream named like
    #: any job's. Only the job document (state, times, instances) is the platform's alone.
    forgeable: ClassVar[frozenset[str]] = frozenset({"metrics", "platform_metrics", "logs"})

    def __init__(self, clients: Clients, name: str | None = None, period: int = 60,
                 lookback_s: float = 3 * 3600.0, tags_ttl_s: float = 600.0,
                 page_size: int = 100, clock: Any = time.time) -> None:
        super().__init__(name)
        self.clients = clients
        self.period = period
        self.lookback_s = lookback_s
        self.tags_ttl_s = tags_ttl_s
        self.page_size = page_size
        self.clock = clock
        self.logs = LogTail(clients.logs, lookback_s)
        self._events: dict[str, Described] = {}  # job name -> its latest event since the last tick
        self._tags: dict[str, tuple[float, dict[str, str]]] = {}  # ARN -> (fetched at, tags)

    # --- state ----------------------------------------------------------------------------

    def map_state(self, raw: str | None) -> JobState:
        status, _, secondary = (raw or "").partition("/")
        return mapping.map_state(status or None, secondary or None)

    def list_running(self) -> Iterable[str]:
        pages = self.clients.sagemaker.get_paginator("list_training_jobs").paginate(
            StatusEquals="InProgress", PaginationConfig={"PageSize": self.page_size})
        for page in pages:
            for summary in page["TrainingJobSummaries"]:
                yield summary["TrainingJobName"]

    def remember_event(self, event: Mapping[str, Any]) -> Job:
        """Take a job's state from an EventBridge "SageMaker Training Job State Change"
        event: the next tick does not call DescribeTrainingJob for it. Raises
        ``mapping.MalformedJob`` (naming the event and field) on a bad event."""
        job, detail = mapping.event_detail(event)
        d = Described(job, mapping.metric_names(detail), mapping.host_count(detail),
                      _modified(detail))
        known = self._events.get(job.id)
        if known is None or d.modified >= known.modified:
            self._events[job.id] = d
        return job

    def describe(self, ref: str) -> Described:
        """The job from its event since the last tick, else from DescribeTrainingJob."""
        if ref in self._events:
            return self._events[ref]
        doc = self.clients.sagemaker.describe_training_job(TrainingJobName=ref)
        try:
            job = mapping.to_job(doc, tags=self._tags_of(doc["TrainingJobArn"]))
        except mapping.MalformedJob as e:
            # Listed, never dropped: UNKNOWN with the reason (and reported as an error).
            log.error("%s: job %s listed as UNKNOWN: %s", self.name, ref, e)
            self.errors.append(JobError(ref, f"MalformedJob: {e}"))
            return Described(mapping.unmapped_job(doc, ref, str(e)), [], 0)
        return Described(job, mapping.metric_names(doc), mapping.host_count(doc))

    def fresh_tags(self, job: Job) -> dict[str, str]:
        """The job's tags read now, never from the cache (lambdas/trust.py asks just
        before a stop: a protect tag added since the listing is honoured)."""
        doc = self.clients.sagemaker.describe_training_job(TrainingJobName=job.id)
        return self._tags_of(doc["TrainingJobArn"], cached_ok=False)

    def _tags_of(self, arn: str, cached_ok: bool = True) -> dict[str, str]:
        cached = self._tags.get(arn)
        now = self.clock()
        if cached_ok and cached is not None and now - cached[0] < self.tags_ttl_s:
            return cached[1]
        tags: dict[str, str] = {}
        for page in self.clients.sagemaker.get_paginator("list_tags").paginate(ResourceArn=arn):
            tags.update(mapping.tags_of(page.get("Tags", [])) or {})
        self._tags[arn] = (now, tags)
        return tags

    # --- reading --------------------------------------------------------------------------

    def list_jobs(self, now: float) -> list[Job]:
        """The running jobs, plus any job whose event since the last tick says it ended
        (returned once, so a failure's reason and logs are seen)."""
        self.errors = []
        refs = list(dict.fromkeys(self.list_running()))
        listed = set(refs)
        refs += [n for n in self._events if n not in listed]
        try:
            return [set_aside(job) for job in self.read_jobs(refs, now)]  # as Adapter's
        finally:
            self._events.clear()

    def read_jobs(self, refs: list[str], now: float) -> list[Job]:
        described: list[Described] = []
        for ref in refs:
            try:
                described.append(self.describe(ref))
            except Exception as e:  # one malformed or unreadable job must not hide the others
                log.error("%s: skipping job %s: %s", self.name, ref, e)
                self.errors.append(JobError(ref, f"{type(e).__name__}: {e}"))
        self._attach(described, now)
        return [d.job for d in described]

    def read_job(self, ref: str, now: float) -> Job:
        d = self.describe(ref)
        self._attach([d], now)
        return d.job

    def _attach(self, described: list[Described], now: float) -> None:
        """Metrics and log lines for all the jobs at once. If CloudWatch fails, the jobs
        are still returned (state and cost stay watched) and the failure is reported."""
        if not described:
            return
        queries = [q for d in described for q in metrics.queries_for(
            d.job, d.definitions, d.hosts, now, self.lookback_s, self.period)]
        try:
            data = metrics.fetch(self.clients.cloudwatch, queries, now, self.period)
            series, hosts = metrics.to_series(data), metrics.host_series(data)
        except Exception as e:
            self._report_all(described, "metrics", e)
            series, hosts = {}, {}
        try:
            self.logs.refresh(now)
        except Exception as e:
            self._report_all(described, "logs", e)
        for d in described:
            d.job.series = series.get(d.job.id, {})
            d.job.hosts = hosts.get(d.job.id, {})
            d.job.logs = self.logs.of(d.job.id)

    def _report_all(self, described: list[Described], what: str, e: Exception) -> None:
        log.error("%s: %s unavailable this tick: %s", self.name, what, e)
        for d in described:
            self.errors.append(JobError(d.job.id, f"{what}: {type(e).__name__}: {e}"))

    # --- acting ---------------------------------------------------------------------------

    def stop(self, job: Job, reason: str) -> None:
        log.warning("%s: StopTrainingJob %s: %s", self.name, job.id, reason)
        self.clients.sagemaker.stop_training_job(TrainingJobName=job.id)


def _modified(detail: Mapping[str, Any]) -> float:
    value = detail.get("LastModifiedTime")
    return mapping.epoch(value, "LastModifiedTime") if value is not None else 0.0
