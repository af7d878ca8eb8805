"""The launcher reports a worker's loss once the kernel marks it exiting (PF_EXITING and
its wait status in /proc/<pid>/stat), not only once ``waitpid`` sees it gone: a process
freeing gigabytes of page-locked memory and a CUDA context takes most of a second to
finish exiting. A zombie is a process past that point, held still for the test."""

import os
import signal
import subprocess
import sys
import time

from seamguard.runtime.launcher import exiting_code


def _python(first: str) -> subprocess.Popen:
    """A child running ``first``, then sleeping; never reaped before the test's end."""
    return subprocess.Popen([sys.executable, "-c", f"import os, time\n{first}\ntime.sleep(60)"])


def _until(pred, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_running_process_is_not_exiting():
    proc = _python("")
    try:
        time.sleep(0.2)
        assert exiting_code(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_process_reports_its_signal_before_it_is_reaped():
    proc = _python("")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        _until(lambda: exiting_code(proc.pid) is not None)
        assert exiting_code(proc.pid) == -signal.SIGKILL
    finally:
        proc.kill()
        assert proc.wait() == -signal.SIGKILL   # what waitpid says agrees


def test_an_exit_code_is_reported_as_waitpid_would():
    proc = _python("os._exit(3)")
    try:
        _until(lambda: exiting_code(proc.pid) is not None)
        assert exiting_code(proc.pid) == 3
    finally:
        assert proc.wait() == 3


def test_a_pid_that_is_gone_says_nothing():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert exiting_code(proc.pid) is None
