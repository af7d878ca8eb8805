"""The rendezvous-store key layout shared by launcher, coordinator, workers and hints.

Everything the processes of one job say to each other through the TCPStore is named
here, so the protocol can be read in one place (docs/runtime.md documents it for
operators and for the control plane, which writes the hint keys).
"""

from __future__ import annotations

ROOT = "sg"


def worker_addr(wid: int) -> str:
    """host:port of the worker's replica side channel, written once at start."""
    return f"{ROOT}/worker/{wid}/addr"


def worker_pid(wid: int) -> str:
    return f"{ROOT}/worker/{wid}/pid"


def worker_slots(wid: int) -> str:
    """Path prefix of the worker's shared-memory snapshot slots (they outlive a crash)."""
    return f"{ROOT}/worker/{wid}/slots"


def heartbeat(wid: int) -> str:
    """JSON progress beat: counter, step, phase, compute seconds of the last step."""
    return f"{ROOT}/hb/{wid}"


GENERATION = f"{ROOT}/gen"
"""Current membership generation (decimal string); bumped by the coordinator only."""


def plan(gen: int) -> str:
    """JSON membership plan of a generation (see membership.Plan)."""
    return f"{ROOT}/gen/{gen}/plan"


def have(gen: int, wid: int) -> str:
    """JSON: snapshot steps this worker holds (own and replicas), for the rollback choice."""
    return f"{ROOT}/gen/{gen}/have/{wid}"


def resume(gen: int) -> str:
    """JSON: the step every member restores and where from (memory or disk)."""
    return f"{ROOT}/gen/{gen}/resume"


def recovered(gen: int, wid: int) -> str:
    """JSON: the member finished recovery (with its parameter checksum) or failed."""
    return f"{ROOT}/gen/{gen}/recovered/{wid}"


def group_prefix(gen: int) -> str:
    """Store prefix under which the gloo group of a generation rendezvous."""
    return f"{ROOT}/pg/{gen}/"


def progress(wid: int) -> str:
    """Last committed step of a worker (written each step)."""
    return f"{ROOT}/progress/{wid}"


def exit_code(wid: int) -> str:
    """Written by the worker's node launcher when the process ends."""
    return f"{ROOT}/exit/{wid}"


def kill_request(wid: int) -> str:
    """Written by the coordinator; the worker's node launcher SIGKILLs the process."""
    return f"{ROOT}/kill/{wid}"


def done(wid: int) -> str:
    return f"{ROOT}/done/{wid}"


JOB_DONE = f"{ROOT}/job/done"
"""Set when training finished or failed for good; spares and launchers exit."""

HINT_PREFIX = f"{ROOT}/hint/"
HINT_CHECKPOINT = f"{HINT_PREFIX}checkpoint"
"""Control-plane hint: a counter; when it grows, workers persist the next snapshot."""
HINT_CHECKPOINT_REQ = f"{HINT_PREFIX}checkpoint_req"
"""The signed request (runtime/hintauth.py) that goes with a bump of HINT_CHECKPOINT.
Every hint's value key holds a signed envelope; its counter only says to read it."""

HINT_EVACUATE = f"{ROOT}/hint/evacuate"
"""Control-plane hint: comma-separated ranks to move onto spares at the next chance."""

CHAOS_FIRED_PREFIX = f"{ROOT}/chaos/fired/"
"""One counter per chaos trigger so a trigger fires once per job, not once per process."""

EVENT_COUNT = f"{ROOT}/events/n"


def event(n: int) -> str:
    return f"{ROOT}/events/{n}"

HINT_PERSIST_AT = f"{ROOT}/hint/persist_at"
# checkpoint interval requests: a counter and the interval in seconds ("default": the job's own);
# the coordinator answers with the cadence entries every rank reads (runtime/cadence.py)
HINT_INTERVAL_N = f"{ROOT}/hint/interval_n"
HINT_INTERVAL_S = f"{ROOT}/hint/interval_s"
PERSIST_CADENCE = f"{ROOT}/hint/persist_cadence"
# checkpoint target requests: a counter and the directory ("default": the job's own); the
# coordinator answers with the target entries every rank reads (runtime/cadence.py)
HINT_TARGET_N = f"{ROOT}/hint/target_n"
HINT_TARGET = f"{ROOT}/hint/target"
PERSIST_TARGETS = f"{ROOT}/hint/persist_targets"
# rollback requests: a counter, and the step to go back to (-1: the newest persisted)
HINT_ROLLBACK_N = f"{ROOT}/hint/rollback_n"
HINT_ROLLBACK_TO = f"{ROOT}/hint/rollback_to"
# rails to stay off and degraded mode: a counter and the request each ("default": none, off);
# the coordinator answers with the step modes every rank reads (runtime/stepmodes.py)
HINT_AVOID_RAILS_N = f"{ROOT}/hint/avoid_rails_n"
HINT_AVOID_RAILS = f"{ROOT}/hint/avoid_rails"
HINT_DEGRADED_N = f"{ROOT}/hint/degraded_n"
HINT_DEGRADED = f"{ROOT}/hint/degraded"
STEP_MODES = f"{ROOT}/hint/step_modes"
# --snapshot-every auto: the coordinator's snapshot interval entries (runtime/cadence.py)
SNAPSHOT_CADENCE = f"{ROOT}/hint/snapshot_cadence"

CONTROL_N = f"{ROOT}/control/n"
"""Bumped by the coordinator after each change to a key of CONTROL_KEYS, which ranks obey
from a step (created before the first generation). A rank's heartbeat reads it with the
generation, and the rank reads CONTROL_KEYS again only when it moved: no store round trip
per step (runtime/worker.py, ``Runtime._controls``)."""
CONTROL_KEYS = (STEP_MODES, HINT_PERSIST_AT, PERSIST_CADENCE, PERSIST_TARGETS, SNAPSHOT_CADENCE)
"""Set by the coordinator from a checkpoint hint: every rank persists this step."""

NEXT_WID = f"{ROOT}/wid/next"
"""Counter handing out worker ids to replacement spares started after a loss."""

JOINED_COUNT = f"{ROOT}/joined/n"


def joined(n: int) -> str:
    """Worker id of the n-th replacement spare (1-based), written by its node launcher."""
    return f"{ROOT}/joined/{n}"


def ready(wid: int) -> str:
    """The worker registered its model and waits in steps(): it can take a rank now."""
    return f"{ROOT}/worker/{wid}/ready"


def guard_replaced(step: int) -> str:
    """Set (to the generation) by a rank leaving because its gradient at `step` stayed
    anomalous on recompute; in a later generation, an anomaly at that step is the data's."""
    return f"{ROOT}/guard/replaced/{step}"


MESH_REPLICAS = f"{ROOT}/mesh/replicas"
"""HSDP: the replica groups of the job's device mesh (decimal), written by every rank when
it builds the mesh; absent for one mesh dimension. Replica holders follow it
(membership.replica_holder), in the workers and in the coordinator's plans."""


WAKE_WAIT_S = 86400.0
"""One wait for the next generation's wake key by a generation follower (a node's
launcher, a worker) before it is renewed: long, since the job's end sets a wake key too,
and each expired c10d wait prints a warning."""


def wake(gen: int) -> str:
    """Set by the coordinator when generation `gen` starts, and (gen = current + 1) when the
    job ends: idle spares block on it (a server-side wait, an etcd watch) instead of polling."""
    return f"{ROOT}/wake/{gen}"


NODE_PREFIX = f"{ROOT}/node/"

LINK = f"{ROOT}/link"
"""host:port#hub where node 0's launcher (the coordinator) accepts the other node launchers'
links (runtime/nodelink.py): a link closing without a goodbye is that node's loss."""
COORDINATOR = f"{ROOT}/coordinator"
"""With an etcd store: the elected coordinator's node rank, on its launcher's lease
(runtime/election.py). Its create revision fences the coordinator's writes; the key gone
(the lease expired) is how the other nodes know the coordinator is lost."""
LINK_KEY = f"{ROOT}/link-key"
"""The key that signs the links (hex, liveness.link_key of the job's hint key), published
by node 0 only when its hint key is fresh (no operator's --hint-key-file): the nodes learn
it from the store, so the links are then exactly as trusted as the store. With the same
--hint-key-file on every node nothing is published and the links are stronger than the store."""


def node_beats(node: int) -> str:
    """JSON written by a node's launcher every node beat: its counter and the latest
    heartbeat of each of its workers (read from the node-local store), so the job-wide store
    takes one write per node instead of one per rank (multi-node or etcd launches)."""
    return f"{NODE_PREFIX}{node}"


EXIT_PREFIX = f"{ROOT}/exit/"
DONE_PREFIX = f"{ROOT}/done/"
KILL_PREFIX = f"{ROOT}/kill/"


def read_family(store, prefix: str, names: list[str]) -> dict[str, bytes]:
    """The values of ``prefix + name`` that exist: one range request on a store that can
    read a prefix (runtime/store.py's EtcdStore), else a check and a get per name (a
    TCPStore has no range read)."""
    if hasattr(store, "get_prefix"):
        found = store.get_prefix(prefix)
        return {n: found[prefix + n] for n in names if prefix + n in found}
    out = {}
    for n in names:
        if store.check([prefix + n]):
            out[n] = store.get(prefix + n)
    return out


def peek(store, key: str) -> bytes | None:
    """A key's value or None, in one request where the store can (EtcdStore.peek)."""
    if hasattr(store, "peek"):
        return store.peek(key)
    return store.get(key) if store.check([key]) else None


def read_existing(store, names: list[str]) -> list[bytes]:
    """The values of keys that are known to exist, in one request where the store can
    (TCPStore.multi_get; it would wait for a missing key), else one get each."""
    if hasattr(store, "multi_get") and not hasattr(store, "peek"):   # EtcdStore: peek/get
        return list(store.multi_get(names))
    return [store.get(k) for k in names]


class NewKeys:
    """Whether a store may hold keys it did not hold at the last look, so that families of
    keys that only ever appear (exit codes, done marks, kill requests, joined spares) are
    read when one appeared rather than key by key every pass: the store's key count moved
    (one request: TCPStore.num_keys), or ``full_every_s`` passed since the last full read
    (a key deleted and another created in between leave the count as it was). A store
    that cannot count its keys always may."""

    def __init__(self, full_every_s: float) -> None:
        self.full_every_s = full_every_s
        self._count = -1
        self._full_s = float("-inf")

    def appeared(self, store, now_s: float) -> bool:
        count = getattr(store, "num_keys", None)
        if count is None:
            return True
        n = count()
        if n != self._count or now_s - self._full_s >= self.full_every_s:
            self._count, self._full_s = n, now_s
            return True
        return False
