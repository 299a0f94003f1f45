"""The CI skip gate, run as a user meets it: pytest in a subprocess on a small suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skip_gate import allowed_skips

ROOT = Path(__file__).resolve().parent.parent
SUITE = '''
import pytest

def test_runs():
    assert True

def test_needs_a_tool():
    pytest.skip("npm not found")
'''


def run_suite(tmp_path: Path, ci: str | None, allowed: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.skip_gate"]\n')
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "allowed.txt").write_text(allowed)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PYTHONPATH=str(ROOT), TRAINGUARD_ALLOWED_SKIPS=str(tmp_path / "allowed.txt"))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_an_unlisted_skip_fails_a_ci_run_and_names_the_test(tmp_path: Path) -> None:
    done = run_suite(tmp_path, "true", "# nothing allowed\n")
    assert done.returncode == 1, done.stdout
    assert "test_suite.py::test_needs_a_tool: npm not found" in done.stdout


def test_a_listed_skip_passes(tmp_path: Path) -> None:
    done = run_suite(tmp_path, "true", "*::test_needs_a_tool | the tool is optional\n")
    assert done.returncode == 0, done.stdout


def test_outside_ci_a_skip_is_reported_not_failed(tmp_path: Path) -> None:
    done = run_suite(tmp_path, None, "")
    assert done.returncode == 0, done.stdout
    assert "with CI=true these would fail the run" in done.stdout


def test_a_list_line_without_a_reason_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "allowed.txt"
    bad.write_text("# header\ntests/test_x.py::test_y\n")
    with pytest.raises(ValueError, match=r"allowed.txt:2: expected"):
        allowed_skips(bad)
