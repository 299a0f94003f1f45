"""Launch helpers: make a job watchable where it is launched, before it starts.

``sagemaker.watch(estimator_or_trainer, policy=...)``, ``azureml.watch(command_job, ...)``
and ``kubeflow.watch(manifest, ...)`` each add trainguard's watch tag (or label), the
policy name, and what the platform needs to read ``trainguard.emit``'s lines.
"""

from __future__ import annotations

import re

WATCH_TAG = "trainguard:watch"
POLICY_TAG = "trainguard:policy"

# the characters AWS, Azure and Kubernetes all accept in a tag or label value
_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")


def check_policy_name(policy: str) -> str:
    if not _VALUE.fullmatch(policy):
        raise ValueError(f"policy name {policy!r}: use 1-63 letters, digits, '_', '.' or '-', "
                         "starting and ending with a letter or digit (it becomes a tag or "
                         "label value)")
    return policy
