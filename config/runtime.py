"""The policy a deployed watchdog runs: ``runtime_policy`` is what every runtime (the AWS
Lambda, the Azure Function, the Kubernetes CronJob) and the local watch do with the
policy they are given, written once: load it (or the embedded default), say so when the
deployment's switch holds back stops the policy allows, and apply ``effective_policy``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from trainguard.checker.policy import Policy
from trainguard.config.policy import default_policy, load_policy

log = logging.getLogger("trainguard.config")

#: the deployment's switch, as each runtime's settings name it
STOP_SWITCH = "TRAINGUARD_STOP_ENABLED"


def effective_policy(policy: Policy, stop_enabled: bool) -> Policy:
    """The policy as a deployment may run it: in dry run unless the deployment enables
    stops too (the environment's ``stop_enabled``), whatever the policy says. The switch
    can only make a policy more careful, never less."""
    if stop_enabled or policy.safety.dry_run:
        return policy
    return dataclasses.replace(policy, safety=dataclasses.replace(policy.safety, dry_run=True))


def runtime_policy(path: str | Path | None, stop_enabled: bool,
                   warn: Callable[[str], object] | None = None,
                   switch: str = STOP_SWITCH) -> Policy:
    """The policy file at ``path`` (``None``: the embedded default) as the deployment
    runs it. Raises ``PolicyError`` naming the file, line and field of every problem.
    ``warn`` (default: the ``trainguard.config`` logger) hears when ``switch`` keeps a
    policy that allows stops in dry run."""
    policy = load_policy(path) if path is not None else default_policy()
    if not stop_enabled and not policy.safety.dry_run:
        (warn or log.warning)(f"policy {policy.name!r} allows stops but {switch} is not "
                              "true: running in dry run")
    return effective_policy(policy, stop_enabled)
