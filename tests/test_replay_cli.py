"""``trainguard replay`` on long runs, as a user runs it: not refused, ticked on a bounded
schedule, each fire reported on the record that made it; a tick in the wrong unit
refused before any judging."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.replay import MAX_AUTO_TICKS

runner = CliRunner()


def _csv(path: Path, n: int, nan_from: int) -> Path:
    """A metrics CSV with only steps: a falling loss, NaN from ``nan_from``."""
    rows = ["step,loss"] + [f"{i},{math.nan if i >= nan_from else 5.0 / (1 + i / 20)}"
                            for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _replay(*args: str | Path) -> Any:
    result = runner.invoke(app, ["replay", *map(str, args), "--format", "json"])
    assert result.exit_code == 1, result.output  # critical: the run diverged
    return json.loads(result.stdout)["runs"][0]


def test_a_long_run_is_replayed_on_a_bounded_schedule_with_fires_on_their_record(
        tmp_path: Path) -> None:
    run = _replay(_csv(tmp_path / "long.csv", 30_000, nan_from=21_234))
    assert run["ticks"] == MAX_AUTO_TICKS and run["tick"] > 1
    [f] = [f for f in run["findings"] if f["rule"] == "divergence"]
    # NaN from step 21,234; the default policy confirms it on the second NaN: step 21,235,
    # however far apart the ticks are
    assert f["first_fired"]["step"] == 21_235 and f["severity"] == "critical"
    assert f["savings"]["stop_step"] == 21_235


def test_a_given_tick_fires_at_the_ticks(tmp_path: Path) -> None:
    run = _replay(_csv(tmp_path / "run.csv", 3_000, nan_from=1_234), "--tick", "100")
    assert run["ticks"] == 31 and run["tick"] == 100
    [f] = [f for f in run["findings"] if f["rule"] == "divergence"]
    assert f["first_fired"]["step"] == 1_300  # the first tick that saw two NaN


def test_a_tick_in_the_wrong_unit_is_refused_before_judging(tmp_path: Path) -> None:
    path = _csv(tmp_path / "run.csv", 3_000, nan_from=1_234)
    result = runner.invoke(app, ["replay", str(path), "--tick", "0.0001"])
    assert result.exit_code == 2
    assert "makes 29,990,001 ticks" in result.output and "at most 10,000,000" in result.output
