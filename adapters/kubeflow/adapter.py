"""Kubeflow training jobs (Training Operator v1 PyTorchJob, Trainer v2 TrainJob) in
the checker's model.

A job's id is ``NAMESPACE/KIND/NAME`` (``ml-team/pytorchjob/bert-ft``); its scope is
``CLUSTER/NAMESPACE``. Listing reads each kind once per namespace and the pods of
each kind once per namespace (grouped by their job label), so a tick costs a few
calls per namespace, not per job. Metrics come from ``trainerStatus`` where the
Trainer reports it, and from the ``metrics`` hook (the Prometheus adapter) which
the runtime composes in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainguard.adapters.base import Adapter, AdapterError, JobError
from trainguard.adapters.kubeflow.client import Kube, describe
from trainguard.adapters.kubeflow.fields import Malformed, Reader
from trainguard.adapters.kubeflow.kinds import KINDS, Kind
from trainguard.adapters.kubeflow.pods import PodFacts, read_pods
from trainguard.checker.model import Job, JobState, Series
from trainguard.checker.prices import gpus_of

log = logging.getLogger("trainguard.adapters.kubeflow")

MetricsHook = Callable[[Job], dict[str, Series]]


@dataclass
class _Batch:
    """What one listing fetched, read by the job reads that follow it."""

    objects: dict[str, Any] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, list[Any]] | None] = field(default_factory=dict)


class KubeflowAdapter(Adapter):
    provider = "kubeflow"
    STATES: ClassVar[dict[str, JobState]] = {
        "Created": JobState.PENDING,
        "Running": JobState.RUNNING,
        "Restarting": JobState.RUNNING,  # still holding its GPUs; the restarts rule reads why
        "Succeeded": JobState.SUCCEEDED,
        "Complete": JobState.SUCCEEDED,
        "Failed": JobState.FAILED,
        "Suspended": JobState.STOPPED,
    }

    def __init__(self, kube: Kube, cluster: str, namespaces: Sequence[str] | None,
                 kinds: Iterable[str] = ("pytorchjob", "trainjob"), delete: bool = False,
                 metrics: MetricsHook | None = None, console: str | None = None,
                 name: str | None = None) -> None:
        """``namespaces`` None means every namespace the ServiceAccount can list."""
        super().__init__(name)
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"kubeflow: unknown kind(s) {unknown} (known: {sorted(KINDS)})")
        self.kube = kube
        self.cluster = cluster
        self.namespaces = list(namespaces) if namespaces is not None else None
        self.kinds = [KINDS[k] for k in kinds]
        self.delete = delete
        self.metrics = metrics
        self.console = console.rstrip("/") if console else None
        self._batch: _Batch | None = None

    # -- listing -------------------------------------------------------------------
    def list_running(self) -> Iterable[str]:
        self._batch = _Batch()
        refs: list[str] = []
        listed, problems = 0, 0
        for kind in self.kinds:
            for where, items in self._listings(kind):
                if items is None:
                    problems += 1
                    continue
                listed += 1
                refs += self._running(kind, where, items)
        if listed == 0 and problems:
            raise AdapterError(f"{self.name}: could not list any job: "
                               + "; ".join(e.reason for e in self.errors))
        return refs

    def _listings(self, kind: Kind) -> Iterable[tuple[str | None, list[Any] | None]]:
        """(namespace, items) per listing; items None where the listing failed (reported)."""
        if self.namespaces is not None:
            for ns in self.namespaces:
                yield ns, self._list(kind, ns)
            return
        try:
            everywhere: list[Any] | None = self.kube.list_objects(kind, None)
        except Exception as e:
            if getattr(e, "status", None) != 403:
                self._report(f"{self.cluster}/*/{kind.name}", e)
                yield None, None
                return
            everywhere = None
        if everywhere is not None:
            yield None, everywhere
            return
        # No cluster-wide right: try each namespace, and say nothing of those it may not read.
        try:
            namespaces = self.kube.list_namespaces()
        except Exception as e:
            self._report(f"{self.cluster}/namespaces", e)
            yield None, None
            return
        readable = 0
        for ns in namespaces:
            items: list[Any] | None = None
            try:
                items = self.kube.list_objects(kind, ns)
            except Exception as e:
                if getattr(e, "status", None) == 403:
                    log.debug("%s: no right to list %s in %s", self.name, kind.plural, ns)
                    continue
                self._report(f"{self.cluster}/{ns}/{kind.name}", e)
            readable += 1
            yield ns, items
        if not readable:
            self._report(f"{self.cluster}/*/{kind.name}", PermissionError(
                f"{kind.plural} may be listed in none of {len(namespaces)} namespaces"))
            yield None, None

    def _list(self, kind: Kind, ns: str) -> list[Any] | None:
        try:
            return self.kube.list_objects(kind, ns)
        except Exception as e:  # one namespace failing must not blind us to the others
            self._report(f"{self.cluster}/{ns}/{kind.name}", e)
            return None

    def _running(self, kind: Kind, where: str | None, items: list[Any]) -> list[str]:
        assert self._batch is not None
        refs = []
        for item in items:
            meta = item.get("metadata") if isinstance(item, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            ns = meta.get("namespace", where) if isinstance(meta, dict) else where
            if not isinstance(name, str) or not isinstance(ns, str):
                self._report(f"{self.cluster}/{where or '*'}/{kind.name}",
                             Malformed(f"a {kind.kind} without metadata.name or namespace"))
                continue
            ref = f"{ns}/{kind.name}/{name}"
            self._batch.objects[ref] = item
            try:
                state = self._state(kind, Reader(f"{kind.kind} {ns}/{name}", item))[0]
            except Malformed:
                state = JobState.RUNNING  # listed so that reading it reports what is wrong
            if state is JobState.RUNNING:
                refs.append(ref)
        return refs

    def read_jobs(self, refs: list[str], now: float) -> list[Job]:
        try:
            return super().read_jobs(refs, now)
        finally:
            self._batch = None

    # -- one job -------------------------------------------------------------------
    def read_job(self, ref: str, now: float) -> Job:
        ns, kind, name = self._parse(ref)
        obj = self._batch.objects.pop(ref, None) if self._batch else None
        if obj is None:
            obj = self.kube.get_object(kind, ns, name)
        r = Reader(f"{kind.kind} {ns}/{name}", obj)
        state, raw = self._state(kind, r)
        res = kind.resources(r)
        start, end = kind.times(r)
        series = kind.series(r)
        logs = kind.condition_logs(r)
        pods = self._pods(ns, kind, name)
        facts = read_pods(pods, r.label) if pods is not None else PodFacts()
        if not kind.has_start_time and facts.first_start is not None:
            start = facts.first_start
        itype = res.instance_type or (
            next(iter(facts.instance_types)) if len(facts.instance_types) == 1 else None)
        gpus = res.gpus_per_instance or (gpus_of(itype) if itype else None)
        job = Job(
            id=ref, provider=self.provider, scope=f"{self.cluster}/{ns}", name=name,
            state=state, raw_state=raw, clock="wall", start_time=start, end_time=end,
            instance_type=itype, instance_count=res.count or facts.pods or 1,
            gpus_per_instance=gpus, restarts=facts.restarts,
            restart_times=facts.restart_times, tags=_labels(r),
            console_url=self._console_url(kind, ns, name),
            failure_reason=kind.failure_reason(r), max_runtime_s=kind.max_runtime(r),
            series=series, logs=sorted(logs + facts.logs, key=lambda line: line.time))
        if self.metrics is not None:
            try:
                job.series.update(self.metrics(job))
                hosts_of = getattr(self.metrics, "hosts_of", None)  # per pod and GPU
                if hosts_of is not None:
                    job.hosts = hosts_of(job)
            except Exception as e:  # without metrics the job still counts for cost and state
                self._report(ref, e, what="metrics")
        return job

    def _state(self, kind: Kind, r: Reader) -> tuple[JobState, str]:
        word, raw = kind.state(r)
        state = self.map_state(word)
        if kind.suspend_requested(r) and state in (JobState.RUNNING, JobState.PENDING):
            return JobState.STOPPING, f"{raw}; suspend requested"
        return state, raw

    def _pods(self, ns: str, kind: Kind, name: str) -> list[Any] | None:
        """The job's pods; None (reported) when they cannot be listed."""
        if self._batch is None:
            try:
                return self.kube.list_pods(ns, f"{kind.pod_label}={name}")
            except Exception as e:
                self._report(f"{self.cluster}/{ns}/pods", e, what="pods")
                return None
        key = (ns, kind.pod_label)
        if key not in self._batch.pods:
            grouped: dict[str, list[Any]] = {}
            try:
                for pod in self.kube.list_pods(ns, kind.pod_label):
                    owner = ((pod.get("metadata") or {}).get("labels") or {}).get(kind.pod_label)
                    grouped.setdefault(str(owner), []).append(pod)
                self._batch.pods[key] = grouped
            except Exception as e:
                self._report(f"{self.cluster}/{ns}/pods", e, what="pods")
                self._batch.pods[key] = None
        group = self._batch.pods[key]
        return group.get(name, []) if group is not None else None

    # -- stopping ------------------------------------------------------------------
    def fresh_tags(self, job: Job) -> dict[str, str]:
        """The job's labels and annotations as tags, read now (lambdas/trust.py asks just
        before a stop, so a protect label added since the listing is honoured)."""
        ns, kind, name = self._parse(job.id)
        return _labels(Reader(f"{kind.kind} {ns}/{name}", self.kube.get_object(kind, ns, name)))

    def stop(self, job: Job, reason: str) -> None:
        ns, kind, name = self._parse(job.id)
        if self.delete:
            log.warning("%s: deleting %s %s/%s: %s", self.name, kind.kind, ns, name, reason)
            self.kube.delete(kind, ns, name)
        else:
            log.warning("%s: suspending %s %s/%s: %s", self.name, kind.kind, ns, name, reason)
            self.kube.patch(kind, ns, name, kind.suspend_patch(reason))

    # -- helpers -------------------------------------------------------------------
    def _parse(self, ref: str) -> tuple[str, Kind, str]:
        parts = ref.split("/")
        if len(parts) != 3 or parts[1] not in KINDS or not parts[0] or not parts[2]:
            raise ValueError(f"{ref!r} is not a Kubeflow job id (NAMESPACE/KIND/NAME, "
                             f"KIND one of {sorted(KINDS)})")
        return parts[0], KINDS[parts[1]], parts[2]

    def _report(self, ref: str, e: Exception, what: str = "") -> None:
        reason = (f"{what}: " if what else "") + describe(e)
        log.error("%s: %s: %s", self.name, ref, reason)
        self.errors.append(JobError(ref, reason))

    def _console_url(self, kind: Kind, ns: str, name: str) -> str | None:
        if not self.console:
            return None  # OpenShift console's path for a custom resource
        return f"{self.console}/k8s/ns/{ns}/{kind.group}~{kind.version}~{kind.kind}/{name}"


#: Kubernetes label keys cannot hold ``:``: ``trainguard.io/protect`` is read as the
#: ``trainguard:protect`` tag the default policy knows (likewise any ``trainguard.io/X``).
LABEL_PREFIX, TAG_PREFIX = "trainguard.io/", "trainguard:"


def _labels(r: Reader) -> dict[str, str]:
    """The job's labels and annotations as tags (labels win on a clash)."""
    tags = {str(k): str(v) for k, v in r.mapping("metadata", "annotations").items()}
    tags.update({str(k): str(v) for k, v in r.mapping("metadata", "labels").items()})
    for key in [k for k in tags if k.startswith(LABEL_PREFIX)]:
        tags.setdefault(TAG_PREFIX + key[len(LABEL_PREFIX):], tags[key])
    return tags
