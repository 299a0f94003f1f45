"""Report a training job's progress in one line per call, readable on every platform.

Standard library only, Python 3.9 and later: this module is imported inside training
images that have none of trainguard's other dependencies (``pip install --no-deps`` of
the trainguard wheel, see the README's "Installing", or copy this one file).

    from trainguard.emit import emit, pause
    for step, batch in enumerate(loader):
        loss = train_step(batch)
        emit(step=step, loss=loss.item(), lr=sched.get_last_lr()[0])
    with pause("eval"):          # heartbeats every 30 s while evaluation runs
        val_loss = evaluate()
    emit(step=step, val_loss=val_loss, event="eval")

The line format (``docs/platforms/scripts.md``), one line per written record::

    2025-11-29T17:06:40.123Z trainguard: step=120/5000 loss=2.3451 lr=0.0003 t=1764436000.123
    2025-11-29T17:07:10.001Z trainguard: pause phase=eval step=120 elapsed=0 t=...
    2025-11-29T17:07:40.002Z trainguard: heartbeat phase=eval step=120 elapsed=30 t=...
    2025-11-29T17:07:51.219Z trainguard: resume phase=eval step=120 elapsed=41.22 t=...

GPU memory for the ``rightsizing`` rule: the peak this process's GPU held, in GB, as
``gpu_mem_used_gb`` (a name every reader knows)::

    emit(step=step, loss=loss.item(),
         gpu_mem_used_gb=torch.cuda.max_memory_allocated() / 1e9)

Tokens are ``key=value`` separated by one space after the ``trainguard:`` mark, so one
regex per metric reads them (SageMaker metric definitions, Loki, Fluentd, trainguard's
text reader: ``adapters/local/emit_format.py`` holds the shipped definitions). Numbers are
written with 7 significant digits; NaN and infinity as ``nan``, ``inf``, ``-inf``, which
read back as non-finite. The ISO-8601 UTC timestamp first gives log files a clock; ``t=``
(epoch seconds) keeps one when a launcher prefixes the lines.

Rate limit: at most one line per ``interval`` seconds (default 10, ``TRAINGUARD_EMIT_INTERVAL``);
the first call, an ``event``, and any non-finite value always write. A skipped call costs
well under a microsecond (``docs/platforms/scripts.md`` has the measurement).
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, SupportsFloat, TextIO

MARK = "trainguard:"
DEFAULT_INTERVAL = 10.0
DEFAULT_HEARTBEAT = 30.0  # well below the stall rule's 300 s floor

_isfinite = math.isfinite
_monotonic = time.monotonic
_BAD_KEY = re.compile(r"[^\w.]")
_PHASE = re.compile(r"[A-Za-z0-9_.-]+")


def fmt(value: SupportsFloat) -> str:
    """A number as the line carries it: ``%.7g``, and ``nan``, ``inf``, ``-inf``."""
    v = float(value)
    if v != v:
        return "nan"
    return format(v, ".7g")  # inf -> 'inf', -inf -> '-inf'


def iso(epoch: float) -> str:
    """UTC ISO-8601 with milliseconds, e.g. ``2025-11-29T17:06:40.123Z``."""
    ms = round(epoch * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


class Sink(Protocol):
    """Somewhere else a written record goes (MLflow, Prometheus)."""

    def record(self, step: int | None, values: Mapping[str, float], when: float) -> None: ...

    def heartbeat(self, phase: str, step: int | None, elapsed: float, when: float) -> None: ...


class Emitter:
    """Writes the lines. One per process is made by the module functions from the
    environment; make your own for another stream or interval."""

    def __init__(self, interval: float = DEFAULT_INTERVAL, stream: TextIO | None = None,
                 sinks: tuple[Sink, ...] = (), total_steps: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval}")
        self.interval = interval
        self.stream = stream  # None: sys.stdout as it is at write time
        self.sinks = sinks
        self.total_steps = total_steps
        self.clock = clock
        self.step: int | None = None  # the last step seen, for heartbeat lines
        self.written = 0
        self.skipped = 0
        self._due = -math.inf  # monotonic time the next rate-limited line may be written
        self._keys: dict[str, str] = {}
        self._lock = threading.Lock()

    # --- the hot path -------------------------------------------------------------------

    def emit(self, step: int | None = None, loss: SupportsFloat | None = None, *,
             event: str | None = None, **metrics: SupportsFloat) -> bool:
        """Write one line unless rate-limited; True when a line was written."""
        if step is not None:
            self.step = step
        if event is None and _monotonic() < self._due:
            # skipped unless a value is non-finite (the divergence rule must see it)
            try:
                if (loss is None or _isfinite(loss)) and all(map(_isfinite, metrics.values())):
                    self.skipped += 1
                    return False
            except TypeError:
                raise TypeError(f"trainguard.emit: values must be numbers, got "
                                f"loss={loss!r}, {metrics!r}") from None
        values: dict[str, float] = {}
        if loss is not None:
            values["loss"] = float(loss)
        for key, value in metrics.items():
            values[self._key(key)] = float(value)
        self._write_record(step, values, event)
        return True

    def record(self, step: int | None, values: Mapping[str, SupportsFloat], *,
               event: str | None = None, force: bool = False) -> bool:
        """``emit`` with the metrics in a mapping (``loss`` among them, if any); ``force``
        writes past the rate limit (a framework's own logging cadence already paces it)."""
        if step is not None:
            self.step = step
        if (event is None and not force and _monotonic() < self._due
                and all(map(_isfinite, values.values()))):
            self.skipped += 1
            return False
        self._write_record(step, {self._key(k): float(v) for k, v in values.items()}, event)
        return True

    def due(self) -> bool:
        """Whether the next rate-limited call will write (skip costly work otherwise)."""
        return _monotonic() >= self._due

    # --- everything else is rare ------------------------------------------------------------

    def _key(self, key: str) -> str:
        """A metric name as one token: characters other than word characters and dots
        become ``_`` (``train/loss`` -> ``train_loss``)."""
        safe = self._keys.get(key)
        if safe is None:
            safe = self._keys[key] = _BAD_KEY.sub("_", key) or "_"
        return safe

    def _write_record(self, step: int | None, values: dict[str, float],
                      event: str | None) -> None:
        parts = []
        if event is not None:
            parts.append(f"event={_phase(event)}")
        if step is not None:
            parts.append(f"step={int(step)}" + (f"/{self.total_steps}" if self.total_steps
                                                 else ""))
        parts += [f"{k}={fmt(v)}" for k, v in values.items()]
        when = self.clock()
        self._write(" ".join(parts), when)
        self._due = _monotonic() + self.interval
        for sink in self.sinks:
            sink.record(step, values, when)

    def _write(self, body: str, when: float) -> None:
        line = f"{iso(when)} {MARK} {body} t={round(when * 1000) / 1000:.3f}\n"
        with self._lock:
            stream = self.stream or sys.stdout
            stream.write(line)
            stream.flush()
            self.written += 1

    def heartbeat(self, phase: str = "busy", elapsed: float = 0.0, word: str = "heartbeat",
                  ) -> None:
        """One ``heartbeat`` line now (``pause`` writes them for you)."""
        phase = _phase(phase)
        step = f" step={int(self.step)}" if self.step is not None else ""
        when = self.clock()
        self._write(f"{word} phase={phase}{step} elapsed={fmt(round(elapsed, 2))}", when)
        for sink in self.sinks:
            sink.heartbeat(phase, self.step, elapsed if word != "resume" else -1.0, when)

    @contextmanager
    def pause(self, phase: str, every: float = DEFAULT_HEARTBEAT) -> Iterator[None]:
        """Heartbeats from a daemon thread while the block runs: ``pause`` on entry,
        ``heartbeat`` every ``every`` seconds, ``resume`` on exit (also on an error)."""
        if every <= 0:
            raise ValueError(f"heartbeat interval must be > 0 seconds, got {every}")
        phase = _phase(phase)
        start = _monotonic()
        self.heartbeat(phase, 0.0, "pause")
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every):
                self.heartbeat(phase, _monotonic() - start)

        thread = threading.Thread(target=beat, name=f"trainguard-heartbeat-{phase}",
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.heartbeat(phase, _monotonic() - start, "resume")
            self._due = -math.inf  # the first step after a pause is always written


def _phase(name: str) -> str:
    if not _PHASE.fullmatch(name):
        raise ValueError(f"trainguard.emit: phase/event {name!r} must be one word of letters, "
                         "digits, '_', '.' or '-'")
    return name


# --- optional sinks (each imports its client only when used) -----------------------------

class MlflowSink:
    """``mlflow.log_metrics`` for each written record (Azure ML reads job metrics from
    MLflow). Heartbeats go in as ``trainguard_heartbeat`` (seconds into the pause)."""

    def __init__(self) -> None:
        import mlflow  # a clear ImportError here: the sink was asked for

        self._mlflow: Any = mlflow

    def record(self, step: int | None, values: Mapping[str, float], when: float) -> None:
        metrics = dict(values)
        if step is not None:
            metrics["step"] = float(step)
        self._mlflow.log_metrics(metrics, step=step, timestamp=int(when * 1000))

    def heartbeat(self, phase: str, step: int | None, elapsed: float, when: float) -> None:
        self._mlflow.log_metric(f"trainguard_heartbeat_{phase}", elapsed, step=step,
                                timestamp=int(when * 1000))


class PrometheusSink:
    """Gauges for Prometheus: scraped from ``port`` (a PodMonitor), or pushed to a
    Pushgateway at ``gateway`` (host:port) on every written record and heartbeat.

    One gauge per metric, named as the Prometheus adapter's default mapping and the
    generated PrometheusRules read them, each labelled ``run`` (the job's id):
    ``trainguard_step``, ``trainguard_loss``, ``trainguard_val_loss``, ...
    (``trainguard_<name>`` for any metric), ``trainguard_last_record_timestamp_seconds``,
    and ``trainguard_heartbeat_timestamp_seconds{phase}`` /
    ``trainguard_pause_elapsed_seconds{phase}`` (-1 once the pause ended).
    """

    def __init__(self, job: str, port: int | None = None, gateway: str | None = None) -> None:
        import prometheus_client as pc

        if (port is None) == (gateway is None):
            raise ValueError("PrometheusSink: give exactly one of port (scrape) or gateway (push)")
        self._pc: Any = pc
        self.job, self.gateway = job, gateway
        self.registry = pc.CollectorRegistry()
        self._gauges: dict[str, Any] = {}
        self.last = self._gauge("last_record_timestamp_seconds", "when the last record was written")
        self.beat = self._gauge("heartbeat_timestamp_seconds",
                                "when the last heartbeat was written", ("phase",))
        self.paused = self._gauge("pause_elapsed_seconds",
                                  "seconds into the current pause, -1 after it ended", ("phase",))
        if port is not None:
            self.server = pc.start_http_server(port, registry=self.registry)

    def _gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        full = "trainguard_" + _PROM_NAME.sub("_", name)
        if full not in self._gauges:
            self._gauges[full] = self._pc.Gauge(full, doc, ["run", *extra],
                                                registry=self.registry)
        return self._gauges[full]

    def _push(self) -> None:
        if self.gateway is not None:
            self._pc.push_to_gateway(self.gateway, job="trainguard", registry=self.registry,
                                     grouping_key={"run": self.job})

    def record(self, step: int | None, values: Mapping[str, float], when: float) -> None:
        if step is not None:
            self._gauge("step", "last training step").labels(self.job).set(step)
        for name, value in values.items():
            self._gauge(name, f"last value of {name}").labels(self.job).set(value)
        self.last.labels(self.job).set(when)
        self._push()

    def heartbeat(self, phase: str, step: int | None, elapsed: float, when: float) -> None:
        self.beat.labels(self.job, phase).set(when)
        self.paused.labels(self.job, phase).set(elapsed)
        self._push()


_PROM_NAME = re.compile(r"[^a-zA-Z0-9_]")


def sinks_from_env(env: Mapping[str, str]) -> tuple[Sink, ...]:
    """``TRAINGUARD_SINKS=mlflow,prometheus`` (what the launch helpers set); Prometheus
    scrapes ``TRAINGUARD_METRICS_PORT`` or pushes to ``TRAINGUARD_PUSHGATEWAY``."""
    names = [n.strip() for n in env.get("TRAINGUARD_SINKS", "").split(",") if n.strip()]
    sinks: list[Sink] = []
    for name in names:
        if name == "mlflow":
            sinks.append(MlflowSink())
        elif name == "prometheus":
            port = env.get("TRAINGUARD_METRICS_PORT")
            job = env.get("TRAINGUARD_JOB_NAME") or env.get("HOSTNAME", "training")
            sinks.append(PrometheusSink(job, port=int(port) if port else None,
                                        gateway=env.get("TRAINGUARD_PUSHGATEWAY")))
        else:
            raise ValueError(f"TRAINGUARD_SINKS: unknown sink {name!r} "
                             "(known: mlflow, prometheus)")
    return tuple(sinks)


def from_env(env: Mapping[str, str] | None = None) -> Emitter:
    """The emitter the module functions use, configured by ``TRAINGUARD_*`` variables."""
    env = os.environ if env is None else env
    raw = env.get("TRAINGUARD_EMIT_INTERVAL", str(DEFAULT_INTERVAL))
    try:
        interval = float(raw)
    except ValueError:
        raise ValueError(f"TRAINGUARD_EMIT_INTERVAL={raw!r}: not a number of seconds") from None
    return Emitter(interval=interval, sinks=sinks_from_env(env))


# --- module functions: one emitter per process -------------------------------------------

_default: Emitter | None = None


def default() -> Emitter:
    global _default
    if _default is None:
        _default = from_env()
    return _default


def configure(emitter: Emitter | None = None, **options: Any) -> Emitter:
    """Replace the process's emitter: ``configure(interval=5, total_steps=5000)``."""
    global _default
    _default = emitter if emitter is not None else Emitter(**options)
    return _default


def emit(step: int | None = None, loss: SupportsFloat | None = None, *,
         event: str | None = None, **metrics: SupportsFloat) -> bool:
    """Write ``trainguard: step=N loss=X key=value ...`` (rate-limited; see the module doc)."""
    return (_default or default()).emit(step, loss, event=event, **metrics)


def pause(phase: str, every: float = DEFAULT_HEARTBEAT) -> Any:
    """``with pause("eval"):`` heartbeat lines while a long evaluation or checkpoint runs."""
    return default().pause(phase, every)


def heartbeat(phase: str = "busy", elapsed: float = 0.0) -> None:
    """One heartbeat line now, for a long phase you drive from your own loop."""
    default().heartbeat(phase, elapsed)
