"""How a job's series are found in Prometheus: which query lists the running jobs, which
label matchers pick one job's series, and which query gives each series.

A mapping is a dict (or a YAML/JSON file holding one)::

    discover: group by (run) (trainguard_step)   # each result's ``id_label`` is a job id
    id_label: run
    selector: '{job="trainguard-demo", run="{job_id}"}'  # one job's series
    series:
      loss: trainguard_loss                        # a metric name: gets the selector
      step: trainguard_step
      gpu_util:                                    # averaged over the GPUs of the job's pods
        metric: DCGM_FI_DEV_GPU_UTIL
        match: 'pod=~"{job_id}-.*"'
        aggregate: avg
      tokens_per_s: 'sum(rate(tokens_total{selector}[1m]))'  # any PromQL
    state: trainguard_state{selector}              # optional info metric; its label is the state
    state_label: state
    start_time: trainguard_start_time_seconds{selector}  # optional: epoch seconds
    gpus: count(DCGM_FI_DEV_GPU_UTIL{pod=~"{job_id}-.*"})  # optional
    history: 86400     # seconds of history read each tick
    recent: 300        # a job with a sample this recent is still reporting
    min_step: 1        # finest range-query step, seconds

In a PromQL entry ``{selector}`` stands for the job's matchers in braces and ``{job_id}``
for the job id; a bare metric name is that metric under the selector.
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


def _default_series() -> dict[str, str]:
    return {
        "loss": "trainguard_loss",
        "val_loss": "trainguard_val_loss",
        "step": "trainguard_step",
        "throughput": "trainguard_throughput",
        # DCGM exporter: one series per GPU, labelled with the pod it serves.
        "gpu_util": 'avg(DCGM_FI_DEV_GPU_UTIL{pod=~"{job_id}-.*"})',
    }


@dataclass(frozen=True)
class Mapping:
    discover: str = "group by (run) (trainguard_step)"
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

    def expr(self, template: str, job_id: str) -> str:
        """``template`` (a metric name or PromQL) made into one job's query."""
        if _METRIC_NAME.match(template):
            template = template + "{selector}"
        matchers = "{" + self.selector + "}"
        return template.replace("{selector}", matchers).replace("{job_id}", _quote(job_id))

    def series_expr(self, name: str, job_id: str) -> str:
        return self.expr(self.series[name], job_id)


def _quote(job_id: str) -> str:
    # The id lands inside a PromQL string literal: escape what would end or break it.
    return job_id.replace("\\", "\\\\").replace('"', '\\"')


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
    for key in ("discover", "id_label", "selector", "state_label"):
        if key in doc:
            kw[key] = _text(name, key, doc[key])
    for key in ("state", "start_time", "gpus"):
        if key in doc:
            kw[key] = None if doc[key] in (None, "") else _text(name, key, doc[key])
    for key in ("history", "recent", "min_step"):
        if key in doc:
            kw[key] = _seconds(name, key, doc[key])
    if "id_label" in kw and not _LABEL_NAME.match(kw["id_label"]):
        raise MappingError(name, "id_label", f"{kw['id_label']!r} is not a label name")
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
    expr = metric + ("{" + _text(name, f"{where}.match", match).strip("{} ") + "}"
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
