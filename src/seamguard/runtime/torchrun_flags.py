"""torchrun's launch flags, with torchrun's meaning, in terms of `seamguard launch`'s own.

Why it exists: a torchrun user's first command is their old one with ``seamguard launch``
in front (``--nproc-per-node 8 --nnodes 2 --node-rank 0 --rdzv-endpoint h0:29400``).
`seamguard launch` accepts those flags (dashes or underscores, as torchrun does) and this
module says what each one means here (docs/runtime.md, "torchrun's flags"):

- ``--nproc-per-node N|gpu|cpu|auto``: training ranks per node (``gpu``: the visible CUDA
  devices, ``cpu``: the CPU count, ``auto``: GPUs if any, else CPUs);
- ``--nnodes N``: nodes in the job; torchrun's elastic ``MIN:MAX`` is taken only as ``N:N``:
  seamguard starts a fixed set of nodes and covers a node lost later with hot spares (or
  a smaller group), not with a node count that floats between MIN and MAX;
- ``--node-rank``: this node's rank; required with several nodes (node 0 runs the
  coordinator), where torchrun's c10d rendezvous would number the nodes itself;
- ``--rdzv-endpoint host[:port]``: where the job meets: node 0's store (``--master-addr``
  / ``--master-port``; port 29400 as torchrun's), or with ``--rdzv-backend etcd`` the
  etcd cluster the job's store lives in (``--store etcd://host:port``, port 2379);
- ``--rdzv-id``: the job's id, ``--run-id``;
- ``--max-restarts N``: recoveries before the job fails (torchrun restarts the whole group
  where seamguard recovers in place; either way the (N+1)-th failure ends the job);
- ``--standalone``: one node, its store on a free port of 127.0.0.1 (the default).

A flag that contradicts another (``--rdzv-id a --run-id b``) is refused, not overridden.
Pure: the command line's values in, a frozen :class:`Rendezvous` out, or a one-line
ValueError naming the flag; the device count comes from the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

C10D_PORT = 29400
"""torchrun's port for a ``--rdzv-endpoint`` given without one."""
ETCD_PORT = 2379
BACKENDS = {"static": "tcp", "c10d": "tcp", "etcd": "etcd", "etcd-v2": "etcd"}
"""torchrun's rendezvous backends -> the job-wide store that plays their part here."""
DEVICE_KINDS = ("gpu", "cpu", "auto")


@dataclass(frozen=True)
class Given:
    """The launch flags as given (None: not on the command line)."""

    nproc_per_node: str = "1"
    nnodes: str = "1"
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    run_id: str | None = None
    store: str | None = None
    standalone: bool = False
    max_restarts: int | None = None


@dataclass(frozen=True)
class Rendezvous:
    """Where and as what this node joins the job, in the launcher's terms (LaunchSettings)."""

    nproc: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    run_id: str
    store: str
    max_recoveries: int | None  # None: the launcher's default


def resolve(g: Given, devices: Callable[[str], int]) -> Rendezvous:
    """torchrun's flags -> the launcher's nodes, store and run id. ``devices("gpu" | "cpu")``
    counts what this node has (asked only for ``--nproc-per-node gpu|cpu|auto``)."""
    nnodes = _nnodes(g.nnodes)
    if g.standalone:
        _standalone_alone(g, nnodes)
    addr, port, store = _meeting_point(g)
    if g.rdzv_id is not None and g.run_id is not None and g.rdzv_id != g.run_id:
        raise ValueError(f"--rdzv-id {g.rdzv_id!r} and --run-id {g.run_id!r} name the job twice, differently")
    if g.node_rank is None and nnodes > 1:
        raise ValueError(f"--node-rank: required with --nnodes {nnodes} (each node's rank, 0 = the node that runs "
                         "the coordinator; under Slurm $SLURM_NODEID)")
    if g.max_restarts is not None and g.max_restarts < 0:
        raise ValueError(f"--max-restarts: expected a count >= 0, got {g.max_restarts}")
    return Rendezvous(nproc=_nproc(g.nproc_per_node, devices), nnodes=nnodes, node_rank=g.node_rank or 0,
                      master_addr=addr, master_port=port, run_id=g.rdzv_id or g.run_id or "seamguard",
                      store=store, max_recoveries=g.max_restarts)


def _nproc(text: str, devices: Callable[[str], int]) -> int:
    want = text.strip().lower()
    if want.isdigit() and int(want) >= 1:
        return int(want)
    if want not in DEVICE_KINDS:
        raise ValueError(f"--nproc-per-node: expected a count >= 1 or one of {', '.join(DEVICE_KINDS)}, got {text!r}")
    gpus = devices("gpu") if want != "cpu" else 0
    if want == "gpu" and gpus < 1:
        raise ValueError("--nproc-per-node gpu: no CUDA device is visible on this node")
    return gpus if gpus >= 1 else max(1, devices("cpu"))


def _nnodes(text: str) -> int:
    low, sep, high = text.strip().partition(":")
    if not low.isdigit() or int(low) < 1 or (sep and not high.isdigit()):
        raise ValueError(f"--nnodes: expected N or N:N (N >= 1), got {text!r}")
    if sep and int(high) != int(low):
        raise ValueError(f"--nnodes {text}: seamguard launch starts a fixed set of nodes; an elastic MIN:MAX range "
                         f"is not taken (give --nnodes {high}: a node lost later is covered by hot spares)")
    return int(low)


def _standalone_alone(g: Given, nnodes: int) -> None:
    """``--standalone`` is a one-node job with its own local store: anything that says otherwise is refused."""
    clash = next((flag for flag, given in (("--nnodes", nnodes != 1), ("--rdzv-endpoint", g.rdzv_endpoint is not None),
                                           ("--master-addr", g.master_addr is not None),
                                           ("--master-port", g.master_port is not None),
                                           ("--store", g.store not in (None, "tcp"))) if given), None)
    if clash is not None:
        raise ValueError(f"--standalone runs one node with its store on a free local port: it cannot go with {clash}")


def _meeting_point(g: Given) -> tuple[str, int, str]:
    """(master address, master port, store) from --rdzv-backend/--rdzv-endpoint or the seamguard flags."""
    backend = (g.rdzv_backend or "static").strip().lower()
    if backend not in BACKENDS:
        raise ValueError(f"--rdzv-backend: expected one of {', '.join(BACKENDS)}, got {g.rdzv_backend!r}")
    addr, port, store = g.master_addr or "127.0.0.1", g.master_port or 0, g.store or "tcp"
    if g.rdzv_endpoint is None:
        if BACKENDS[backend] == "etcd":
            raise ValueError(f"--rdzv-backend {backend}: needs --rdzv-endpoint host:port (the etcd cluster)")
        return addr, port, store
    host, port_given = _endpoint(g.rdzv_endpoint)
    if BACKENDS[backend] == "etcd":
        url = f"etcd://{host}:{port_given or ETCD_PORT}"
        if g.store is not None and g.store != url:
            raise ValueError(f"--rdzv-endpoint with --rdzv-backend {backend} is the store {url}: it cannot go with "
                             f"--store {g.store}")
        return addr, port, url
    port_here = port_given or C10D_PORT
    for flag, given, here in (("--master-addr", g.master_addr, host), ("--master-port", g.master_port, port_here)):
        if given is not None and given != here:
            raise ValueError(f"--rdzv-endpoint {g.rdzv_endpoint} names node 0's store, and {flag} {given} another")
    if g.store not in (None, "tcp"):
        raise ValueError(f"--rdzv-endpoint {g.rdzv_endpoint} names node 0's store; --store {g.store} is etcd "
                         "(give --rdzv-backend etcd to meet there)")
    return host, port_here, "tcp"


def _endpoint(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[v6]:port`` -> (host, port or None)."""
    raw = text.strip()
    host, sep, port = raw.rpartition(":")
    if not sep or (host.count(":") and not host.startswith("[")):
        host, port = raw, ""   # no port (or a bare IPv6 address)
    host = host.strip("[]")
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"--rdzv-endpoint: expected host[:port], got {text!r}")
    return host, int(port) if port else None
