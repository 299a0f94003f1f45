"""Training and host metrics of many jobs from CloudWatch, in as few GetMetricData
calls as the service allows (500 queries a call).

SageMaker publishes, in the namespace ``/aws/sagemaker/TrainingJobs``:

* each metric definition of the job (the regexes over its log), dimension
  ``TrainingJobName``;
* instance metrics per host, dimension ``Host`` = ``JOBNAME/algo-N``:
  ``GPUUtilization`` and ``GPUMemoryUtilization`` (0-100 *times the GPUs of the
  instance*), ``CPUUtilization`` (0-100 times the vCPUs).

GPU figures are divided by the instance's GPU count, where known, so that ``gpu_util``
and ``gpu_mem`` read 0-100 like every other source, then averaged across hosts for the
job's series; each host's own series are kept too (``Job.hosts``, keyed ``algo-N``),
so that a straggler can be named.
CloudWatch has no step axis: ``step`` is NaN unless the job defines a metric named
``step``, which then is the progress series and gives the other series their steps.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from trainguard.checker.model import FloatArray, Job, Series

log = logging.getLogger("trainguard.adapters.sagemaker")

NAMESPACE = "/aws/sagemaker/TrainingJobs"
MAX_QUERIES = 500  # GetMetricData's limit per call
#: host metric -> (series name, divide by the instance's GPUs)
HOST_METRICS: dict[str, tuple[str, bool]] = {
    "GPUUtilization": ("gpu_util", True),
    "GPUMemoryUtilization": ("gpu_mem", True),
    "CPUUtilization": ("cpu_util", False),
}
#: progress counters: the largest value in a period is the one reached
STAT_OF: dict[str, str] = {"step": "Maximum"}


@dataclass(frozen=True)
class Query:
    job: str
    series: str  # the series it feeds
    metric: str  # the CloudWatch metric name
    dimension: tuple[str, str]
    stat: str
    scale: float  # values are divided by this (GPUs per instance for GPU metrics)
    start: float  # epoch seconds the job needs data from
    host: str = ""  # ``algo-N`` for an instance metric; "" for the job's own metrics


def queries_for(job: Job, definitions: Sequence[str], hosts: int, now: float,
                lookback_s: float, period: int) -> list[Query]:
    """The queries one job needs: its metric definitions and its hosts' utilisation."""
    start = max(now - lookback_s, (job.start_time or now - lookback_s) - period)
    out = [Query(job.id, name, name, ("TrainingJobName", job.id), STAT_OF.get(name, "Average"),
                 1.0, start) for name in dict.fromkeys(definitions)]
    for metric, (series, per_gpu) in HOST_METRICS.items():
        scale = float(job.gpus_per_instance) if per_gpu and job.gpus_per_instance else 1.0
        out += [Query(job.id, series, metric, ("Host", f"{job.id}/algo-{h}"), "Average", scale,
                      start, f"algo-{h}") for h in range(1, max(hosts, 1) + 1)]
    return out


def batches(queries: Sequence[Query]) -> Iterator[list[Query]]:
    """Chunks of at most 500, oldest start first, so that one call's window (from its
    oldest start) fetches little more than each job needs: ceil(n / 500) chunks."""
    ordered = sorted(queries, key=lambda q: q.start)
    for i in range(0, len(ordered), MAX_QUERIES):
        yield ordered[i:i + MAX_QUERIES]


def calls_needed(n_queries: int) -> int:
    return math.ceil(n_queries / MAX_QUERIES)


def fetch(cloudwatch: Any, queries: Sequence[Query], now: float, period: int,
          ) -> dict[Query, tuple[list[float], list[float]]]:
    """Every query's (times, values), one GetMetricData call per 500 queries (plus
    NextToken pages when a window holds more than one answer's datapoints)."""
    out: dict[Query, tuple[list[float], list[float]]] = {}
    for chunk in batches(queries):
        by_id = {f"q{i}": q for i, q in enumerate(chunk)}
        request: dict[str, Any] = {
            "MetricDataQueries": [
                {"Id": qid, "ReturnData": True, "MetricStat": {
                    "Metric": {"Namespace": NAMESPACE, "MetricName": q.metric,
                               "Dimensions": [{"Name": q.dimension[0], "Value": q.dimension[1]}]},
                    "Period": period, "Stat": q.stat}}
                for qid, q in by_id.items()],
            "StartTime": datetime.fromtimestamp(min(q.start for q in chunk), UTC),
            "EndTime": datetime.fromtimestamp(now, UTC),
            "ScanBy": "TimestampAscending",
        }
        while True:
            page = cloudwatch.get_metric_data(**request)
            for result in page.get("MetricDataResults", []):
                q = by_id.get(result.get("Id", ""))
                if q is None:
                    continue
                times, values = out.setdefault(q, ([], []))
                times += [t.timestamp() for t in result.get("Timestamps", [])]
                values += [float(v) / q.scale for v in result.get("Values", [])]
            token = page.get("NextToken")
            if not token:
                break
            request["NextToken"] = token
    return out


def _mean_by_time(parts: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float]]:
    """One series from several hosts: the mean of the hosts that reported at each time."""
    acc: dict[float, list[float]] = defaultdict(list)
    for times, values in parts:
        for t, v in zip(times, values, strict=True):
            acc[t].append(v)
    times = sorted(acc)
    return times, [float(np.mean(acc[t])) for t in times]


def to_series(data: dict[Query, tuple[list[float], list[float]]]) -> dict[str, dict[str, Series]]:
    """job -> series name -> Series, sorted by time; steps from a ``step`` series."""
    grouped: dict[str, dict[str, list[tuple[list[float], list[float]]]]] = defaultdict(
        lambda: defaultdict(list))
    for q, tv in data.items():
        if tv[0]:
            grouped[q.job][q.series].append(tv)
    out: dict[str, dict[str, Series]] = {}
    for job, by_name in grouped.items():
        merged = {name: _mean_by_time(parts) for name, parts in by_name.items()}
        step = merged.get("step")
        series = {}
        for name, (times, values) in merged.items():
            t, v = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
            series[name] = Series(name, t, _steps_at(t, step), v)
        out[job] = series
    return out


def host_series(data: dict[Query, tuple[list[float], list[float]]],
                ) -> dict[str, dict[str, dict[str, Series]]]:
    """job -> host (``algo-N``) -> series name -> that host's own Series."""
    steps = {q.job: tv for q, tv in data.items() if q.series == "step" and not q.host}
    out: dict[str, dict[str, dict[str, Series]]] = defaultdict(dict)
    for q, (times, values) in data.items():
        if not q.host or not times:
            continue
        order = np.argsort(np.asarray(times, dtype=float), kind="stable")
        t = np.asarray(times, dtype=float)[order]
        v = np.asarray(values, dtype=float)[order]
        out[q.job].setdefault(q.host, {})[q.series] = Series(q.series, t,
                                                             _steps_at(t, steps.get(q.job)), v)
    return dict(out)


def _steps_at(times: FloatArray, step: tuple[list[float], list[float]] | None) -> FloatArray:
    """The last step reached at or before each time; NaN before the first step or when
    the job publishes no ``step`` metric."""
    if step is None or not step[0]:
        return np.full(len(times), np.nan)
    st, sv = np.asarray(step[0]), np.asarray(step[1])
    idx = np.searchsorted(st, times, side="right") - 1
    return np.where(idx >= 0, sv[np.clip(idx, 0, None)], np.nan)
