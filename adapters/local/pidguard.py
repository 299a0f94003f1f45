"""A handle on a process given by PID (``watch --pid``) that cannot signal another one.

A bare PID is a name that the kernel hands to a new process once the first has ended:
a watchdog that waited out a grace period and then sent SIGKILL to "the PID" could kill
whatever reused it. ``PidHandle`` pins the process when the watchdog first sees it: by a
pidfd where the kernel has them (Linux 5.3+: signals go to that process or fail), else
by its start time (``/proc/PID/stat``), checked again before every signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat),
    or None where /proc is not there or the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name may hold spaces and ")"
    return fields[19] if len(fields) > 19 else None


def started_at(pid: int) -> float | None:
    """When the process started, in epoch seconds (boot time plus its start ticks), or
    None where /proc does not say."""
    ticks = start_time(pid)
    try:
        boot = next(float(line.split()[1]) for line in
                    Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
        return boot + int(ticks) / os.sysconf("SC_CLK_TCK") if ticks is not None else None
    except (OSError, StopIteration, ValueError):
        return None


class PidHandle:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.started = start_time(pid)
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd here: start time
            self.fd = os.pidfd_open(pid)

    def same(self) -> bool:
        """Whether the PID still names the process first seen (not a reuse)."""
        if self.fd is not None:
            return True  # a pidfd names one process for good
        return self.started is None or start_time(self.pid) == self.started

    def send(self, sig: signal.Signals) -> bool:
        """``sig`` to the pinned process; False (and nothing sent) if it is gone or its
        PID now names another process."""
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
                return True
            if not self.same():
                return False
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def alive(self) -> bool:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, 0)
            elif not self.same():
                return False
            else:
                os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # someone else's process, still there
        return True

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
