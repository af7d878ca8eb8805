"""`seamguard launch`: starts the workers and spares of one node and supervises them.

Speaks torchrun's environment contract (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) so scripts and schedulers (Slurm, Kubernetes) see what they
expect, plus SEAMGUARD_* variables for the runtime. Node 0 runs the Coordinator and, unless
the job-wide store is etcd (``--store etcd://…``, runtime/store.py), hosts the TCPStore,
listening on 127.0.0.1 for a one-node job and on ``--master-addr`` (or ``--store-bind``)
otherwise, never on every interface; it creates the job's hint key and takes only hint
files signed with it (seamguard/hintauth.py).
With etcd or several nodes the membership is aggregated per node: workers beat to a
TCPStore their own launcher hosts on 127.0.0.1, and the launcher writes one record for
the node to the job-wide store every node beat (docs/runtime.md, "Many nodes"), and mirrors
each new generation into its node's store the moment it is announced. Every
node's launcher reports its children's exits to the store the moment
`waitpid` sees them (this is how a killed rank is detected in milliseconds), carries out
kill requests for its own children, and turns hint files into store keys. Every node's
launcher but node 0's holds a TCP link to node 0's (runtime/nodelink.py): when a node's
processes die, its kernel closes the link and the coordinator judges the node lost at
once instead of after its record's timeout. At start a launcher removes the snapshot
slots that killed launchers left in /dev/shm (runtime/shm.py).
"""

from __future__ import annotations

import datetime
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from seamguard.ports import free_port
from seamguard import hintauth, hintfiles
from seamguard.runtime import keys, shm
from seamguard.runtime import store as jobstore
from seamguard.runtime.coordinator import Coordinator
from seamguard.runtime.eventlog import (
    EVENTS_FILE_ENV,
    LOG_FORMAT_ENV,
    EventLog,
    set_title,
)
from seamguard.runtime.liveness import link_key
from seamguard.runtime.metrics import MetricsServer, render
from seamguard.runtime.nodelink import LinkClient, LinkServer
from seamguard.runtime.settings import LaunchSettings, RuntimeSettings
from seamguard.runtime.zygote import ForkedProcess, ForkServer

POLL_S = 0.005
# While the job runs and no worker of this node exited, the coordinator's pass and the
# kill-request checks run every STEADY_PASS_S, not every POLL_S: at 200 passes a second
# the launcher used as much CPU as a training rank (FSDP2 --quick job, docs/benchmarks.md).
# In between the launcher sleeps on the zygote's socket, so an exit still triggers a pass
# at once; hang detection is 1 s.
STEADY_PASS_S = 0.1
COORDINATOR_LOST = b"coordinator lost"


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


def _start(s: LaunchSettings, server: ForkServer | None, env: dict[str, str]
           ) -> subprocess.Popen | ForkedProcess:
    """A worker process: forked from the node's zygote when there is one (a .py script),
    else a fresh interpreter."""
    if server is not None:
        return server.spawn(list(s.script), env, timeout_s=s.startup_timeout_s)
    return subprocess.Popen(_command(s.script), env=env)


def _worker_env(s: LaunchSettings, port: int, wid: int, local: int,
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


# hint files with a value (hintfiles.VALUE_ERRORS checks the text): file name -> (value key,
# counter key); the value is published as written (stripped unless it is a multi-line avoid_rails list)
_VALUED_HINTS = {
    hintfiles.CHECKPOINT_INTERVAL: (keys.HINT_INTERVAL_S, keys.HINT_INTERVAL_N),
    hintfiles.CHECKPOINT_DIR: (keys.HINT_TARGET, keys.HINT_TARGET_N),
    hintfiles.AVOID_RAILS: (keys.HINT_AVOID_RAILS, keys.HINT_AVOID_RAILS_N),
    hintfiles.DEGRADED: (keys.HINT_DEGRADED, keys.HINT_DEGRADED_N),
}


def _hint_files(store, hint_dir: Path | None, gate: hintauth.HintGate, log=None) -> None:
    """checkpoint_now -> bump the checkpoint hint; evacuate_rank_<r> -> evacuate hint;
    checkpoint_interval_s (seconds, or "default") -> persist at that interval;
    checkpoint_dir (a directory, or "default") -> persist there;
    avoid_rails (rails to stay off, one "<rail> [severity]" a line, or "default") and
    degraded ("on" or "off") -> step modes (runtime/stepmodes.py);
    rollback -> back to the newest persisted step; rollback_to_step_<s> -> back to s.
    Every file must be signed with the job's key (runtime/hintauth.py): one that is not, is
    forged, replayed or stale is refused (logged as ``hint_refused``) and removed. What is
    taken goes on to the store signed again, where the coordinator verifies it."""
    if hint_dir is None:
        return
    evacuate: list[str] = []
    for name, text in hintfiles.take_files(hint_dir, gate.admit, lambda n, exc: _refused(log, "file", n, exc)):
        p = hint_dir / name
        if p.name == hintfiles.CHECKPOINT_NOW:
            hintauth.send(store, keys.HINT_CHECKPOINT_REQ, "now", gate.key, keys.HINT_CHECKPOINT)
        elif p.name.startswith(hintfiles.EVACUATE_PREFIX):
            evacuate.append(p.name.rsplit("_", 1)[1])
        elif p.name in _VALUED_HINTS:
            value_key, counter_key = _VALUED_HINTS[p.name]
            why = hintfiles.VALUE_ERRORS[p.name](text)
            if why is not None:
                print(f"seamguard launcher: ignoring hint file {p}: {why}", file=sys.stderr)
            else:
                hintauth.send(store, value_key, text if p.name == hintfiles.AVOID_RAILS else text.strip(), gate.key,
                              counter_key)
        else:
            to = p.name.rsplit("_", 1)[1] if p.name != hintfiles.ROLLBACK else "-1"
            if not to.lstrip("-").isdigit():
                print(f"seamguard launcher: ignoring hint file {p}: bad step {to!r}", file=sys.stderr)
            else:
                hintauth.send(store, keys.HINT_ROLLBACK_TO, to, gate.key, keys.HINT_ROLLBACK_N)
    if evacuate:
        _send_evacuations(store, gate.key, evacuate)


def _send_evacuations(store, key: bytes, ranks: list[str]) -> None:
    """Add ranks to the evacuate hint, keeping those of a genuine one not read yet."""
    cur = keys.peek(store, keys.HINT_EVACUATE) or b""
    try:
        pending = hintauth.unseal(key, keys.HINT_EVACUATE, cur.decode())[1] if cur else ""
    except (hintauth.HintRefused, UnicodeDecodeError):
        pending = ""   # not the job's: the coordinator refuses and logs it if it is still there
    hintauth.send(store, keys.HINT_EVACUATE, ",".join(filter(None, [pending, *ranks])), key)


def _refused(log, channel: str, name: str, exc: Exception) -> None:
    """One line (an event) per refused hint."""
    event = {"event": "hint_refused", "channel": channel, "hint": name,
             "reason": getattr(exc, "reason", "unsigned"), "detail": str(exc)[:200]}
    if log is not None:
        log(event)
    else:
        print(f"seamguard launcher: refused hint {name}: {event['detail']}", file=sys.stderr)


PLACEMENT_FILE = hintfiles.PLACEMENT_FILE


def _publish_placement(hint_dir: Path | None, view, last: str) -> str:
    """Write which node each rank runs on (by the name the topology uses) into the hint
    directory when it changes, so a controller draining a node knows which ranks to
    evacuate first. Returns what is written now."""
    if hint_dir is None or not view.ranks:
        return last
    text = hintfiles.placement_text(view.job, view.generation, {r.rank: r.host for r in view.ranks})
    if text != last and hint_dir.is_dir():
        tmp = hint_dir / f"{PLACEMENT_FILE}.tmp"
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, hint_dir / PLACEMENT_FILE)
        except OSError as exc:
            print(f"seamguard launcher: cannot write {hint_dir / PLACEMENT_FILE}: {exc.strerror}", file=sys.stderr)
            return last
        return text
    return last


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _open_store(s: LaunchSettings, master: bool) -> tuple:
    """The job-wide store and the port workers reach it on. Node 0 of a TCPStore job
    listens on ``s.store_host`` only (loopback for one node), never on every interface.
    ValueError: one line naming what could not be reached or bound, and which option."""
    url = s.store_url
    if url.kind == "tcp" and master:
        try:
            sock = jobstore.listen_socket(s.store_host, s.master_port)
        except OSError as exc:
            raise ValueError(f"cannot listen on {s.store_host}:{s.master_port} for the job's store "
                             f"(--store-bind / --master-addr / --master-port): {exc.strerror or exc}") from None
        port = sock.getsockname()[1]
        return jobstore.connect(url, s.store_host, port, s.startup_timeout_s, is_master=True,
                                listen_fd=sock.detach()), port
    port = s.master_port or free_port()
    try:
        store = jobstore.connect(url, s.master_addr, port, s.startup_timeout_s, is_master=False)
        keys.peek(store, keys.JOB_DONE)   # etcd answers lazily: ask it once now
    except (jobstore.StoreError, RuntimeError, OSError) as exc:
        where = (f"etcd at {','.join(f'{h}:{p}' for h, p in url.endpoints)} (--store)" if url.kind == "etcd"
                 else f"node 0's store at {s.master_addr}:{port} (--master-addr/--master-port)")
        raise ValueError(f"cannot reach {where}: {_one_line(exc)}") from None
    return store, port


def _hint_key(s: LaunchSettings) -> bytes:
    """The job's hint key: an operator's existing --hint-key-file, else a fresh random key
    written 0600 to --hint-key-file or <hint-dir>/.hint-key (else held in memory only)."""
    return hintauth.job_key(s.hint_dir, s.hint_key_file)


class LaunchFailed(Exception):
    """What ended a launch, in one line, and the exit status it ends with: the CLI reports
    it in the shell's one error style (seamguard/clikit.py)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def launch(s: LaunchSettings) -> int:
    """Run one node of a job to completion; returns the exit code for the CLI. What stops
    it before it starts (a store it cannot reach or bind, a bad key file: exit 2) and a
    store lost while it runs (exit 1, its workers stopped first) raise LaunchFailed, one
    line, not a traceback."""
    master = s.node_rank == 0
    try:
        store, port = _open_store(s, master)
        links_key, publish = _link_key(s, master)
        key = _hint_key(s) if master else b""
    except ValueError as exc:
        raise LaunchFailed(str(exc), 2) from None
    try:
        return _run(s, store, port, key, links_key or (link_key(key) if master else None), publish)
    except jobstore.StoreError as exc:
        raise LaunchFailed(f"run {s.run_id!r} lost the job-wide store ({_one_line(exc)}); its workers were "
                           "stopped, its persisted checkpoints are kept: restart it to resume from them", 1) from None


def _link_key(s: LaunchSettings, master: bool) -> tuple[bytes | None, bool]:
    """The key that signs the node launchers' links (liveness.link_key of the job's key) as
    far as this node knows it before the job starts, and whether node 0 must publish it in
    the store (keys.LINK_KEY). With an operator's --hint-key-file that exists on this node:
    derived from it, published nowhere. Otherwise node 0 derives it from the fresh key it
    creates (None here) and publishes it; the other nodes read it from the store (None)."""
    given = s.hint_key_file is not None and Path(s.hint_key_file).exists()
    if given:
        return link_key(hintauth.read_key(Path(s.hint_key_file), private=True)), False
    return None, master


def _run(s: LaunchSettings, store, port: int, hint_key: bytes, links_key: bytes | None = None,
         publish_link_key: bool = False) -> int:
    master = s.node_rank == 0
    if keys.peek(store, keys.JOB_DONE) is not None:
        raise LaunchFailed(f"the job-wide store already holds a finished run {s.run_id!r}: "
                           "give every job its own --run-id (e.g. the scheduler's job id)", 2)
    node = _NodeBeat(store, s, links_key) if s.aggregate else None
    if node is not None:
        node.follow_generations(lambda: jobstore.connect(s.store_url, s.master_addr, port, s.startup_timeout_s))
    events = EventLog(s.log_format, s.events_file)
    who = f"node {s.node_rank}/{s.nnodes}" if s.nnodes > 1 else "launcher"
    set_title(f"seamguard launch: {who} run {s.run_id}")
    t0 = time.monotonic()

    def log(event: dict) -> None:
        events.emit(event, who)

    def _terminate(signum, frame) -> None:  # SIGTERM (scheduler, kill): clean up as on any exit
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    swept, swept_bytes = shm.sweep()   # slots of launchers killed before they could clean up
    if swept:
        log({"event": "stale_slots_removed", "files": swept, "mib": round(swept_bytes / 2**20, 1)})
    per_node = s.nproc + s.spares
    job = RuntimeSettings.from_env(s.env)
    server = ForkServer(s.preload) if s.fork_server and s.script[0].endswith(".py") else None
    children = []
    for local in range(per_node):
        wid = s.node_rank * per_node + local
        children.append(Child(wid, _start(s, server, _worker_env(s, port, wid, local, node.address if node else ""))))
    coord = None
    links = None   # node 0 of several: the other node launchers' links (runtime/nodelink.py)
    if master:
        trainers = [n * per_node + i for n in range(s.nnodes) for i in range(s.nproc)]
        spares = [n * per_node + s.nproc + i for n in range(s.nnodes) for i in range(s.spares)]
        coord = Coordinator(store, s, trainers, spares, job.checkpoint_dir, job.recovery_timeout_s,
                            log, hint_key=hint_key)
        if s.nnodes > 1:
            links = LinkServer(s.run_id, links_key, s.store_host, nodes=s.nnodes, on_refused=lambda exc: log(
                {"event": "link_refused", "reason": exc.reason, "detail": str(exc)[:200]}))
            coord.link_records = lambda: links.records
            if publish_link_key:   # before the address: a node that sees the address sees the key
                store.set(keys.LINK_KEY, links_key.hex())
            store.set(keys.LINK, links.address(s.master_addr))
    code = 1
    respawned = 0
    placement, placement_t = "", 0.0
    ended_s: float | None = None  # when this (non-coordinator) node's last worker ended
    pass_s = 0.0   # when the coordinator's pass and kill checks last ran
    new_keys = keys.NewKeys(full_every_s=0.5)
    exporter = MetricsServer(s.metrics_port) if master and s.metrics_port is not None else None
    try:
        while True:
            if exporter is not None:
                exporter.publish(lambda: render(coord.view(s.run_id)))
            now_s = time.monotonic()
            ended = {c.wid: c.ended() for c in children if not c.reported}
            exited = any(code is not None for code in ended.values())
            closed = tuple(links.poll()) if links is not None else ()
            due = exited or bool(closed) or coord is None or coord.phase != "running" \
                or now_s - pass_s >= STEADY_PASS_S
            pass_s = now_s if due else pass_s
            # kill requests are keys that appear: looked for only when the key count moved
            kills_due = due and node is None and new_keys.appeared(store, now_s)
            for c in list(children):
                code = None if c.reported else ended.get(c.wid)
                if code is not None:
                    c.reported = True
                    store.set(keys.exit_code(c.wid), str(code))
                    if code != 0 and s.replenish_spares and \
                            not store.check([keys.JOB_DONE]) and respawned < s.max_recoveries:
                        respawned += 1
                        children.append(_spawn_spare(s, server, store, port, per_node,
                                                     node.address if node else ""))
                if kills_due and not c.reported and store.check([keys.kill_request(c.wid)]):
                    c.proc.send_signal(signal.SIGKILL)
            job_done = None
            if node is not None:  # kill requests and the job's end come with the node beat
                job_done = node.maybe_beat(children)
            elif not master and store.check([keys.JOB_DONE]):
                job_done = store.get(keys.JOB_DONE)
            if master:
                _hint_files(store, s.hint_dir, coord.hints, log)
                if s.hint_dir is not None and time.monotonic() - placement_t > 0.5:
                    placement, placement_t = _publish_placement(s.hint_dir, coord.view(s.run_id), placement), \
                        time.monotonic()
                phase = coord.tick(exited, closed) if due else coord.phase
                if phase in ("done", "failed"):
                    code = 0 if phase == "done" else 1
                    break
            elif job_done == COORDINATOR_LOST:
                log({"event": "coordinator_lost", "silent_s": s.coordinator_timeout_s})
                for c in children:  # nobody will ever assign them a rank again
                    if c.proc.poll() is None:
                        c.proc.kill()
                code = 1
                break
            elif job_done is not None:
                code = 0 if job_done == b"ok" else 1
                break
            if all(c.reported for c in children) and not master:
                # its workers can end before the job's end reaches this node: wait for it, bounded
                ended_s = ended_s if ended_s is not None else time.monotonic()
                if time.monotonic() - ended_s > s.coordinator_timeout_s:
                    break
            _idle(server, children, _wait_s(coord, node, pass_s, time.monotonic()),
                  (links,) if links is not None else ())
        _drain(children, timeout_s=30.0, log=log)
        if node is not None:
            node.link.close(orderly=True)   # this node's part ended as planned: no loss
        if links is not None:
            _await_nodes(links, timeout_s=35.0)
        if coord is not None:
            log({"event": "summary", "outcome": "job done" if code == 0 else "JOB FAILED",
                 "wall_s": round(time.monotonic() - t0, 3), "recoveries": coord.recoveries,
                 "lost": len(coord.lost)})
    finally:
        if exporter is not None:
            exporter.close()
        if links is not None:
            links.close()
        if node is not None:
            node.link.close(orderly=False)
        for c in children:
            if c.proc.poll() is None:
                c.proc.kill()
        _remove_shared_memory(s.run_id, children)
        if server is not None:
            server.close()
        events.close()
    return code


def _wait_s(coord: Coordinator | None, node: _NodeBeat | None, pass_s: float, now_s: float) -> float:
    """How long the launcher may sleep before its next pass: until the coordinator's next
    steady pass while the job runs (node 0), or the next node beat (the other nodes: they
    have nothing else to do on a clock, so a pass in between only cost CPU); POLL_S during
    start-up and recoveries. A child's exit wakes it earlier (`_idle`)."""
    if coord is not None:
        steady = coord.phase == "running"
        return max(POLL_S, STEADY_PASS_S - (now_s - pass_s)) if steady else POLL_S
    if node is not None:
        return max(POLL_S, node.next_s - now_s)
    return POLL_S


def _idle(server: ForkServer | None, children: list[Child], wait_s: float, links=()) -> None:
    """Wait ``wait_s`` between passes, waking at once when a child forked by the zygote
    exits (the zygote reports it on its socket) or a node launcher's link has something to
    read (``links``: the link server, a waitable); a child started otherwise is polled."""
    if server is not None and all(isinstance(c.proc, ForkedProcess) for c in children):
        server.idle(wait_s, links)
    elif links:
        select.select(list(links), [], [], POLL_S)
    else:
        time.sleep(POLL_S)


def _remove_shared_memory(run_id: str, children: list[Child]) -> None:
    """Snapshot slots a crashed worker left in /dev/shm and nobody adopted (a clean exit
    removes its own)."""
    for c in children:
        prefix = shm.slot_prefix(run_id, c.proc.pid, c.wid, os.getpid(), shm.pid_namespace())
        for f in shm.SHM.glob(f"{prefix}-slot*"):
            f.unlink(missing_ok=True)


def _spawn_spare(s: LaunchSettings, server: ForkServer | None, store, port: int,
                 per_node: int, node_store: str) -> Child:
    """Start a fresh hot spare in place of a lost process (new worker id)."""
    wid = s.nnodes * per_node + store.add(keys.NEXT_WID, 1) - 1
    env = _worker_env(s, port, wid, s.nproc, node_store)  # a local slot past the trainers: a spare
    child = Child(wid, _start(s, server, env))
    store.set(keys.joined(store.add(keys.JOINED_COUNT, 1)), str(wid))
    return child


NODE_BEAT_READS = (keys.GENERATION, keys.CONTROL_N, keys.JOB_DONE)
"""The job's keys every node beat reads (with the node's kill keys and node 0's record's
revision; and the coordinator's link address until the node's link is up)."""


class _NodeBeat:
    """Per-node aggregation: this node's workers beat into a TCPStore on 127.0.0.1 that the
    launcher hosts; every ``node_beat_s`` the launcher writes their latest beats to the
    job-wide store as one record (keys.node_beats), mirrors the generation and the control
    counter (keys.CONTROL_N) back for the workers' heartbeat threads, and reads its
    children's kill requests and the job's end.
    On etcd the node beat is one request (a transaction: the record's put and the reads
    of the generation, the node's kill keys, the job's end and node 0's record, which
    tells the other nodes the coordinator is alive), whatever the node's rank count."""

    def __init__(self, job, s: LaunchSettings, links_key: bytes | None = None) -> None:
        self.job, self.node, self.every_s = job, s.node_rank, s.node_beat_s
        sock = jobstore.listen_socket("127.0.0.1", 0)   # this node's workers only: loopback
        self.local = dist.TCPStore("127.0.0.1", sock.getsockname()[1], None, True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=s.startup_timeout_s),
                                   master_listen_fd=sock.detach())
        self.address = f"127.0.0.1:{self.local.port}"
        self.counter = 0
        self.next_s = 0.0   # when the next node beat is due (monotonic)
        self._gen = self._control = -1   # mirrored into the node's store so far
        self._mirror_lock = threading.Lock()
        self._coordinator_timeout_s, self._startup_timeout_s = s.coordinator_timeout_s, s.startup_timeout_s
        self._coordinator: tuple[int | None, float] = (None, time.monotonic())
        self.link = LinkClient(s.run_id, s.node_rank, links_key)   # to the coordinator (node 0 has none)
        self._linking = s.node_rank > 0
        self._keyless_said = False

    def maybe_beat(self, children: list[Child]) -> bytes | None:
        """One node beat when due; returns the job's end (JOB_DONE's value) once set."""
        now = time.monotonic()
        if now < self.next_s:
            return None
        self.next_s = now + self.every_s
        self.counter += 1
        live = [c for c in children if not c.reported]
        beats = _local_beats(self.local, [c.wid for c in live])
        record = json.dumps({"n": self.counter, "beats": {w: json.loads(raw) for w, raw in beats.items()}})
        linking = self._linking and not self.link.connected
        singles = [*NODE_BEAT_READS, *([keys.LINK, keys.LINK_KEY] if linking else [])]
        linked = self.link.send(record.encode())   # over its link: the store is not written
        try:
            got, kills = self._exchange(None if linked else record, singles, live)
        except (RuntimeError, OSError):
            # the job's store cannot be reached (node 0 gone with its TCPStore, etcd down): as
            # if node 0's record stood still, so coordinator_timeout_s decides, not a traceback
            return None if self.node == 0 else self._coordinator_silent(self._coordinator[0], now)
        if linking:
            self._connect(got, now)
        self._mirror(got[keys.CONTROL_N], got[keys.GENERATION])
        for c in live:
            if str(c.wid) in kills:
                c.proc.send_signal(signal.SIGKILL)
        done = got[keys.JOB_DONE]
        return done if done is not None or self.node == 0 else self._coordinator_silent(got[keys.node_beats(0)], now)

    def _connect(self, got: dict, now: float) -> None:
        """Open the link once node 0 published its address and this node knows the key."""
        if self.link.key is None and got.get(keys.LINK_KEY):
            try:
                self.link.key = bytes.fromhex(got[keys.LINK_KEY].decode())
            except ValueError:
                pass
        if self.link.key is None and got.get(keys.LINK) and not self._keyless_said:
            self._keyless_said = True
            print(f"seamguard launcher: node {self.node} has no key for its link to the coordinator (node 0 took "
                  "an existing --hint-key-file: give this node the same file); its record goes to the store "
                  "and its loss is judged by the record's timeout", file=sys.stderr)
        self.link.ensure((got[keys.LINK] or b"").decode(), now)

    def _mirror(self, control: bytes | None, gen: bytes | None) -> None:
        """Copy the control counter, then the generation and the wake keys up to it, into
        the node's store, only ever forward (two threads read them at different times):
        a worker that sees the generation sees the counter too."""
        with self._mirror_lock:
            if control is not None and int(control) > self._control:
                self.local.set(keys.CONTROL_N, control)
                self._control = int(control)
            if gen is not None and int(gen) > self._gen:
                self.local.set(keys.GENERATION, gen)
                for g in range(self._gen + 1, int(gen) + 1):
                    self.local.set(keys.wake(g), "1")
                self._gen = int(gen)

    def follow_generations(self, connect) -> None:
        """Mirror each new generation the moment the coordinator announces it (a thread
        blocked on its wake key in the job's store, on a connection ``connect()`` makes),
        not a node beat later: a node's workers learn of a recovery as fast as with one
        store, and the node beat's period only bounds how stale a heartbeat record is."""
        threading.Thread(target=self._follow, args=(connect,), name="sg-node-generations", daemon=True).start()

    def _follow(self, connect) -> None:
        job = None
        while True:
            nxt = self._gen + 1
            try:
                job = job or connect()
                job.wait([keys.wake(nxt)], datetime.timedelta(seconds=keys.WAKE_WAIT_S))
                woke = job.get(keys.wake(nxt))
                control, gen = keys.read_existing(job, [keys.CONTROL_N, keys.GENERATION])
            except dist.DistStoreError:
                continue   # no new generation within keys.WAKE_WAIT_S
            except (RuntimeError, OSError, ValueError):
                job = None   # the job's store is unreachable: the node beat judges that
                time.sleep(self.every_s)
                continue
            if int(gen) < nxt:   # the wake key without a generation: the job's end
                self.local.set(keys.wake(nxt), woke)
                return
            self._mirror(control, gen)

    def _exchange(self, record: str | None, singles: list[str], live: list[Child]) -> tuple[dict, set[str]]:
        """Write this node's beat (None: it went over the link); read the job's keys and the
        kill requests for its workers."""
        if hasattr(self.job, "put_and_read"):  # etcd: the whole node beat is one transaction
            got, families = self.job.put_and_read(None if record is None else keys.node_beats(self.node), record or "",
                                                  singles, [keys.KILL_PREFIX], versions=(keys.node_beats(0),))
            return got, {k[len(keys.KILL_PREFIX):] for k in families[keys.KILL_PREFIX]}
        if record is not None:
            self.job.set(keys.node_beats(self.node), record)
        got = {k: keys.peek(self.job, k) for k in [*singles, keys.node_beats(0)]}
        return got, set(keys.read_family(self.job, keys.KILL_PREFIX, [str(c.wid) for c in live]))

    def _coordinator_silent(self, raw: bytes | None, now: float) -> bytes | None:
        """COORDINATOR_LOST once node 0's record (its launcher runs the coordinator) has
        stood still for coordinator_timeout_s: no one would plan a generation again."""
        counter = raw  # node 0's record (TCPStore) or its revision (etcd): any change is life
        if counter != self._coordinator[0]:
            self._coordinator = (counter, now)
        elif now - self._coordinator[1] > (self._coordinator_timeout_s if counter is not None
                                           else self._startup_timeout_s):  # node 0 may start late
            return COORDINATOR_LOST
        return None


def _local_beats(local, wids: list[int]) -> dict[str, bytes]:
    """The latest heartbeat of each worker of ``wids`` that has one, from the node's own
    TCPStore: once every one has beaten (the steady state), two requests (a check of all,
    a multi_get), not a check and a get per worker every node beat."""
    names = [keys.heartbeat(w) for w in wids]
    if names and local.check(names):
        return {str(w): raw for w, raw in zip(wids, local.multi_get(names))}
    return keys.read_family(local, f"{keys.ROOT}/hb/", [str(w) for w in wids])


def _await_nodes(links, timeout_s: float) -> None:
    """Node 0 keeps the job's store up until every other node's launcher has read the job's
    end (it says bye once it has drained) or closed its link, bounded: with the job-wide
    TCPStore on node 0, leaving at once broke the pipe of a node that had not read it yet."""
    deadline = time.monotonic() + timeout_s
    while links.open_links() and time.monotonic() < deadline:
        select.select([links], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
        links.poll()


def _drain(children: list[Child], timeout_s: float, log) -> None:
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
