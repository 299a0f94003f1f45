"""``trainguard prices show|refresh``: the price book, and its live refresh."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from trainguard.report import OutputFormat

prices_app = typer.Typer(help="The GPU price book and its live refresh.", no_args_is_help=True)
CacheOpt = Annotated[Path | None, typer.Option(
    "--cache", help="Price cache file (default ~/.cache/trainguard/prices.json).")]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _table(*columns: str) -> Table:
    """Long cells fold onto more lines instead of being cut on a narrow terminal."""
    t = Table()
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


@prices_app.command("show")
def show(cache: CacheOpt = None,
         format: Annotated[OutputFormat, typer.Option(
             "--format", help="table, or json with every field whole.")] = OutputFormat.table,
         ) -> None:
    """Every price in use: the shipped book with cached live prices over it, each with its
    region, the date it was read and its source."""
    from trainguard.adapters.pricing import current_book

    book = sorted(current_book(cache).items())
    if format is OutputFormat.json:
        doc = [{**dataclasses.asdict(p), "usd_per_gpu_hour": p.usd_per_gpu_hour}
               for _, p in book]
        typer.echo(json.dumps({"schema": "trainguard.prices/v1", "prices": doc}, indent=2))
        return
    rows = [(itype, region, f"{p.usd_per_hour:,.3f}", str(p.gpus), p.read_on, p.source)
            for (itype, region), p in book]
    heads = ("instance type", "region", "$/hour", "GPUs", "read on")
    console = _console()
    t = Table(caption="Sources are cut to fit; --format json prints them whole.")
    for c in heads:
        t.add_column(c, no_wrap=True)
    # A source is a paragraph: folded, it made the table hundreds of lines tall. It gets
    # what the other columns leave (each as wide as its longest cell, plus 3 for borders;
    # zip stops at the heads, so the source is not measured).
    used = sum(max(map(len, column)) + 3 for column in zip(heads, *rows, strict=False)) + 4
    t.add_column("source", overflow="ellipsis", no_wrap=True,
                 max_width=max(console.width - used, 20))
    for r in rows:
        t.add_row(*r)
    console.print(t)


@prices_app.command("refresh")
def refresh(
    targets: Annotated[list[str] | None, typer.Argument(
        metavar="[TYPE@REGION]...",
        help="What to fetch, e.g. ml.g5.48xlarge@us-east-1 (default: every type in the "
             "book, in its regions).")] = None,
    cache: CacheOpt = None,
    azure_url: Annotated[str | None, typer.Option(
        "--azure-url", help="Azure Retail Prices API base URL (a mirror or a proxy).")]
    = None,
) -> None:
    """Fetch live prices (AWS Price List API, Azure Retail Prices API) into the cache. A
    price that cannot be fetched falls back to a stale cache entry, then to the shipped
    book, and the table says which. Exit 1 when nothing at all could be fetched live."""
    from trainguard.adapters.pricing import fetchers, refresh_prices
    from trainguard.common import fail

    pairs: list[tuple[str, str]] | None = None
    if targets:
        pairs = []
        for t in targets:
            itype, at, region = t.partition("@")
            if not at or not itype or not region:
                fail(f"{t!r}: expected TYPE@REGION, e.g. ml.g5.48xlarge@us-east-1")
            pairs.append((itype, region))
    fetch = fetchers(azure_url=azure_url) if azure_url else None
    results = refresh_prices(pairs, cache_path=cache, fetch=fetch)
    table = _table("instance type", "region", "$/hour", "from", "note")
    for r in results:
        table.add_row(r.instance_type, r.region,
                      f"{r.price.usd_per_hour:,.3f}" if r.price else "-", r.origin, r.note)
    _console().print(table)
    if results and not any(r.origin == "live" for r in results):
        raise typer.Exit(1)
