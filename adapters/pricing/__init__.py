"""Live prices for the price book: the AWS Price List API (SageMaker training) and the
Azure Retail Prices API (VM sizes), cached on disk with the time they were fetched.

Without network (or when an API has no single answer) a price comes from the cache,
however old, else from the table shipped in ``checker/prices.py`` with its own date,
and a warning says which. ``refresh_prices`` is the ``trainguard prices refresh`` hook.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainguard.adapters.pricing import aws, azure
from trainguard.adapters.pricing.cache import DEFAULT_TTL_S, Cached, PriceCache, default_path
from trainguard.checker.prices import BOOK, DEFAULT_REGION, GPUS, Price, lookup, provider_of

log = logging.getLogger("trainguard.pricing")

Origin = Literal["live", "cache", "stale cache", "shipped", "none"]
#: provider -> fetch(instance_type, region, read_on) -> Price
Fetcher = Callable[[str, str, str], Price]


@dataclass(frozen=True)
class Priced:
    instance_type: str
    region: str
    price: Price | None
    origin: Origin
    note: str = ""  # why it is not live, when it is not


def fetchers(pricing_client: Any = None, azure_url: str = azure.API_URL,
             timeout: float = 20.0, retries: int = 3) -> dict[str, Fetcher]:
    """The live fetchers; the boto3 client is made on first use (boto3 is optional).
    ``retries`` applies to Azure; boto3 retries in its own standard mode."""
    made: dict[str, Any] = {}

    def sagemaker(instance_type: str, region: str, read_on: str) -> Price:
        if "client" not in made:
            made["client"] = pricing_client or aws.make_client(timeout)
        return aws.sagemaker_price(made["client"], instance_type, region, read_on)

    def azureml(instance_type: str, region: str, read_on: str) -> Price:
        return azure.azure_price(instance_type, region, read_on, base_url=azure_url,
                                 timeout=timeout, retries=retries)

    return {"sagemaker": sagemaker, "azureml": azureml}


def live_price(instance_type: str, region: str | None = None, *,
               cache: PriceCache | None = None, fetch: dict[str, Fetcher] | None = None,
               now: float | None = None, force: bool = False) -> Priced:
    """A fresh cached price, else a live one (then cached), else the fallbacks above."""
    now = time.time() if now is None else now
    cache = cache or PriceCache()
    provider = provider_of(instance_type)
    region = region or DEFAULT_REGION.get(provider or "", "")
    cached = cache.get(instance_type, region) if region else None
    if not force and cached is not None and cache.fresh(cached, now):
        return Priced(instance_type, region, cached.price, "cache")
    fetcher = (fetch if fetch is not None else fetchers()).get(provider or "")
    if fetcher is None or not region:
        why = f"no live price source for {instance_type!r}"
    else:
        read_on = dt.datetime.fromtimestamp(now, dt.UTC).date().isoformat()
        try:
            price = fetcher(instance_type, region, read_on)
        except Exception as e:  # any failure of a live source falls back, loudly
            why = f"live price of {instance_type} in {region} failed: {type(e).__name__}: {e}"
        else:
            cache.put(price, now)
            return Priced(instance_type, region, price, "live")
    return _fallback(instance_type, region, cached, why)


def _fallback(instance_type: str, region: str, cached: Cached | None, why: str) -> Priced:
    if cached is not None:
        note = f"{why}; using the cached price read on {cached.price.read_on}"
        log.warning(note)
        return Priced(instance_type, region, cached.price, "stale cache", note)
    shipped = lookup(instance_type, region or None)
    if shipped is not None:
        note = (f"{why}; using the shipped price book read on {shipped.read_on} "
                f"({shipped.region})")
        log.warning(note)
        return Priced(instance_type, region, shipped, "shipped", note)
    note = f"{why}; the shipped price book has no price for it either"
    log.warning(note)
    return Priced(instance_type, region, None, "none", note)


def default_targets() -> list[tuple[str, str]]:
    """Every (instance, region) the shipped book prices, and every GPU instance it knows
    in its provider's default region."""
    targets = set(BOOK)
    for instance_type in GPUS:
        region = DEFAULT_REGION.get(provider_of(instance_type) or "")
        if region:
            targets.add((instance_type, region))
    return sorted(targets)


def refresh_prices(targets: Iterable[tuple[str, str]] | None = None, *,
                   cache_path: Path | str | None = None, ttl_s: float = DEFAULT_TTL_S,
                   force: bool = True, fetch: dict[str, Fetcher] | None = None,
                   now: float | None = None) -> list[Priced]:
    """Fetch live prices for ``targets`` (default: ``default_targets()``) into the cache
    at ``cache_path`` (default: ``~/.cache/trainguard/prices.json``); ``force`` refetches
    fresh entries too. Each result says where its price came from."""
    cache = PriceCache(cache_path, ttl_s)
    fetch = fetch if fetch is not None else fetchers()
    return [live_price(t, r, cache=cache, fetch=fetch, now=now, force=force)
            for t, r in (targets if targets is not None else default_targets())]


def current_book(cache_path: Path | str | None = None) -> dict[tuple[str, str], Price]:
    """The shipped book with every cached live price laid over it (each says its date)."""
    book = dict(BOOK)
    for cached in PriceCache(cache_path).all():
        book[(cached.price.instance_type, cached.price.region)] = cached.price
    return book


__all__ = ["DEFAULT_TTL_S", "Fetcher", "PriceCache", "Priced", "current_book",
           "default_path", "default_targets", "fetchers", "live_price", "refresh_prices"]
