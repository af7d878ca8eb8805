"""A launcher's worker processes: started, watched, replaced, drained, cleaned up after.

Process supervision for `seamguard launch` (runtime/launcher.py): each worker's
environment (torchrun's contract, MASTER_ADDR … LOCAL_WORLD_SIZE, plus SEAMGUARD_*), its
start (forked from the node's zygote, runtime/zygote.py, or a fresh interpreter), when it
has ended (`Child.ended`, `exiting_code`: before `waitpid` can see it), a fresh hot spare
in place of a lost one (registered in the job's store: keys.joined), the wait between
passes that an exit cuts short, the bounded drain at the end and the /dev/shm slots a
crashed worker left (runtime/shm.py). The launcher's loop decides when; this module does.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass

from seamguard.runtime import keys, shm
from seamguard.runtime.eventlog import EVENTS_FILE_ENV, LOG_FORMAT_ENV
from seamguard.runtime.settings import LaunchSettings
from seamguard.runtime.zygote import ForkedProcess, ForkServer

POLL_S = 0.005



@dataclass
class Child:
    wid: int
    proc: subprocess.Popen | ForkedProcess
    reported: bool = False

    def ended(self) -> int | None:
        """Its exit code once it exited, or once it is irreversibly exiting (`exiting_code`),
        else None."""
        code = self.proc.poll()
        return code if code is not None else exiting_code(self.proc.pid)


_PF_EXITING = 0x4   # include/linux/sched.h: the task is in do_exit


def exiting_code(pid: int) -> int | None:
    """The exit code (as ``subprocess`` reports it) of a process that has begun exiting
    but may not have finished, from /proc/<pid>/stat; None while it runs, or where the
    kernel does not say. A process that dies holding gigabytes of page-locked memory and
    a CUDA context takes most of a second to finish exiting (the H100 runs,
    docs/benchmarks.md); ``waitpid`` only sees it then. The kernel marks the thread group
    leader PF_EXITING (stat field 9) and stores its wait status (field 52, Linux >= 3.5)
    before it releases any memory, and nothing it does afterwards runs user code, so the
    launcher reports the loss at that point (proc(5))."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        flags, status = int(fields[9 - 3]), int(fields[52 - 3])
        return os.waitstatus_to_exitcode(status) if flags & _PF_EXITING else None
    except (OSError, IndexError, ValueError):
        return None


def _command(script: list[str]) -> list[str]:
    return [sys.executable, *script] if script[0].endswith(".py") else list(script)


def start_worker(s: LaunchSettings, server: ForkServer | None, env: dict[str, str]
           ) -> subprocess.Popen | ForkedProcess:
    """A worker process: forked from the node's zygote when there is one (a .py script),
    else a fresh interpreter."""
    if server is not None:
        return server.spawn(list(s.script), env, timeout_s=s.startup_timeout_s)
    return subprocess.Popen(_command(s.script), env=env)


def worker_env(s: LaunchSettings, port: int, wid: int, local: int,
                node_store: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env.update(s.env)
    trainer = local < s.nproc
    env.update({
        "MASTER_ADDR": s.store_host if s.nnodes == 1 else s.master_addr, "MASTER_PORT": str(port),
        "WORLD_SIZE": str(s.nnodes * s.nproc), "LOCAL_WORLD_SIZE": str(s.nproc),
        "LOCAL_RANK": str(local),
        # initial rank only; after a recovery the runtime's rank is authoritative
        "RANK": str(s.node_rank * s.nproc + local) if trainer else "-1",
        "SEAMGUARD_WORKER_ID": str(wid), "SEAMGUARD_RUN_ID": s.run_id,
        "SEAMGUARD_RANKS_PER_NODE": str(s.nproc), "SEAMGUARD_ROLE": "trainer" if trainer else "spare",
        LOG_FORMAT_ENV: s.log_format, "SEAMGUARD_STORE": s.store,
        shm.LAUNCHER_PID_ENV: str(os.getpid()),
    })
    if node_store:
        env["SEAMGUARD_NODE_STORE"] = node_store
        env["SEAMGUARD_NODE_BEAT_S"] = str(s.node_beat_s)   # how stale its mirrored keys may be
    if s.events_file is not None:
        env[EVENTS_FILE_ENV] = str(s.events_file)
    return env


def idle(server: ForkServer | None, children: list[Child], wait_s: float, links=()) -> None:
    """Wait ``wait_s`` between passes, waking at once when a child forked by the zygote
    exits (the zygote reports it on its socket) or a node launcher's link has something to
    read (``links``: the link server, a waitable); a child started otherwise is polled."""
    if server is not None and all(isinstance(c.proc, ForkedProcess) for c in children):
        server.idle(wait_s, links)
    elif links:
        select.select(list(links), [], [], POLL_S)
    else:
        time.sleep(POLL_S)


def remove_shared_memory(run_id: str, children: list[Child]) -> None:
    """Snapshot slots a crashed worker left in /dev/shm and nobody adopted (a clean exit
    removes its own)."""
    for c in children:
        prefix = shm.slot_prefix(run_id, c.proc.pid, c.wid, os.getpid(), shm.pid_namespace())
        for f in shm.SHM.glob(f"{prefix}-slot*"):
            f.unlink(missing_ok=True)


def spawn_spare(s: LaunchSettings, server: ForkServer | None, store, port: int,
                 per_node: int, node_store: str) -> Child:
    """Start a fresh hot spare in place of a lost process (new worker id)."""
    wid = s.nnodes * per_node + store.add(keys.NEXT_WID, 1) - 1
    env = worker_env(s, port, wid, s.nproc, node_store)  # a local slot past the trainers: a spare
    child = Child(wid, start_worker(s, server, env))
    store.set(keys.joined(store.add(keys.JOINED_COUNT, 1)), str(wid))
    return child


def drain(children: list[Child], timeout_s: float, log) -> None:
    """Let finished trainers exit; spares leave on JOB_DONE by themselves (bounded).

    The job's outcome is already decided here: a process that outlives the bound is
    killed, and one that does not even die within 5 s more is reported, not waited for.
    """
    deadline = time.monotonic() + timeout_s
    for c in children:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            try:
                c.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log({"event": "child_not_reaped", "wid": c.wid, "pid": c.proc.pid})
