"""``trainguard gate`` end to end on the local source: real training processes writing
``trainguard.emit`` lines, gated through the CLI, stopped with real signals. (The cloud
and cluster sources: tests/test_gate_sources.py.)

A healthy run passes (exit 0); a run forecast to miss its target is cancelled (exit 3);
a diverging one fails fast (exit 1) and its process is ended; a run still going at the
deadline is cancelled; a forged line cannot stop a run it does not belong to; a source
that cannot be read, or a stop that fails, is an error (exit 2), never a pass.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from trainguard.checker.model import Job, JobState, Series
from trainguard.checker.policy import Policy
from trainguard.cli import app
from trainguard.gate import (
    CANCELLED,
    ERROR,
    FAILED,
    PASS,
    GateSource,
    GateSpec,
    parse_duration,
    parse_target,
    run_gate,
)

#: a training process: ``step=S/PLANNED`` lines with loss and val_loss, 20 per second
TRAIN = textwrap.dedent('''
    import math, sys, time
    from datetime import datetime, timezone
    path, kind, planned = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(path, "a") as f:
        for i in range(1, planned + 1):
            t = time.time()
            decay = math.exp(-i / 30)
            loss = 2.0 * decay + 0.3
            val = 2.0 * decay + 0.35 if kind != "plateau" else 1.2 + 0.01 * math.sin(i)
            if kind == "diverge" and i > 40:
                loss = float("nan")
            stamp = datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            f.write(f"{stamp[:-4]}Z trainguard: step={i}/{planned} loss={loss:.7g} "
                    f"val_loss={val:.7g} t={t:.3f}\\n")
            f.flush()
            time.sleep(0.05)
''')


@pytest.fixture
def train(tmp_path: Path) -> Any:
    """``(run file, --start command)`` of a training of a kind and planned length."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)

    def command(kind: str, planned: int) -> tuple[Path, str]:
        log = tmp_path / f"{kind}.log"
        return log, f"{sys.executable} {script} {log} {kind} {planned}"

    return command


def gate(*args: str) -> tuple[int, str, dict[str, Any]]:
    out = Path(args[0]).with_suffix(".gate.json")
    result = CliRunner().invoke(app, ["gate", *args, "--json", str(out), "--tick", "0.2"])
    data = json.loads(out.read_text()) if out.exists() else {}
    return result.exit_code, result.output, data


def lines(log: Path) -> int:
    return sum(1 for _ in log.open())


def test_a_training_that_loads_before_its_first_record_is_waited_for(tmp_path: Path) -> None:
    """A training that takes longer than three ticks to write its first record (a model
    and a dataset to load) is a running job with nothing logged yet: the gate waited three
    ticks for the file and ended with "the job could not be read" (exit 2)."""
    script = tmp_path / "slow.py"
    script.write_text(TRAIN.replace("path, kind, planned = sys.argv[1], sys.argv[2], "
                                    "int(sys.argv[3])",
                                    "path, kind, planned = sys.argv[1], sys.argv[2], "
                                    "int(sys.argv[3]); time.sleep(1.5)"))
    log = tmp_path / "slow.log"
    code, output, data = gate(str(log), "--source", "local",
                              "--start", f"{sys.executable} {script} {log} healthy 30")
    assert code == PASS, output
    assert "cannot read the job" not in output
    assert data["verdict"] == "pass" and data["state"] == "SUCCEEDED"


def test_a_healthy_run_passes(train: Any) -> None:
    log, command = train("healthy", 60)
    code, output, data = gate(str(log), "--source", "local", "--start", command,
                              "--target", "val_loss<=0.8", "--forecast-without-prior")
    assert code == PASS, output
    assert data["verdict"] == "pass" and data["state"] == "SUCCEEDED"
    assert lines(log) == 60  # it ran to its end, untouched
    assert "gate: PASS" in output


def test_a_run_forecast_to_miss_its_target_is_cancelled(train: Any) -> None:
    log, command = train("plateau", 400)
    code, output, data = gate(str(log), "--source", "local", "--start", command,
                              "--target", "val_loss<=0.5", "--forecast-without-prior",
                              "--deadline", "10m")
    assert code == CANCELLED, output
    assert data["stopped_by"] == "target" and data["verdict"] == "cancelled"
    assert "misses target 0.5" in output
    written = lines(log)
    time.sleep(0.5)
    assert lines(log) == written < 400  # ended well before its planned end


def test_a_diverging_run_fails_fast(train: Any) -> None:
    log, command = train("diverge", 400)
    started = time.monotonic()
    code, output, data = gate(str(log), "--source", "local", "--start", command)
    assert code == FAILED, output
    assert data["stopped_by"] == "divergence"
    assert time.monotonic() - started < 15
    assert any(f["rule"] == "divergence" and f["severity"] == "critical"
               for f in data["findings"])
    written = lines(log)
    time.sleep(0.5)
    assert lines(log) == written < 400


def test_a_run_the_pipeline_started_is_gated_by_its_pid(train: Any) -> None:
    """The pipeline started the training itself (``python train.py & gate --pid $!``):
    the gate is not its parent, and stops it with a signal all the same."""
    log, command = train("diverge", 400)
    shell = subprocess.run(["sh", "-c", f"{command} >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    pid = int(shell.stdout)
    try:
        code, output, _ = gate(str(log), "--source", "local", "--pid", str(pid))
        assert code == FAILED, output
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the gated process still runs")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_run_still_going_at_the_deadline_is_cancelled(train: Any) -> None:
    log, command = train("healthy", 4000)
    code, output, data = gate(str(log), "--source", "local", "--start", command,
                              "--deadline", "2s")
    assert code == CANCELLED, output
    assert "still running at the deadline" in data["reason"]
    assert data["stopped_by"] == "gate"


def test_until_deadline_passes_a_healthy_run_and_leaves_it_running(train: Any) -> None:
    log, command = train("healthy", 100)
    code, output, data = gate(str(log), "--source", "local", "--start", command,
                              "--until", "deadline", "--deadline", "2s")
    assert code == PASS, output
    assert "left running" in data["reason"]
    written = lines(log)
    time.sleep(0.6)
    assert lines(log) > written


def test_dry_run_says_what_it_would_stop_and_stops_nothing(train: Any) -> None:
    log, command = train("diverge", 100)
    code, output, data = gate(str(log), "--source", "local", "--start", command,
                              "--dry-run")
    assert code == FAILED, output
    assert "would stop (dry run)" in data["reason"]


def test_a_process_that_fails_on_its_own_fails_the_gate(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    log.write_text("2026-01-01T00:00:00.000Z trainguard: step=1/10 loss=2.0 t=1767225600\n")
    code, output, data = gate(str(log), "--source", "local", "--start",
                              f"{sys.executable} -c 'import time; time.sleep(0.5); "
                              "raise SystemExit(3)'")
    assert code == FAILED, output
    assert data["state"] == "FAILED" and "exit 3" in data["reason"]


# --- attack and faults -------------------------------------------------------------------

def test_forged_lines_in_another_file_cannot_stop_the_gated_run(train: Any,
                                                                tmp_path: Path) -> None:
    """Attack: a NaN written into some other log (a forged run) is not the gated job's;
    the gated run passes untouched."""
    forged = tmp_path / "forged.log"
    forged.write_text("".join(f"2026-01-01T00:00:{i:02d}.000Z trainguard: step={i}/50 "
                              f"loss=nan t={1767225600 + i}\n" for i in range(1, 20)))
    log, command = train("healthy", 40)
    code, output, data = gate(str(log), "--source", "local", "--start", command)
    assert code == PASS, output
    assert not data["findings"]


class Broken:
    """Fault injection at the source boundary: reads or the stop call fail."""

    def __init__(self, fail_reads: int, fail_stop: bool, job: Job) -> None:
        self.fail_reads, self.fail_stop, self.job = fail_reads, fail_stop, job
        self.reads = 0
        self.stops: list[str] = []

    def read(self, now: float) -> Job:
        self.reads += 1
        if self.reads <= self.fail_reads:
            raise ConnectionError("connection reset by peer")
        return self.job

    def stop(self, job: Job, reason: str) -> None:
        if self.fail_stop:
            raise PermissionError("AccessDenied: not authorised to stop")
        self.stops.append(job.id)


def diverged(now: float) -> Job:
    t = np.asarray([now - 50.0 + i for i in range(50)], dtype=np.float64)
    loss = np.asarray([1.0] * 45 + [float("nan")] * 5, dtype=np.float64)
    return Job(id="j", provider="memory", state=JobState.RUNNING, start_time=now - 60,
               hourly_price=10.0,
               series={"loss": Series("loss", t, np.arange(50, dtype=np.float64), loss)})


def quiet_gate(broken: Broken, **spec: Any) -> Any:
    source = GateSource("memory", broken.read, broken.stop, "j", None)
    now = [1_800_000_000.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    return run_gate(source, Policy(), GateSpec(tick_s=1.0, **spec),
                    Console(file=io.StringIO()), clock=clock,
                    sleep=lambda s: None)


def test_a_source_that_keeps_failing_is_an_error_and_nothing_is_stopped() -> None:
    broken = Broken(fail_reads=99, fail_stop=False, job=diverged(1_800_000_000.0))
    result = quiet_gate(broken)
    assert result.exit_code == ERROR and "could not be read" in result.reason
    assert broken.stops == [] and broken.reads == 3


def test_a_failing_read_now_and_then_is_retried() -> None:
    broken = Broken(fail_reads=2, fail_stop=False, job=diverged(1_800_000_100.0))
    result = quiet_gate(broken)
    assert result.exit_code == FAILED and broken.stops == ["j"]


def test_a_stop_that_fails_is_an_error_not_a_pass_and_is_not_retried_twice() -> None:
    broken = Broken(fail_reads=0, fail_stop=True, job=diverged(1_800_000_000.0))
    result = quiet_gate(broken)
    assert result.exit_code == ERROR and "stop failed" in result.reason
    assert broken.stops == []


# --- input ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [("5400", 5400), ("90m", 5400),
                                               ("1h30m", 5400), ("45s", 45)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_targets() -> None:
    assert parse_target("val_loss<=0.35") == ("val_loss", "min", 0.35)
    assert parse_target("accuracy >= 0.9") == ("accuracy", "max", 0.9)


@pytest.mark.parametrize(("args", "message"), [
    (["--until", "forever"], "--until 'forever'"),
    (["--until", "deadline"], "needs --deadline"),
    (["--deadline", "soon"], "not a duration"),
    (["--target", "val_loss=0.3"], "expected METRIC<=VALUE"),
    ([], "needs --start COMMAND"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                             message: str) -> None:
    log = tmp_path / "run.log"
    log.write_text("")
    result = CliRunner().invoke(app, ["gate", str(log), "--source", "local", *args])
    assert result.exit_code == ERROR, result.output
    assert message in result.output and "Traceback" not in result.output


def test_an_unknown_job_on_a_provider_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["gate", "nope", "--source", "nosuchsource"])
    assert result.exit_code == ERROR
    assert "--source nosuchsource" in result.output
