"""The wheel a user installs: only ``trainguard`` at the top of site-packages, every data
file the package reads at run time inside it, and the ``trainguard`` command working
from a fresh venv outside the repository (issue 14).

The install takes the base dependencies from the configured package index (PyPI, or
a local mirror of it); nothing is mocked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.wheel_build import ROOT, layer_folders, wheel

# Files under the package's folders that the installed package does not read: docs for
# the repository's readers, and tooling run from a clone (checkov's accepted findings are
# read by tests/test_stacks.py, the Node shim by the cdktn CLI started in the repository).
REPOSITORY_ONLY = {
    "adapters/local/README.md",
    "stacks/checkov_skips.yaml",
    "stacks/node20-shim.cjs",
}
# The layer folders that must never install at the top of site-packages.
GENERIC_NAMES = ("checker", "adapters", "config", "lambdas", "stacks", "tests")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheel(tmp_path_factory.mktemp("wheel"))


def _clean_env() -> dict[str, str]:
    """The environment without anything that would put the repository on sys.path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _package_data_in_repo() -> set[str]:
    """Every non-Python file under trainguard/ and the linked layer folders, as its path
    inside the installed package (``checker/x.yaml`` -> ``trainguard/checker/x.yaml``)."""
    found = set()
    for top in ["trainguard", *layer_folders()]:
        for path in (ROOT / top).rglob("*"):
            if (path.is_dir() or path.is_symlink() or path.suffix in (".py", ".pyc")
                    or "__pycache__" in path.parts):
                continue
            rel = path.relative_to(ROOT).as_posix()
            if rel in REPOSITORY_ONLY:
                continue
            found.add(rel if top == "trainguard" else f"trainguard/{rel}")
    return found


def test_the_wheel_holds_only_the_trainguard_package(built: Path) -> None:
    names = zipfile.ZipFile(built).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"trainguard", built.name.split("-py3")[0] + ".dist-info"}, tops
    # every layer is inside the package (the links were followed), none beside it
    for layer in layer_folders():
        assert any(n.startswith(f"trainguard/{layer}/") for n in names), layer
        assert f"trainguard/{layer}/__init__.py" in names
    assert not [n for n in names if "/tests/" in n or "__pycache__" in n]


def test_every_data_file_the_package_reads_is_in_the_wheel(built: Path) -> None:
    names = set(zipfile.ZipFile(built).namelist())
    missing = sorted(_package_data_in_repo() - names)
    assert not missing, (f"not in the wheel: {missing}; add them to "
                         "[tool.setuptools.package-data] in pyproject.toml, or to "
                         "REPOSITORY_ONLY here if only the repository reads them")
    assert "trainguard/launch/sagemaker-metric-definitions.json" in names


def test_metadata_installs_on_39_and_holds_the_tools_dependencies_to_311(built: Path) -> None:
    with zipfile.ZipFile(built) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(meta_name).decode())
        entry_points = z.read(meta_name.replace("METADATA", "entry_points.txt")).decode()
    assert meta["Requires-Python"] == ">=3.9"
    base = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower() for r in base} >= {  # type: ignore[index]
        "numpy", "pydantic", "pyyaml", "typer", "rich", "matplotlib"}
    assert all('python_version >= "3.11"' in r for r in base), base
    assert "trainguard = trainguard.cli:app" in entry_points


@pytest.fixture(scope="module")
def venv(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no pip of its own, no system site-packages) with the wheel installed
    by the test's pip, dependencies from the package index."""
    where = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(where / "bin" / "python"), "install",
         "-q", str(built)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)


PROBE = r"""
import importlib.metadata as md, json, pkgutil, sys, sysconfig
from importlib import resources
import trainguard, trainguard.checker
from trainguard.launch.sagemaker import metric_definitions
site = sysconfig.get_paths()["purelib"]
ours = md.distribution("trainguard").files
for m in pkgutil.walk_packages(trainguard.checker.__path__, "trainguard.checker."):
    __import__(m.name)
print(json.dumps({
    "file": trainguard.__file__,
    "site": site,
    "tops": sorted({str(f).split("/")[0] for f in ours}),
    "outside": sorted(str(f) for f in ours if str(f).startswith("..")),
    "site_tops": sorted(p.name for p in __import__("pathlib").Path(site).iterdir()),
    "definitions": len(metric_definitions()),
    "demo_policy": resources.files("trainguard.demo").joinpath("demo-policy.yaml").is_file(),
}))
"""


def test_installed_in_a_fresh_venv_only_trainguard_reaches_site_packages(
        venv: Path, tmp_path: Path) -> None:
    done = _run(venv / "bin" / "python", "-c", PROBE, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    # imported from the venv, not from the repository
    assert got["file"].startswith(got["site"]), got["file"]
    assert not got["file"].startswith(str(ROOT) + os.sep)
    dist_info = next(t for t in got["tops"] if t.endswith(".dist-info"))
    assert set(got["tops"]) == {"trainguard", dist_info, ".."}, got["tops"]
    assert got["outside"] == ["../../../bin/trainguard"]  # the console script, nothing else
    assert not set(GENERIC_NAMES) & set(got["site_tops"]), got["site_tops"]
    assert got["definitions"] >= 10 and got["demo_policy"]
    assert (venv / "bin" / "trainguard").is_file()


def test_the_console_script_checks_a_run_outside_the_repository(
        venv: Path, tmp_path: Path) -> None:
    version = _run(venv / "bin" / "trainguard", "--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == "trainguard " + wheel_version(venv)
    # the default policy is package data: shown in full from the installed package
    shown = _run(venv / "bin" / "trainguard", "policy", "show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "divergence:" in shown.stdout and "dry_run" in shown.stdout

    log = tmp_path / "run.log"
    lines = [f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}.000Z trainguard: step={i}/400 "
             f"loss={3.0 / (1 + i / 20) if i < 150 else float('nan')} t={1767225600 + i}"
             for i in range(1, 201)]
    log.write_text("\n".join(lines) + "\n")
    done = _run(venv / "bin" / "trainguard", "check", "--format", "json", log,
                cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]  # a critical finding
    (run,) = json.loads(done.stdout)["runs"]
    (finding,) = [f for f in run["findings"] if f["rule"] == "divergence"]
    assert finding["severity"] == "critical" and finding["step"] == 150

    bad = tmp_path / "policy.yaml"
    bad.write_text("rules:\n  stall: {enabled: maybe}\n")
    refused = _run(venv / "bin" / "trainguard", "check", "--policy", bad, log,
                   cwd=tmp_path)
    assert refused.returncode == 2 and "policy.yaml" in refused.stderr
    assert "Traceback" not in refused.stderr


def wheel_version(venv: Path) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print(m.version('trainguard'))"],
                          capture_output=True, text=True, check=True, env=_clean_env())
    return done.stdout.strip()
