"""A job's own stdout and stderr, for the failure signatures, where no Log Analytics table
has them: Azure ML compute clusters write each process's output to
``user_logs/std_log*.txt`` in the run's logs, and send none to Container Insights.

The run history service lists them (``GET {region}.api.azureml.ms/history/v1.0/.../runs/
{run}/details`` -> ``logFiles``: name -> a read-only SAS URL on the workspace's storage),
which is what azure-ai-ml's ``jobs.stream`` reads. Only the tail of each file is fetched
(HTTP Range), the SAS URL without the bearer token, and only on a blob host of the cloud;
lines matching a signature are kept, dated at the blob's Last-Modified (the job's last
write: a line dated at the tick would hide a silence from the stall rule).
"""

from __future__ import annotations

import re
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from azure.core import PipelineClient
from azure.core.credentials import TokenCredential
from azure.core.pipeline.policies import (
    BearerTokenCredentialPolicy,
    HeadersPolicy,
    RetryPolicy,
    UserAgentPolicy,
)
from azure.core.rest import HttpRequest

from trainguard.adapters.azureml.mlflow import ARM_SCOPE, MlflowError
from trainguard.checker import signatures
from trainguard.checker.model import LogLine

#: the files azure-ai-ml calls a job's user logs (JobLogPattern.COMMON_RUNTIME_ALL_USER_LOG_PATTERN)
STD_LOG = re.compile(r"^user_logs/std_log.*\.txt$")
TAIL_BYTES = 256 * 1024  # per file and tick: failures are at the end
MAX_LINES = 200  # matching lines kept per job
#: cloud -> the blob host suffix a SAS URL must have (the token-less GET goes only there)
BLOB_HOSTS = {"AzureCloud": ".blob.core.windows.net",
              "AzureUSGovernment": ".blob.core.usgovcloudapi.net",
              "AzureChinaCloud": ".blob.core.chinacloudapi.cn"}


def history_base(mlflow_base: str) -> str:
    """The run history root beside a workspace's MLflow root (same regional host)."""
    if "/mlflow/v1.0/" not in mlflow_base:
        raise MlflowError(f"{mlflow_base!r} is not an Azure ML MLflow tracking root")
    return mlflow_base.replace("/mlflow/v1.0/", "/history/v1.0/", 1)


class StdLogReader:
    """The signature lines in a job's ``user_logs/std_log*.txt``."""

    def __init__(self, credential: TokenCredential, *, retry_total: int = 4,
                 retry_backoff: float = 0.8, connection_verify: bool | str = True,
                 cloud: str = "AzureCloud", endpoint: str | None = None) -> None:
        def retry() -> RetryPolicy[Any, Any]:  # one each: a pipeline links its policies in place
            return RetryPolicy(retry_total=retry_total, retry_backoff_factor=retry_backoff,
                               retry_backoff_max=30.0)

        self._api: PipelineClient[Any, Any] = PipelineClient(
            "https://api.azureml.ms", connection_verify=connection_verify, policies=[
                HeadersPolicy({"Accept": "application/json"}), UserAgentPolicy("trainguard"),
                retry(), BearerTokenCredentialPolicy(credential, ARM_SCOPE)])
        # No credential policy: the SAS in the URL is the only authority sent to storage.
        self._blob: PipelineClient[Any, Any] = PipelineClient(
            "https://blob.core.windows.net", connection_verify=connection_verify,
            policies=[UserAgentPolicy("trainguard"), retry()])
        self.blob_suffix = BLOB_HOSTS[cloud]
        self.endpoint_host = urlsplit(endpoint).netloc if endpoint else None

    def log_files(self, mlflow_base: str, run_id: str) -> dict[str, str]:
        url = f"{history_base(mlflow_base)}/runs/{run_id}/details"
        response = self._api.send_request(HttpRequest("GET", url))
        if response.status_code >= 400:
            raise MlflowError(f"run details {run_id}: HTTP {response.status_code}")
        files = (response.json() or {}).get("logFiles") or {}
        if not isinstance(files, dict):
            raise MlflowError(f"run details {run_id}: logFiles is not an object")
        return {str(k): str(v) for k, v in files.items() if STD_LOG.match(str(k))}

    def _allowed(self, url: str) -> bool:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme != "https" or parts.username:
            return False
        return host.endswith(self.blob_suffix) or parts.netloc == self.endpoint_host

    def lines(self, mlflow_base: str, run_id: str) -> list[LogLine]:
        out: list[LogLine] = []
        for name, url in sorted(self.log_files(mlflow_base, run_id).items()):
            if not self._allowed(url):
                raise MlflowError(f"run {run_id}: {name} is not on a storage host of this "
                                  f"cloud ({urlsplit(url).netloc!r}): not read")
            response = self._blob.send_request(HttpRequest(
                "GET", url, headers={"Range": f"bytes=-{TAIL_BYTES}"}))
            if response.status_code == 416:  # an empty file has no last bytes
                continue
            if response.status_code >= 400:
                raise MlflowError(f"run {run_id}: {name}: HTTP {response.status_code}")
            modified = response.headers.get("Last-Modified")
            if not modified:
                raise MlflowError(f"run {run_id}: {name}: no Last-Modified to date it by")
            at = parsedate_to_datetime(modified).timestamp()
            text = response.read().decode("utf-8", errors="replace")
            whole = response.status_code == 200 or response.headers.get(
                "Content-Range", "").startswith("bytes 0-")
            if not whole:  # a tail: its first line may be cut
                text = text.partition("\n")[2]
            out += [LogLine(at, line) for line in text.splitlines()
                    if signatures.match(line) is not None]
        return out[-MAX_LINES:]
