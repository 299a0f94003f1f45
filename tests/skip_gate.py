"""CI that cannot be fooled by a skip: with ``CI=true`` a skipped test fails the run unless
``tests/allowed-skips.txt`` lists it with its reason.

Without the gate, a machine missing npm, apt or the shared data would skip the stack,
Azure and real-data tests and still print a green run. Locally (no ``CI``) skips are only
reported, so a developer without those tools can still run the rest.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

# TRAINGUARD_ALLOWED_SKIPS names another list (the gate's own tests use it).
ALLOWED = Path(os.environ.get("TRAINGUARD_ALLOWED_SKIPS")
               or Path(__file__).with_name("allowed-skips.txt"))
_skipped: list[tuple[str, str]] = []  # (node id, reason)


def allowed_skips(path: Path = ALLOWED) -> list[tuple[str, str]]:
    """(node id pattern, reason) per line ``PATTERN | REASON``; a line without a reason is
    an error naming the file and line."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, _, reason = (part.strip() for part in line.partition("|"))
        if not pattern or not reason:
            raise ValueError(f"{path}:{n}: expected 'NODE_ID_PATTERN | reason', got {line!r}")
        out.append((pattern, reason))
    return out


def unlisted(skipped: list[tuple[str, str]],
             allowed: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(node, why) for node, why in skipped
            if not any(fnmatch.fnmatchcase(node, pattern) for pattern, _ in allowed)]


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _reason(report)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        _skipped.append((report.nodeid, _reason(report)))


def _gate_on() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _gate_on() and unlisted(_skipped, allowed_skips()) and exitstatus in (0, 5):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    bad = unlisted(_skipped, allowed_skips())
    if not bad:
        return
    title = ("skipped tests not in tests/allowed-skips.txt (CI=true: the run fails)"
             if _gate_on() else "skipped tests (with CI=true these would fail the run)")
    terminalreporter.section(title, sep="=", red=_gate_on(), bold=True)
    for node, why in bad:
        terminalreporter.line(f"{node}: {why}")
