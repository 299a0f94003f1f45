"""Live prices kept on disk between runs: one JSON file, each entry with the time it
was fetched, fresh for a TTL."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.checker.prices import Price

log = logging.getLogger("trainguard.pricing")

DEFAULT_TTL_S = 7 * 86_400.0  # list prices move a few times a year, not daily


def default_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainguard" / "prices.json"


@dataclass(frozen=True)
class Cached:
    price: Price
    fetched_at: float  # epoch seconds


class PriceCache:
    """``{"prices": {"<instance>@<region>": {"fetched_at": ..., "price": {...}}}}``."""

    def __init__(self, path: Path | str | None = None, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.ttl_s = ttl_s

    @staticmethod
    def key(instance_type: str, region: str) -> str:
        return f"{instance_type.lower()}@{region.lower()}"

    def get(self, instance_type: str, region: str) -> Cached | None:
        entry = self._load().get(self.key(instance_type, region))
        if entry is None:
            return None
        try:
            return Cached(Price(**entry["price"]), float(entry["fetched_at"]))
        except (KeyError, TypeError, ValueError) as e:
            log.warning("%s: ignoring entry %s: %s", self.path, self.key(instance_type, region), e)
            return None

    def fresh(self, cached: Cached | None, now: float) -> bool:
        return cached is not None and now - cached.fetched_at < self.ttl_s

    def put(self, price: Price, fetched_at: float) -> None:
        entries = self._load()
        entries[self.key(price.instance_type, price.region)] = {
            "fetched_at": fetched_at, "price": dataclasses.asdict(price)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"prices": entries}, indent=1, sort_keys=True))
        tmp.replace(self.path)  # a reader never sees half a file

    def all(self) -> list[Cached]:
        out = []
        for key in self._load():
            instance_type, _, region = key.partition("@")
            cached = self.get(instance_type, region)
            if cached is not None:
                out.append(cached)
        return out

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text())
            entries = doc["prices"]
            if not isinstance(entries, dict):
                raise ValueError("'prices' is not an object")
            return entries
        except (OSError, ValueError, KeyError, TypeError) as e:
            # A damaged cache costs one refetch, never a failed check.
            log.warning("%s: unreadable price cache, ignoring it: %s", self.path, e)
            return {}
