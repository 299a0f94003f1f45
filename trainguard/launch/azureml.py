"""Azure ML: the watch tag, the policy name and emit's MLflow sink on a command job.

    from azure.ai.ml import command
    from trainguard.launch.azureml import watch
    job = watch(command(command="python train.py", ...), policy="research")
    ml_client.jobs.create_or_update(job)

Azure ML configures MLflow inside its jobs by itself (tracking URI and run), so the job
needs no ``MLFLOW_TRACKING_URI``: the helper turns on emit's MLflow sink
(``TRAINGUARD_SINKS=mlflow``: every written line is also ``mlflow.log_metrics``, the job
metrics the Azure adapter reads) and MLflow's asynchronous logging
(``MLFLOW_ENABLE_ASYNC_LOGGING``), so a slow tracking call never holds up a training step.
The job image needs ``mlflow`` (or ``mlflow-skinny``) and ``azureml-mlflow``.
"""

from __future__ import annotations

from typing import Any

from trainguard.launch import POLICY_TAG, WATCH_TAG, check_policy_name

#: set on the job unless the job already sets them
ENVIRONMENT = {
    "TRAINGUARD_SINKS": "mlflow",
    "MLFLOW_ENABLE_ASYNC_LOGGING": "true",
}


def watch(job: Any, policy: str = "default", tag: str = WATCH_TAG,
          emit_interval: float | None = None) -> Any:
    """Add the tags and environment to an ``azure.ai.ml`` command job (the ``Command``
    that ``azure.ai.ml.command(...)`` returns, or a ``CommandJob``), in place; returns it."""
    if not hasattr(job, "tags") or not hasattr(job, "environment_variables"):
        raise TypeError("trainguard.launch.azureml.watch: expected an azure.ai.ml command job "
                        f"(with tags and environment_variables), got {type(job).__name__}")
    job.tags = {**(job.tags or {}), tag: "true", POLICY_TAG: check_policy_name(policy)}
    env = dict(job.environment_variables or {})
    for key, value in ENVIRONMENT.items():
        env.setdefault(key, value)
    if emit_interval is not None:
        env["TRAINGUARD_EMIT_INTERVAL"] = f"{emit_interval:g}"
    job.environment_variables = env
    return job
