"""Shared fixtures. Real curves are read where they lie, beside the checkout."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Real servers (Prometheus, ...) started on loopback, shared by the tests that need them.
pytest_plugins = ["tests.servers", "tests.skip_gate"]

ROOT = Path(__file__).resolve().parent.parent
CURVES = Path(os.environ.get("TRAINGUARD_CURVES", ROOT.parent / "shared" / "data" / "curves"))


@pytest.fixture(scope="session")
def curves_dir() -> Path:
    """The shared real training curves; the test is skipped when the folder is absent."""
    if not (CURVES / "labels.csv").is_file():
        pytest.skip(f"real curves not found at {CURVES} (set TRAINGUARD_CURVES or lay "
                    "../shared/data/curves beside the checkout)")
    return CURVES


SAMPLES = ("aws-dev", "azure-research", "openshift-onprem")


@pytest.fixture(scope="session")
def outdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthesise every sample environment once per session, with the app cdktf.json names,
    in its own process (a synth holds over a GB of memory; it is given back when the
    process ends)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("cdktf.out")
    env = {**os.environ, "CDKTF_OUTDIR": str(out),
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    done = subprocess.run([sys.executable, "-m", "trainguard.stacks"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def stacks(outdir: Path) -> dict[str, dict[str, Any]]:
    """The synthesised Terraform JSON of each sample environment."""
    import json

    return {name: json.loads((outdir / "stacks" / name / "cdk.tf.json").read_text())
            for name in SAMPLES}


@pytest.fixture(autouse=True)
def _azure_cloud_does_not_leak() -> Iterator[None]:
    """azure-ai-ml writes the cloud it was built for into ``AZUREML_CURRENT_CLOUD`` in
    ``os.environ``; a test's loopback "cloud" must not reach later tests or their
    subprocesses."""
    before = os.environ.get("AZUREML_CURRENT_CLOUD")
    yield
    if before is None:
        os.environ.pop("AZUREML_CURRENT_CLOUD", None)
    else:
        os.environ["AZUREML_CURRENT_CLOUD"] = before
