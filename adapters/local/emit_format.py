"""Metric definitions for the lines ``trainguard.emit`` writes (``trainguard: key=value ...``).

Every regex starts at the ``trainguard:`` mark and needs the space before the key, so
``loss`` never matches inside ``val_loss``, and other lines of the log never match. They
use no lookbehind and no inline flags, so the same regexes serve as SageMaker
``MetricDefinitions`` (``trainguard.launch.sagemaker``) and in Loki or Fluentd.

Heartbeats: ``pause``/``heartbeat`` lines become the ``heartbeat`` series (value: seconds
into the pause, one series per known phase too: ``heartbeat/eval``), ``resume`` lines the
``pause_seconds`` series (the length of a finished pause).
"""

from __future__ import annotations

from trainguard.adapters.local.metric import PLANNED, STEP, MetricDefinition

# the numbers emit writes: %.7g, and nan, inf, -inf in lower case
EMIT_NUM = r"([-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf))"
_MARK = r"trainguard:"

#: the metrics the callbacks write and the rules read; any other key needs its own
#: definition: ``emit_definition(NAME)``
EMIT_METRICS = ("loss", "val_loss", "lr", "grad_norm", "epoch", "throughput",
                "gpu_mem_used_gb")
#: phases the callbacks pause for; any other phase still feeds ``heartbeat``
EMIT_PHASES = ("eval", "checkpoint")


def emit_definition(key: str, name: str | None = None) -> MetricDefinition:
    """The definition reading ``key=<number>`` from an emit line, as series ``name``."""
    return MetricDefinition(name or key, _MARK + r".*? " + _escape(key) + "=" + EMIT_NUM,
                            needle=_MARK)


def _escape(key: str) -> str:
    # keys are word characters and dots (emit replaces the rest); only the dot is special
    return key.replace(".", r"\.")


def _pause(phase: str) -> str:
    return _MARK + r" (?:pause|heartbeat) phase=" + phase + r" .*?elapsed=" + EMIT_NUM


EMIT_DEFINITIONS: tuple[MetricDefinition, ...] = (
    MetricDefinition(STEP, _MARK + r".*? step=([0-9]+)", needle=_MARK),
    MetricDefinition(PLANNED, _MARK + r".*? step=[0-9]+/([0-9]+)", needle=_MARK),
    *(emit_definition(k) for k in EMIT_METRICS),
    MetricDefinition("heartbeat", _pause(r"[^ ]+"), needle=_MARK),
    *(MetricDefinition(f"heartbeat/{p}", _pause(p), needle=_MARK) for p in EMIT_PHASES),
    MetricDefinition("pause_seconds", _MARK + r" resume phase=[^ ]+ .*?elapsed=" + EMIT_NUM,
                     needle=_MARK),
    # epoch seconds: the clock when a launcher's prefix hides the ISO timestamp
    MetricDefinition("emit_time", _MARK + r".* t=([0-9]+(?:\.[0-9]*)?)", time=True,
                     needle=_MARK),
)
