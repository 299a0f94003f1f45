"""``trainguard watch --start`` at its edges, on real processes: one that exits without
writing its run file, one that crashes at start, and a real torch DataLoader with two
worker processes that a stop must end with the process it belongs to."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from trainguard.checker.model import Action, Severity
from trainguard.checker.policy import Policy, RuleConfig, Safety
from trainguard.cli import app
from trainguard.lambdas.local import watch

runner = CliRunner()
TICK = 0.5


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def watch_cli(tmp_path: Path, script: str, *extra: str) -> tuple[Any, dict[str, Any]]:
    (tmp_path / "train.py").write_text(script)
    run = tmp_path / "run.jsonl"
    result = runner.invoke(app, [
        "watch", str(run), "--start", f"{run}={sys.executable} {tmp_path / 'train.py'}",
        "--tick", str(TICK), "--until", "60", "--state", str(tmp_path / "state.sqlite"),
        "--json", str(tmp_path / "out.json"), *extra])
    return result, json.loads((tmp_path / "out.json").read_text())


def test_a_process_that_exits_without_writing_ends_the_watch(tmp_path: Path) -> None:
    """It prints to stdout instead of writing run.jsonl: watch used to wait forever."""
    result, doc = watch_cli(tmp_path, "import time\nprint('loss 0.5')\n"
                                      "print('exit at', time.time(), flush=True)\n")
    out = (tmp_path / "run.jsonl.out").read_text()
    exited = float(out.split("exit at")[1])
    assert doc["ended_at"] - exited <= 2 * TICK + 0.5, (doc["ended_at"] - exited)
    [run] = doc["runs"]
    assert run["exit_code"] == 0 and run["state"] != "RUNNING"
    text = result.output
    assert "exit code 0" in text and "never wrote" in text
    assert "loss 0.5" in text  # the tail of its output: where its numbers went
    assert "trainguard watch: runs" in text  # the summary table


def test_a_process_that_crashes_says_its_exit_code_and_tail(tmp_path: Path) -> None:
    result, doc = watch_cli(tmp_path, "import time\nprint('exit at', time.time())\n"
                                      "raise RuntimeError('CUDA error: out of memory')\n")
    out = (tmp_path / "run.jsonl.out").read_text()
    exited = float(out.split("exit at")[1].split()[0])
    assert doc["ended_at"] - exited <= 2 * TICK + 0.5
    assert doc["runs"][0]["exit_code"] == 1
    text = result.output
    assert result.exit_code == 1
    assert "exit code 1" in text and "RuntimeError: CUDA error: out of memory" in text


# A training loop over a real DataLoader with two workers: it records the workers' PIDs,
# then logs a loss that goes NaN, and keeps iterating until stopped. "deaf": it and its
# workers ignore SIGTERM.
LOADER = r"""
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

out, pids, deaf = sys.argv[1], sys.argv[2], sys.argv[3] == "deaf"

class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.tensor([float(i)])

def init(_):
    if deaf:
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\n")

if __name__ == "__main__":
    if deaf:
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, worker_init_fn=init)
    with open(out, "a") as f:
        for step, batch in enumerate(loader, 1):
            loss = float("nan") if step > 20 else 3.0 / step
            f.write(json.dumps({"time": time.time(), "step": step, "loss": loss}) + "\n")
            f.flush()
"""


def stop_on_nan() -> Policy:
    pol = Policy(name="stop-on-nan", safety=Safety(dry_run=False, persist_ticks=1))
    pol.rules["divergence"] = RuleConfig(actions={Severity.CRITICAL: Action.STOP})
    return pol


def worker_pids(path: Path, want: int = 2) -> list[int]:
    pids = [int(x) for x in path.read_text().split()] if path.exists() else []
    assert len(pids) >= want, f"the loader's workers never started: {pids}"
    return pids


@pytest.mark.slow
def test_a_stop_ends_the_dataloader_workers_too(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="pip install 'trainguard[train]'")
    (tmp_path / "policy.yaml").write_text(
        "name: stop-on-nan\nsafety: {dry_run: false, persist_ticks: 1}\n"
        "rules:\n  divergence:\n    actions: {critical: stop}\n")
    script = LOADER.replace("sys.argv[1]", repr(str(tmp_path / "run.jsonl"))).replace(
        "sys.argv[2]", repr(str(tmp_path / "pids"))).replace("sys.argv[3]", "'polite'")
    result, doc = watch_cli(tmp_path, script, "--policy", str(tmp_path / "policy.yaml"))
    [run] = doc["runs"]
    assert run["stopped_by"] == "divergence", result.output
    pids = worker_pids(tmp_path / "pids")
    assert not [p for p in [*pids, int(str(run["pid"]))] if alive(p)]


@pytest.mark.slow
def test_a_group_that_ignores_sigterm_is_killed_after_the_grace_period(
        tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="pip install 'trainguard[train]'")
    run, pids_file = tmp_path / "run.jsonl", tmp_path / "pids"
    (tmp_path / "train.py").write_text(LOADER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "train.py"), str(run),
                             str(pids_file), "deaf"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = watch([run], stop_on_nan(), tmp_path / "state.sqlite", TICK,
                       Console(file=open(os.devnull, "w")), until=60,  # noqa: SIM115
                       processes={run: proc}, grace_s=1.0)
        [outcome] = result.runs
        assert outcome.stopped_by == "divergence"
        assert proc.returncode == -signal.SIGKILL  # SIGTERM was ignored
        assert not [p for p in worker_pids(pids_file) if alive(p)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_process_given_by_pid_is_signalled_alone(tmp_path: Path) -> None:
    """A PID the user gave (not started by the watchdog) may share its group with the
    user's shell: only that process is signalled, never its group."""
    from trainguard.adapters.local.process import Process

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        p = Process(proc.pid)
        assert p.group is None
        p.signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGTERM
        assert alive(os.getpid())  # the test's own group was not touched
    finally:
        if proc.poll() is None:
            proc.kill()
    started = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               start_new_session=True)
    p = Process(started)
    assert p.group == started.pid
    t0 = time.time()
    p.end(grace_s=5.0)
    assert started.returncode == -signal.SIGTERM and time.time() - t0 < 5.0


NAN_THEN_EXIT_0 = r"""
import json, sys, time
with open(sys.argv[1], "a") as f:
    for step in range(1, 41):
        loss = float("nan") if step > 20 else 3.0 / step
        f.write(json.dumps({"time": time.time(), "step": step, "loss": loss}) + "\n")
        f.flush()
        time.sleep(0.02)
    time.sleep(1.5)
"""


def test_a_run_that_went_nan_and_exited_0_is_not_cleared(tmp_path: Path) -> None:
    """The finding stands when the run ends: the end stops the judging, it clears nothing."""
    run = tmp_path / "run.jsonl"
    (tmp_path / "t.py").write_text(NAN_THEN_EXIT_0)
    result = runner.invoke(app, [
        "watch", str(run), "--start", f"{run}={sys.executable} {tmp_path / 't.py'} {run}",
        "--tick", str(TICK), "--until", "60", "--state", str(tmp_path / "s.sqlite")])
    text = result.output
    assert "critical" in text and "divergence" in text, text
    assert "cleared" not in text
    assert "no longer judged run: its critical divergence stands, the run ended (succeeded)" \
        in text
    assert result.exit_code == 1  # the finding went critical


def test_a_short_silence_is_said_in_seconds() -> None:
    from trainguard.checker.evaluate import evaluate
    from trainguard.checker.model import Job, Series
    from trainguard.config import default_policy

    t = 1_717_000_000.0 + np.arange(30.0)
    job = Job(id="j", series={"step": Series("step", t, t - t[0], t - t[0])})
    pol = default_policy()
    pol.rules["stall"] = RuleConfig(params={"min_seconds": 5.0, "unlearnt_seconds": 5.0})
    [stall] = [f for f in evaluate([job], pol, float(t[-1]) + 40) if f.rule == "stall"]
    assert "no progress for 40 s" in stall.message, stall.message
    [long] = [f for f in evaluate([job], pol, float(t[-1]) + 600) if f.rule == "stall"]
    assert "no progress for 10.0 min" in long.message, long.message
