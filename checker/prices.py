"""The price book: on-demand $/hour of the GPU instances training jobs run on.

Each price says where it was read and when, because list prices move (AWS cut
P4/P5 prices in mid-2025) and a wrong rate mis-enforces every budget. A policy's
``cost.prices`` wins over this book; an instance missing here is left to the
policy's ``gpu_hour_usd`` or ``default_hourly_usd`` rather than guessed.

Instance deliberately absent because no trustworthy price was found:
SageMaker ml.g6.16xlarge. Its GPU count is still known (``gpus_of``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Price:
    instance_type: str
    usd_per_hour: float  # one instance, on demand (Linux pay-as-you-go on Azure)
    gpus: int
    gpu_model: str
    region: str
    read_on: str  # ISO date the price was read (or published, when the source says)
    source: str  # where, and how direct the source is

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpus


DEFAULT_REGION = {"sagemaker": "us-east-1", "azureml": "eastus"}

# GPUs per instance: hardware facts, kept apart from prices so that a type with no
# trustworthy price still has a GPU count.
GPUS: dict[str, tuple[int, str]] = {
    **{f"ml.g5.{s}": (1, "A10G") for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "ml.g5.12xlarge": (4, "A10G"), "ml.g5.24xlarge": (4, "A10G"), "ml.g5.48xlarge": (8, "A10G"),
    **{f"ml.g6.{s}": (1, "L4") for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "ml.g6.12xlarge": (4, "L4"), "ml.g6.24xlarge": (4, "L4"), "ml.g6.48xlarge": (8, "L4"),
    "ml.p4d.24xlarge": (8, "A100 40GB"), "ml.p4de.24xlarge": (8, "A100 80GB"),
    "ml.p5.48xlarge": (8, "H100 80GB"),
    "Standard_NC24ads_A100_v4": (1, "A100 80GB PCIe"),
    "Standard_NC48ads_A100_v4": (2, "A100 80GB PCIe"),
    "Standard_NC96ads_A100_v4": (4, "A100 80GB PCIe"),
    "Standard_ND96asr_v4": (8, "A100 40GB"),
    "Standard_ND96isr_H100_v5": (8, "H100 80GB"),
}

# GPU memory (GB per GPU) and dense FP16/BF16 tensor TFLOPS per GPU model, from the
# makers' published specs, for the rightsizing rule (what fits a job's peak, and what
# keeps up with the compute it uses):
# * memory: AWS EC2 accelerated-computing instance tables (g5: 24 GiB A10G, g6: 24 GiB
#   L4, p4d: 40 GB A100, p4de: 80 GB A100, p5: 80 GB H100 per GPU;
#   https://aws.amazon.com/ec2/instance-types/ and the AWS Batch GPU jobs page) and
#   Microsoft's GPU VM size pages (NC A100 v4: A100 80GB PCIe; ND A100 v4: A100 40GB;
#   ND H100 v5: H100 80GB; https://learn.microsoft.com/azure/virtual-machines/sizes/).
# * compute: NVIDIA datasheets, dense (without sparsity): A100 312 TFLOPS (40 and 80 GB,
#   SXM and PCIe), H100 SXM 989, L4 121 (242 with sparsity). NVIDIA publishes no sheet for
#   AWS's A10G; the A10's 125 is used, an upper bound (the A10G's tensor throughput is
#   lower), so a move to an A10G is only offered when utilisation leaves room to spare.
GPU_SPECS: dict[str, tuple[float, float]] = {  # model -> (GB per GPU, dense tensor TFLOPS)
    "A10G": (24.0, 125.0),
    "L4": (24.0, 121.0),
    "A100 40GB": (40.0, 312.0),
    "A100 80GB": (80.0, 312.0),
    "A100 80GB PCIe": (80.0, 312.0),
    "H100 80GB": (80.0, 989.0),
}

# The search for these ran on 2026-11-29 and 2026-11-30 over stored copies of public pages and code;
# the primary pages (aws.amazon.com/sagemaker/pricing, azure.microsoft.com pricing,
# the AWS Price List and Azure Retail Prices APIs) could not be fetched live, so every
# number below comes from a secondary source, said so in ``source``.
_READ_ON = "2026-11-29"
_READ_ON_P = "2026-11-30"  # the SageMaker P-family rows

_SAGEMAKER_USW2 = (
    "secondary: a public GitHub project's SageMaker rate table stating it was taken from "
    "the AWS Price List API (service AmazonSageMaker, Training component, us-west-2 "
    "on-demand; its publication date is not given); primary: "
    "https://aws.amazon.com/sagemaker/pricing/ (not fetched)")
_AZURE_EASTUS_NC = (
    "secondary: several public GitHub projects agree (one a pinned East US snapshot of "
    "https://prices.azure.com/api/retail/prices, Linux pay-as-you-go, 3.6741/7.3482/"
    "14.6964); primary: https://azure.microsoft.com/pricing/details/virtual-machines/linux/ "
    "(not fetched)")
_AZURE_WESTEU_NC = (
    "secondary: one public GitHub project's pinned West Europe snapshot of the Azure Retail "
    "Prices API (Linux pay-as-you-go), not cross-checked")
_AZURE_EASTUS_ND = (
    "secondary: public GitHub projects' East US pay-as-you-go tables (one marked "
    "'approximate'); not cross-checked against the Azure Retail Prices API")

_SAGEMAKER_P_SOURCE = (
    "secondary: public GitHub projects running SageMaker training jobs on these types; {where}. "
    "Cross-checked: each equals the EC2 on-demand list price after the June 2025 P4/P5 cut "
    "(p4d.24xlarge 21.957642, p4de.24xlarge 27.44705, p5.48xlarge 55.04, read from a "
    "third public table) x 1.15, the same SageMaker-over-EC2 ratio the pre-cut prices had "
    "(ml.p4d.24xlarge 37.688 = 32.7726 x 1.15); primary: "
    "https://aws.amazon.com/sagemaker/pricing/ (not fetched)")
_SAGEMAKER_P_USW2 = _SAGEMAKER_P_SOURCE.format(
    where="one states 'SageMaker training, us-west-2, on-demand from the AWS Pricing API "
          "(2026-09-12)' and bills real ml.p5 jobs at it")
_SAGEMAKER_P_USE1 = _SAGEMAKER_P_SOURCE.format(
    where="one launcher's us-east-1 training cost cap (its jobs tagged July 2026), at the "
          "Price List API's precision")

# (instance type, $/hour) per (region, source, date read).
_TABLES: list[tuple[str, str, str, list[tuple[str, float]]]] = [
    ("us-west-2", _SAGEMAKER_USW2, _READ_ON, [
        ("ml.g5.xlarge", 1.408), ("ml.g5.2xlarge", 1.515), ("ml.g5.4xlarge", 2.03),
        ("ml.g5.8xlarge", 3.06), ("ml.g5.12xlarge", 7.09), ("ml.g5.16xlarge", 5.12),
        ("ml.g5.24xlarge", 10.18), ("ml.g5.48xlarge", 20.36),
        ("ml.g6.xlarge", 1.127), ("ml.g6.2xlarge", 1.222), ("ml.g6.4xlarge", 1.654),
        ("ml.g6.8xlarge", 2.518), ("ml.g6.12xlarge", 5.752), ("ml.g6.24xlarge", 8.344),
        ("ml.g6.48xlarge", 16.688),
    ]),
    ("us-west-2", _SAGEMAKER_P_USW2, _READ_ON_P, [
        ("ml.p4d.24xlarge", 25.251), ("ml.p5.48xlarge", 63.296),
    ]),
    ("us-east-1", _SAGEMAKER_P_USE1, _READ_ON_P, [
        ("ml.p4de.24xlarge", 31.5641075),
    ]),
    ("eastus", _AZURE_EASTUS_NC, _READ_ON, [
        ("Standard_NC24ads_A100_v4", 3.673), ("Standard_NC48ads_A100_v4", 7.346),
        ("Standard_NC96ads_A100_v4", 14.692),
    ]),
    ("westeurope", _AZURE_WESTEU_NC, _READ_ON, [
        ("Standard_NC24ads_A100_v4", 4.0416), ("Standard_NC48ads_A100_v4", 8.0832),
        ("Standard_NC96ads_A100_v4", 16.1664),
    ]),
    ("eastus", _AZURE_EASTUS_ND, _READ_ON, [
        ("Standard_ND96asr_v4", 27.197), ("Standard_ND96isr_H100_v5", 98.32),
    ]),
]


def _build() -> dict[tuple[str, str], Price]:
    book: dict[tuple[str, str], Price] = {}
    for region, source, read_on, rows in _TABLES:
        for instance_type, usd in rows:
            gpus, model = GPUS[instance_type]
            book[(instance_type, region)] = Price(instance_type, usd, gpus, model, region,
                                                  read_on, source)
    return book


BOOK: dict[tuple[str, str], Price] = _build()

# Lower-cased index: Azure reports VM sizes in any case (Standard_NC24ads_A100_v4,
# standard_nc24ads_a100_v4), and SageMaker names are lower case already.
_INDEX: dict[tuple[str, str], Price] = {(t.lower(), r.lower()): p for (t, r), p in BOOK.items()}
_GPU_INDEX: dict[str, tuple[int, str]] = {t.lower(): v for t, v in GPUS.items()}


def provider_of(instance_type: str) -> str | None:
    name = instance_type.lower()
    if name.startswith("ml."):
        return "sagemaker"
    if name.startswith("standard_"):
        return "azureml"
    return None


def lookup(instance_type: str, region: str | None = None) -> Price | None:
    """The price of one instance in ``region``, else in its provider's default region,
    else in any region the book has for it (``Price.region`` says which it is).

    A price from a neighbouring region is a far better spend estimate than none at all,
    which would blind the budget rule to the job.
    """
    name = instance_type.lower()
    tried = [region, DEFAULT_REGION.get(provider_of(instance_type) or "")]
    for r in tried:
        if r and (name, r.lower()) in _INDEX:
            return _INDEX[(name, r.lower())]
    others = sorted(r for (t, r) in _INDEX if t == name)
    return _INDEX[(name, others[0])] if others else None


def gpus_of(instance_type: str) -> int | None:
    known = _GPU_INDEX.get(instance_type.lower())
    return known[0] if known else None


def gpu_spec(instance_type: str) -> tuple[int, str, float, float] | None:
    """(GPUs, model, GB per GPU, dense tensor TFLOPS per GPU) of an instance type."""
    known = _GPU_INDEX.get(instance_type.lower())
    if known is None or known[1] not in GPU_SPECS:
        return None
    return (known[0], known[1], *GPU_SPECS[known[1]])


def priced_in(region: str) -> list[Price]:
    """Every instance type the book prices in ``region`` (cheapest first)."""
    return sorted((p for (_, r), p in BOOK.items() if r.lower() == region.lower()),
                  key=lambda p: (p.usd_per_hour, p.instance_type))
