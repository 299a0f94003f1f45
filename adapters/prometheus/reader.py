"""One job's series, state and facts read from Prometheus through a ``Mapping``.

A range query evaluates its expression on a grid of times, so a sample is repeated at
every grid point until a newer one arrives (or it goes stale). Each series is therefore
read together with ``timestamp()`` of the same expression, which gives the time the
sample was written, and repeats of one sample are dropped: a series read back holds
the samples the job wrote, at the times it wrote them (for an aggregate such as the
average over GPUs, the grid times).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainguard.adapters.prometheus.client import PromClient, RawSeries, step_for
from trainguard.adapters.prometheus.mapping import Mapping
from trainguard.checker.model import Series

_FIELD = "tg_field"  # the label that tells a value series from its timestamp series


class AmbiguousSeries(ValueError):
    """A query that should give one series for a job gave several."""


@dataclass
class Reading:
    """What Prometheus holds about one job between ``start`` and ``end``."""

    series: dict[str, Series]
    labels: dict[str, str] = field(default_factory=dict)  # of its step series, if any
    state: str | None = None  # the state label's value, when the mapping has a state
    start_time: float | None = None
    gpus: int | None = None
    hosts: dict[str, dict[str, Series]] = field(default_factory=dict)  # ``Job.hosts``

    def last_time(self) -> float | None:
        times = [s.last_time for s in self.series.values() if len(s)]
        present = [t for t in times if t is not None]
        return max(present) if present else None


class Metrics:
    """Reads jobs' series from one Prometheus server; the Kubeflow adapter uses it too."""

    def __init__(self, client: PromClient, mapping: Mapping | None = None,
                 namespace: str | None = None) -> None:
        self.client = client
        self.mapping = mapping or Mapping()
        self.namespace = namespace  # every read bound to it unless a read names its own

    def job_ids(self, at: float | None = None) -> list[str]:
        """The ids the discovery query names at ``at``: the jobs reporting then."""
        ns, label = self.namespace, self.mapping.namespace_label
        ids = {r.labels.get(self.mapping.id_label, "")
               for r in self.client.query(self.mapping.discover, at, namespace=ns)
               if ns is None or r.labels.get(label) == ns}
        ids.discard("")  # a result without the id label names no job
        return sorted(ids)

    def series_for(self, job_id: str, start: float, end: float,
                   namespace: str | None = None) -> dict[str, Series]:
        """Every mapped series the job has points for between ``start`` and ``end``; with
        a ``namespace``, only series Prometheus holds for that namespace."""
        return self.read(job_id, start, end, namespace).series

    def read(self, job_id: str, start: float, end: float,
             namespace: str | None = None) -> Reading:
        ns = namespace if namespace is not None else self.namespace
        step = step_for(start, end, self.mapping.min_step)
        raw: dict[str, tuple[dict[str, str], np.ndarray, np.ndarray]] = {}
        for name in self.mapping.series:
            found = self._samples(name, job_id, ns, start, end, step)
            if found is not None:
                raw[name] = found
        steps = raw.get("step")
        series = {name: Series(name, t, _steps_at(t, steps, name), v)
                  for name, (_, t, v) in raw.items()}
        reading = Reading(series, labels=steps[0] if steps else {})
        for name in self.mapping.devices:
            for host, by in self._devices(name, job_id, ns, start, end, step, steps).items():
                reading.hosts.setdefault(host, {}).update(by)
        m = self.mapping
        if m.state:
            reading.state = self._state(job_id, ns, start, end, step)
        if m.start_time:
            value = self._scalar(m.expr(m.start_time, job_id, ns), ns, end, "start_time",
                                 job_id)
            reading.start_time = value
        if reading.start_time is None and series:
            reading.start_time = min(float(s.time[0]) for s in series.values() if len(s))
        if m.gpus:
            gpus = self._scalar(m.expr(m.gpus, job_id, ns), ns, end, "gpus", job_id)
            reading.gpus = int(gpus) if gpus is not None and gpus == gpus else None
        return reading

    def _samples(self, name: str, job_id: str, ns: str | None, start: float, end: float,
                 step: float) -> tuple[dict[str, str], np.ndarray, np.ndarray] | None:
        expr = self.mapping.series_expr(name, job_id, ns)
        # One request gives both the values and the times they were written.
        both = (f'label_replace({expr}, "{_FIELD}", "value", "", "") or '
                f'label_replace(timestamp({expr}), "{_FIELD}", "time", "", "")')
        result = self.client.query_range(both, start, end, step, namespace=ns)
        if not result:
            return None
        groups: dict[tuple[tuple[str, str], ...], dict[str, RawSeries]] = {}
        for r in result:
            key = tuple(sorted((k, v) for k, v in r.labels.items()
                               if k not in (_FIELD, "__name__")))
            groups.setdefault(key, {})[r.labels.get(_FIELD, "")] = r
        if len(groups) > 1:
            shown = "; ".join("{" + ", ".join(f"{k}={v!r}" for k, v in key) + "}"
                              for key in list(groups)[:3])
            raise AmbiguousSeries(
                f"series {name!r} of job {job_id!r}: the query {expr} gives {len(groups)} "
                f"series ({shown}), not one; narrow the mapping's selector or aggregate "
                "it (e.g. avg(...))")
        (key, pair), = groups.items()
        values, times = pair.get("value"), pair.get("time")
        if values is None or times is None:
            raise ValueError(f"series {name!r} of job {job_id!r}: Prometheus returned "
                             "values without their timestamps")
        labels = {k: val for k, val in values.labels.items() if k not in (_FIELD, "__name__")}
        return labels, *_written(values, times)

    def _devices(self, name: str, job_id: str, ns: str | None, start: float, end: float,
                 step: float, steps: tuple[dict[str, str], np.ndarray, np.ndarray] | None,
                 ) -> dict[str, dict[str, Series]]:
        """host -> ``NAME/gpuN`` for each of its GPUs and ``NAME``, their mean at each time."""
        m = self.mapping
        expr = m.device_expr(name, job_id, ns)
        both = (f'label_replace({expr}, "{_FIELD}", "value", "", "") or '
                f'label_replace(timestamp({expr}), "{_FIELD}", "time", "", "")')
        groups: dict[tuple[tuple[str, str], ...], dict[str, RawSeries]] = {}
        for r in self.client.query_range(both, start, end, step, namespace=ns):
            key = tuple(sorted((k, v) for k, v in r.labels.items()
                               if k not in (_FIELD, "__name__")))
            groups.setdefault(key, {})[r.labels.get(_FIELD, "")] = r
        per_host: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for key, pair in groups.items():
            labels = dict(key)
            host, gpu = labels.get(m.host_label), labels.get(m.gpu_label, "")
            values = pair.get("value")
            if not host or values is None:
                continue  # a series that names no host cannot be placed
            t, v = _written(values, pair.get("time"))
            per_host.setdefault(host, {})[f"{name}/gpu{gpu}"] = (t, v)
        out: dict[str, dict[str, Series]] = {}
        for host, gpus in per_host.items():
            by = {k: Series(k, t, _steps_at(t, steps, k), v) for k, (t, v) in gpus.items()}
            acc: dict[float, list[float]] = {}
            for t, v in gpus.values():
                for ti, vi in zip(t.tolist(), v.tolist(), strict=True):
                    acc.setdefault(ti, []).append(vi)
            mt = np.asarray(sorted(acc), dtype=np.float64)
            mv = np.asarray([float(np.mean(acc[x])) for x in mt.tolist()], dtype=np.float64)
            by[name] = Series(name, mt, _steps_at(mt, steps, name), mv)
            out[host] = by
        return out

    def _state(self, job_id: str, ns: str | None, start: float, end: float,
               step: float) -> str | None:
        m = self.mapping
        assert m.state is not None
        result = self.client.query_range(m.expr(m.state, job_id, ns), start, end, step,
                                         namespace=ns)
        latest = [(r.points[-1][0], r) for r in result if r.points]
        if not latest:
            return None
        _, newest = max(latest, key=lambda p: p[0])
        state = newest.labels.get(m.state_label)
        if not state:
            raise ValueError(f"job {job_id!r}: the state query {m.state} gives a series "
                             f"without the {m.state_label!r} label: {newest.labels}")
        return state

    def _scalar(self, expr: str, ns: str | None, at: float, what: str,
                job_id: str) -> float | None:
        result = self.client.query(expr, at, namespace=ns)
        if not result:
            return None
        if len(result) > 1:
            raise AmbiguousSeries(f"{what} of job {job_id!r}: the query {expr} gives "
                                  f"{len(result)} series, not one")
        return result[0].points[-1][1]


def _written(values: RawSeries, times: RawSeries | None) -> tuple[np.ndarray, np.ndarray]:
    """The samples of a range query at the times they were written: a repeat of one sample
    at later grid times, or an older one seen through staleness, is dropped."""
    written = dict(times.points) if times is not None else {}  # grid -> written
    t: list[float] = []
    v: list[float] = []
    for grid, value in values.points:
        when = written.get(grid, grid)
        if t and when <= t[-1]:
            continue
        t.append(when)
        v.append(value)
    return np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)


def _steps_at(times: np.ndarray, steps: tuple[dict[str, str], np.ndarray, np.ndarray] | None,
              name: str) -> np.ndarray:
    """The training step in force at each time: the last step written at or before it."""
    if name == "step" and steps is not None:
        return steps[2]
    if steps is None or not len(steps[1]):
        return np.full(len(times), np.nan)
    i = np.searchsorted(steps[1], times, side="right") - 1
    out = np.where(i >= 0, steps[2][np.clip(i, 0, None)], np.nan)
    return np.asarray(out, dtype=np.float64)
