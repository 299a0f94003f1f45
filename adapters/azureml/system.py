"""Per node and per GPU series from MLflow's system metrics, which Azure ML runs log.

MLflow's system metrics monitor (``mlflow.system_metrics``, on with
``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true`` or ``log_system_metrics=True``) logs, per
GPU ``i`` of the node it runs on, ``system/gpu_{i}_utilization_percentage``,
``system/gpu_{i}_memory_usage_percentage`` and ``system/gpu_{i}_memory_usage_megabytes``
(bytes / 1e6); with a node id (``MLFLOW_SYSTEM_METRICS_NODE_ID``, set per node of a
multi-node job) the keys are ``system/{node}/gpu_{i}_...``. Read from mlflow's
``system_metrics/metrics/gpu_monitor.py`` and ``system_metrics_monitor.py``.

Each becomes the node's own series in ``Job.hosts`` (``gpu_util/gpu0``, ``gpu_mem/gpu0``,
``gpu_mem_used_gb/gpu0``, and each name's mean over the node's GPUs), and, unless the job
logs them itself, the job's ``gpu_util`` and ``gpu_mem`` (mean over every GPU) and
``gpu_mem_used_gb`` (the fullest GPU). The system metrics' ``step`` counts their own
logging rounds, not training steps: the derived series carry none.
"""

from __future__ import annotations

import re

import numpy as np

from trainguard.checker.model import FloatArray, Series

_KEY = re.compile(r"^system/(?:(?P<node>[^/]+)/)?gpu_(?P<gpu>\d+)_(?P<what>"
                  r"utilization_percentage|memory_usage_percentage|memory_usage_megabytes)$")
#: MLflow's name -> (our series name, multiply by)
_NAMES: dict[str, tuple[str, float]] = {
    "utilization_percentage": ("gpu_util", 1.0),
    "memory_usage_percentage": ("gpu_mem", 1.0),
    "memory_usage_megabytes": ("gpu_mem_used_gb", 1e-3),
}
#: The host name of a single-node run's metrics (no node id in their keys).
ONE_NODE = "node"


def per_node(series: dict[str, Series]) -> tuple[dict[str, Series], dict[str, dict[str, Series]]]:
    """(the job's series with the GPU aggregates added, node -> its own series)."""
    by_node: dict[str, dict[str, Series]] = {}
    for key, s in series.items():
        m = _KEY.match(key)
        if m is None or not len(s):
            continue
        name, scale = _NAMES[m["what"]]
        node = m["node"] or ONE_NODE
        full = f"{name}/gpu{m['gpu']}"
        by_node.setdefault(node, {})[full] = Series(full, s.time, np.full(len(s), np.nan),
                                                    s.value * scale)
    if not by_node:
        return series, {}
    out = dict(series)
    for name, _ in _NAMES.values():
        parts = [s for by in by_node.values() for k, s in by.items()
                 if k.startswith(name + "/gpu")]
        for by in by_node.values():
            mine = [s for k, s in by.items() if k.startswith(name + "/gpu")]
            if mine:
                by[name] = _combine(name, mine, np.mean)
        if parts and name not in out:
            out[name] = _combine(name, parts, np.max if name == "gpu_mem_used_gb" else np.mean)
    return out, by_node


def _combine(name: str, parts: list[Series], how: object) -> Series:
    """One series at every time any part was logged: at each, ``how`` of every part's
    last value at or before it (nodes and GPUs log at their own moments)."""
    times: FloatArray = np.unique(np.concatenate([p.time for p in parts]))
    cols = []
    for p in parts:
        i = np.searchsorted(p.time, times, side="right") - 1
        cols.append(np.where(i >= 0, p.value[np.clip(i, 0, None)], np.nan))
    stacked = np.vstack(cols)
    fn = np.nanmax if how is np.max else np.nanmean
    with np.errstate(all="ignore"):
        seen = np.isfinite(stacked).any(axis=0)
        values = np.full(len(times), np.nan)
        values[seen] = fn(stacked[:, seen], axis=0)
    return Series(name, times, np.full(len(times), np.nan), values)
