"""One settings contract per runtime: ``aws.Settings``, ``azure.Settings`` and
``k8s.Settings``, each a plain dataclass with ``from_env`` (the runtime reads it) and
``to_env`` (the stack writes it), sharing one boolean parser and ``ConfigError``."""

from trainguard.config.settings.base import PREFIX, parse_bool

__all__ = ["PREFIX", "parse_bool"]
