"""How a job's series are found in Prometheus: which query lists the running jobs, which
label matchers pick one job's series, and which query gives each series.

A mapping is a dict (or a YAML/JSON file holding one)::

    discover: group by (namespace, run) (trainguard_step)   # each result's ``id_label`` is a job id
    id_label: run
    selector: '{job="trainguard-demo", run="{job_id}"}'  # one job's series
    series:
      loss: trainguard_loss                        # a metric name: gets the selector
      step: trainguard_step
      gpu_util:                                    # averaged over the GPUs of the job's pods
        metric: DCGM_FI_DEV_GPU_UTIL
        match: 'pod=~"{job_id_re}-[a-z]+-[0-9]+"{in_namespace}'
        aggregate: avg
      tokens_per_s: 'sum(rate(tokens_total{selector}[1m]))'  # any PromQL
    devices:                                       # optional: one series per GPU
      gpu_util: 'DCGM_FI_DEV_GPU_UTIL{pod=~"{job_id_re}-.+"{in_namespace}}'
    host_label: pod    # the label of a device series that names its host (pod or node)
    gpu_label: gpu     # and the one that names its GPU
    state: trainguard_state{selector}              # optional info metric; its label is the state
    state_label: state
    start_time: trainguard_start_time_seconds{selector}  # optional: epoch seconds
    gpus: count(DCGM_FI_DEV_GPU_UTIL{pod=~"{job_id_re}-.+"{in_namespace}})  # optional
    namespace_label: namespace  # the label Prometheus sets to the namespace of the target
    history: 86400     # seconds of history read each tick
    recent: 300        # a job with a sample this recent is still reporting
    min_step: 1        # finest range-query step, seconds

``devices`` are read without aggregation, one series per GPU: each becomes the GPU's own
series (``gpu_util/gpu0``) in ``Job.hosts[POD]``, beside the pod's mean over its GPUs
(``gpu_util``); the job's aggregate ``series`` stay what rules read by default. By
default the DCGM exporter's GPU use, memory in percent (FB_USED / (FB_USED + FB_FREE))
and memory used in GiB (FB_USED is in MiB) are read per pod and GPU.

In a PromQL entry ``{selector}`` stands for the job's matchers in braces, ``{job_id}``
for the job id inside a string literal, ``{job_id_re}`` for the job id escaped for a
regex matcher (PromQL anchors regexes at both ends), ``{namespace}`` for the job's
namespace and ``{in_namespace}`` for ``, namespace="NS"`` (nothing when the job has no
namespace); a bare metric name is that metric under the selector.

Binding (security): when the job has a namespace (a Kubeflow job), the selector carries
``namespace_label="NS"`` too, and every query must select the namespace (through
``{selector}``, ``{namespace}`` or ``{in_namespace}``): a pod in another namespace
exporting a series with the same ``run`` cannot speak for the job. On OpenShift user
workload monitoring Prometheus sets ``namespace`` from the scrape target itself, so a
workload cannot forge it (see docs/security.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_AGGREGATES = ("avg", "sum", "min", "max")


class MappingError(ValueError):
    """A mapping that cannot be used; the message names its source, field and reason."""

    def __init__(self, source: str, where: str, reason: str) -> None:
        super().__init__(f"{source}: {where}: {reason}")


#: The DCGM exporter's series of one job's GPUs (see ``_default_series``).
_DCGM_PODS = 'pod=~"{job_id_re}-[a-z]+-[0-9]+(-[0-9]+-[a-z0-9]{5})?"{in_namespace}'
_FB_USED = "DCGM_FI_DEV_FB_USED{" + _DCGM_PODS + "}"
_FB_FREE = "DCGM_FI_DEV_FB_FREE{" + _DCGM_PODS + "}"
_MEM_PCT = f"100 * {_FB_USED} / ({_FB_USED} + {_FB_FREE})"


def _default_devices() -> dict[str, str]:
    return {
        "gpu_util": "DCGM_FI_DEV_GPU_UTIL{" + _DCGM_PODS + "}",
        "gpu_mem": _MEM_PCT,
        "gpu_mem_used_gb": f"{_FB_USED} / 1024",
    }


def _default_series() -> dict[str, str]:
    return {
        "loss": "trainguard_loss",
        "val_loss": "trainguard_val_loss",
        "step": "trainguard_step",
        "throughput": "trainguard_throughput",
        # DCGM exporter: one series per GPU, labelled with the pod it serves. The pod
        # names of a Training Operator job are JOB-REPLICATYPE-INDEX (and those of a
        # TrainJob JOB-RJOB-I-J-xxxxx): the regex must not take in the pods of a job
        # whose name merely starts with this one's (bert vs bert-large).
        "gpu_util": 'avg(DCGM_FI_DEV_GPU_UTIL{pod=~"{job_id_re}-[a-z]+-[0-9]+'
                    '(-[0-9]+-[a-z0-9]{5})?"{in_namespace}})',
        # memory: the mean share of the GPUs' memory, and the fullest GPU's GiB
        "gpu_mem": f"avg({_MEM_PCT})",
        "gpu_mem_used_gb": f"max({_FB_USED}) / 1024",
    }


@dataclass(frozen=True)
class Mapping:
    discover: str = "group by (namespace, run) (trainguard_step)"
    id_label: str = "run"
    selector: str = 'run="{job_id}"'  # label matchers, without the braces
    series: dict[str, str] = field(default_factory=_default_series)  # name -> PromQL
    state: str | None = "trainguard_state{selector}"
    state_label: str = "state"
    start_time: str | None = None
    gpus: str | None = None
    history: float = 86_400.0
    recent: float = 300.0
    min_step: float = 1.0
    namespace_label: str = "namespace"
    devices: dict[str, str] = field(default_factory=_default_devices)  # name -> PromQL
    host_label: str = "pod"
    gpu_label: str = "gpu"

    def expr(self, template: str, job_id: str, namespace: str | None = None) -> str:
        """``template`` (a metric name or PromQL) made into one job's query; with a
        ``namespace``, one that selects only that namespace's series."""
        if _METRIC_NAME.match(template):
            template = template + "{selector}"
        if namespace is not None and not _BINDS_NAMESPACE.search(template):
            raise MappingError("mapping", template, "does not select the job's namespace "
                               "(use {selector}, {namespace} or {in_namespace}): another "
                               "namespace's series could speak for the job")
        ns = f', {self.namespace_label}="{_quote(namespace)}"' if namespace is not None else ""
        values = {"job_id": _quote(job_id), "job_id_re": _quote(regex_literal(job_id)),
                  "namespace": _quote(namespace or ""), "in_namespace": ns}

        def fill(text: str) -> str:  # one pass: a value is never read again as a placeholder
            return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)

        values["selector"] = "{" + fill(self.selector) + ns + "}"
        return fill(template)

    def series_expr(self, name: str, job_id: str, namespace: str | None = None) -> str:
        return self.expr(self.series[name], job_id, namespace)

    def device_expr(self, name: str, job_id: str, namespace: str | None = None) -> str:
        return self.expr(self.devices[name], job_id, namespace)

    def unbound(self) -> list[str]:
        """The mapping's queries that could not select a job's namespace."""
        queries = {f"series.{k}": v for k, v in self.series.items()}
        queries |= {f"devices.{k}": v for k, v in self.devices.items()}
        queries |= {k: getattr(self, k) for k in ("state", "start_time", "gpus")
                    if getattr(self, k)}
        return [k for k, v in queries.items()
                if not _METRIC_NAME.match(v) and not _BINDS_NAMESPACE.search(v)]


_PLACEHOLDER = re.compile(r"\{(selector|job_id_re|job_id|namespace|in_namespace)\}")
_BINDS_NAMESPACE = re.compile(r"\{(selector|namespace|in_namespace)\}")


def regex_literal(text: str) -> str:
    """``text`` as a regex that matches exactly it (RE2 takes any escaped punctuation)."""
    return re.escape(text)


def _quote(job_id: str) -> str:
    # The id lands inside a PromQL string literal: escape what would end or break it.
    return job_id.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def load_mapping(source: str | Path | dict[str, Any] | None,
                 overrides: dict[str, str] | None = None) -> Mapping:
    """A mapping from a YAML/JSON file, a dict, or None (the defaults above), with
    ``overrides`` (from ``--opt``) applied last."""
    if source is None or isinstance(source, dict):
        name, doc = "mapping", dict(source or {})
    else:
        name = str(source)
        try:
            text = Path(source).read_text()
            doc = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise MappingError(name, "file", str(e)) from e
        if not isinstance(doc, dict):
            raise MappingError(name, "top level", "expected a mapping of keys to values")
    doc.update(overrides or {})
    return _build(name, doc)


def _build(name: str, doc: dict[str, Any]) -> Mapping:
    known = {f.name for f in fields(Mapping)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise MappingError(name, unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
    kw: dict[str, Any] = {}
    for key in ("discover", "id_label", "selector", "state_label", "namespace_label",
                "host_label", "gpu_label"):
        if key in doc:
            kw[key] = _text(name, key, doc[key])
    for key in ("state", "start_time", "gpus"):
        if key in doc:
            kw[key] = None if doc[key] in (None, "") else _text(name, key, doc[key])
    for key in ("history", "recent", "min_step"):
        if key in doc:
            kw[key] = _seconds(name, key, doc[key])
    for key in ("id_label", "namespace_label", "host_label", "gpu_label"):
        if key in kw and not _LABEL_NAME.match(kw[key]):
            raise MappingError(name, key, f"{kw[key]!r} is not a label name")
    if "selector" in kw:
        kw["selector"] = kw["selector"].strip().removeprefix("{").removesuffix("}").strip()
        if "{job_id}" not in kw["selector"]:
            raise MappingError(name, "selector", "must contain {job_id}, or every job "
                               "would read the same series")
    if "series" in doc:
        series = doc["series"]
        if not isinstance(series, dict) or not series:
            raise MappingError(name, "series", "expected a mapping of series name to query")
        kw["series"] = {str(k): _series(name, str(k), v) for k, v in series.items()}
    if "devices" in doc:
        devices = doc["devices"]
        if devices in (None, {}):
            kw["devices"] = {}  # no per-GPU reads
        elif not isinstance(devices, dict):
            raise MappingError(name, "devices", "expected a mapping of series name to a "
                               "query giving one series per GPU")
        else:
            kw["devices"] = {str(k): _series(name, f"devices.{k}", v)
                             for k, v in devices.items()}
    return Mapping(**kw)


def _series(name: str, key: str, spec: Any) -> str:
    where = f"series.{key}"
    if isinstance(spec, str) and spec.strip():
        return spec.strip()
    if not isinstance(spec, dict):
        raise MappingError(name, where, "expected a metric name, a PromQL expression, or "
                           "{metric, match, aggregate}")
    extra = sorted(set(spec) - {"metric", "match", "aggregate"})
    if extra:
        raise MappingError(name, f"{where}.{extra[0]}", "unknown key (known: metric, match, "
                           "aggregate)")
    metric = _text(name, f"{where}.metric", spec.get("metric"))
    if not _METRIC_NAME.match(metric):
        raise MappingError(name, f"{where}.metric", f"{metric!r} is not a metric name")
    match = spec.get("match")
    # A ``match`` is bound to the job's namespace like the selector is.
    expr = metric + ("{" + _text(name, f"{where}.match", match).strip("{} ") + "{in_namespace}}"
                     if match else "{selector}")
    aggregate = spec.get("aggregate")
    if aggregate is None:
        return expr
    if aggregate not in _AGGREGATES:
        raise MappingError(name, f"{where}.aggregate", f"{aggregate!r} is not one of "
                           f"{', '.join(_AGGREGATES)}")
    return f"{aggregate}({expr})"


def _text(name: str, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MappingError(name, where, f"expected a non-empty string, got {value!r}")
    return value.strip()


def _seconds(name: str, where: str, value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise MappingError(name, where, f"expected seconds, got {value!r}") from None
    if not seconds > 0:
        raise MappingError(name, where, f"must be > 0 seconds, got {value!r}")
    return seconds
