"""Where a worker's snapshot slots live in /dev/shm, and which ones nobody will come back for.

A worker's snapshot slots (snapshot.SlotStore) are files in /dev/shm so that they outlive
the worker: a spare on the same node adopts a crashed worker's newest snapshot, and the
node's launcher deletes what is left when the job ends. A launcher killed with SIGKILL
deletes nothing, so on a machine that runs many jobs (a test suite, a shared node) the
files pile up. Each slot's name therefore carries its worker's pid, its launcher's pid
and their PID namespace, and every launcher sweeps at start the slots of its own PID
namespace whose worker and launcher are both gone: no process can adopt or delete them
any more. A slot whose launcher lives is left alone (its job may still adopt it), and so
is a slot of another PID namespace (a container sharing /dev/shm with this one: its pids
mean nothing here). A slot named before the launcher's pid was in the name is swept once
its worker's pid is gone from this namespace.

The naming (`slot_prefix`) and the judgement (`stale`) are pure; `sweep` does the I/O.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

SHM = Path("/dev/shm")
LAUNCHER_PID_ENV = "SEAMGUARD_LAUNCHER_PID"
"""Set by the launcher in its workers' environment: the pid their slot names carry."""
_NAME = re.compile(r"seamguard-(?P<run>.+)-(?P<pid>\d+)-w(?P<wid>\d+)"
                   r"(?:-l(?P<launcher>\d+)(?:-n(?P<ns>\d+))?)?-slot\d+(?:\.json)?")


def pid_namespace() -> int | None:
    """This process's PID namespace (the inode of /proc/self/ns/pid); None where unknown."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def slot_prefix(run_id: str, pid: int, wid: int, launcher_pid: int | None, namespace: int | None = None) -> str:
    """The name every slot file of one worker starts with (SlotStore adds ``-slot<i>``)."""
    if not launcher_pid:
        return f"seamguard-{run_id}-{pid}-w{wid}"
    return f"seamguard-{run_id}-{pid}-w{wid}-l{launcher_pid}" + (f"-n{namespace}" if namespace else "")


def owners(name: str) -> tuple[int, int | None, int | None] | None:
    """(worker pid, launcher pid or None, PID namespace or None) of a slot file's name;
    None if it is not a slot."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    return (int(m["pid"]), int(m["launcher"]) if m["launcher"] else None,
            int(m["ns"]) if m["ns"] else None)


def stale(names: Iterable[str], alive: Callable[[int], bool], namespace: int | None = None) -> list[str]:
    """The slot files (and their manifests) no process will adopt or delete: the worker
    is gone and so is its launcher (when the name records it), judged only for slots of
    ``namespace`` (the caller's PID namespace) or of none recorded."""
    out = []
    for name in names:
        who = owners(name)
        if who is None:
            continue
        worker, launcher, ns = who
        if ns is not None and ns != namespace:
            continue   # another PID namespace's pids: cannot be judged from here
        if not alive(worker) and (launcher is None or not alive(launcher)):
            out.append(name)
    return out


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (another user's counts: it may own the slot)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(directory: Path = SHM, alive: Callable[[int], bool] = pid_alive) -> tuple[int, int]:
    """Delete the stale slot files in ``directory``; returns (files, bytes) removed."""
    try:
        names = [p.name for p in directory.iterdir() if p.name.startswith("seamguard-")]
    except OSError:
        return 0, 0
    files = nbytes = 0
    for name in stale(names, alive, pid_namespace()):
        path = directory / name
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError:
            continue   # another launcher swept it first
        files, nbytes = files + 1, nbytes + size
    return files, nbytes
