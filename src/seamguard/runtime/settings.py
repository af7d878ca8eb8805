"""Typed settings for the runtime worker and the launcher, in one place.

The CLI and :meth:`Runtime.from_environment` are the only readers of flags and
environment; everything below them receives these frozen dataclasses.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

from seamguard.runtime.cadence import GPU_MTTF_H

#: Imported lazily by common training code, and costly: ``torch.compile`` and
#: ``torch.use_deterministic_algorithms`` pull in dynamo and inductor (with sympy), about
#: 1.7 s of CPU per process on the 2-core test machine.
DEFAULT_PRELOAD = ("torch._dynamo", "torch._inductor.config")


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def run_id_error(run_id: str) -> str | None:
    """What is wrong with a run id, or None: it names files (/dev/shm slots, etcd keys),
    so it is 1-128 of [A-Za-z0-9._-], starting with a letter or digit, and never '..'."""
    if _RUN_ID.fullmatch(run_id) and ".." not in run_id:
        return None
    return (f"--run-id: expected 1-128 characters of letters, digits, '.', '_', '-' (starting with a "
            f"letter or digit, no '..'), got {run_id[:60]!r}")


def path_error(option: str, path: Path | None, absolute: bool = False) -> str | None:
    """What is wrong with a path-like option, or None: no NUL or line breaks (they would
    split log lines and hint files), and absolute where the option says so."""
    if path is None:
        return None
    text = str(path)
    if not text or any(c in text for c in "\0\n\r"):
        return f"{option}: not a usable path: {text[:60]!r}"
    if absolute and not Path(text).is_absolute():
        return f"{option}: expected an absolute path, got {text[:60]!r}"
    return None


def checkpoint_roots(checkpoint_dir: Path | None, roots: tuple[str, ...]) -> tuple[Path, ...]:
    """The directories a job's checkpoints may be written under: the ones configured, else
    the parent of the job's own ``--checkpoint-dir`` (its siblings: other storage paths
    mounted side by side), else none."""
    if roots:
        return tuple(Path(r) for r in roots)
    return (Path(checkpoint_dir).absolute().parent,) if checkpoint_dir is not None else ()


def under_roots(path: Path | str, roots: tuple[Path, ...]) -> bool:
    """Whether ``path`` is, once '..' and symbolic links are resolved, inside one of
    ``roots`` (resolved the same way). Pure but for reading the links that exist."""
    if not Path(path).is_absolute():
        return False
    real = os.path.realpath(path)
    for root in roots:
        base = os.path.realpath(root)
        if os.path.commonpath([real, base]) == base:
            return True
    return False


def port_error(option: str, port: int, allow_zero: bool) -> str | None:
    low = 0 if allow_zero else 1
    return None if low <= port <= 65535 else f"{option}: expected a port in {low}..65535, got {port}"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


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


SETTINGS_ENV = "SEAMGUARD_SETTINGS"
"""The environment variable that carries a job's RuntimeSettings from the launch to its
workers and coordinator (JSON: RuntimeSettings.to_env / from_env)."""

RAIL_MODES = {"stripe": 0, "standby": 1}
"""How rails share the gradient all-reduce: RuntimeSettings.rail_mode -> RailSettings.chunks."""


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
    rail_mode: str = "stripe"
    """"stripe": every rail carries a share of each all-reduce; "standby": one rail carries
    it, the others wait for it to fail (`RailSettings.chunks`)."""
    checkpoint_roots: tuple[str, ...] = ()
    """Absolute directories every checkpoint directory of the job must be under (its own,
    and any a ``checkpoint_dir`` hint moves it to); empty: the parent of
    ``checkpoint_dir``. A target elsewhere is refused, by the coordinator and the ranks."""

    @property
    def roots(self) -> tuple[Path, ...]:
        """The checkpoint roots in force (settings.checkpoint_roots)."""
        return checkpoint_roots(self.checkpoint_dir, self.checkpoint_roots)

    def to_env(self) -> dict[str, str]:
        """The environment that carries these settings to the workers (``from_env`` reads it)."""
        return {SETTINGS_ENV: json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                          for k, v in asdict(self).items()})}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "RuntimeSettings":
        """The settings ``to_env`` wrote into ``env`` (the defaults where it wrote none);
        ValueError, one line, names what is wrong."""
        text = env.get(SETTINGS_ENV, "")
        try:
            raw = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"{SETTINGS_ENV}: not JSON ({exc.msg} at {exc.pos})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{SETTINGS_ENV}: expected a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"{SETTINGS_ENV}: unknown settings {', '.join(unknown)[:200]}")
        if raw.get("checkpoint_dir"):
            raw["checkpoint_dir"] = Path(raw["checkpoint_dir"])
        else:
            raw.pop("checkpoint_dir", None)
        try:
            return cls(**raw)
        except TypeError as exc:   # e.g. a number where a list belongs
            raise ValueError(f"{SETTINGS_ENV}: {exc}") from None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rails", tuple(self.rails))  # JSON gives a list
        object.__setattr__(self, "checkpoint_roots", tuple(str(r) for r in self.checkpoint_roots))
        for root in self.checkpoint_roots:
            if (why := path_error("--checkpoint-roots", Path(root), absolute=True)) is not None:
                raise ValueError(why)
        if (why := path_error("--checkpoint-dir", self.checkpoint_dir)) is not None:
            raise ValueError(why)
        if self.checkpoint_dir is not None and self.checkpoint_roots and \
                not under_roots(Path(self.checkpoint_dir).absolute(), self.roots):
            raise ValueError(f"--checkpoint-dir {self.checkpoint_dir} is not under --checkpoint-roots "
                             f"{','.join(self.checkpoint_roots)}")
        if any(not r or "," in r for r in self.rails):
            raise ValueError(f"rails must be interface names, got {list(self.rails)}")
        if self.rail_mode not in RAIL_MODES:
            raise ValueError(f"--rail-mode must be one of {', '.join(RAIL_MODES)}, got {self.rail_mode!r}")
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
    store_bind: str = ""
    """Address node 0's TCPStore (and its node link server) listens on: empty means
    127.0.0.1 for a one-node job and the address ``master_addr`` names otherwise; never
    every interface unless asked for (``0.0.0.0``)."""
    hint_key_file: Path | None = None
    """The job's hint key (runtime/hintauth.py): an existing file is used as it is (it must
    not be readable by others); otherwise node 0's launcher writes a fresh random key here,
    or to ``<hint_dir>/.hint-key``, mode 0600 (none of them: only the launcher holds it)."""
    coordinator_timeout_s: float = 10.0
    """With several nodes: on an etcd store, the coordinator's lease (runtime/election.py):
    this long after its launcher's last renewal another node's launcher may take over;
    on node 0's TCPStore, a node whose launcher sees node 0's record stand still this long
    ends its part of the job (exit 1) instead of waiting forever (docs/runtime.md,
    "Coordinator failover")."""

    @property
    def store_url(self) -> StoreUrl:
        return parse_store_url(self.store, self.run_id)

    @property
    def store_host(self) -> str:
        """Where node 0's TCPStore listens and a one-node job's workers reach it."""
        if self.store_bind:
            return self.store_bind
        return "127.0.0.1" if self.nnodes == 1 else self.master_addr

    @property
    def aggregate(self) -> bool:
        """Workers beat to their own node's launcher, which writes one record per node."""
        return self.nnodes > 1 or self.store_url.kind != "tcp"

    def __post_init__(self) -> None:
        if not self.script:
            raise ValueError("no training command given after '--'")
        for why in (run_id_error(self.run_id), port_error("--master-port", self.master_port, allow_zero=True),
                    path_error("--hint-dir", self.hint_dir), path_error("--events-file", self.events_file),
                    path_error("--hint-key-file", self.hint_key_file),
                    None if self.metrics_port is None else port_error("--metrics-port", self.metrics_port, False)):
            if why is not None:
                raise ValueError(why)
        if self.log_format not in ("text", "json"):
            raise ValueError(f"--log-format must be text or json, got {self.log_format!r}")
        if self.nproc < 1 or self.spares < 0 or self.nnodes < 1:
            raise ValueError("need nproc >= 1, spares >= 0, nnodes >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} outside 0..{self.nnodes - 1}")
        url = parse_store_url(self.store, self.run_id)
        if self.nnodes > 1 and self.master_port == 0 and url.kind == "tcp":
            raise ValueError("multi-node launch needs an explicit --master-port (or --store etcd://…)")
        if not self.coordinator_timeout_s > 0:
            raise ValueError(f"--coordinator-timeout-s must be > 0 seconds, got {self.coordinator_timeout_s}")
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
