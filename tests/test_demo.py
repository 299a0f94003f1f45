"""``trainguard demo`` end to end: four real trainings in their own processes, watched
live; the healthy one runs to the end and each bad one is stopped by the rule that fits."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (the demo extra)")

from trainguard.demo import run_demo


@pytest.mark.slow
def test_demo_stops_the_three_bad_runs_by_the_expected_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    # A relative work folder, as `trainguard demo` gets by default.
    monkeypatch.chdir(tmp_path)
    result = run_demo(Path("demo-out"), console)

    runs = {r.name: r for r in result.runs}
    assert runs["healthy"].stopped_by is None
    assert runs["healthy"].exit_code == 0
    assert runs["healthy"].steps == runs["healthy"].planned_steps
    assert {n: r.stopped_by for n, r in runs.items() if n != "healthy"} == {
        "diverge": "divergence", "nolearn": "plateau", "hang": "stall"}
    for name in ("diverge", "nolearn", "hang"):
        r = runs[name]
        assert r.exit_code == -15, name  # SIGTERM landed
        assert r.steps is not None and r.steps < r.planned_steps, name
        assert r.saved_usd > 0 and r.cost_usd < r.unwatched_cost_usd, name
    assert result.watch is not None
    assert not any(f for f in result.watch.runs if f.job_id == "healthy" and f.findings)

    # Findings were printed as they appeared, and no training process is left behind.
    live = buf.getvalue()
    assert "STOPPED diverge" in live and "STOPPED nolearn" in live and "STOPPED hang" in live
    for o in result.watch.runs:
        assert o.pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(o.pid, 0)

    table = io.StringIO()
    Console(file=table, width=220).print(result.table())
    assert "stopped: stall" in table.getvalue() and result.instance_type in table.getvalue()
    assert result.to_dict()["runs"][0]["name"] == "healthy"


def test_demo_leaves_no_process_behind_on_ctrl_c(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import trainguard.demo.run as demo_run

    seen: dict[Any, subprocess.Popen[bytes]] = {}

    def interrupted(*args: Any, processes: dict[Any, subprocess.Popen[bytes]],
                    **kwargs: Any) -> Any:
        seen.update(processes)
        raise KeyboardInterrupt  # the user pressed Ctrl-C while the watchdog ran

    monkeypatch.setattr(demo_run, "watch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_demo(tmp_path, Console(file=io.StringIO()))
    assert len(seen) == 4
    assert all(p.returncode is not None for p in seen.values())
