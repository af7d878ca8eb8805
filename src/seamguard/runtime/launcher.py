"""`seamguard launch`: starts the workers and spares of one node and supervises them.

Speaks torchrun's environment contract (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) so scripts and schedulers (Slurm, Kubernetes) see what they
expect, plus SEAMGUARD_* variables for the runtime. Node 0 runs the Coordinator and, unless
the job-wide store is etcd (``--store etcd://…``, runtime/store.py), hosts the TCPStore,
listening on 127.0.0.1 for a one-node job and on ``--master-addr`` (or ``--store-bind``)
otherwise, never on every interface; it creates the job's hint key and takes only hint
files signed with it (seamguard/hintauth.py).
With etcd or several nodes the membership is aggregated per node: workers beat to a
TCPStore their own launcher hosts on 127.0.0.1, and the launcher sends one record for
the node every node beat (over its link, docs/runtime.md "Many nodes"), and mirrors
each new generation into its node's store the moment it is announced. Every
node's launcher reports its children's exits to the store the moment
`waitpid` sees them (this is how a killed rank is detected in milliseconds), carries out
kill requests for its own children, and turns hint files into store keys. Every node's
launcher but the coordinator's holds a TCP link to the coordinator's (runtime/nodelink.py):
when a node's processes die, its kernel closes the link and the coordinator judges the
node lost at once instead of after its record's timeout. With several nodes on etcd the
coordinator is elected (runtime/election.py): node 0's launcher holds the key first, and
when its lease expires another launcher takes the coordinator over (`_Loop._take_over`,
Coordinator.take_over) without restarting a rank. At start a launcher removes the
snapshot slots that killed launchers left in /dev/shm (runtime/shm.py).

This module is the launch itself: opening the store and keys, the pass loop and when each
part runs. The parts are their own modules: the worker processes (runtime/supervise.py),
the node beat (runtime/nodebeat.py), hint files to store keys (runtime/hintbridge.py).
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from seamguard.ports import free_port
from seamguard import hintauth
from seamguard.runtime import keys, shm
from seamguard.runtime import store as jobstore
from seamguard.runtime.coordinator import Coordinator
from seamguard.runtime.election import Deposed, Election
from seamguard.runtime.eventlog import EventLog, set_title
from seamguard.runtime.hintbridge import PLACEMENT_FILE, hint_files, publish_placement
from seamguard.runtime.linkwire import link_key
from seamguard.runtime.metrics import MetricsServer, render
from seamguard.runtime.nodebeat import COORDINATOR_LOST, NODE_BEAT_READS, NodeBeat
from seamguard.runtime.nodelink import LinkServer
from seamguard.runtime.settings import LaunchSettings, RuntimeSettings
from seamguard.runtime.supervise import (
    POLL_S,
    Child,
    drain,
    exiting_code,
    idle,
    remove_shared_memory,
    spawn_spare,
    start_worker,
    worker_env,
)
from seamguard.runtime.zygote import ForkServer

# the names this module had before its parts moved out (tests, benchmarks, the CLI use them)
_hint_files, _NodeBeat = hint_files, NodeBeat
__all__ = ["COORDINATOR_LOST", "NODE_BEAT_READS", "PLACEMENT_FILE", "POLL_S", "STEADY_PASS_S", "Child",
           "LaunchFailed", "exiting_code", "launch"]

# While the job runs and no worker of this node exited, the coordinator's pass and the
# kill-request checks run every STEADY_PASS_S, not every POLL_S: at 200 passes a second
# the launcher used as much CPU as a training rank (FSDP2 --quick job, docs/benchmarks.md).
# In between the launcher sleeps on the zygote's socket, so an exit still triggers a pass
# at once; hang detection is 1 s.
STEADY_PASS_S = 0.1


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
    except jobstore.LOST as exc:
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
    if keys.peek(store, keys.JOB_DONE) is not None:
        raise LaunchFailed(f"the job-wide store already holds a finished run {s.run_id!r}: "
                           "give every job its own --run-id (e.g. the scheduler's job id)", 2)
    election = _election(s, store)
    if s.node_rank == 0 and election is not None and not election.campaign():
        raise LaunchFailed(f"another launcher already coordinates run {s.run_id!r} (its key {keys.COORDINATOR} is "
                           "held in etcd): give every job its own --run-id", 2)
    node = NodeBeat(store, s, links_key, elected=election is not None) if s.aggregate else None
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
    children = [Child(wid, start_worker(s, server, worker_env(s, port, wid, local, node.address if node else "")))
                for local, wid in ((i, s.node_rank * per_node + i) for i in range(per_node))]
    coord, links = (_coordinator(s, job, election.fenced(store) if election else store, log, hint_key, links_key,
                                 publish_link_key, (s.store_host, s.master_addr), node)
                    if s.node_rank == 0 else (None, None))
    loop = _Loop(s, store, port, server, node, coord, links, children, log, election=election)
    code = 1
    try:
        code = loop.run()
        drain(loop.children, timeout_s=30.0, log=log)
        if node is not None:
            node.link.close(orderly=True)   # this node's part ended as planned: no loss
        if loop.links is not None:
            _await_nodes(loop.links, timeout_s=35.0)
        if loop.coord is not None:
            log({"event": "summary", "outcome": "job done" if code == 0 else "JOB FAILED",
                 "wall_s": round(time.monotonic() - t0, 3), "recoveries": loop.coord.recoveries,
                 "lost": len(loop.coord.lost)})
    finally:
        loop.close()
        if election is not None:
            election.resign()
        events.close()
    return code


def _election(s: LaunchSettings, store) -> Election | None:
    """With several nodes on an etcd store: this launcher's part in electing the coordinator
    (runtime/election.py; its lease is ``coordinator_timeout_s``, at least etcd's 2 s).
    With the TCPStore on node 0 the store dies with node 0: nobody could take over."""
    if s.nnodes < 2 or s.store_url.kind != "etcd":
        return None
    return Election(store, s.node_rank, lease_s=max(2, math.ceil(s.coordinator_timeout_s)))


def _coordinator(s: LaunchSettings, job: RuntimeSettings, store, log, hint_key: bytes, links_key: bytes | None,
                 publish_link_key: bool, hosts: tuple[str, str], node: NodeBeat | None
                 ) -> tuple[Coordinator, LinkServer | None]:
    """The coordinator (node 0's, or the launcher's that took over) and, with several nodes,
    the server of the other node launchers' links (runtime/nodelink.py), bound to
    ``hosts[0]``, its address (``hosts[1]``) and key published in the store. This node's own
    record reaches the coordinator in process (``node.own_record``), not through the store."""
    per_node = s.nproc + s.spares
    trainers = [n * per_node + i for n in range(s.nnodes) for i in range(s.nproc)]
    spares = [n * per_node + s.nproc + i for n in range(s.nnodes) for i in range(s.spares)]
    coord = Coordinator(store, s, trainers, spares, job.checkpoint_dir, job.recovery_timeout_s,
                        log, hint_key=hint_key)
    own = (lambda: {node.node: node.own_record} if node.own_record else {}) if node is not None else dict
    coord.link_records = own
    links = None
    if s.nnodes > 1:
        links = LinkServer(s.run_id, links_key, hosts[0], nodes=s.nnodes, on_refused=lambda exc: log(
            {"event": "link_refused", "reason": exc.reason, "detail": str(exc)[:200]}))
        coord.link_records = lambda: {**links.records, **own()}
        if publish_link_key:   # before the address: a node that sees the address sees the key
            store.set(keys.LINK_KEY, links_key.hex())
        store.set(keys.LINK, links.address(hosts[1]))
    return coord, links


def _taken_over_hint_key(s: LaunchSettings) -> bytes:
    """The hint key for a launcher that takes the coordinator over: the job's key file where
    this node can read it (--hint-key-file, or <hint-dir>/.hint-key on shared storage),
    else a fresh one (hints signed with node 0's key are then refused: docs/runtime.md)."""
    if s.hint_dir is not None or s.hint_key_file is not None:
        path = hintauth.key_file_for(s.hint_dir, s.hint_key_file)
        if path.exists():
            return hintauth.read_key(path, private=True)
    return _hint_key(s)


@dataclass
class _Loop:
    """The launcher's passes over its node: children's exits reported (and replaced), kill
    requests carried out, the node beat, node 0's hint files and coordinator pass, until
    the job's end; `run` returns the exit code."""
    s: LaunchSettings
    store: object
    port: int
    server: ForkServer | None
    node: NodeBeat | None
    coord: Coordinator | None
    links: LinkServer | None
    children: list[Child]
    log: Callable[[dict], None]
    respawned: int = 0
    placement: str = ""
    placement_t: float = 0.0
    ended_s: float | None = None  # when this (non-coordinator) node's last worker ended
    pass_s: float = 0.0   # when the coordinator's pass and kill checks last ran
    new_keys: keys.NewKeys = field(default_factory=lambda: keys.NewKeys(full_every_s=0.5))
    exporter: MetricsServer | None = None
    election: Election | None = None

    def __post_init__(self) -> None:
        if self.coord is not None and self.s.metrics_port is not None:
            self.exporter = MetricsServer(self.s.metrics_port)

    def run(self) -> int | None:
        s = self.s
        while True:
            coord, links = self.coord, self.links   # a launcher that takes over gets both
            if self.exporter is not None:
                self.exporter.publish(lambda: render(coord.view(s.run_id)))
            now_s = time.monotonic()
            ended = {c.wid: c.ended() for c in self.children if not c.reported}
            exited = any(code is not None for code in ended.values())
            closed = tuple(links.poll()) if links is not None else ()
            due = exited or bool(closed) or coord is None or coord.phase != "running" \
                or now_s - self.pass_s >= STEADY_PASS_S
            self.pass_s = now_s if due else self.pass_s
            # kill requests are keys that appear: looked for only when the key count moved
            kills_due = due and self.node is None and self.new_keys.appeared(self.store, now_s)
            self._report(ended, kills_due)
            code = self._coordinate(exited, closed, due) if coord is not None else self._follow()
            if code is not None:
                return code
            if all(c.reported for c in self.children) and coord is None:
                # its workers can end before the job's end reaches this node: wait for it, bounded
                self.ended_s = self.ended_s if self.ended_s is not None else time.monotonic()
                if time.monotonic() - self.ended_s > s.coordinator_timeout_s:
                    # its own workers' codes do not say how the job ended: never report success
                    self.log({"event": "job_outcome_unknown", "waited_s": s.coordinator_timeout_s})
                    return 1
            idle(self.server, self.children, _wait_s(coord, self.node, self.pass_s, time.monotonic()),
                 (links,) if links is not None else ())

    def _report(self, ended: dict[int, int | None], kills_due: bool) -> None:
        """Write each child's exit code to the store as it ends, start a replacement spare
        for one that failed (bounded by max_recoveries), carry out kill requests."""
        s, store = self.s, self.store
        for c in list(self.children):
            code = None if c.reported else ended.get(c.wid)
            if code is not None:
                c.reported = True
                store.set(keys.exit_code(c.wid), str(code))
                if code != 0 and s.replenish_spares and \
                        not store.check([keys.JOB_DONE]) and self.respawned < s.max_recoveries:
                    self.respawned += 1
                    self.children.append(spawn_spare(s, self.server, store, self.port, s.nproc + s.spares,
                                                     self.node.address if self.node else ""))
            if kills_due and not c.reported and store.check([keys.kill_request(c.wid)]):
                c.proc.send_signal(signal.SIGKILL)

    def _coordinate(self, exited: bool, closed: tuple, due: bool) -> int | None:
        """The coordinator's node: the node beat, hint files, the placement file, the
        coordinator's pass while its term lets it act (an elected one); the exit code once
        the job is done or failed, or 1 once another launcher coordinates."""
        s, coord, election = self.s, self.coord, self.election
        if self.node is not None:  # kill requests and the job's end come with the node beat
            self.node.maybe_beat(self.children)
        if election is not None and not election.may_act():
            # renewals late (this launcher starved, etcd slow): act again once one gets through;
            # the lease gone: another launcher may coordinate already
            return None if election.term().token else self._abandon("its lease expired")
        hint_files(self.store, s.hint_dir, coord.hints, self.log)
        if s.hint_dir is not None and time.monotonic() - self.placement_t > 0.5:
            self.placement = publish_placement(s.hint_dir, coord.view(s.run_id), self.placement)
            self.placement_t = time.monotonic()
        try:
            phase = coord.tick(exited, closed) if due else coord.phase
        except Deposed as exc:
            return self._abandon(str(exc))
        return None if phase not in ("done", "failed") else 0 if phase == "done" else 1

    def _abandon(self, why: str) -> int:
        """This launcher coordinated and no longer may: it ends its node's part (exit 1, its
        workers killed) and the coordinator that took over judges the node lost."""
        self.log({"event": "coordinator_deposed", "reason": why[:300]})
        self._kill_children()
        return 1

    def _kill_children(self) -> None:
        for c in self.children:
            if c.proc.poll() is None:
                c.proc.kill()

    def _take_over(self) -> int | None:
        """The coordinator's key expired (its launcher's node lost): campaign, and if this
        launcher wins, coordinate from the job's state in the store (Coordinator.take_over):
        its own link server, its address published (keys.LINK), the other nodes relink to
        it. Losing the campaign: another launcher won and this one follows it."""
        s, node = self.s, self.node
        dead = node.coordinator_node
        if not self.election.campaign():
            return None
        raw = keys.peek(self.store, keys.node_beats(dead))
        dead_workers = {int(w) for w in json.loads(raw)["beats"]} if raw else set()
        host = os.environ.get("SEAMGUARD_ADVERTISE_HOST", "127.0.0.1")   # as the workers' own address
        node.coordinate()
        self.coord, self.links = _coordinator(s, RuntimeSettings.from_env(s.env), self.election.fenced(self.store),
                                              self.log, _taken_over_hint_key(s), node.link.key, False,
                                              (host, host), node)
        if s.metrics_port is not None:
            self.exporter = MetricsServer(s.metrics_port)
        phase = self.coord.take_over(dead, dead_workers, grace_s=s.coordinator_timeout_s)
        return 1 if phase == "failed" else None

    def _follow(self) -> int | None:
        """The other nodes: the job's end as node 0's coordinator sets it (with the node
        beat, or read from the store), or COORDINATOR_LOST; its exit code once known."""
        if self.node is not None:
            job_done = self.node.maybe_beat(self.children)
        else:
            job_done = self.store.get(keys.JOB_DONE) if self.store.check([keys.JOB_DONE]) else None
        if job_done == COORDINATOR_LOST and self.election is not None and self.node.coordinator_node is not None:
            return self._take_over()   # the store is etcd: a node's launcher takes the coordinator's place
        if job_done == COORDINATOR_LOST:
            self.log({"event": "coordinator_lost", "silent_s": self.s.coordinator_timeout_s})
            self._kill_children()  # nobody will ever assign them a rank again
            return 1
        if job_done is not None:
            return 0 if job_done == b"ok" else 1
        return None

    def close(self) -> None:
        """On any exit: the exporter and links closed, every child still running killed, the
        /dev/shm slots crashed children left removed, the zygote stopped."""
        if self.exporter is not None:
            self.exporter.close()
        if self.links is not None:
            self.links.close()
        if self.node is not None:
            self.node.link.close(orderly=False)
        self._kill_children()
        remove_shared_memory(self.s.run_id, self.children)
        if self.server is not None:
            self.server.close()


def _wait_s(coord: Coordinator | None, node: NodeBeat | None, pass_s: float, now_s: float) -> float:
    """How long the launcher may sleep before its next pass: until the coordinator's next
    steady pass while the job runs (node 0), or the next node beat (the other nodes: they
    have nothing else to do on a clock, so a pass in between only cost CPU); POLL_S during
    start-up and recoveries. A child's exit wakes it earlier (`supervise.idle`)."""
    if coord is not None:
        steady = coord.phase == "running"
        return max(POLL_S, STEADY_PASS_S - (now_s - pass_s)) if steady else POLL_S
    if node is not None:
        return max(POLL_S, node.next_s - now_s)
    return POLL_S


def _await_nodes(links, timeout_s: float) -> None:
    """Node 0 keeps the job's store up until every other node's launcher has read the job's
    end (it says bye once it has drained) or closed its link, bounded: with the job-wide
    TCPStore on node 0, leaving at once broke the pipe of a node that had not read it yet."""
    deadline = time.monotonic() + timeout_s
    while links.open_links() and time.monotonic() < deadline:
        select.select([links], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
        links.poll()
