"""Kubeflow jobs' series from Prometheus: the ``metrics`` hook of the Kubeflow adapter.

Kubernetes says what a job is and how it runs; its loss, step and GPU use live in
Prometheus (pushed or scraped training metrics, the DCGM exporter). The hook reads them
with the Prometheus adapter's mapping, for the job's id as the mapping names it, and
only from the job's own namespace: a pod elsewhere exporting the same ``run`` label
cannot speak for it (docs/security.md).
"""

from __future__ import annotations

import time

from trainguard.adapters.prometheus import MappingError, Metrics
from trainguard.checker.model import Job, Series


class PrometheusHook:
    """``hook(job) -> series``: the mapping's history of the job up to ``now`` (a tick's
    fixed time), or up to the wall clock when ``now`` is None (a live check)."""

    def __init__(self, metrics: Metrics, id_template: str = "{name}",
                 now: float | None = None) -> None:
        self.metrics, self.id_template, self.now = metrics, id_template, now
        unbound = metrics.mapping.unbound()
        if unbound:
            raise MappingError("prometheus mapping", unbound[0], "does not select the job's "
                               "namespace: use {selector}, {namespace} or {in_namespace}, "
                               "or another namespace's series could speak for the job")
        self.read: dict[str, list[str]] = {}  # job id -> series read: a run's summary shows it
        self._hosts: dict[str, dict[str, dict[str, Series]]] = {}  # of the last read

    def prometheus_id(self, job: Job) -> str:
        """The job's id in Prometheus: ``{name}``, ``{namespace}``, ``{kind}`` or ``{id}``
        of the Kubeflow id ``NAMESPACE/KIND/NAME``."""
        ns, kind, name = [*job.id.split("/"), "", "", ""][:3]
        return self.id_template.format(name=name or job.id, namespace=ns, kind=kind, id=job.id)

    def __call__(self, job: Job) -> dict[str, Series]:
        now = self.now if self.now is not None else time.time()
        namespace = job.id.split("/", 1)[0]
        reading = self.metrics.read(self.prometheus_id(job),
                                    now - self.metrics.mapping.history, now, namespace)
        series = reading.series
        self.read[job.id] = sorted(f"{k}:{len(s)}" for k, s in series.items())
        self._hosts[job.id] = reading.hosts
        return series

    def hosts_of(self, job: Job) -> dict[str, dict[str, Series]]:
        """Each pod's own GPU series (``Job.hosts``) from the last read of ``job``."""
        return self._hosts.pop(job.id, {})
