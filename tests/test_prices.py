"""The price book: lookups a cost estimate relies on, and every entry's provenance."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from trainguard.checker.prices import BOOK, DEFAULT_REGION, gpus_of, lookup, provider_of


def test_lookup_by_type_and_region() -> None:
    price = lookup("Standard_NC24ads_A100_v4", "westeurope")
    assert price is not None
    assert price.region == "westeurope"
    assert price.gpus == 1
    assert price.usd_per_hour == BOOK[("Standard_NC24ads_A100_v4", "westeurope")].usd_per_hour


def test_region_omitted_falls_back_to_the_provider_default() -> None:
    price = lookup("Standard_ND96isr_H100_v5")
    assert price is not None and price.region == DEFAULT_REGION["azureml"]
    # A region the book has no entry for behaves like no region at all.
    assert lookup("Standard_ND96isr_H100_v5", "japaneast") == price


def test_type_priced_only_outside_its_default_region_still_gets_a_price() -> None:
    # The SageMaker rows were found for us-west-2 only; the price says so.
    price = lookup("ml.g5.12xlarge", "us-east-1")
    assert price is not None
    assert price.region == "us-west-2"
    assert price.gpus == 4


@pytest.mark.parametrize("name", ["standard_nc24ads_a100_v4", "STANDARD_NC24ADS_A100_V4",
                                  "Standard_NC24ads_A100_v4"])
def test_azure_names_are_case_insensitive(name: str) -> None:
    price = lookup(name, "EastUS")
    assert price is not None
    assert price.instance_type == "Standard_NC24ads_A100_v4"
    assert gpus_of(name) == 1


def test_unknown_instance_type_is_none() -> None:
    assert lookup("ml.q9.huge") is None
    assert lookup("Standard_Nope_v9", "eastus") is None
    assert gpus_of("n1-standard-8") is None


def test_gpu_count_known_even_without_a_trustworthy_price() -> None:
    assert gpus_of("ml.g6.16xlarge") == 1
    assert lookup("ml.g6.16xlarge") is None


@pytest.mark.parametrize("instance_type", ["ml.p4d.24xlarge", "ml.p4de.24xlarge",
                                           "ml.p5.48xlarge"])
def test_p_family_prices_agree_with_the_ec2_list_price_their_source_names(
        instance_type: str) -> None:
    """The SageMaker P-family rows are post-cut training prices from secondary sources;
    each must stay equal to 1.15 x the EC2 list price quoted in its own source, so an
    edited number without an edited source fails here."""
    price = lookup(instance_type)
    assert price is not None and price.gpus == 8
    ec2_name = instance_type.removeprefix("ml.")
    quoted = re.search(rf"{re.escape(ec2_name)} ([0-9.]+)", price.source)
    assert quoted, f"{instance_type}: its source does not quote the EC2 price"
    assert price.usd_per_hour == pytest.approx(float(quoted.group(1)) * 1.15, abs=0.005)
    # And the post-cut rate, not the pre-cut one (ml.p4d.24xlarge was 37.688 before).
    assert price.usd_per_gpu_hour < 8.0


def test_provider_of() -> None:
    assert provider_of("ml.g6.xlarge") == "sagemaker"
    assert provider_of("Standard_ND96asr_v4") == "azureml"
    assert provider_of("p4d.24xlarge") is None


def test_book_covers_both_clouds() -> None:
    providers = {provider_of(t) for t, _ in BOOK}
    assert providers == {"sagemaker", "azureml"}


@pytest.mark.parametrize("key", sorted(BOOK))
def test_every_entry_is_plausible_and_sourced(key: tuple[str, str]) -> None:
    price = BOOK[key]
    assert (price.instance_type, price.region) == key
    assert price.gpus > 0
    assert price.gpus == gpus_of(price.instance_type)
    assert 0.3 <= price.usd_per_gpu_hour <= 15, f"{key}: ${price.usd_per_gpu_hour:.2f}/GPU-hour"
    assert dt.date.fromisoformat(price.read_on) <= dt.date.today()
    assert "http" in price.source or "GitHub" in price.source
    assert price.gpu_model
