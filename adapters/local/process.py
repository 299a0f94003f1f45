"""The processes a local watch follows: a child it started or any PID, signalled as a
process group when it leads one (its DataLoader workers end with it), SIGTERM first and
SIGKILL after a grace period."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainguard.adapters.local.pidguard import PidHandle, started_at

GRACE_S = 10.0
#: lines of a started process's output shown when it ends
TAIL_LINES = 10


def tail(path: Path | None, lines: int = TAIL_LINES, max_bytes: int = 16384) -> list[str]:
    """The last ``lines`` lines of a file ([] when there is none)."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - max_bytes, 0))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip()][-lines:]


class Process:
    """A process to watch: a child we started (``Popen``) or any PID.

    A child started in its own session (``start_new_session=True``, as ``watch --start``
    does) is signalled as a process group, so the workers it forked end with it."""

    def __init__(self, target: int | subprocess.Popen[Any], output: Path | None = None) -> None:
        self.popen = target if isinstance(target, subprocess.Popen) else None
        self.pid = target.pid if isinstance(target, subprocess.Popen) else int(target)
        self.output = output  # where its stdout and stderr go, for the tail when it ends
        self.exit_code: int | None = None
        self.exited_at: float | None = None
        self.term_sent_at: float | None = None
        self.killed = False
        self.reported = False  # its end has been said
        self.group: int | None = None
        # A bare PID is pinned to the process it names now: never signal a PID reuse.
        self.handle = PidHandle(self.pid) if self.popen is None else None
        # when it started: a run whose log has one record so far is judged from there
        self.started_at = time.time() if self.popen is not None else started_at(self.pid)
        if self.popen is not None:
            with contextlib.suppress(OSError):
                if os.getpgid(self.pid) == self.pid:  # it leads its own group
                    self.group = self.pid

    def poll(self, now: float) -> bool:
        """True while the process runs; notes its exit code and time once it has ended."""
        if self.exited_at is not None:
            return False
        if self.popen is not None:
            code = self.popen.poll()
            alive = code is None
        else:
            code = None
            assert self.handle is not None
            alive = self.handle.alive()
        if not alive:
            self.exit_code, self.exited_at = code, now
        return alive

    def signal(self, sig: signal.Signals) -> None:
        """``sig`` to the process, or to its whole group (its workers outlive it otherwise,
        re-parented to PID 1)."""
        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own
            if self.group is not None:
                os.killpg(self.group, sig)
            elif self.handle is not None:
                self.handle.send(sig)
            else:
                os.kill(self.pid, sig)

    def group_alive(self) -> bool:
        """Whether any process of the group (or the process) is left."""
        if self.popen is not None:
            self.popen.poll()  # reap it: a zombie still counts as a member of its group
        if self.handle is not None:
            return self.handle.alive()
        try:
            if self.group is not None:
                os.killpg(self.group, 0)
            else:
                os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def end(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM the group, then SIGKILL what is left after ``grace_s``: for the processes
        the watchdog started and must not leave behind."""
        if not self.group_alive():
            return
        if self.term_sent_at is None:
            self.term_sent_at = time.time()
            self.signal(signal.SIGTERM)
        deadline = self.term_sent_at + grace_s
        while time.time() < deadline and self.group_alive():
            time.sleep(0.05)
        if self.group_alive():
            self.signal(signal.SIGKILL)
            self.killed = True
            for _ in range(100):  # the kernel takes a moment to tear them down
                if not self.group_alive():
                    break
                time.sleep(0.02)


def end_all(processes: Sequence[Process], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group at once, then wait out one grace period for all of them."""
    for proc in processes:
        if proc.term_sent_at is None and proc.group_alive():
            proc.term_sent_at = time.time()
            proc.signal(signal.SIGTERM)
    for proc in processes:
        proc.end(grace_s)


def exit_text(code: int | None) -> str:
    """An exit code as a person reads it (a negative Popen code is a signal)."""
    if code is None:
        return "exit code unknown (not our child)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
