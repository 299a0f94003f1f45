"""The Kubeflow job kinds: where each lives in the API and how its fields read.

A kind is a registry entry: adding one (JAXJob, MPIJob...) is one class here.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from trainguard.adapters.kubeflow.fields import Reader
from trainguard.checker.model import LogLine, Series

log = logging.getLogger("trainguard.adapters.kubeflow")

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
#: condition types that explain trouble; their messages become log lines for the rules
NOTEWORTHY = ("Restarting", "Failed")
#: the stop reason is written on the object, beside the suspend, for whoever looks next
STOP_REASON_ANNOTATION = "trainguard.io/stop-reason"


@dataclass(frozen=True)
class Resources:
    count: int  # pods (nodes) the job asks for
    gpus_per_instance: int | None
    instance_type: str | None


class Kind(ABC):
    name: ClassVar[str]  # as in ids and the ``kinds`` option: ``pytorchjob``
    kind: ClassVar[str]  # as in the API: ``PyTorchJob``
    group: ClassVar[str]
    version: ClassVar[str]
    plural: ClassVar[str]
    pod_label: ClassVar[str]  # the label every pod of a job carries, valued with its name
    has_start_time: ClassVar[bool] = True  # else the job started when its first pod did

    def latest_true(self, r: Reader) -> Reader | None:
        """The condition that became true last (list order breaks ties): it decides."""
        best: tuple[float, int, Reader] | None = None
        for i, c in enumerate(r.children("status", "conditions")):
            if c.text("status") != "True":
                continue
            key = (c.time("lastTransitionTime") or 0.0, i)
            if best is None or key >= best[:2]:
                best = (*key, c)
        return best[2] if best else None

    def state(self, r: Reader) -> tuple[str | None, str]:
        """The word that decides the state (a condition type) and the raw state kept."""
        c = self.latest_true(r)
        if c is None:
            return None, "NoCondition"
        kind = c.text("type") or ""
        return kind, _raw(kind, c.text("reason"))

    def failure_reason(self, r: Reader) -> str | None:
        for c in r.children("status", "conditions"):
            if c.text("type") == "Failed" and c.text("status") == "True":
                return c.text("message") or c.text("reason")
        return None

    def condition_logs(self, r: Reader) -> list[LogLine]:
        lines = []
        for c in r.children("status", "conditions"):
            t = c.time("lastTransitionTime")
            if c.text("type") in NOTEWORTHY and c.text("status") == "True" and t is not None:
                why = c.text("message") or c.text("reason")
                lines.append(LogLine(t, f"{c.text('type')}: {why}"))
        return lines

    def series(self, r: Reader) -> dict[str, Series]:
        return {}

    @abstractmethod
    def suspend_requested(self, r: Reader) -> bool: ...

    @abstractmethod
    def resources(self, r: Reader) -> Resources: ...

    @abstractmethod
    def times(self, r: Reader) -> tuple[float | None, float | None]: ...

    @abstractmethod
    def max_runtime(self, r: Reader) -> float | None: ...

    @abstractmethod
    def suspend_patch(self, reason: str) -> dict[str, Any]: ...


KINDS: dict[str, Kind] = {}


def register(cls: type[Kind]) -> type[Kind]:
    KINDS[cls.name] = cls()
    return cls


def _raw(kind: str, reason: str | None) -> str:
    return f"{kind}/{reason}" if reason else kind


def _annotated(reason: str) -> dict[str, Any]:
    return {"annotations": {STOP_REASON_ANNOTATION: reason[:1000]}}


def pod_gpus(spec: Reader) -> int:
    """GPUs one pod asks for: the sum over its containers (limits, else requests)."""
    total = 0
    for c in spec.children("containers"):
        for res in GPU_RESOURCES:
            n = c.quantity("resources", "limits", res)
            n = c.quantity("resources", "requests", res) if n is None else n
            total += n or 0
    return total


def instance_type_of(node_selector: dict[str, Any]) -> str | None:
    for label in INSTANCE_TYPE_LABELS:
        value = node_selector.get(label)
        if isinstance(value, str) and value:
            return value
    return None


@register
class PyTorchJob(Kind):
    """Training Operator v1 (kubeflow.org/v1)."""

    name = "pytorchjob"
    kind = "PyTorchJob"
    group = "kubeflow.org"
    version = "v1"
    plural = "pytorchjobs"
    pod_label = "training.kubeflow.org/job-name"

    def suspend_requested(self, r: Reader) -> bool:
        return r.flag("spec", "runPolicy", "suspend")

    def resources(self, r: Reader) -> Resources:
        count, gpus, types = 0, 0, set()
        for rtype in r.mapping("spec", "pytorchReplicaSpecs"):
            spec = r.child("spec", "pytorchReplicaSpecs", rtype)
            n = spec.integer("replicas")
            n = 1 if n is None else n  # the API's default
            pod = spec.child("template", "spec")
            count += n
            gpus += n * pod_gpus(pod)
            itype = instance_type_of(pod.mapping("nodeSelector"))
            if itype:
                types.add(itype)
        # Master and Workers almost always share a pod shape; where they do not, the
        # average keeps the job's GPU total right.
        per = round(gpus / count) if count else None
        return Resources(count, per if gpus else None,
                         sorted(types)[0] if len(types) == 1 else None)

    def times(self, r: Reader) -> tuple[float | None, float | None]:
        start = r.time("status", "startTime") or r.time("metadata", "creationTimestamp")
        return start, r.time("status", "completionTime")

    def max_runtime(self, r: Reader) -> float | None:
        n = r.integer("spec", "runPolicy", "activeDeadlineSeconds")
        return float(n) if n is not None else None

    def suspend_patch(self, reason: str) -> dict[str, Any]:
        return {"metadata": _annotated(reason), "spec": {"runPolicy": {"suspend": True}}}


@register
class TrainJob(Kind):
    """Trainer v2 (trainer.kubeflow.org/v1alpha1): runs as a JobSet of the same name.

    Its conditions are Suspended, Complete and Failed (``Created`` until Trainer 2.0
    removed it); a job with none of them true runs when its child Jobs are active.
    ``status.trainerStatus`` (progress, metrics) exists only on newer Trainer releases
    with the TrainJobStatus feature gate; it is read where present.
    """

    name = "trainjob"
    kind = "TrainJob"
    group = "trainer.kubeflow.org"
    version = "v1alpha1"
    plural = "trainjobs"
    pod_label = "jobset.sigs.k8s.io/jobset-name"
    has_start_time = False
    #: trainer metric names to the checker's well-known ones, where the well-known is absent
    ALIASES: ClassVar[dict[str, str]] = {"eval_loss": "val_loss", "validation_loss": "val_loss",
                                         "train_loss": "loss"}

    def state(self, r: Reader) -> tuple[str | None, str]:
        word, raw = super().state(r)
        if word not in (None, "Created"):
            return word, raw
        active = sum(j.integer("active") or 0 for j in r.children("status", "jobsStatus"))
        seen = f"jobsStatus active={active}"
        raw = seen if word is None else f"{raw}; {seen}"
        return ("Running" if active else "Created"), raw

    def suspend_requested(self, r: Reader) -> bool:
        return r.flag("spec", "suspend")

    def resources(self, r: Reader) -> Resources:
        n = r.integer("spec", "trainer", "numNodes")
        per = r.child("spec", "trainer", "resourcesPerNode")
        gpus = sum(per.quantity("limits", res) or per.quantity("requests", res) or 0
                   for res in GPU_RESOURCES)
        # numNodes absent: the runtime decides; the pods tell (see the adapter)
        return Resources(n if n is not None else 0, gpus or None, None)

    def times(self, r: Reader) -> tuple[float | None, float | None]:
        end = None
        for c in r.children("status", "conditions"):
            if c.text("type") in ("Complete", "Failed") and c.text("status") == "True":
                end = c.time("lastTransitionTime")
        return r.time("metadata", "creationTimestamp"), end

    def max_runtime(self, r: Reader) -> float | None:
        n = r.integer("spec", "activeDeadlineSeconds")
        return float(n) if n is not None else None

    def suspend_patch(self, reason: str) -> dict[str, Any]:
        return {"metadata": _annotated(reason), "spec": {"suspend": True}}

    def series(self, r: Reader) -> dict[str, Series]:
        status = r.child("status", "trainerStatus")
        t = status.time("lastUpdatedTime")
        if t is None:
            return {}
        out: dict[str, Series] = {}
        pct = status.integer("progressPercentage")
        if pct is not None:
            out["progress_pct"] = _point("progress_pct", t, float(pct))
        for m in status.children("metrics"):
            name, value = m.text("name"), m.text("value")
            if not name or value is None:
                continue
            try:
                number = float(value)
            except ValueError:  # a user's metric, not the API's shape: drop it, keep the job
                log.warning("%s: trainerStatus metric %s=%r is not a number; ignored",
                            r.label, name, value)
                continue
            out[name] = _point(name, t, number)
        for alias, well_known in self.ALIASES.items():
            if alias in out and well_known not in out:
                s = out[alias]
                out[well_known] = Series(well_known, s.time, s.step, s.value)
        return out


def _point(name: str, t: float, value: float) -> Series:
    """One reading: ``trainerStatus`` holds the latest value only, with no step."""
    return Series(name, np.array([t]), np.array([np.nan]), np.array([value]))
