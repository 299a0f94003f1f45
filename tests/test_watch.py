"""The local watchdog on real processes writing real files: findings appear as the file
grows, SIGTERM (then SIGKILL) lands, and the SQLite state carries over a restart."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from trainguard.checker.model import Action, Severity
from trainguard.checker.policy import Policy, RuleConfig, Safety
from trainguard.lambdas.local import WatchResult, watch
from trainguard.lambdas.sqlite_state import SQLiteStore
from trainguard.lambdas.state import AuditAction

# A training loop in miniature: logs a falling loss with wall-clock times, then either
# finishes, hangs (alive, silent) or hangs and ignores SIGTERM.
WRITER = r"""
import json, signal, sys, time
out, steps, then = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if then == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(out, "a") as f:
    for step in range(1, steps + 1):
        f.write(json.dumps({"time": time.time(), "step": step, "loss": 3.0 / step}) + "\n")
        f.flush()
        time.sleep(0.05)
if then in ("hang", "deaf"):
    time.sleep(120)
"""


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def spawn(procs: list[subprocess.Popen[bytes]], out: Path, steps: int,
          then: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(steps), then])
    procs.append(p)
    return p


def stall_policy(persist: int = 2) -> Policy:
    pol = Policy(name="test", safety=Safety(dry_run=False, persist_ticks=persist))
    pol.rules["stall"] = RuleConfig(
        params={"min_seconds": 1.0, "min_updates": 5, "unlearnt_seconds": 3.0,
                "critical_seconds": 2.0},
        actions={Severity.WARNING: Action.NOTIFY, Severity.CRITICAL: Action.STOP})
    return pol


def quiet() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False), buf


def stopped(run: Path, p: subprocess.Popen[bytes], tick: float,
            state: Path) -> tuple[WatchResult, str]:
    """``watch`` of ``run`` written by ``p`` under the stall policy, which must end because
    the process did (SIGTERMed), not by ``until``; the result and what it printed."""
    console, out = quiet()
    t0 = time.time()
    result = watch([run], stall_policy(), state, tick, console, until=60, processes={run: p})
    assert time.time() - t0 < 30  # ended because the process did, not by ``until``
    assert p.returncode == -15  # SIGTERM
    return result, out.getvalue()


def test_hung_writer_is_found_live_and_sigterm_lands(tmp_path: Path,
                                                     procs: list[subprocess.Popen[bytes]]) -> None:
    run = tmp_path / "hung.jsonl"
    p = spawn(procs, run, 30, "hang")
    result, text = stopped(run, p, 0.3, tmp_path / "state.sqlite")
    [outcome] = result.runs
    assert outcome.stopped_by == "stall"
    assert outcome.state == "STOPPED"
    assert outcome.steps == 30  # the file was read as it grew
    assert outcome.stopped_at is not None and outcome.start_time is not None
    assert outcome.stopped_at - outcome.start_time >= 30 * 0.05 + 2.0  # critical after 2x 1 s
    assert "stall" in text and "STOPPED" in text and "hung" in text
    actions = [a.action for a in result.audit]
    assert actions.count(AuditAction.STOP) == 1
    assert actions.index(AuditAction.SKIP_PERSISTENCE) < actions.index(AuditAction.STOP)


def test_a_writer_that_hangs_after_its_first_record_is_stopped(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """One record, then a hang (the first all-reduce): the log alone has no start before
    its first record, so its cadence is unknown and a silence after it only a warning; the
    process's own start time is the job's start, and the hang is critical and stopped."""
    run = tmp_path / "first.jsonl"
    p = spawn(procs, run, 1, "hang")
    console, _ = quiet()
    result = watch([run], stall_policy(), tmp_path / "state.sqlite", 0.3, console, until=60,
                   processes={run: p})
    assert p.returncode == -15  # SIGTERM
    [outcome] = result.runs
    assert outcome.stopped_by == "stall" and outcome.steps == 1
    assert outcome.stopped_at is not None
    assert outcome.start_time is not None and outcome.start_time < outcome.stopped_at


def test_healthy_writer_runs_to_the_end(tmp_path: Path,
                                        procs: list[subprocess.Popen[bytes]]) -> None:
    run = tmp_path / "fine.jsonl"
    p = spawn(procs, run, 40, "exit")
    console, _ = quiet()
    result = watch([run], stall_policy(), tmp_path / "state.sqlite", 0.2, console, until=60,
                   processes={run: p})
    [outcome] = result.runs
    assert p.returncode == 0
    assert outcome.state == "SUCCEEDED" and outcome.exit_code == 0
    assert outcome.stopped_by is None and outcome.findings == []
    assert outcome.steps == 40
    assert result.ticks >= 3


# nanochat's shape: set-up logged through ``logging`` (stamped), then one printed line
# per step (not stamped), for longer than the stall policy's threshold.
PRINTER = r"""
import sys, time
out, steps = sys.argv[1], int(sys.argv[2])
then = sys.argv[3] if len(sys.argv) > 3 else "exit"
with open(out, "a") as f:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    f.write(f"{stamp},037 - nanochat.common - INFO - Distributed world size: 1\n")
    f.flush()
    for step in range(steps):
        f.write(f"step {step:05d}/{steps} ({100 * step / steps:.2f}%) | loss: "
                f"{3.0 / (step + 1):.6f} | dt: 50.00ms\n")
        f.flush()
        time.sleep(0.05)
if then == "hang":
    time.sleep(120)
"""


def test_printed_steps_after_one_logged_line_are_no_stall(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """A log stamped only on its set-up lines dated every printed step to the last stamp:
    the live watch saw no progress for as long as the run went on, and stopped it (stall,
    critical) a second or two into a healthy run. The steps carry no time: the log is on
    its steps, and a stall is not judged from a clock it does not have."""
    run = tmp_path / "speedrun.log"
    p = subprocess.Popen([sys.executable, "-c", PRINTER, str(run), "100"])
    procs.append(p)
    console, _ = quiet()
    result = watch([run], stall_policy(), tmp_path / "state.sqlite", 0.2, console, until=60,
                   processes={run: p})
    [outcome] = result.runs
    assert p.returncode == 0
    assert outcome.stopped_by is None and outcome.findings == []
    assert outcome.steps == 99


def test_a_log_with_no_clock_that_hangs_is_stopped(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Printed steps with no time on them (nanoGPT's ``iter 10: loss 4.57``): the log alone
    measures no silence, so a live watch saw a hung run as a running one and never stopped
    it. Its records are now timed by when the watchdog saw them (the file's mtime at each
    read), from the process's start: the hang is a stall, and SIGTERM lands."""
    run = tmp_path / "printed.log"
    p = subprocess.Popen([sys.executable, "-c", PRINTER, str(run), "40", "hang"])
    procs.append(p)
    result, text = stopped(run, p, 0.2, tmp_path / "state.sqlite")
    [outcome] = result.runs
    assert outcome.stopped_by == "stall" and outcome.steps == 39
    assert outcome.stopped_at is not None and outcome.start_time is not None
    assert outcome.stopped_at - outcome.start_time >= 40 * 0.05 + 2.0
    assert "no progress for" in text and "STOPPED" in text


def test_sigkill_after_the_grace_period(tmp_path: Path,
                                        procs: list[subprocess.Popen[bytes]]) -> None:
    run = tmp_path / "deaf.jsonl"
    p = spawn(procs, run, 20, "deaf")
    console, _ = quiet()
    result = watch([run], stall_policy(persist=1), tmp_path / "state.sqlite", 0.25, console,
                   until=60, processes={run: p}, grace_s=1.0)
    assert p.returncode == -9  # SIGTERM was ignored; SIGKILL after the grace period
    assert result.runs[0].stopped_by == "stall"


def write_nan_run(path: Path) -> None:
    now = time.time()
    with open(path, "w") as f:
        for step in range(1, 31):
            loss = 2.0 / step if step <= 27 else math.nan
            f.write(json.dumps({"time": now - 31 + step, "step": step, "loss": loss}) + "\n")


def test_state_survives_a_restart(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    run = tmp_path / "nan.jsonl"
    write_nan_run(run)
    state = tmp_path / "state.sqlite"
    pol = Policy(name="test", safety=Safety(dry_run=False, persist_ticks=100))
    pol.rules["divergence"] = RuleConfig(actions={Severity.CRITICAL: Action.STOP})
    console, _ = quiet()
    first = watch([run], pol, state, 0.2, console, until=0.5)  # no process: until ends it
    assert [f["rule"] for f in first.runs[0].findings] == ["divergence"]
    assert first.runs[0].stopped_by is None

    store = SQLiteStore(state)
    # the job's memory (the store also keeps the tick clock, under its own key)
    [memory] = [m for m in store.load_all().values() if m.job_id == "nan"]
    [seen] = memory.findings.values()
    assert seen.consecutive == first.ticks
    store.close()

    # A new watchdog on the same state: one more tick makes the needed persistence, so
    # the stop comes at once, and the alarm raised before is not raised again.
    pol.safety.persist_ticks = first.ticks + 1
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    procs.append(sleeper)
    second = watch([run], pol, state, 0.2, console, until=30, processes={run: sleeper})
    assert sleeper.returncode == -15
    assert second.runs[0].stopped_by == "divergence"
    assert second.runs[0].findings == []  # no second "raise"
    assert [a.action for a in second.audit] == [AuditAction.STOP]
    store = SQLiteStore(state)
    log = [a.action for a in store.audit_log()]
    store.close()
    assert log[-1] == AuditAction.STOP
    assert log.count(AuditAction.SKIP_PERSISTENCE) == first.ticks


def test_elapsed_clock_log_is_judged_on_the_wall_clock(tmp_path: Path) -> None:
    """A log with only train_time (no timestamps) written just now is not a week-old stall."""
    import os
    import time as _time

    from trainguard.adapters.local import load_run
    from trainguard.adapters.local.clock import on_wall_clock

    log = tmp_path / "run.log"
    log.write_text("".join(f"step:{i}/100 train_loss:{3 - i / 100:.3f} train_time:{i * 500}ms "
                           "step_avg:500ms\n" for i in range(1, 60)))
    now = _time.time()
    os.utime(log, (now, now))
    job = on_wall_clock(load_run(log), log.stat().st_mtime)
    assert job.clock == "wall"
    last = job.last_time()
    assert last is not None and abs(last - now) < 1.0
    assert job.start_time is not None and abs((last - job.start_time) - 29.0) < 1e-6


def test_watch_starts_the_training_and_stops_it_when_it_hangs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trainguard watch RUN --start RUN=COMMAND``: the watchdog launches a real training
    (the demo's, whose data loader hangs), watches its log, and SIGTERMs it on the stall."""
    pytest.importorskip("sklearn", reason="the demo training needs scikit-learn")

    import shlex

    from typer.testing import CliRunner

    from trainguard.cli import app

    monkeypatch.chdir(tmp_path)
    policy = Path(__file__).resolve().parent.parent / "trainguard" / "demo" / "demo-policy.yaml"
    command = shlex.join([sys.executable, "-m", "trainguard.demo.train", "--mode", "hang",
                          "--out", "hang.jsonl", "--steps", "300", "--interval", "0.05"])
    res = CliRunner().invoke(app, [
        "watch", "hang.jsonl", "--start", f"hang.jsonl={command}", "--policy", str(policy),
        "--tick", "1", "--until", "90", "--state", "state.sqlite", "--json", "out.json"])
    assert res.exit_code == 1, res.output  # a critical finding
    (run,) = json.loads((tmp_path / "out.json").read_text())["runs"]
    assert run["stopped_by"] == "stall"
    assert run["exit_code"] == -15  # SIGTERM landed
    assert (tmp_path / "hang.jsonl.out").exists()


def test_watch_start_needs_a_watched_path() -> None:
    from typer.testing import CliRunner

    from trainguard.cli import app

    res = CliRunner().invoke(app, ["watch", "a.jsonl", "--start", "b.jsonl=true"])
    assert res.exit_code == 2 and "is not one of the runs watched" in res.output


def test_the_read_clock_times_records_by_when_they_were_seen() -> None:
    """``ReadClock`` on its own: the records there at the first read spread from the
    process's start to that read, the ones new at each later read at its mtime, a series
    begun later at the read that first saw it, and a series that lost records (the file
    rewritten) spread again."""
    import numpy as np

    from trainguard.adapters.local.clock import ReadClock
    from trainguard.checker.model import Job, LogLine, Series

    def cut(n: int, val: int = 0, logs: int = 0) -> Job:
        k = np.arange(float(n))
        series = {"loss": Series("loss", k, k, 3.0 / (k + 1))}
        if val:
            v = np.arange(float(val)) * 10
            series["val_loss"] = Series("val_loss", v, v, np.ones(val))
        return Job(id="r", clock="step", series=series,
                   logs=[LogLine(float(i), f"line {i}") for i in range(logs)])

    clock = ReadClock(start=100.0)
    first = clock.stamp(cut(4, logs=1), 104.0)
    assert first.clock == "wall" and first.start_time == 100.0
    assert first.series["loss"].time.tolist() == [101.0, 102.0, 103.0, 104.0]
    later = clock.stamp(cut(6, val=2, logs=2), 110.0)
    assert later.series["loss"].time.tolist() == [101.0, 102.0, 103.0, 104.0, 110.0, 110.0]
    assert later.series["val_loss"].time.tolist() == [110.0, 110.0]  # begun since
    assert [line.time for line in later.logs] == [104.0, 110.0]
    rewritten = clock.stamp(cut(2), 120.0)
    assert rewritten.series["loss"].time.tolist() == [110.0, 120.0]
    elapsed = Job(id="e", clock="elapsed", series={})
    assert clock.stamp(elapsed, 130.0) is elapsed  # its own clock, put on the wall elsewhere
