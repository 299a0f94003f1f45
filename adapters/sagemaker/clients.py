"""The three boto3 clients the adapter talks to, with botocore's own retries.

Throttling (ThrottlingException, TooManyRequestsException…) and 5xx answers are
retried by botocore with exponential backoff and jitter ("standard"), or with a
client-side rate limiter on top ("adaptive", for accounts where many watchers share
the ListTrainingJobs and GetMetricData quotas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import boto3
from botocore.config import Config

RETRY_MODES = ("standard", "adaptive")


@dataclass
class Clients:
    sagemaker: Any
    cloudwatch: Any
    logs: Any
    region: str


def make_clients(region: str | None = None, profile: str | None = None,
                 endpoints: dict[str, str] | None = None, retry_mode: str = "standard",
                 max_attempts: int = 8, session: boto3.Session | None = None) -> Clients:
    """Clients for SageMaker, CloudWatch and CloudWatch Logs in one region.

    ``endpoints`` maps a service name (``sagemaker``, ``cloudwatch``, ``logs``) to an
    endpoint URL, for tests against moto or a replay server."""
    if retry_mode not in RETRY_MODES:
        raise ValueError(f"retry_mode {retry_mode!r}: must be one of {', '.join(RETRY_MODES)}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts {max_attempts}: must be at least 1")
    session = session or boto3.Session(profile_name=profile, region_name=region)
    region = region or session.region_name
    if not region:
        raise ValueError("no AWS region: set the region option or AWS_REGION")
    mode: Literal["standard", "adaptive"] = "adaptive" if retry_mode == "adaptive" else "standard"
    # total_max_attempts counts the first call; botocore's max_attempts would not
    config = Config(retries={"mode": mode, "total_max_attempts": max_attempts},
                    user_agent_extra="trainguard")
    endpoints = endpoints or {}

    def client(service: str) -> Any:
        return session.client(service, region_name=region, config=config,  # type: ignore[call-overload]
                              endpoint_url=endpoints.get(service))

    return Clients(sagemaker=client("sagemaker"), cloudwatch=client("cloudwatch"),
                   logs=client("logs"), region=region)
