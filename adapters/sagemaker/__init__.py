"""SageMaker training jobs: ``trainguard check --source sagemaker --opt region=...``.

Modules: ``clients`` (boto3 clients and retries), ``mapping`` (DescribeTrainingJob and
EventBridge documents to ``Job``), ``metrics`` (CloudWatch GetMetricData, batched
across jobs), ``logs`` (CloudWatch Logs failure lines), ``adapter`` (the tick's view).
"""

from __future__ import annotations

from trainguard.adapters.sagemaker.adapter import SageMakerAdapter
from trainguard.adapters.sagemaker.clients import RETRY_MODES, make_clients
from trainguard.adapters.sagemaker.mapping import MalformedJob, parse_event

__all__ = ["MalformedJob", "SageMakerAdapter", "from_options", "make_clients", "parse_event"]

_SERVICES = ("sagemaker", "cloudwatch", "logs")
OPTIONS = {
    "region": "AWS region (default: the profile's or AWS_REGION)",
    "profile": "named profile from ~/.aws/config (default: the usual credential chain)",
    "endpoint_url": "one endpoint for all three services (tests, moto, VPC endpoints)",
    "sagemaker_endpoint_url": "endpoint for SageMaker only (overrides endpoint_url)",
    "cloudwatch_endpoint_url": "endpoint for CloudWatch only",
    "logs_endpoint_url": "endpoint for CloudWatch Logs only",
    "retry_mode": f"botocore retry mode: {' or '.join(RETRY_MODES)} (default standard)",
    "max_attempts": "attempts per call, first included, on throttling and 5xx (default 8)",
    "period": "CloudWatch period of the series, seconds (default 60)",
    "lookback": "seconds of metrics and log lines read on a job's first tick (default 10800)",
    "tags_ttl": "seconds a job's tags are reused before ListTags again (default 600)",
}


def from_options(opts: dict[str, str]) -> SageMakerAdapter:
    """The adapter from ``--opt KEY=VALUE`` pairs.

    Options: region, profile, endpoint_url, sagemaker_endpoint_url,
    cloudwatch_endpoint_url, logs_endpoint_url, retry_mode (standard | adaptive),
    max_attempts, period (s), lookback (s), tags_ttl (s); see ``OPTIONS``.
    """
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ValueError(f"sagemaker: unknown option(s) {', '.join(unknown)} "
                         f"(known: {', '.join(OPTIONS)})")

    def number(key: str, default: float) -> float:
        try:
            value = float(opts.get(key, default))
        except ValueError:
            raise ValueError(f"sagemaker: option {key}={opts[key]!r} is not a number") from None
        if value <= 0:
            raise ValueError(f"sagemaker: option {key}={opts[key]!r} must be positive")
        return value

    endpoints = {s: opts.get(f"{s}_endpoint_url") or opts["endpoint_url"]
                 for s in _SERVICES if opts.get(f"{s}_endpoint_url") or opts.get("endpoint_url")}
    clients = make_clients(region=opts.get("region"), profile=opts.get("profile"),
                           endpoints=endpoints, retry_mode=opts.get("retry_mode", "standard"),
                           max_attempts=int(number("max_attempts", 8)))
    return SageMakerAdapter(clients, period=int(number("period", 60)),
                            lookback_s=number("lookback", 10800),
                            tags_ttl_s=number("tags_ttl", 600))
