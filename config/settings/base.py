"""What every runtime's ``Settings`` shares: the one boolean parser, the environment's
prefix and small readers that name the variable and the value in every ``ConfigError``.

Settings are plain frozen dataclasses with no dependency beyond the standard library:
the runtimes read them with ``from_env`` and the stacks write them with ``to_env``, so a
setting is named once, here, for both sides.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from trainguard.config.problems import ConfigError

PREFIX = "TRAINGUARD_"

_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


def parse_bool(name: str, value: str) -> bool:
    """``true/yes/1/on`` or ``false/no/0/off`` (any case, spaces ignored); anything else
    is a ``ConfigError`` naming ``name`` and the value: a typo must never mean dry run or
    stop silently."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r}: expected one of {'/'.join(_TRUE + _FALSE)}")


def bool_text(value: bool) -> str:
    return "true" if value else "false"


def text(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, stripped; ``None`` when unset or blank."""
    value = env.get(name, "").strip()
    return value or None


def flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = text(env, name)
    return default if value is None else parse_bool(name, value)


def positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = text(env, name)
    if value is None:
        return default
    if not value.isdigit() or int(value) <= 0:
        raise ConfigError(f"{name}={value!r}: must be a positive whole number")
    return int(value)


def positive_float(env: Mapping[str, str], name: str) -> float | None:
    value = text(env, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise ConfigError(f"{name}={value!r}: must be a positive number")
    return number


def number_text(value: float) -> str:
    """A number as a setting: ``300`` rather than ``300.0``."""
    return f"{value:g}" if float(value).is_integer() and abs(value) < 1e15 else repr(value)


#: ``TRAINGUARD_`` names that belong to trainguard's other parts, never to a runtime: the
#: training side's emitter (``trainguard.emit``, the launch helpers), the stack builder and
#: the tests. A runtime lets them be; any other name it does not read is refused.
NOT_RUNTIME = frozenset({
    "TRAINGUARD_SINKS", "TRAINGUARD_METRICS_PORT", "TRAINGUARD_PUSHGATEWAY",
    "TRAINGUARD_JOB_NAME", "TRAINGUARD_EMIT_INTERVAL",  # the training process's emitter
    "TRAINGUARD_WHEEL_CACHE", "TRAINGUARD_ENVIRONMENTS",  # the stack builder
    "TRAINGUARD_RUNS", "TRAINGUARD_CURVES", "TRAINGUARD_UPDATE_GOLDEN",  # the tests
    "TRAINGUARD_ALLOWED_SKIPS",
})


def unknown(env: Mapping[str, str], known: set[str], prefixes: tuple[str, ...] = ()) -> set[str]:
    """The ``TRAINGUARD_`` names in ``env`` that are neither ``known`` nor under one of
    ``prefixes`` (nor another part's, ``NOT_RUNTIME``): a renamed or mistyped setting
    that the runtime would never read."""
    return {k for k in env if k.startswith(PREFIX) and k not in known
            and k not in NOT_RUNTIME and not k.startswith(prefixes or ("\0",))}


def refuse_unknown(env: Mapping[str, str], known: set[str], who: str,
                   prefixes: tuple[str, ...] = ()) -> None:
    """A ``ConfigError`` naming each ``TRAINGUARD_`` variable ``who`` would never read,
    with the setting it most looks like: the stop tag set under a mistyped name must not
    mean "any job may be stopped" silently."""
    extra = sorted(unknown(env, known, prefixes))
    if not extra:
        return
    said = []
    tails = sorted(k[len(PREFIX):] for k in known)  # compared without the common prefix
    for name in extra:
        close = difflib.get_close_matches(name[len(PREFIX):], tails, n=1, cutoff=0.75)
        said.append(f"{name}: not a setting {who} reads"
                    + (f" (did you mean {PREFIX}{close[0]}?)" if close else ""))
    raise ConfigError("; ".join(said) + f"; it reads {', '.join(sorted(known))}"
                      + "".join(f", {p}*" for p in prefixes))
