"""Attack: a job's own document sends the Function's token elsewhere (issue 16, finding 9).

An Azure ML job's MLflow tracking URI comes from the job (``services.Tracking``), which
whoever submits or edits it controls. The reader sends the Function's management token
to that host; it now goes only to the Azure ML API hosts of the workspace's cloud.
"""

from __future__ import annotations

import pytest

from trainguard.adapters.azureml.mlflow import MlflowError, https_base

PATH = ("/mlflow/v1.0/subscriptions/0/resourceGroups/rg/providers/"
        "Microsoft.MachineLearningServices/workspaces/ws")


@pytest.mark.parametrize("host", [
    "evil.example", "eastus.api.azureml.ms.evil.example", "evil.example#.api.azureml.ms",
    "user@eastus.api.azureml.ms", "eastus.api.azureml.ms:8443", "api.azureml.ms",
    "eastus.api.ml.azure.us",  # another cloud's host, for a public-cloud workspace
])
def test_a_tracking_host_outside_azure_ml_gets_no_token(host: str) -> None:
    with pytest.raises(MlflowError, match=r"not an Azure ML host|has no host or path"):
        https_base(f"azureml://{host}{PATH}")
    # an operator's endpoint override (a proxy) does not make a bad job host acceptable
    with pytest.raises(MlflowError, match=r"not an Azure ML host|has no host or path"):
        https_base(f"azureml://{host}{PATH}", endpoint="https://proxy.internal")


@pytest.mark.parametrize(("host", "cloud"), [
    ("eastus.api.azureml.ms", "AzureCloud"), ("westeurope.api.azureml.ms", "AzureCloud"),
    ("usgovvirginia.api.ml.azure.us", "AzureUSGovernment"),
    ("chinaeast2.api.ml.azure.cn", "AzureChinaCloud"),
])
def test_the_workspace_clouds_hosts_are_read(host: str, cloud: str) -> None:
    assert https_base(f"azureml://{host}{PATH}?x=1", cloud=cloud) == f"https://{host}{PATH}"
