"""Attack: ``watch --pid`` signals whatever reused the PID (issue 16, finding 8), and a
remote name prints terminal control sequences.

Real processes on this machine: a PID is made to name another process by pinning a
handle, letting the first process end and giving the handle a start time it no longer
matches (the kernel reusing a PID cannot be forced in a test; a changed start time is
exactly what a reuse looks like). With a pidfd the kernel itself refuses.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from trainguard.adapters.local.pidguard import PidHandle, start_time
from trainguard.adapters.local.process import Process
from trainguard.lambdas.message import clean


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_pid_whose_process_changed_is_never_signalled() -> None:
    victim = sleeper()
    try:
        handle = PidHandle(victim.pid)
        assert handle.started == start_time(victim.pid) and handle.alive()
        handle.close()  # no pidfd: the start-time check is what guards
        handle.started = "1"  # as if the PID now named a process started at another time
        assert handle.send(signal.SIGKILL) is False  # before the fix: the victim killed
        time.sleep(0.2)
        assert victim.poll() is None and not handle.alive()
    finally:
        victim.kill()
        victim.wait()


def test_a_pidfd_signals_only_its_own_process() -> None:
    proc = sleeper()
    watched = Process(proc.pid)  # watch --pid PID: a bare PID, not our child
    assert watched.handle is not None and watched.poll(0.0)
    watched.signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert not watched.poll(1.0)
    assert watched.handle.send(signal.SIGKILL) is False  # gone: nothing is sent anywhere


def test_remote_names_print_no_terminal_control_sequences() -> None:
    name = "bert\x1b]0;pwned\x07\x1b[2J\r\nFAKE: all good\u202e"
    shown = clean(name)
    assert "\x1b" not in shown and "\n" not in shown and "\u202e" not in shown
    assert shown.startswith("bert")


def test_a_remote_job_id_prints_as_text() -> None:
    """The check heading, as ``trainguard check --source ...`` prints a remote job."""
    import io

    from rich.console import Console

    from trainguard import report
    from trainguard.checker.model import Job

    out = io.StringIO()
    run = report.Run(path="sagemaker", fmt="sagemaker",
                     job=Job(id="x\x1b]0;pwned\x07[red]forged[/red]"))
    report._heading(Console(file=out, force_terminal=True, width=200), run, "ok")
    text = out.getvalue()
    assert "\x1b]0;" not in text and "\x07" not in text and "[red]forged[/red]" in text
