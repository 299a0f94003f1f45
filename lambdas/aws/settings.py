"""The Lambda's settings: ``trainguard.config.settings.aws`` (the stack writes them with
``Settings(...).to_env()``), and where the zip's root lies, which only the Lambda knows."""

from __future__ import annotations

from pathlib import Path

from trainguard.config import ConfigError
from trainguard.config.settings.aws import (
    DEFAULT_IDEMPOTENCY_TTL_S,
    DEFAULT_POLICY,
    DEFAULT_REGION_ENV,
    ENVIRONMENT_ENV,
    IDEMPOTENCY_TTL_ENV,
    INTERVAL_ENV,
    POLICY_ENV,
    REGION_ENV,
    SAGEMAKER_ENV_PREFIX,
    SERVICE,
    STATE_TABLE_ENV,
    STOP_ENABLED_ENV,
    STOP_TAG_ENV,
    TOPIC_ARN_ENV,
    Settings,
)

#: the zip's root, where stacks/package.py lays ``policy.yaml``: the folder holding the
#: ``trainguard`` package, three up from trainguard/lambdas/aws/settings.py. Not resolved:
#: in a checkout trainguard/lambdas is a link, and its target's parents are elsewhere.
PACKAGE_ROOT = Path(__file__).absolute().parents[3]


def policy_path(settings: Settings) -> Path:
    """The settings' policy file, relative paths against the package root."""
    path = Path(settings.policy)
    return path if path.is_absolute() else PACKAGE_ROOT / path


__all__ = [
    "DEFAULT_IDEMPOTENCY_TTL_S", "DEFAULT_POLICY", "DEFAULT_REGION_ENV", "ENVIRONMENT_ENV",
    "IDEMPOTENCY_TTL_ENV", "INTERVAL_ENV", "PACKAGE_ROOT", "POLICY_ENV", "REGION_ENV",
    "SAGEMAKER_ENV_PREFIX", "SERVICE", "STATE_TABLE_ENV", "STOP_ENABLED_ENV", "STOP_TAG_ENV",
    "TOPIC_ARN_ENV", "ConfigError", "Settings", "policy_path",
]
