"""Azure ML jobs: listed and read with azure-ai-ml's ``MLClient``, metrics from the
workspace's MLflow tracking server (REST, no ``mlflow`` import), stopped with
``jobs.begin_cancel``. ``states.py`` says how statuses map, ``mapping.py`` how a job
entity becomes the model, ``mlflow.py`` how metrics are read.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from trainguard.adapters.azureml.adapter import UNPARSED, AzureMLAdapter
from trainguard.adapters.azureml.logs import StdLogReader
from trainguard.adapters.azureml.mapping import MalformedJob
from trainguard.adapters.azureml.mlflow import MlflowError, MlflowReader
from trainguard.adapters.azureml.states import STATES

_OPTIONS = ("subscription", "resource_group", "workspace", "endpoint", "ca_file", "retries",
            "backoff")


def _cloud_kwargs(endpoint: str) -> dict[str, Any]:
    """An azure-ai-ml cloud whose Resource Manager is ``endpoint`` (named after it: the
    SDK keeps clouds in a process-wide table and never overwrites one)."""
    url = endpoint.rstrip("/") + "/"
    return {"cloud": f"trainguard:{urlsplit(url).netloc}", "cloud_metadata": {
        "azure_portal": url, "resource_manager": url, "active_directory": url,
        "aml_resource_id": url, "storage_endpoint": "core.windows.net",
        "registry_discovery_endpoint": url}}


def from_options(opts: dict[str, str], credential: Any = None) -> AzureMLAdapter:
    """The Azure ML source for ``trainguard check --source azureml``. Options:

    - ``subscription``, ``resource_group``, ``workspace`` (required): the workspace.
    - ``endpoint``: an https URL that replaces both Azure Resource Manager and the MLflow
      host (a recorded-response server in tests, or a proxy); ``ca_file``: the CA bundle
      that signs its certificate.
    - ``retries`` (default 4) and ``backoff`` (seconds, default 0.8): azure-core's retry
      policy on 408/429/5xx and connection errors, honouring Retry-After.

    The credential is ``DefaultAzureCredential`` (a Function's managed identity) unless
    one is passed.
    """
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"source azureml: unknown option {unknown[0]!r} "
                         f"(known: {', '.join(_OPTIONS)})")
    missing = [k for k in ("subscription", "resource_group", "workspace") if not opts.get(k)]
    if missing:
        raise ValueError(f"source azureml: option {missing[0]} is required "
                         "(--opt subscription=... --opt resource_group=... --opt workspace=...)")
    try:
        retries, backoff = int(opts.get("retries", 4)), float(opts.get("backoff", 0.8))
    except ValueError as e:
        raise ValueError(f"source azureml: option retries or backoff: {e}") from e
    endpoint = opts.get("endpoint") or None
    if endpoint and not endpoint.lower().startswith("https://"):
        raise ValueError(f"source azureml: option endpoint {endpoint!r} must be https "
                         "(bearer tokens are never sent in clear)")
    from azure.ai.ml import MLClient

    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    verify: bool | str = opts.get("ca_file") or True
    kwargs: dict[str, Any] = {"enable_telemetry": False, "retry_total": retries,
                              "retry_backoff_factor": backoff, "retry_backoff_max": 30.0,
                              "connection_verify": verify}
    # The public cloud, named so that a cloud left in AZUREML_CURRENT_CLOUD cannot leak in.
    kwargs.update(_cloud_kwargs(endpoint) if endpoint else {"cloud": "AzureCloud"})
    ml = MLClient(credential, opts["subscription"], opts["resource_group"], opts["workspace"],
                  **kwargs)
    reader = MlflowReader(credential, retry_total=retries, retry_backoff=backoff,
                          connection_verify=verify)
    logs = StdLogReader(credential, retry_total=retries, retry_backoff=backoff,
                        connection_verify=verify, endpoint=endpoint)
    return AzureMLAdapter(ml, reader, subscription=opts["subscription"],
                          resource_group=opts["resource_group"], workspace=opts["workspace"],
                          endpoint=endpoint, logs=logs)


__all__ = ["STATES", "UNPARSED", "AzureMLAdapter", "MalformedJob", "MlflowError",
           "MlflowReader", "from_options"]
