"""Fork server: one process per node that imported the training stack once; workers are
forked from it.

Why this file exists: starting a worker is mostly importing torch (about 2 s of CPU on
the 2-core test machine). After a crash of every rank, every rank must be started again
at once, and after each loss the launcher starts a replacement hot spare, whose start-up
competes for the node's cores with the ranks that are training. The launcher therefore
starts one zygote per node; it imports torch, numpy and the runtime but never initialises
CUDA or a process group, so a fork of it is a clean start that skips the imports.

Protocol (the launcher's side is :class:`ForkServer`): one JSON object per line over a
socket pair. The launcher sends ``{"argv": [script, args...], "env": {...}, "cwd": ...}``;
the zygote forks, and the child runs the script as ``__main__`` with that environment
(``python script.py args...`` semantics) while the zygote answers ``{"pid": N}``. When a
child ends the zygote reports ``{"exit": N, "code": C}``, C as ``subprocess`` gives it
(the exit status, or minus the signal number). The children keep the zygote's standard
streams, which are the launcher's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.005
# The zygote sleeps in select() until a request or a child's exit (SIGCHLD, through a
# wake-up pipe) arrives; this bound is only a safety net. It polled every 5 ms before:
# 1.8 ms of CPU per training step of the FSDP2 --quick job (docs/benchmarks.md).
IDLE_S = 1.0


# ---------------------------------------------------------------- the zygote process
def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux PR_SET_PDEATHSIG):
    a launcher killed with SIGKILL takes its zygote and workers with it instead of leaving
    them training into a store that is gone."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exit_wakeup() -> int:
    """A pipe the kernel's SIGCHLD writes a byte to (``signal.set_wakeup_fd``): its read
    end is readable as soon as a child ends, so the zygote can block in select()."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)   # a Python handler: the fd is written
    signal.set_wakeup_fd(w)
    return r


def _forget_exit_wakeup(r: int) -> None:
    """In a forked child: the zygote's SIGCHLD handling is not the script's."""
    w = signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in (r, w):
        if fd >= 0:
            os.close(fd)


def _run_child(argv: list[str], env: dict[str, str], cwd: str | None) -> None:
    """In the forked child: become ``python argv[0] argv[1:]`` (never returns)."""
    die_with_parent()
    os.environ.clear()
    os.environ.update(env)
    from seamguard.runtime.eventlog import set_title
    set_title(f"seamguard: worker w{env.get('SEAMGUARD_WORKER_ID', '?')} {env.get('SEAMGUARD_ROLE', '')} starting")
    if cwd:
        os.chdir(cwd)
    script = Path(argv[0])
    sys.argv = list(argv)
    sys.path[0] = str(script.resolve().parent)
    import numpy as np
    np.random.seed()   # a fresh interpreter would have drawn its own seed
    import runpy
    runpy.run_path(str(script), run_name="__main__")
    sys.exit(0)


def serve(fd: int, preload: tuple[str, ...] = ()) -> None:
    """The zygote's loop: fork on request, report exits, leave when the launcher does."""
    import importlib

    from seamguard.runtime.eventlog import set_title
    set_title("seamguard: fork server")
    die_with_parent()   # a launcher killed with SIGKILL takes this process, and so every worker, at once

    # the training stack, imported once for every worker forked from here
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import xxhash  # noqa: F401

    import seamguard.runtime  # noqa: F401
    import seamguard.runtime.worker  # noqa: F401
    for name in preload:
        importlib.import_module(name)

    sock = socket.socket(fileno=fd)
    wake = _exit_wakeup()
    buf = b""
    while True:
        ready, _, _ = select.select([sock, wake], [], [], IDLE_S)
        if wake in ready:
            while True:   # drain: one byte per signal delivered
                try:
                    if not os.read(wake, 512):
                        break
                except BlockingIOError:
                    break
        if sock in ready:
            data = sock.recv(65536)
            if not data:
                # the launcher is gone; the workers die with this process (die_with_parent). No
                # interpreter teardown first: with torch imported it kept them alive 2.5 s more.
                os._exit(0)
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _forget_exit_wakeup(wake)
                    _run_child(req["argv"], req["env"], req.get("cwd"))
                sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while True:   # reap every child that has ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:   # no children at all
                break
            if not pid:
                break
            sock.sendall(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
                         .encode() + b"\n")


# ---------------------------------------------------------------- the launcher's side
class ForkServer:
    """Starts a zygote and asks it for workers (see module docstring)."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seamguard.runtime.zygote", str(theirs.fileno()),
             *preload], pass_fds=(theirs.fileno(),))
        theirs.close()
        self.sock = ours
        self.sock.setblocking(False)
        self._buf = b""
        self._pids: list[int] = []
        self.codes: dict[int, int] = {}

    def _pump(self, timeout_s: float = 0.0, also=()) -> None:
        """Read whatever the zygote has sent (waiting up to ``timeout_s`` for something
        from it or for ``also``, other sockets the caller wants to be woken by)."""
        if timeout_s > 0:
            select.select([self.sock, *also], [], [], timeout_s)
        elif not select.select([self.sock], [], [], 0)[0]:
            return   # nothing sent: no recv, no BlockingIOError (the launcher asks often)
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                break
            if not data:
                raise RuntimeError(f"fork server exited (code {self.proc.poll()})")
            self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            msg = json.loads(line)
            if "pid" in msg:
                self._pids.append(int(msg["pid"]))
            else:
                self.codes[int(msg["exit"])] = int(msg["code"])

    def spawn(self, argv: list[str], env: dict[str, str], timeout_s: float) -> "ForkedProcess":
        """Fork a worker running ``argv`` (a .py script and its arguments)."""
        self.sock.setblocking(True)
        try:
            self.sock.sendall(json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
                              + b"\n")
        finally:
            self.sock.setblocking(False)
        deadline = time.monotonic() + timeout_s
        while not self._pids:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fork server gave no worker within {timeout_s}s")
            if self.proc.poll() is not None:
                raise RuntimeError(f"fork server exited (code {self.proc.returncode})")
            self._pump(0.05)
        return ForkedProcess(self, self._pids.pop(0))

    def idle(self, timeout_s: float, also=()) -> None:
        """Sleep up to ``timeout_s``, waking at once when the zygote reports something
        (a child's exit) or one of ``also`` is readable: the launcher's wait between passes."""
        self._pump(timeout_s, also)

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the control socket; the server leaves on its own (killed after ``timeout_s``)."""
        self.sock.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedProcess:
    """The part of ``subprocess.Popen`` the launcher uses, for a child of the zygote."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server._pump()
            self.returncode = self.server.codes.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            self.server._pump(POLL_S)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(int(sys.argv[1]), tuple(sys.argv[2:]))
