"""Azure ML as a source: jobs through azure-ai-ml's ``MLClient``, metrics through the
workspace's MLflow tracking server, stop with ``jobs.begin_cancel``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, ClassVar

from trainguard.adapters.azureml.logs import StdLogReader
from trainguard.adapters.azureml.mapping import Fields, fields, heartbeat_line, raw_status
from trainguard.adapters.azureml.mlflow import MlflowError, MlflowReader, https_base
from trainguard.adapters.azureml.states import STATES
from trainguard.adapters.azureml.system import per_node
from trainguard.adapters.base import Adapter, AdapterError, JobError
from trainguard.checker.model import Job, JobState, LogLine, Series
from trainguard.checker.prices import gpus_of

log = logging.getLogger("trainguard.adapters.azureml")

#: A listed job the SDK could not turn into an entity: azure-ai-ml drops it, name and all.
UNPARSED = "<listing>"


class AzureMLAdapter(Adapter):
    provider = "azureml"
    STATES: ClassVar[dict[str, JobState]] = STATES
    #: The mapped states a tick watches: those that burn compute and make progress.
    WATCHED: ClassVar[frozenset[JobState]] = frozenset({JobState.RUNNING})
    #: States with no MLflow run worth reading yet.
    NO_METRICS: ClassVar[frozenset[JobState]] = frozenset({JobState.PENDING})
    #: Signals principals other than the job can write (lambdas/trust.py): anyone allowed
    #: to log to the workspace's runs can log metrics (system GPU metrics included) into
    #: any run, MLflow does not bind a metric to the process that ran the job.
    forgeable: ClassVar[frozenset[str]] = frozenset({"metrics", "platform_metrics", "logs"})

    def __init__(self, ml: Any, mlflow: MlflowReader, *, subscription: str,
                 resource_group: str, workspace: str, endpoint: str | None = None,
                 name: str | None = None, logs: StdLogReader | None = None) -> None:
        """``ml`` is an ``azure.ai.ml.MLClient`` for the workspace; ``endpoint`` replaces
        the MLflow host (the same override the MLClient was built with); ``logs`` reads
        the signature lines of each job's ``user_logs/std_log*.txt`` (compute clusters
        send no stdout to Log Analytics)."""
        super().__init__(name)
        self.ml = ml
        self.mlflow = mlflow
        self.logs = logs
        self.workspace = workspace
        self.scope = f"{subscription}/{resource_group}/{workspace}"
        self.endpoint = endpoint
        self._listed: dict[str, Any] = {}  # this tick's entities, so a read needs no GET
        self._sizes: dict[str, str | None] = {}  # compute name -> VM size, per tick

    def list_running(self) -> Iterable[str]:
        self._listed, self._sizes = {}, {}
        try:
            entities = list(self.ml.jobs.list())
        except Exception as e:  # credentials, network, a page the SDK cannot read
            raise AdapterError(f"{self.name}: cannot list jobs in {self.scope}: "
                               f"{type(e).__name__}: {e}") from e
        refs, unparsed = [], 0
        for entity in entities:
            if entity is None:
                unparsed += 1
                continue
            raw = raw_status(entity)
            state = self.map_state(raw)
            if state is JobState.UNKNOWN:
                log.warning("%s: job %s has status %r, which this adapter does not know: "
                            "not watched", self.name, entity.name, raw)
            if state in self.WATCHED:
                refs.append(entity.name)
                self._listed[entity.name] = entity
        if unparsed:
            reason = (f"{unparsed} listed job(s) azure-ai-ml could not parse (it drops them "
                      "without their names; see the azure.ai.ml logger at DEBUG)")
            log.error("%s: %s", self.name, reason)
            self.errors.append(JobError(UNPARSED, reason))
        return refs

    def read_job(self, ref: str, now: float) -> Job:
        entity = self._listed.pop(ref, None) or self.ml.jobs.get(ref)
        f = fields(entity)
        state = self.map_state(f.raw_state)
        series, start = ({}, None) if state in self.NO_METRICS else self._metrics(f)
        series, hosts = per_node(series)  # MLflow's system metrics, per node and GPU
        start = start if start is not None else f.created
        lines = [] if state in self.NO_METRICS else self._log_lines(f)
        instance_type = f.instance_type or self._size(f.compute)
        return Job(
            id=f.name, provider=self.provider, scope=self.scope, name=f.display_name,
            state=state, raw_state=f.raw_state, clock="wall", start_time=start,
            instance_type=instance_type, instance_count=f.instance_count,
            gpus_per_instance=gpus_of(instance_type) if instance_type else None,
            tags=f.tags, console_url=f.console_url, max_runtime_s=f.max_runtime_s,
            series=series, hosts=hosts,
            logs=sorted([*lines, *heartbeat_line(f.raw_state, start, series)],
                        key=lambda line: line.time),
        )

    def fresh_tags(self, job: Job) -> dict[str, str]:
        """The job's tags, read now with a GET (lambdas/trust.py, just before a stop)."""
        return fields(self.ml.jobs.get(job.id)).tags

    def stop(self, job: Job, reason: str) -> None:
        # Azure ML's cancel takes no reason: it goes to our log (and the tick's audit).
        log.info("%s: cancelling job %s: %s", self.name, job.id, reason)
        self.ml.jobs.begin_cancel(job.id, polling=False)

    def _size(self, compute: str | None) -> str | None:
        """The compute target's VM size, asked once per tick per compute."""
        if compute is None:
            return None
        if compute not in self._sizes:
            try:
                size = getattr(self.ml.compute.get(compute), "size", None)
                self._sizes[compute] = str(size) if size else None
            except Exception as e:  # the job is still worth watching without its price
                log.warning("%s: cannot read compute %s: %s", self.name, compute, e)
                self._sizes[compute] = None
        return self._sizes[compute]

    def _tracking(self, f: Fields) -> str:
        if f.tracking_uri is None:  # every v2 job has one; a job without is not tracked
            raise MlflowError(f"job {f.name} has no Tracking service (services.Tracking)")
        return https_base(f.tracking_uri, self.endpoint)

    def _log_lines(self, f: Fields) -> list[LogLine]:
        """The job's std_log signature lines; a failure is reported, the job kept."""
        if self.logs is None:
            return []
        try:
            return self.logs.lines(self._tracking(f), f.name)
        except Exception as e:
            reason = f"logs not read: {type(e).__name__}: {e}"
            log.error("%s: job %s: %s", self.name, f.name, reason)
            self.errors.append(JobError(f.name, reason))
            return []

    def _metrics(self, f: Fields) -> tuple[dict[str, Series], float | None]:
        """The job's MLflow metric histories and run start; a failure here is reported
        and the job kept without them (its state and cost still count)."""
        try:
            base = self._tracking(f)
            run = self.mlflow.run(base, f.name)
            series = {k: self.mlflow.history(base, f.name, k) for k in run.metric_keys}
            return series, run.start_time
        except Exception as e:
            reason = f"metrics not read: {type(e).__name__}: {e}"
            log.error("%s: job %s: %s", self.name, f.name, reason)
            self.errors.append(JobError(f.name, reason))
            return {}, None
