"""Shared fixtures. Real curves are read where they lie, beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Real servers (Prometheus, ...) started on loopback, shared by the tests that need them.
pytest_plugins = ["tests.servers"]

ROOT = Path(__file__).resolve().parent.parent
CURVES = Path(os.environ.get("TRAINGUARD_CURVES", ROOT.parent / "shared" / "data" / "curves"))


@pytest.fixture(scope="session")
def curves_dir() -> Path:
    """The shared real training curves; the test is skipped when the folder is absent."""
    if not (CURVES / "labels.csv").is_file():
        pytest.skip(f"real curves not found at {CURVES} (set TRAINGUARD_CURVES or lay "
                    "../shared/data/curves beside the checkout)")
    return CURVES
