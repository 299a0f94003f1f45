"""Azure VM prices from the Azure Retail Prices API (unauthenticated, public).

One filter per size and region: ``serviceName eq 'Virtual Machines' and armSkuName eq
'<size>' and armRegionName eq '<region>' and priceType eq 'Consumption'``; of the items,
the Linux pay-as-you-go hourly meter (not Windows, Spot or Low Priority) is the price.
Pages follow ``NextPageLink``.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from trainguard.checker.prices import GPUS, Price

log = logging.getLogger("trainguard.pricing")

API_URL = "https://prices.azure.com/api/retail/prices"
_RETRY = frozenset({429, 500, 502, 503, 504})
_MAX_PAGES = 20


class PriceNotFound(LookupError):
    """The API answered, but not with one Linux pay-as-you-go hourly price."""


def azure_price(instance_type: str, region: str, read_on: str, base_url: str = API_URL,
                timeout: float = 20.0, retries: int = 3,
                sleep: Callable[[float], None] = time.sleep) -> Price:
    gpus = GPUS.get(instance_type)
    if gpus is None:
        raise PriceNotFound(f"{instance_type}: GPU count unknown (add it to "
                            "trainguard.checker.prices.GPUS)")
    flt = (f"serviceName eq 'Virtual Machines' and armSkuName eq '{instance_type}' and "
           f"armRegionName eq '{region}' and priceType eq 'Consumption'")
    query = urllib.parse.urlencode({"$filter": flt}, quote_via=urllib.parse.quote)
    url: str | None = f"{base_url}?{query}"
    found: dict[float, dict[str, Any]] = {}
    pages = 0
    while url and pages < _MAX_PAGES:
        doc = _get_json(url, timeout, retries, sleep)
        pages += 1
        for item in doc.get("Items", []):
            if _is_linux_on_demand(item) and _is_for(item, instance_type, region):
                found[float(item["retailPrice"])] = item
        url = _rebase(doc.get("NextPageLink"), base_url)
    if len(found) != 1:
        raise PriceNotFound(f"{instance_type} in {region}: the Azure Retail Prices API gave "
                            f"{len(found)} Linux pay-as-you-go prices ({sorted(found)}), not one")
    (usd, item), = found.items()
    source = (f"Azure Retail Prices API ({item.get('productName')}, meter "
              f"{item.get('meterName')} {item.get('meterId')}, effective "
              f"{item.get('effectiveStartDate')})")
    return Price(instance_type, usd, gpus[0], gpus[1], region, read_on, source)


def _is_linux_on_demand(item: dict[str, Any]) -> bool:
    names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
    return (item.get("type") == "Consumption" and item.get("currencyCode") == "USD"
            and item.get("unitOfMeasure") == "1 Hour"
            and not str(item.get("productName", "")).endswith("Windows")
            and "Spot" not in names and "Low Priority" not in names)


def _is_for(item: dict[str, Any], instance_type: str, region: str) -> bool:
    # The filter asked for these; a price for another size must never be taken for it.
    return (str(item.get("armSkuName", "")).lower() == instance_type.lower()
            and str(item.get("armRegionName", "")).lower() == region.lower())


def _rebase(link: Any, base_url: str) -> str | None:
    # Follow the next page on the server we were pointed at (a mirror, or a test's
    # loopback replay), not necessarily the host the link names.
    if not link:
        return None
    nxt, base = urllib.parse.urlsplit(str(link)), urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit((base.scheme, base.netloc, nxt.path, nxt.query, ""))


def _get_json(url: str, timeout: float, retries: int,
              sleep: Callable[[float], None]) -> dict[str, Any]:
    delay = 1.0
    for attempt in range(retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                doc = json.loads(r.read())
                if not isinstance(doc, dict):
                    raise ValueError("the response is not a JSON object")
                return doc
        except urllib.error.HTTPError as e:
            if e.code not in _RETRY or attempt == retries:
                raise
            log.warning("Azure Retail Prices API: HTTP %d, retrying in %.1fs", e.code, delay)
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            if attempt == retries:
                raise
        sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")
