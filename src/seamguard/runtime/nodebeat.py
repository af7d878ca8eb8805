"""One node's beat: its workers' heartbeats aggregated into one record for the coordinator.

With etcd or several nodes (docs/runtime.md, "Many nodes") a node's workers beat to a
TCPStore their own launcher hosts on 127.0.0.1; every node beat the launcher
(runtime/launcher.py) sends their latest beats as one record, over its link to node 0's
launcher (runtime/nodelink.py) or, without one, to the job-wide store (keys.node_beats);
mirrors the generation and the control counter back into the node's store; carries out
its children's kill requests; and tells the launcher the job's end, or COORDINATOR_LOST.

The coordinator's own node hands its record to the coordinator in process (`own_record`).
With an elected coordinator (an etcd store, runtime/election.py) its record goes to etcd
only when its workers change (what a successor needs to know of it), and the other nodes
take the leader key (keys.COORDINATOR, on its lease) as the coordinator's sign of life:
COORDINATOR_LOST once it is gone. With node 0's TCPStore, node 0 writes its record every
node beat and COORDINATOR_LOST comes once it has stood still for coordinator_timeout_s.
"""

from __future__ import annotations

import datetime
import json
import signal
import sys
import threading
import time

import torch.distributed as dist

from seamguard.runtime import keys
from seamguard.runtime import store as jobstore
from seamguard.runtime.nodelink import LinkClient
from seamguard.runtime.settings import LaunchSettings
from seamguard.runtime.supervise import Child

COORDINATOR_LOST = b"coordinator lost"

NODE_BEAT_READS = (keys.GENERATION, keys.CONTROL_N, keys.JOB_DONE)
"""The job's keys every node beat reads (with the node's kill keys and node 0's record's
revision; and the coordinator's link address until the node's link is up)."""


class NodeBeat:
    """Per-node aggregation: this node's workers beat into a TCPStore on 127.0.0.1 that the
    launcher hosts; every ``node_beat_s`` the launcher writes their latest beats to the
    job-wide store as one record (keys.node_beats), mirrors the generation and the control
    counter (keys.CONTROL_N) back for the workers' heartbeat threads, and reads its
    children's kill requests and the job's end.
    On etcd the node beat is one request (a transaction: the record's put and the reads
    of the generation, the node's kill keys, the job's end and node 0's record, which
    tells the other nodes the coordinator is alive), whatever the node's rank count."""

    def __init__(self, job, s: LaunchSettings, links_key: bytes | None = None, elected: bool = False) -> None:
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
        self.link = LinkClient(s.run_id, s.node_rank, links_key)   # to the coordinator (not from its own node)
        self.elected = elected   # the coordinator holds keys.COORDINATOR (etcd): its sign of life
        self.quiet = s.store_url.kind == "etcd"   # the coordinator's own record: to etcd only on change
        self.coordinating = s.node_rank == 0
        self.coordinator_node: int | None = None   # elected: the holder of keys.COORDINATOR last seen
        self.own_record: dict | None = None   # the coordinating node's newest record, for its coordinator
        self._stored_workers: list[str] | None = None
        self._keyless_said = False

    def coordinate(self) -> None:
        """This node's launcher took the coordinator over: its record goes to the coordinator
        in process from now on, not over a link."""
        self.coordinating = True
        self.link.close(orderly=True)

    def maybe_beat(self, children: list[Child]) -> bytes | None:
        """One node beat when due; returns the job's end (JOB_DONE's value) once set."""
        now = time.monotonic()
        if now < self.next_s:
            return None
        self.next_s = now + self.every_s
        self.counter += 1
        live = [c for c in children if not c.reported]
        beats = _local_beats(self.local, [c.wid for c in live])
        own = {"n": self.counter, "beats": {w: json.loads(raw) for w, raw in beats.items()}}
        record = json.dumps(own)
        linking = not self.coordinating and not self.link.connected
        singles = [*NODE_BEAT_READS, *([keys.COORDINATOR] if self.elected else []),
                   *([keys.LINK, keys.LINK_KEY] if linking else [])]
        if self.coordinating:
            self.own_record = own
            stored = self._store_own(sorted(beats))
        else:
            stored = not self.link.send(record.encode())   # over its link: the store is not written
        try:
            got, kills = self._exchange(record if stored else None, singles, live)
        except (RuntimeError, OSError):
            # the job's store cannot be reached (node 0 gone with its TCPStore, etcd down): as
            # if the coordinator's record stood still, so coordinator_timeout_s decides, not a traceback
            return None if self.coordinating else self._coordinator_silent(self._coordinator[0], now)
        if linking:
            self._connect(got, now)
        self._mirror(got[keys.CONTROL_N], got[keys.GENERATION])
        for c in live:
            if str(c.wid) in kills:
                c.proc.send_signal(signal.SIGKILL)
        done = got[keys.JOB_DONE]
        if done is not None or self.coordinating:
            return done
        if self.elected:
            return self._coordinator_gone(got[keys.COORDINATOR], now)
        return self._coordinator_silent(got[keys.node_beats(0)], now)

    def _store_own(self, workers: list[str]) -> bool:
        """The coordinating node: whether this beat's record goes to the store too. On etcd
        only when its workers changed (a successor reads who they were); on node 0's
        TCPStore every beat (the other nodes' sign that the coordinator lives)."""
        if self.quiet and workers == self._stored_workers:
            return False
        self._stored_workers = workers
        return True

    def _coordinator_gone(self, holder: bytes | None, now: float) -> bytes | None:
        """Elected: COORDINATOR_LOST once the leader key is gone (its lease expired), or was
        never there within the start-up bound."""
        if holder is not None:
            self.coordinator_node, self._coordinator = int(holder), (holder, now)
            return None
        if self.coordinator_node is not None:
            return COORDINATOR_LOST
        return self._coordinator_silent(None, now)

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
            versions = () if self.elected or self.coordinating else (keys.node_beats(0),)
            got, families = self.job.put_and_read(None if record is None else keys.node_beats(self.node), record or "",
                                                  singles, [keys.KILL_PREFIX], versions=versions)
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
