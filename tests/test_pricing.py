"""Live price refresh: AWS Price List API through botocore's Stubber (which checks each
request and response against botocore's own service model), the Azure Retail Prices API
replayed over HTTP from loopback, the disk cache, and the fallback to the shipped book.

The recordings under ``tests/recordings/pricing`` are pages in each API's wire shape
(``{"pages": [page, ...]}``); their prices are illustrative, not a claim about today's
list price.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import boto3
import pytest
from botocore.stub import Stubber

from trainguard.adapters.pricing import (
    PriceCache,
    current_book,
    fetchers,
    live_price,
    refresh_prices,
)
from trainguard.adapters.pricing.aws import filters
from trainguard.checker.prices import BOOK

RECORDINGS = Path(__file__).parent / "recordings" / "pricing"
NOW = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC).timestamp()
DAY = 86_400.0


def pages(name: str) -> list[dict[str, Any]]:
    return list(json.loads((RECORDINGS / name).read_text())["pages"])


@pytest.fixture
def pricing() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    with Stubber(client) as stub:
        yield client, stub


def expect_sagemaker(stub: Stubber) -> None:
    first, second = pages("aws_get_products_ml.g5.xlarge_us-west-2.json")
    params = {"ServiceCode": "AmazonSageMaker", "Filters": filters("ml.g5.xlarge", "us-west-2")}
    stub.add_response("get_products", first, params)
    stub.add_response("get_products", second, {**params, "NextToken": first["NextToken"]})


# --- Azure replay ------------------------------------------------------------------


class Replay(http.server.BaseHTTPRequestHandler):
    pages: ClassVar[list[dict[str, Any]]] = []
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        page = self.pages[1] if "%24skip=" in self.path or "$skip=" in self.path else self.pages[0]
        body = json.dumps(page).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def azure_replay(name: str) -> Iterator[str]:
    Replay.pages, Replay.paths = pages(name), []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/retail/prices"
    finally:
        server.shutdown()
        server.server_close()


# --- tests -----------------------------------------------------------------------


def test_sagemaker_training_price_comes_from_the_price_list_api(
        pricing: tuple[Any, Stubber], tmp_path: Path) -> None:
    client, stub = pricing
    expect_sagemaker(stub)
    got = live_price("ml.g5.xlarge", "us-west-2", cache=PriceCache(tmp_path / "p.json"),
                     fetch=fetchers(pricing_client=client), now=NOW)
    stub.assert_no_pending_responses()  # both pages were read
    assert got.origin == "live" and got.price is not None
    assert got.price.usd_per_hour == 1.4214
    assert (got.price.gpus, got.price.region, got.price.read_on) == (1, "us-west-2", "2026-11-30")
    assert "AWS Price List API" in got.price.source and "ABCDEFGH12345678" in got.price.source


def test_azure_price_is_the_linux_pay_as_you_go_meter(tmp_path: Path) -> None:
    with azure_replay("azure_retail_Standard_NC24ads_A100_v4_eastus.json") as url:
        got = live_price("Standard_NC24ads_A100_v4", "eastus",
                         cache=PriceCache(tmp_path / "p.json"),
                         fetch=fetchers(azure_url=url), now=NOW)
    # Spot and Low Priority on page 1 and Windows on page 2 are not the price.
    assert got.origin == "live" and got.price is not None and got.price.usd_per_hour == 3.71
    assert got.price.read_on == "2026-11-30" and "Azure Retail Prices API" in got.price.source
    assert len(Replay.paths) == 2  # followed NextPageLink
    assert ("armSkuName%20eq%20%27Standard_NC24ads_A100_v4%27" in Replay.paths[0]
            and "priceType%20eq%20%27Consumption%27" in Replay.paths[0])


def test_a_fresh_cache_answers_without_the_network(pricing: tuple[Any, Stubber],
                                                   tmp_path: Path) -> None:
    client, stub = pricing
    expect_sagemaker(stub)
    cache = PriceCache(tmp_path / "p.json", ttl_s=DAY)
    fetch = fetchers(pricing_client=client)
    first = live_price("ml.g5.xlarge", "us-west-2", cache=cache, fetch=fetch, now=NOW)
    # No response queued any more: a second API call would fail the Stubber.
    again = live_price("ml.g5.xlarge", "us-west-2", cache=PriceCache(tmp_path / "p.json", DAY),
                       fetch=fetch, now=NOW + DAY / 2)
    assert (first.origin, again.origin) == ("live", "cache")
    assert again.price == first.price
    stored = json.loads((tmp_path / "p.json").read_text())["prices"]["ml.g5.xlarge@us-west-2"]
    assert stored["fetched_at"] == NOW and stored["price"]["usd_per_hour"] == 1.4214


def test_an_expired_entry_is_fetched_again(pricing: tuple[Any, Stubber], tmp_path: Path) -> None:
    client, stub = pricing
    expect_sagemaker(stub)
    expect_sagemaker(stub)
    cache = PriceCache(tmp_path / "p.json", ttl_s=DAY)
    fetch = fetchers(pricing_client=client)
    live_price("ml.g5.xlarge", "us-west-2", cache=cache, fetch=fetch, now=NOW)
    later = live_price("ml.g5.xlarge", "us-west-2", cache=cache, fetch=fetch, now=NOW + 2 * DAY)
    stub.assert_no_pending_responses()
    assert later.origin == "live" and later.price is not None
    assert later.price.read_on == "2026-12-02"


def test_without_network_the_shipped_book_is_used_and_said_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with azure_replay("azure_retail_Standard_NC24ads_A100_v4_eastus.json") as url:
        pass  # nothing listens there any more
    fetch = fetchers(azure_url=url, timeout=2, retries=0)
    with caplog.at_level(logging.WARNING, logger="trainguard.pricing"):
        got = live_price("Standard_NC24ads_A100_v4", "eastus",
                         cache=PriceCache(tmp_path / "p.json"), fetch=fetch, now=NOW)
    shipped = BOOK[("Standard_NC24ads_A100_v4", "eastus")]
    assert got.origin == "shipped" and got.price == shipped
    assert f"shipped price book read on {shipped.read_on}" in caplog.text
    assert "failed: URLError" in got.note
    assert not (tmp_path / "p.json").exists()  # nothing live to cache


def test_without_network_an_old_cached_price_beats_the_shipped_one(
        pricing: tuple[Any, Stubber], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    client, stub = pricing
    expect_sagemaker(stub)
    stub.add_client_error("get_products", service_error_code="ThrottlingException",
                          http_status_code=400)
    cache = PriceCache(tmp_path / "p.json", ttl_s=DAY)
    fetch = fetchers(pricing_client=client)
    live_price("ml.g5.xlarge", "us-west-2", cache=cache, fetch=fetch, now=NOW)
    with caplog.at_level(logging.WARNING, logger="trainguard.pricing"):
        got = live_price("ml.g5.xlarge", "us-west-2", cache=cache, fetch=fetch,
                         now=NOW + 30 * DAY)
    assert got.origin == "stale cache" and got.price is not None
    assert got.price.usd_per_hour == 1.4214 and got.price.read_on == "2026-11-30"
    assert "ThrottlingException" in caplog.text


def test_refresh_reports_each_price_and_fills_the_book(pricing: tuple[Any, Stubber],
                                                        tmp_path: Path) -> None:
    client, stub = pricing
    expect_sagemaker(stub)
    path = tmp_path / "p.json"
    with azure_replay("azure_retail_Standard_NC24ads_A100_v4_eastus.json") as url:
        done = refresh_prices([("ml.g5.xlarge", "us-west-2"),
                               ("Standard_NC24ads_A100_v4", "eastus"),
                               ("Standard_ND96asr_v4", "eastus")],  # not in the recordings
                              cache_path=path, now=NOW,
                              fetch=fetchers(pricing_client=client, azure_url=url))
    assert [d.origin for d in done] == ["live", "live", "shipped"]
    assert "0 Linux pay-as-you-go prices" in done[2].note
    book = current_book(path)
    assert book[("ml.g5.xlarge", "us-west-2")].read_on == "2026-11-30"
    assert book[("Standard_NC24ads_A100_v4", "eastus")].usd_per_hour == 3.71
    assert book[("Standard_ND96asr_v4", "eastus")] == BOOK[("Standard_ND96asr_v4", "eastus")]


def test_a_damaged_cache_file_costs_a_refetch_not_a_failure(
        pricing: tuple[Any, Stubber], tmp_path: Path) -> None:
    client, stub = pricing
    expect_sagemaker(stub)
    path = tmp_path / "p.json"
    path.write_text("{not json")
    got = live_price("ml.g5.xlarge", "us-west-2", cache=PriceCache(path), now=NOW,
                     fetch=fetchers(pricing_client=client))
    assert got.origin == "live"
    assert json.loads(path.read_text())["prices"]


def test_cli_refresh_fetches_live_and_show_lists_it(tmp_path: Path) -> None:
    """``trainguard prices refresh`` against a recorded Retail Prices answer on loopback."""
    from typer.testing import CliRunner

    from trainguard.cli import app

    cache = tmp_path / "prices.json"
    with azure_replay("azure_retail_Standard_NC24ads_A100_v4_eastus.json") as url:
        res = CliRunner().invoke(app, ["prices", "refresh", "Standard_NC24ads_A100_v4@eastus",
                                       "--cache", str(cache), "--azure-url", url])
    assert res.exit_code == 0, res.output
    assert "live" in res.output
    shown = CliRunner().invoke(app, ["prices", "show", "--cache", str(cache)],
                               env={"COLUMNS": "300"})
    assert shown.exit_code == 0
    row = next(line for line in shown.output.splitlines()
               if "Standard_NC24ads_A100_v4" in line and "eastus" in line)
    assert "Retail Prices" in row or "prices.azure.com" in row  # the live source, not the book
    # offline, the same refresh says it fell back, and exits 1
    res = CliRunner().invoke(app, ["prices", "refresh", "Standard_NC24ads_A100_v4@eastus",
                                   "--cache", str(tmp_path / "other.json"),
                                   "--azure-url", url])
    assert res.exit_code == 1 and "shipped" in res.output
    bad = CliRunner().invoke(app, ["prices", "refresh", "nonsense"])
    assert bad.exit_code == 2 and "TYPE@REGION" in bad.output


def test_cli_show_json_lists_every_price_whole(tmp_path: Path) -> None:
    """``prices show --format json``: the book with nothing folded, for scripts."""
    from typer.testing import CliRunner

    from trainguard.cli import app

    res = CliRunner().invoke(app, ["prices", "show", "--format", "json",
                                   "--cache", str(tmp_path / "none.json")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["schema"] == "trainguard.prices/v1"
    rows = {(r["instance_type"], r["region"]): r for r in doc["prices"]}
    assert set(rows) == set(BOOK)
    p5 = rows[("ml.p5.48xlarge", "us-west-2")]
    assert p5["usd_per_hour"] == BOOK[("ml.p5.48xlarge", "us-west-2")].usd_per_hour
    assert p5["usd_per_gpu_hour"] == p5["usd_per_hour"] / 8
    assert "Pricing API" in p5["source"] and p5["read_on"]


def test_cli_show_table_is_one_line_per_price_on_a_narrow_terminal(tmp_path: Path) -> None:
    """Sources are paragraphs; the table cuts them (and says so) instead of folding."""
    from typer.testing import CliRunner

    from trainguard.cli import app

    res = CliRunner().invoke(app, ["prices", "show", "--cache", str(tmp_path / "none.json")],
                             env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    p5 = [line for line in lines if "ml.p5.48xlarge" in line]
    assert len(p5) == 1 and "63.296" in p5[0] and "us-west-2" in p5[0]
    assert len([line for line in lines if line.startswith("│")]) == len(BOOK)
    assert "--format json" in res.output
