"""The workspace's MLflow tracking server, read over its REST API.

Azure ML serves MLflow's REST API at the workspace's tracking URI with the scheme
changed to https (``https://{region}.api.azureml.ms/mlflow/v1.0/subscriptions/.../
workspaces/{ws}`` + ``/api/2.0/mlflow/...``), with an Azure Resource Manager token. A job's
MLflow run id is the job's name. The calls go through an azure-core pipeline with the
same credential and retry policy as the SDK, so a Function needs no ``mlflow`` import.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from azure.core import PipelineClient
from azure.core.credentials import TokenCredential
from azure.core.pipeline.policies import (
    BearerTokenCredentialPolicy,
    HeadersPolicy,
    RetryPolicy,
    UserAgentPolicy,
)
from azure.core.rest import HttpRequest

from trainguard.checker.model import Series

#: The token audience MLflow on Azure ML accepts (Azure Resource Manager).
ARM_SCOPE = "https://management.azure.com/.default"
API = "api/2.0/mlflow"
PAGE = 1000  # points asked for per get-history page


class MlflowError(Exception):
    """A tracking server answer this reader cannot use."""


#: cloud -> the domain of its Azure ML regional API hosts (REGION.api.azureml.ms): the
#: only hosts the management token is sent to. A job's tracking URI is the job's own
#: document, so a host elsewhere would take the Function's token with it.
AZURE_ML_HOSTS: dict[str, str] = {
    "AzureCloud": "api.azureml.ms",
    "AzureUSGovernment": "api.ml.azure.us",
    "AzureChinaCloud": "api.ml.azure.cn",
}
_REGION = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def https_base(tracking_uri: str, endpoint: str | None = None,
               cloud: str = "AzureCloud") -> str:
    """``azureml://eastus.api.azureml.ms/mlflow/v1.0/...`` -> ``https://...`` (no query);
    with ``endpoint``, its scheme and host replace the tracking URI's (tests, proxies).
    The tracking URI's host must be an Azure ML API host of ``cloud``, else MlflowError."""
    parts = urlsplit(tracking_uri)
    if not parts.netloc or not parts.path.strip("/"):
        raise MlflowError(f"tracking URI {tracking_uri!r} has no host or path")
    domain = AZURE_ML_HOSTS[cloud]
    region, dot, rest = (parts.hostname or "").partition(".")
    if parts.port not in (None, 443) or parts.username or not dot or rest != domain \
            or not _REGION.match(region):
        raise MlflowError(f"tracking URI host {parts.netloc!r} is not an Azure ML host of "
                          f"{cloud} (REGION.{domain}): the token is not sent there")
    scheme, host = "https", parts.netloc
    if endpoint:
        over = urlsplit(endpoint)
        scheme, host = over.scheme, over.netloc
    return urlunsplit((scheme, host, parts.path.rstrip("/"), "", ""))


@dataclass
class Run:
    start_time: float | None  # epoch seconds
    metric_keys: list[str] = field(default_factory=list)


class MlflowReader:
    """Run info and metric history from Azure ML's MLflow endpoint."""

    def __init__(self, credential: TokenCredential, *, retry_total: int = 4,
                 retry_backoff: float = 0.8, retry_backoff_max: float = 30.0,
                 connection_verify: bool | str = True) -> None:
        policies: list[Any] = [
            HeadersPolicy({"Accept": "application/json"}),
            UserAgentPolicy("trainguard"),
            RetryPolicy(retry_total=retry_total, retry_backoff_factor=retry_backoff,
                        retry_backoff_max=retry_backoff_max),
            BearerTokenCredentialPolicy(credential, ARM_SCOPE),
        ]
        # The base URL differs per workspace region: every request carries a full URL.
        self._client: PipelineClient[Any, Any] = PipelineClient(
            "https://api.azureml.ms", policies=policies, connection_verify=connection_verify)

    def _get(self, base: str, path: str, params: dict[str, str]) -> dict[str, Any]:
        response = self._client.send_request(HttpRequest("GET", f"{base}/{API}/{path}",
                                                         params=params))
        if response.status_code >= 400:  # after the retry policy gave up
            text = " ".join(response.text().split())[:200]
            raise MlflowError(f"{path}: HTTP {response.status_code}: {text}")
        body = response.json()
        if not isinstance(body, dict):
            raise MlflowError(f"{path}: expected a JSON object, got {type(body).__name__}")
        return body

    def run(self, base: str, run_id: str) -> Run:
        body = self._get(base, "runs/get", {"run_id": run_id})
        try:
            info, data = body["run"]["info"], body["run"].get("data") or {}
            start = info.get("start_time")
            keys = sorted({str(m["key"]) for m in data.get("metrics") or []})
            return Run(int(start) / 1000.0 if start not in (None, "", 0, "0") else None, keys)
        except (KeyError, TypeError, ValueError) as e:
            raise MlflowError(f"runs/get {run_id}: malformed run ({e!r})") from e

    def history(self, base: str, run_id: str, key: str) -> Series:
        """Every point of one metric, all pages, sorted by time then step."""
        rows: list[tuple[float, float, float]] = []
        token: str | None = None
        while True:
            params = {"run_id": run_id, "metric_key": key, "max_results": str(PAGE)}
            if token:
                params["page_token"] = token
            body = self._get(base, "metrics/get-history", params)
            for m in body.get("metrics") or []:
                rows.append(_point(run_id, key, m))
            token = body.get("next_page_token") or None
            if token is None:
                break
        rows.sort()
        arr = np.array(rows, dtype=np.float64).reshape(-1, 3)
        return Series(key, arr[:, 0], arr[:, 1], arr[:, 2])


def _point(run_id: str, key: str, m: Any) -> tuple[float, float, float]:
    # MLflow writes int64 fields as JSON numbers, some servers as strings: take both.
    try:
        t = int(m["timestamp"]) / 1000.0
        step = float(m["step"]) if m.get("step") is not None else math.nan
        return t, step, float(m["value"])
    except (KeyError, TypeError, ValueError) as e:
        raise MlflowError(f"get-history {run_id}/{key}: malformed point {m!r} ({e!r})") from e
