"""Typed settings for the runtime worker and the launcher, in one place.

The CLI and :meth:`Runtime.from_environment` are the only readers of flags and
environment; everything below them receives these frozen dataclasses.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from seamguard.runtime.cadence import GPU_MTTF_H

#: Imported lazily by common training code, and costly: ``torch.compile`` and
#: ``torch.use_deterministic_algorithms`` pull in dynamo and inductor (with sympy), about
#: 1.7 s of CPU per process on the 2-core test machine.
DEFAULT_PRELOAD = ("torch._dynamo", "torch._inductor.config")


@dataclass(frozen=True)
class StoreUrl:
    """Where the job-wide store is: ``tcp`` (node 0's TCPStore) or an etcd cluster."""

    kind: str  # "tcp" | "etcd"
    endpoints: tuple[tuple[str, int], ...] = ()
    prefix: str = ""
    """Every key of the job lives under this prefix (the run id), so jobs can share etcd."""


def parse_store_url(text: str, run_id: str) -> StoreUrl:
    """``tcp`` (default) or ``etcd://host:port[,host:port…]``; ValueError names what is wrong."""
    if text in ("", "tcp"):
        return StoreUrl("tcp")
    parts = urlsplit(text)
    if parts.scheme != "etcd" or not parts.netloc:
        raise ValueError(f"--store: expected 'tcp' or 'etcd://host:port[,host:port]', got {text!r}")
    endpoints = []
    for item in parts.netloc.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--store: bad etcd endpoint {item!r} in {text!r} (want host:port)")
        endpoints.append((host, int(port)))
    return StoreUrl("etcd", tuple(endpoints), f"/seamguard/{run_id}/")


@dataclass(frozen=True)
class RuntimeSettings:
    """How a training process snapshots, replicates, persists and waits."""

    snapshot_every_steps: int = 1
    """Copy state into host buffers every k committed steps (1 = at most one step lost);
    with ``snapshot_auto``, the interval until the coordinator sets one."""
    snapshot_auto: bool = False
    """Snapshot at Daly's interval for the snapshot's measured cost and the job's failure
    rate (``rank_mttf_h`` / ranks), set by the coordinator (runtime/cadence.py); persist
    points are snapshotted whatever that interval."""
    rank_mttf_h: float = GPU_MTTF_H
    """Hours between failures of one rank, for ``snapshot_auto``."""
    persist_every_steps: int = 50
    """Hand a snapshot to the persister process every p steps (multiple of k); 0 = never."""
    checkpoint_dir: Path | None = None
    """Storage directory for persisted checkpoints (shared storage when multi-node)."""
    keep_checkpoints: int = 2
    """Complete persisted checkpoints kept per rank; older ones are deleted."""
    snapshot_slots: int = 4
    """Host buffers per rank: latest, previous, one pinned while persisting, and (from 4
    on) the newest persisted step, kept so a rollback to it reads memory, not storage."""
    collective_timeout_s: float = 30.0
    """Upper bound on one gradient collective before the rank reports a suspect group."""
    heartbeat_interval_s: float = 0.2
    """Period of the liveness/progress heartbeat written to the store."""
    recovery_timeout_s: float = 60.0
    """Bound on every wait inside a recovery (plan, state transfer, group formation)."""
    replica_timeout_s: float = 20.0
    """Bound on one replica push or fetch over the side channel."""
    dedup_replicas: bool = True
    """Send a tensor to the peer only when its hash differs from the peer's own copy."""
    step_guard: bool = True
    """Judge every step's per-rank gradient norms before the optimizer applies them and
    recompute a step whose gradient looks silently corrupted (runtime/guard.py)."""
    overlap_snapshots: bool = True
    """Copy parameters and optimizer state during the step's forward and backward passes
    (finished before the optimizer step) instead of stalling the step for the copy."""
    crash_capture: bool = True
    """When an exception the training script does not catch ends the process before the
    optimizer touched the step, leave the state at the start of that step in host memory
    first, so a restart resumes there instead of at the last periodic snapshot."""
    rails: tuple[str, ...] = ()
    """Rail interfaces (e.g. ("rail0", "rail1")) the gradient all-reduce runs over with
    rail failover (runtime/rail_sync.py); empty: the job's one gloo group."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rails", tuple(self.rails))  # JSON gives a list
        if any(not r or "," in r for r in self.rails):
            raise ValueError(f"rails must be interface names, got {list(self.rails)}")
        if self.snapshot_every_steps < 1:
            raise ValueError(f"snapshot_every_steps must be >= 1, got {self.snapshot_every_steps}")
        if self.persist_every_steps < 0:
            raise ValueError(f"persist_every_steps must be >= 0, got {self.persist_every_steps}")
        if not self.rank_mttf_h > 0:
            raise ValueError(f"rank_mttf_h must be > 0, got {self.rank_mttf_h}")
        if self.persist_every_steps and not self.snapshot_auto and self.persist_every_steps % self.snapshot_every_steps:
            raise ValueError("persist_every_steps must be a multiple of snapshot_every_steps "
                             f"({self.persist_every_steps} % {self.snapshot_every_steps} != 0)")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.snapshot_slots < 3:
            raise ValueError(f"snapshot_slots must be >= 3, got {self.snapshot_slots}")
        for name in ("collective_timeout_s", "heartbeat_interval_s", "recovery_timeout_s",
                     "replica_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


@dataclass(frozen=True)
class LaunchSettings:
    """What ``seamguard launch`` starts and how its coordinator judges the workers."""

    script: list[str]
    """The training command after ``--`` (a .py file is run with the current Python)."""
    nproc: int = 1
    """Training ranks per node."""
    spares: int = 0
    """Hot spare processes per node, started with the job and waiting for a rank."""
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """Rendezvous TCPStore port; 0 picks a free one (single node only)."""
    run_id: str = "seamguard"
    hang_timeout_s: float = 1.0
    """A worker whose heartbeat counter has not moved this long is declared hung."""
    stall_timeout_s: float = 10.0
    """A worker computing while all peers wait in the collective this long is stalled."""
    straggler_factor: float = 1.5
    """Compute time above factor x median of peers counts as slow."""
    straggler_window: int = 8
    """Consecutive slow steps before a straggler verdict."""
    evacuate_stragglers: bool = False
    """Replace a persistent straggler by a spare (otherwise only report it)."""
    fork_server: bool = True
    """Fork workers of a .py script from a per-node process that has imported torch and
    the runtime once (runtime/zygote.py), instead of starting a fresh interpreter each."""
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    """Modules the fork server imports once, beyond torch, numpy and the runtime, so
    that no worker pays for them (importable names; checked at launch)."""
    replenish_spares: bool = True
    """Start a fresh spare whenever a process is lost, so the pool does not run dry."""
    spare_wait_s: float = 30.0
    """With replenishment on, how long a loss that the ready spares cannot cover waits
    for the replacements being started before the group shrinks instead."""
    max_recoveries: int = 100
    """Give up (exit non-zero) after this many recoveries."""
    startup_timeout_s: float = 120.0
    """Bound on the wait for every worker to register."""
    hint_dir: Path | None = None
    """Directory the launcher watches for control-plane hint files (see docs/runtime.md)."""
    events_file: Path | None = None
    """JSON-lines log of detections and recoveries (the launcher's and every worker's)."""
    metrics_port: int | None = None
    """Node 0 serves the job's progress as Prometheus text on this port (None: off)."""
    log_format: str = "text"
    """stderr: ``text`` (a line a person reads) or ``json`` (the event records)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the workers (settings, chaos plan)."""
    store: str = "tcp"
    """The job-wide store: ``tcp`` (node 0's launcher hosts a TCPStore) or
    ``etcd://host:port[,host:port…]`` (an etcd cluster; runtime/store.py)."""
    node_beat_s: float = 0.25
    """With per-node aggregation (an etcd store or several nodes), how often each node's
    launcher writes its workers' heartbeats to the job-wide store as one record."""
    coordinator_timeout_s: float = 10.0
    """With per-node aggregation: a node whose launcher sees node 0's record (node 0 runs
    the coordinator) stand still this long ends its part of the job (exit 1) instead of
    waiting forever; the coordinator is not re-elected (docs/runtime.md, "Many nodes")."""

    @property
    def store_url(self) -> StoreUrl:
        return parse_store_url(self.store, self.run_id)

    @property
    def aggregate(self) -> bool:
        """Workers beat to their own node's launcher, which writes one record per node."""
        return self.nnodes > 1 or self.store_url.kind != "tcp"

    def __post_init__(self) -> None:
        if not self.script:
            raise ValueError("no training command given after '--'")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"--log-format must be text or json, got {self.log_format!r}")
        if self.nproc < 1 or self.spares < 0 or self.nnodes < 1:
            raise ValueError("need nproc >= 1, spares >= 0, nnodes >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} outside 0..{self.nnodes - 1}")
        url = parse_store_url(self.store, self.run_id)
        if self.nnodes > 1 and self.master_port == 0 and url.kind == "tcp":
            raise ValueError("multi-node launch needs an explicit --master-port (or --store etcd://…)")
        if not 0 < self.node_beat_s <= self.hang_timeout_s / 2:
            raise ValueError(f"node_beat_s must be in (0, hang_timeout_s/2 = {self.hang_timeout_s / 2}], "
                             f"got {self.node_beat_s}")
        for name in self.preload:
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise ValueError(f"--preload: no importable module {name!r}")
