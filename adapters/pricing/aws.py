"""SageMaker training prices from the AWS Price List API (``pricing:GetProducts``).

Products of service ``AmazonSageMaker`` are filtered on the attributes the API
publishes: ``productFamily`` "ML Instance", ``regionCode``, ``instanceName`` and
``platoinstancetype`` "Training" (on-demand training; "SpotTraining" is spot). Each
item of ``PriceList`` is a JSON document in a string.
"""

from __future__ import annotations

import json
from typing import Any

from trainguard.checker.prices import GPUS, Price

SERVICE_CODE = "AmazonSageMaker"
#: The Price List API answers in us-east-1 (and ap-south-1) whatever region is priced.
API_REGION = "us-east-1"


class PriceNotFound(LookupError):
    """The API answered, but not with one on-demand hourly price for the instance."""


def make_client(timeout: float = 20.0) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("pricing", region_name=API_REGION, config=Config(
        retries={"mode": "standard", "max_attempts": 5},  # throttling and 5xx, with backoff
        connect_timeout=timeout, read_timeout=timeout))


def filters(instance_type: str, region: str) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
        ("productFamily", "ML Instance"), ("regionCode", region),
        ("instanceName", instance_type), ("platoinstancetype", "Training"))]


def sagemaker_price(client: Any, instance_type: str, region: str, read_on: str) -> Price:
    """The on-demand $/hour of training on one ``instance_type`` in ``region``."""
    found: dict[float, str] = {}
    gpus: tuple[int, str] | None = GPUS.get(instance_type)
    for page in client.get_paginator("get_products").paginate(
            ServiceCode=SERVICE_CODE, Filters=filters(instance_type, region)):
        for raw in page.get("PriceList", []):
            doc = json.loads(raw) if isinstance(raw, str) else raw
            attrs = doc.get("product", {}).get("attributes", {})
            usage = str(attrs.get("usagetype", ""))
            if "Train:" not in usage or "Spot" in usage:
                continue  # the filter asked for training; be sure of it
            for term in doc.get("terms", {}).get("OnDemand", {}).values():
                for dim in term.get("priceDimensions", {}).values():
                    usd = float(dim.get("pricePerUnit", {}).get("USD", 0) or 0)
                    if dim.get("unit") == "Hrs" and usd > 0:
                        found[usd] = (f"AWS Price List API ({SERVICE_CODE} sku "
                                      f"{doc['product'].get('sku')}, {usage}, effective "
                                      f"{term.get('effectiveDate')}, published "
                                      f"{doc.get('publicationDate')})")
            if gpus is None and str(attrs.get("gpu", "")).isdigit():
                gpus = (int(attrs["gpu"]), str(attrs.get("physicalGpu", "unknown")))
    if len(found) != 1:
        raise PriceNotFound(f"{instance_type} in {region}: the AWS Price List API gave "
                            f"{len(found)} on-demand training prices ({sorted(found)}), "
                            "not one")
    if gpus is None:
        raise PriceNotFound(f"{instance_type}: GPU count unknown (add it to "
                            "trainguard.checker.prices.GPUS)")
    (usd, source), = found.items()
    return Price(instance_type, usd, gpus[0], gpus[1], region, read_on, source)
