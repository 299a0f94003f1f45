"""Prometheus as a source: jobs are what the discovery query names, read through the
mapping. Prometheus only holds metrics, so it cannot stop a job; the adapter of the
system that runs the job (Kubeflow) does, reading its metrics through ``Metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import ClassVar

from trainguard.adapters.base import Adapter, AdapterError
from trainguard.adapters.prometheus.client import PrometheusError
from trainguard.adapters.prometheus.reader import Metrics
from trainguard.checker.model import Job, JobState

#: ``raw_state`` when the mapping has no state metric (or the job wrote none): whether
#: the job wrote a sample within the mapping's ``recent`` seconds.
REPORTING, SILENT = "reporting", "silent"


class PrometheusAdapter(Adapter):
    provider = "prometheus"
    can_stop: ClassVar[bool] = False  # read-only: see ``stop``
    # State words a job may write in its state metric (compared case-insensitively).
    # SILENT is left out on purpose: a job that stopped writing may have finished,
    # crashed or hung, and Prometheus cannot tell which.
    STATES: ClassVar[dict[str, JobState]] = {
        REPORTING: JobState.RUNNING, "running": JobState.RUNNING,
        "pending": JobState.PENDING, "starting": JobState.PENDING,
        "stopping": JobState.STOPPING, "succeeded": JobState.SUCCEEDED,
        "completed": JobState.SUCCEEDED, "failed": JobState.FAILED,
        "stopped": JobState.STOPPED, "suspended": JobState.STOPPED,
    }

    def __init__(self, metrics: Metrics, scope: str | None = None,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.metrics = metrics
        self.scope = scope or metrics.client.base_url
        self._now: float | None = None

    def map_state(self, raw: str | None) -> JobState:
        return super().map_state(raw.lower() if raw else raw)

    def list_jobs(self, now: float) -> list[Job]:
        # Discovery runs at the tick's ``now``, so a replay over history lists the jobs
        # that were running then.
        self._now = now
        try:
            return super().list_jobs(now)
        finally:
            self._now = None

    def list_running(self) -> Iterable[str]:
        at = self._now if self._now is not None else time.time()
        try:
            return self.metrics.job_ids(at)
        except PrometheusError as e:
            raise AdapterError(f"{self.name}: cannot list jobs: {e}") from e

    def read_job(self, ref: str, now: float) -> Job:
        m = self.metrics.mapping
        reading = self.metrics.read(ref, now - m.history, now)
        last = reading.last_time()
        raw = reading.state or (REPORTING if last is not None and last >= now - m.recent
                                else SILENT)
        tags = {k: v for k, v in reading.labels.items() if k != m.id_label}
        return Job(id=ref, provider=self.provider, scope=self.scope, name=ref,
                   state=self.map_state(raw), raw_state=raw, clock="wall",
                   start_time=reading.start_time, instance_count=1,
                   gpus_per_instance=reading.gpus, tags=tags, series=reading.series,
                   hosts=reading.hosts)

    def stop(self, job: Job, reason: str) -> None:
        raise AdapterError(
            f"{self.name}: Prometheus only holds metrics and cannot stop job {job.id!r}; "
            "watch it through the source that runs it (e.g. --source kubeflow, which "
            "reads the same metrics) to stop it")
