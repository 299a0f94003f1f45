"""The labelled runs of both shared corpora, read where they lie (``../shared/data``, or
``TRAINGUARD_RUNS`` / ``TRAINGUARD_CURVES``): every run of ``runs`` and every twentieth of
``curves`` (its modded-nanogpt runs are many and alike). A test using them is skipped,
saying why, when the folder is absent."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from trainguard.adapters.local import load_run, parse_metric_option
from trainguard.bench.labels import Labelled, read_labels
from trainguard.checker.model import Job

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
RUNS = Path(os.environ.get("TRAINGUARD_RUNS", DATA / "runs"))
CURVES = Path(os.environ.get("TRAINGUARD_CURVES", DATA / "curves"))


def rows() -> list[tuple[Path, dict[str, str]]]:
    """(corpus folder, labels row) of every run of ``runs`` and every twentieth of
    ``curves``."""
    out = []
    for root, every in ((RUNS, 1), (CURVES, 20)):
        if not (root / "labels.csv").is_file():
            pytest.skip(f"real runs not found at {root} (lay ../shared/data beside the checkout)")
        with open(root / "labels.csv", newline="") as fh:
            out += [(root, r) for r in list(csv.DictReader(fh))[::every]]
    return out


def labelled() -> list[Labelled]:
    """The same runs as ``rows``, read by the bench's own labels reader (a run's path,
    format and metrics resolved as ``trainguard bench`` reads them)."""
    out: list[Labelled] = []
    for root, every in ((RUNS, 1), (CURVES, 20)):
        if not (root / "labels.csv").is_file():
            pytest.skip(f"real runs not found at {root} (lay ../shared/data beside the checkout)")
        out += read_labels(root / "labels.csv")[::every]
    return out


def load(root: Path, row: dict[str, str]) -> Job:
    """The run of a labels row, read as its row says (format, text-log metrics)."""
    defs = ([parse_metric_option(m) for m in row["metrics"].split(";")]
            if row.get("metrics") else None)
    fmt = "hf" if row["format"] == "json" else row["format"] or None
    return load_run(root / row["run"], defs, fmt=fmt, job_id=row["run"])
