"""The training-process side of the runtime: the step as a transaction, and recovery.

A training script creates one `Runtime` (via `seamguard.runtime.init()`), registers its
model, optimizer and sampler, and iterates `steps()`. Each step is a transaction: the
gradient collective in `sync_gradients()` never raises into model code; a failure (a
peer's socket closed, the coordinator announced a new generation, the collective timed
out) cancels the step and the next iteration of `steps()` recovers: the broken group is
abandoned, every member restores the same step (own snapshot, a peer replica for a
spare, or the last verified checkpoint on storage), a new gloo group is formed under a
new store prefix, parameter checksums are compared, and training goes on.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import resource
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist

from seamguard.runtime import cadence, chaos, fsdp, keys, replica, shm, stepmodes
from seamguard.runtime import store as jobstore
from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.clock import SYSTEM_CLOCK, Clock
from seamguard.runtime.eventlog import EventLog, name_threads_in_os, set_title
from seamguard.runtime.follower import ControlKeys, MembershipFollower
from seamguard.runtime.guard import GuardSettings, judge_gradients
from seamguard.runtime.manifest import CheckpointError, read_checkpoint
from seamguard.runtime.membership import Plan, identical_ranks, replica_holder
from seamguard.runtime.pipeline import Handoff, SnapshotPipeline
from seamguard.runtime.profile import PhaseClock
from seamguard.runtime.rail_sync import RailSync
from seamguard.runtime.records import Board, Controls, Progress
from seamguard.runtime.settings import RuntimeSettings, StoreUrl, parse_store_url, under_roots
from seamguard.runtime.shm import LAUNCHER_PID_ENV
from seamguard.runtime.snapshot import (SlotStore, TrainingState, find_orphans,
                                        read_orphan, state_checksum, tensors_of)

_QUEUED = "queued"   # a snapshot in flight that is already in the pipeline's queue

EXIT_SUSPECT = 75
"""Exit status of a rank that left because its gradient stayed anomalous on recompute."""


class RecoveryError(Exception):
    """A recovery attempt failed; the coordinator plans another (eventually from disk)."""


class GenerationChanged(Exception):
    """The coordinator moved to a newer generation while this process was waiting."""


class JobFinished(Exception):
    """The job ended while this process was waiting (a spare that was never needed)."""


class JobFailed(RuntimeError):
    """The coordinator gave the job up (no consistent state left); see the launcher log."""


TCP_STORE = StoreUrl("tcp")


def _connect(host: str, port: int, timeout_s: float, url: StoreUrl = TCP_STORE) -> dist.Store:
    return jobstore.connect(url, host, port, timeout_s)


def _unlink_all(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def _host_port(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


# how often a wait for a collective looks for a new generation or its timeout; completion
# itself ends gloo's wait(timeout) at once, so this only bounds cancelling
_WAKE_S = 0.05
_WAKE_TD = datetime.timedelta(seconds=_WAKE_S)


class Runtime:
    """One training process of a seamguard job (see module docstring and docs/runtime.md)."""

    def __init__(self, wid: int, master_addr: str, master_port: int, ranks_per_node: int,
                 settings: RuntimeSettings, run_id: str, advertise_host: str = "127.0.0.1",
                 store_url: StoreUrl = TCP_STORE, node_store: tuple[str, int] | None = None,
                 launcher_pid: int | None = None, mirror_lag_s: float = 0.0, clock: Clock = SYSTEM_CLOCK):
        """``mirror_lag_s``: how much older the node's mirror of the control counter may be
        (a node beat, when aggregated); ``clock``: where every part reads the time."""
        self.wid = wid
        self.time = clock
        self._store_url = store_url
        self._node_store = node_store  # heartbeats go to the node's launcher (multi-node/etcd)
        self.settings = settings
        self.ranks_per_node = ranks_per_node
        self._addr = (master_addr, master_port)
        self.store = _connect(master_addr, master_port, settings.recovery_timeout_s, store_url)
        # named by this process and its launcher: a later launcher sweeps them once both are gone (runtime/shm.py)
        self.slots = SlotStore(shm.slot_prefix(run_id, os.getpid(), wid, launcher_pid, shm.pid_namespace()),
                               settings.snapshot_slots)
        self._run_id = run_id
        self.replicas = replica.ReplicaStore(self.slots)
        self.server = replica.ReplicaServer(self.replicas, advertise_host,
                                            settings.replica_timeout_s, settings.dedup_replicas)
        self.injector = chaos.from_env_without_store()
        self.clock = PhaseClock(False)   # where the time goes (SEAMGUARD_PROFILE=1; runtime/profile.py)
        self.slots.clock = self.server.clock = self.clock
        self.plan: Plan | None = None
        self.gen = -1
        self.rank = -1
        self.role = -1  # whose state this worker continues; fixed once assigned
        self._orphans: dict[int, tuple] = {}  # step -> (manifest, path) a dead worker left
        self.group: dist.ProcessGroupGloo | None = None
        self._rails: RailSync | None = None  # the gradient all-reduce over rails (--rails)
        self._mode = stepmodes.NORMAL  # rails avoided, degraded: the control plane's, at this step
        # the records this thread shares with the membership follower's (records.py)
        self.progress: Board[Progress] = Board(Progress())
        self.controls: Board[Controls] = Board(Controls())
        self._control_keys = ControlKeys(self.store, self.controls, settings.heartbeat_interval_s,
                                         mirror_lag_s, clock)
        self._last_step_s = 0.0   # wall time between the last two step boundaries
        self._mesh = None         # FSDP2: the DeviceMesh over a fsdp.ResilientGroup
        self._mesh_rank = -1      # FSDP2: the rank this process's shards were laid out for
        self._replicas = 1        # HSDP: replica groups of the mesh (1: plain FSDP2)
        self._mesh_dims: list[tuple[str, list[int]]] = []  # HSDP: (name, global ranks) per mesh dim
        self._subgroups: dict[str, dist.ProcessGroupGloo] = {}  # HSDP: this generation's, by name
        self._mesh_groups: dict = {}  # HSDP: the mesh's fsdp.ResilientGroup per dimension, by name
        self._dcp_step = -1       # FSDP2: newest step this rank wrote (or skips) as a DCP checkpoint
        self._graveyard: list = []  # abandoned groups: destroying one can block on a dead peer
        self.step = 0
        self.state: TrainingState | None = None
        self.sampler: GlobalBatchSampler | None = None
        self._flat: torch.Tensor | None = None
        self._failed = False
        self._live_ok = False  # the live model/optimizer hold exactly the start of self.step
        self._private: tuple[int, dict[str, bytes]] = (-1, {})  # start-of-step meta + buffers
        self._meta_target: tuple[int, str, int] = (-1, "", -1)  # (gen, holder address, role)
        self._part: tuple[int, int, dict[str, bytes]] | None = None  # (gen, step, rank_private()) sent
        self._part_ok: bool | None = None   # the parts sent so far held (None: none checked yet)
        self._compute_s = 0.0   # the last step's split, for the job's metrics: compute before the
        self._comm_s = 0.0      # gradient collective, the collective itself, and the time the step
        self._stall_s = 0.0     # waited for its snapshot copy (published at each step boundary)
        self._t_compute = 0.0
        self._local_n = 0
        self._persist_at = -1
        self._hint_persisted = -1
        self._force_persist = False
        self._inflight = None  # (Capture, persist?) of a snapshot still copying
        self._snap_opt_entries = -1  # optimizer state entries at the last snapshot
        self._snap_begun = -1   # step of the last snapshot begun
        self._timed: int | None = None   # step whose boundary was the last one passed (None: none since a recovery)
        self._snap_cost = cadence.SnapshotCost()   # --snapshot-every auto: what a snapshot costs
        self._snap_cost_s: float | None = None     # its estimate, published (made as samples come)
        self._made_seen = 0   # slots.made at the last step boundary
        self._applied = -1  # newest step the optimizer began to apply
        self._at_step_start = False  # between steps: live state = start of self.step
        self._prev_excepthook = None
        self._guard = GuardSettings()
        self._norm_history: list[float] = []  # median gradient norm of recent accepted steps
        self._rejected: tuple[int, np.ndarray] | None = None  # (step, norms) awaiting recompute
        self._redo = False
        self.stats = {"snapshots": 0, "snapshot_stall_s": 0.0, "recoveries": 0, "live_captures": 0,
                      "steps_rejected": 0}   # the training thread's; the pipeline counts its own
        self.events: list[dict] = []
        self.log = EventLog.from_environment()
        self.store.set(keys.worker_addr(wid), self.server.address)
        self.store.set(keys.worker_pid(wid), str(os.getpid()))
        self.store.set(keys.worker_slots(wid), self.slots.prefix)
        name_threads_in_os()   # top -H, perf and /proc tell the runtime's threads apart
        self.pipeline = SnapshotPipeline(
            self.slots, settings, self.progress,
            lambda: _connect(*self._addr, settings.recovery_timeout_s, store_url),
            self.server.host, self.injector, self._note, self.clock, run_id)
        self.follower = MembershipFollower(
            wid, self._beat_store, settings.heartbeat_interval_s, self.progress, self.controls,
            (os.environ.get("SEAMGUARD_NODE_NAME") or socket.gethostname().split(".")[0],
             int(os.environ.get("LOCAL_RANK", "0"))),
            clock, self.clock, settings.snapshot_auto, self.pipeline.prepare_spare_slot)
        self.follower.start()

    # ------------------------------------------------------------------ setup
    @classmethod
    def from_environment(cls, settings: RuntimeSettings | None = None) -> "Runtime":
        env = os.environ
        if "SEAMGUARD_WORKER_ID" not in env:
            raise RuntimeError("seamguard.runtime.init() must run under `seamguard launch` "
                               "(SEAMGUARD_WORKER_ID is not set)")
        if settings is None:
            settings = RuntimeSettings.from_env(env)
        rt = cls(int(env["SEAMGUARD_WORKER_ID"]), env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                   int(env.get("SEAMGUARD_RANKS_PER_NODE", env.get("LOCAL_WORLD_SIZE", "1"))),
                   settings, env.get("SEAMGUARD_RUN_ID", "seamguard"),
                   env.get("SEAMGUARD_ADVERTISE_HOST", "127.0.0.1"),
                   parse_store_url(env.get("SEAMGUARD_STORE", ""), env.get("SEAMGUARD_RUN_ID", "seamguard")),
                   _host_port(env.get("SEAMGUARD_NODE_STORE", "")),
                   int(env.get(LAUNCHER_PID_ENV, "0")) or None, float(env.get("SEAMGUARD_NODE_BEAT_S", "0")))
        rt.clock.enabled = env.get("SEAMGUARD_PROFILE") == "1"
        return rt

    def register(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 sampler: GlobalBatchSampler) -> None:
        """Hand the runtime what it snapshots, replicates and restores."""
        self.state = TrainingState(model, optimizer, sampler.state_dict)
        # a snapshot still copying must be complete before the optimizer changes its source
        optimizer.register_step_pre_hook(lambda *_: self._before_optimizer())
        optimizer.register_step_post_hook(
            lambda *_: self.injector.maybe_fire("optimizer", self.rank, self.step))
        self.sampler = sampler
        params = [p for p in model.parameters() if p.requires_grad]
        self._params = params
        self._n_grad = sum(p.numel() for p in params)
        self._flat = None   # sized per generation: gradients + one guard lane per rank
        if any(p.is_cuda for p in model.parameters()):
            self.pipeline.spare_model_on_gpu.set()   # an idle spare keeps a page-locked slot ready
        if self.settings.checkpoint_dir is not None:
            self.pipeline.start_persister()  # start it now, not at the first persist
        if self.settings.crash_capture and self._prev_excepthook is None:
            self._prev_excepthook = sys.excepthook
            sys.excepthook = self._on_uncaught_exception

    def _before_optimizer(self) -> None:
        self._finish_snapshot()
        self._applied = self.step   # from here on the live state is no longer the step's start

    def _on_uncaught_exception(self, exc_type, exc, tb) -> None:
        """sys.excepthook: the training script raised and did not catch (a software bug).
        Before the process ends, and only if the optimizer has not begun the failed step,
        the live state is exactly the start of that step: leave it in host memory with its
        manifest, where a replacement process adopts it (job-wide restarts resume at the
        failed step instead of at the last periodic snapshot). The exception is then
        reported as usual and the process exits non-zero."""
        try:
            phase = self.progress.current.phase
            captured = (phase not in ("recover", "done", "start")
                        and self._applied != self.step and self._capture_step_start(timeout_s=5.0))
            self._note("crash_captured" if captured else "crash_not_captured", step=self.step,
                       phase=phase, error=f"{exc_type.__name__}: {exc}"[:300])
        except BaseException as err:  # noqa: BLE001 - the original error must still be shown
            self._note("crash_capture_failed", step=self.step, error=str(err)[:300])
        finally:
            (self._prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)

    @property
    def world_size(self) -> int:
        return self.plan.world_size if self.plan else 0

    @property
    def sharded(self) -> bool:
        """True once `device_mesh()` was called: the state is FSDP2-sharded."""
        return self._mesh is not None

    def device_mesh(self, replicate: int = 1):
        """FSDP2: the one-dimensional `DeviceMesh` over the job's ranks to pass to
        `fully_shard(..., mesh=rt.device_mesh())`, whose process group the runtime re-forms
        after a loss (`seamguard.runtime.fsdp`). Call it after building the model and
        before `fully_shard`: a spare blocks here until it is given a rank, since FSDP2
        lays the shards out by rank, so a model built first is built while it waits.

        HSDP: ``replicate=R`` (> 1) gives a 2-D mesh ("replicate", "shard") of shape
        (R, world/R): each row shards the model, the R rows replicate it (FSDP2
        reduce-scatters in the shard dimension and all-reduces across replicas). Each
        dimension's process group forwards to a gloo subgroup that the runtime re-forms,
        with the world group, at every recovery.

        One mesh dimension: sharded state is not replicated between ranks, so from here on
        replicas carry every byte of a rank's snapshot (no deduplication) and a loss resumes
        at the newest step whose snapshot every rank and every lost rank's replica holder
        have. HSDP: a rank's replica holder is its peer in the replicate dimension (on
        another node where the layout allows, `membership.replica_holder`), which holds the
        same shard, so replicas stay deduplicated (only rank-private bytes cross) and a
        lost rank is restored from its peer's live state at the step it died in. Either
        way the step guard (which compares ranks' gradients of the same parameters) is off."""
        if self._mesh is not None:
            if replicate != self._replicas:
                raise ValueError(f"device_mesh(replicate={replicate}): the mesh was already "
                                 f"built with replicate={self._replicas}")
            return self._mesh
        from torch.distributed.device_mesh import DeviceMesh

        if not isinstance(replicate, int) or replicate < 1:
            raise ValueError(f"device_mesh(replicate={replicate!r}): replicate must be an int >= 1")
        try:
            rank, world_size = self._await_rank()
        except JobFinished:   # a spare the job never needed: nothing to build or train
            self.finish()
            os._exit(0)
        if world_size % replicate:
            raise ValueError(f"device_mesh(replicate={replicate}): the world size {world_size} "
                             f"is not a multiple of it")
        dedup = self.settings.dedup_replicas and replicate > 1
        self.settings = dataclasses.replace(self.settings, dedup_replicas=dedup, step_guard=False)
        self.server.dedup = dedup
        if replicate > 1:
            self.store.set(keys.MESH_REPLICAS, str(replicate))
        self._resilient = fsdp.install_default_group(
            self, rank, world_size, dist.PrefixStore("sg/pg/default/", self.store))
        self._mesh_rank = rank
        self._replicas = replicate
        if replicate == 1:
            self._mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
            return self._mesh
        layout = torch.arange(world_size, dtype=torch.int).view(replicate, world_size // replicate)
        self._mesh_dims = fsdp.hsdp_subgroups(layout, rank)
        self._mesh_groups = {name: fsdp.install_subgroup(self, name, ranks, rank,
                                                         lambda name=name: self._subgroups.get(name))
                             for name, ranks in self._mesh_dims}
        self._mesh = DeviceMesh.from_group(list(self._mesh_groups.values()), "cpu", mesh=layout,
                                           mesh_dim_names=("replicate", "shard"))
        return self._mesh

    def _await_rank(self) -> tuple[int, int]:
        """(rank, world size) of the first generation that gives this worker a rank;
        a spare waits for it (it counts as ready: everything is imported)."""
        self.store.set(keys.ready(self.wid), "1")
        while True:
            gen = self._next_generation()
            try:
                plan = Plan.from_json(self._wait(keys.plan(gen), gen,
                                                 self.settings.recovery_timeout_s, spare=True))
            except GenerationChanged:
                continue
            if self.wid in plan.ranks:
                return plan.ranks.index(self.wid), plan.world_size
            self.gen = gen   # not in this one: wait for a newer generation
            self.progress.update(gen=gen)

    # ------------------------------------------------------------------ the loop
    def steps(self, total_steps: int) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (step, sample indices of this rank) until `total_steps` are committed.
        The job-wide store gone for good (etcd down: every endpoint refused) ends the
        process with one line, not a traceback: its launcher reports the loss and the
        persisted checkpoints stay where they are."""
        try:
            yield from self._steps(total_steps)
        except jobstore.StoreError as exc:
            raise SystemExit(f"seamguard worker w{self.wid}: lost the job-wide store "
                             f"({' '.join(str(exc).split())[:200]}); exiting") from None

    def _steps(self, total_steps: int) -> Iterator[tuple[int, np.ndarray]]:
        if self.state is None or self.sampler is None:
            raise RuntimeError("call register(model, optimizer, sampler) before steps()")
        self.store.set(keys.ready(self.wid), "1")
        try:
            self._recover()  # generation 0, or a spare waiting for a rank
        except JobFinished:
            return
        t_last = time.perf_counter()
        while True:
            if self._failed or self._overtaken_gen():
                try:
                    self._recover()
                except JobFinished:
                    return  # finished without us (we had already been replaced)
                t_last = time.perf_counter()   # a recovery is no step: read CONTROL_N afresh
                self._timed = None
            if self.step >= total_steps:
                if self._final_barrier():
                    break
                continue
            t_boundary = time.perf_counter()
            self._last_step_s, t_last = t_boundary - t_last, t_boundary
            if self.settings.snapshot_auto:
                self._time_snapshots()
            self._timed = self.step
            if self._private[0] != self.step and (self.settings.step_guard or self._live_recovery()
                                                  or self.settings.crash_capture):
                self._private = (self.step, self.state.step_private(self.step))
            self._read_step_mode()
            self._send_meta()
            stall_before_s = self.stats["snapshot_stall_s"]
            with self.clock.phase("snapshot_begin"):
                self._maybe_snapshot()
            self._maybe_save_dcp()
            self.injector.maybe_fire("step", self.rank, self.step, forget_memory=self.slots.close)
            self.clock.add("step_boundary", time.perf_counter() - t_boundary)
            self._publish_boundary()
            self._t_compute = time.perf_counter()
            self._at_step_start = False
            idx = self.sampler.indices(self.step, self.rank, self.world_size)
            self._local_n = len(idx)
            t_yield = time.perf_counter()
            yield self.step, idx
            self.clock.add("step_body", time.perf_counter() - t_yield)
            self._stall_s = self.stats["snapshot_stall_s"] - stall_before_s   # published at the next boundary
            if self._redo:   # rejected by the step guard: the same step again, from its start
                self._redo = False
                self.state.restore_private(self._private[1])
            elif not self._failed:
                self.step += 1
                self._at_step_start = True
        self._set_phase("done")
        self._persist_final()
        self.store.set(keys.done(self.wid), str(self.step))

    def sync_gradients(self) -> bool:
        """Average gradients over the group; False means the step is cancelled (skip it).

        Gradients are weighted by shard size so a shrunk group with uneven shards still
        computes the mean over the whole global batch. A snapshot begun at the start of
        the step is finished here, before the optimizer may change what it copies.
        """
        try:
            ok = self._sync_gradients()
        finally:
            self._finish_snapshot()
        if ok:
            self._send_rank_part()
        return ok

    def _sync_gradients(self) -> bool:
        assert self.sampler is not None and self.plan is not None
        self._compute_s = time.perf_counter() - self._t_compute
        if self._failed or self._overtaken_gen():
            self._failed = True
            return False
        if self.sharded:   # FSDP2 reduce-scattered the gradients in backward, on our group
            return self._await_replica()
        if self._mode.degraded and not self._settle_degraded():
            return False
        if self.plan.world_size == 1:
            return self._single_rank_gradients()
        n_grad = self._n_grad
        lanes = self.plan.world_size if self.settings.step_guard else 0
        if self._flat is None or self._flat.numel() != n_grad + lanes:
            self._flat = torch.zeros(n_grad + lanes, dtype=self._params[0].dtype,
                                     device=self._params[0].device)
        off = 0
        scale = self._local_n / self.sampler.global_batch
        for p in self._params:
            n = p.numel()
            view = self._flat[off:off + n]
            if p.grad is None:
                view.zero_()
            else:
                torch.mul(p.grad.reshape(-1), scale, out=view)
            off += n
        if lanes:
            grad = self._flat[:n_grad]
            self.injector.maybe_corrupt(self.rank, self.step, grad)
            self._flat[n_grad:].zero_()
            self._flat[n_grad + self.rank] = torch.linalg.vector_norm(grad) / max(scale, 1e-12)
        t_comm = time.perf_counter()
        ok = self._rail_allreduce() if self._rails is not None else \
            self._collective(lambda: self.group.allreduce([self._flat]))
        self._comm_s = time.perf_counter() - t_comm
        if not ok:
            self._failed = True
            return False
        if lanes and not self._guard_accepts(self._flat[n_grad:].double().cpu().numpy()):
            return False
        off = 0
        for p in self._params:
            n = p.numel()
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(self._flat[off:off + n].view_as(p))
            off += n
        return True

    def _single_rank_gradients(self) -> bool:
        """World size 1: the mean over one rank is its own gradient, scaled in place (the
        same values the flat buffer gives); the guard's norm is taken per tensor. No flat
        copy there and back and no collective: on an H100 gloo's all-reduce of a group of
        one copied the 1.6 GB gradient to the host and back (126 ms of a 197 ms step), and
        the flat copies alone moved four times the gradient's bytes every step."""
        self._comm_s = 0.0
        for p in self._params:
            if p.grad is None:   # as the flat path leaves it: a zero gradient, not none
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self._params]
        scale = self._local_n / self.sampler.global_batch
        if scale != 1.0:
            torch._foreach_mul_(grads, scale)
        if not self.settings.step_guard or not grads:
            return True
        self.injector.maybe_corrupt(self.rank, self.step, grads[0].view(-1))
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) / max(scale, 1e-12)
        return self._guard_accepts(norm.double().cpu().numpy().reshape(1))

    def _await_replica(self) -> bool:
        """Sharded state: commit the step only once its start-of-step snapshot has reached
        the replica holder (hashed, pushed, acknowledged), since no peer holds this rank's
        shard. A rank lost during step s+1 has then delivered the start of step s: the job
        resumes at s, at most one completed step is redone. False if a new generation
        overtakes the wait."""
        self._finish_snapshot()
        t0 = time.perf_counter()
        nap_s = 0.0002
        try:
            while self.pipeline.busy():
                if self._failed or self._overtaken_gen():
                    self._failed = True
                    return False
                time.sleep(nap_s)
                nap_s = min(0.005, nap_s * 1.5)
        finally:
            self.stats["snapshot_stall_s"] += time.perf_counter() - t0
            self.clock.add("commit_wait", time.perf_counter() - t0)
        return True

    def _guard_accepts(self, norms: np.ndarray) -> bool:
        """The step guard's verdict on this step (the same on every rank: every rank holds
        every rank's norm). A rejected step is computed again from its start; a transient
        fault does not come back. If the anomaly survives the recompute (a defect can
        reproduce bit for bit), the suspect ranks leave and spares compute the step on
        other hardware; an anomaly that survives that too is the data's and is applied,
        as plain DDP would have."""
        verdict = judge_gradients(norms, np.asarray(self._norm_history), self._guard)
        first = self._rejected is None or self._rejected[0] != self.step
        if not verdict.reject:
            if not first:
                self._note("step_recomputed_clean", step=self.step, norms=norms.tolist())
            self._rejected = None
            self._norm_history = (self._norm_history + [float(np.median(norms))])[-self._guard.history_steps:]
            return True
        if first:
            self._rejected = (self.step, norms.copy())
            self.stats["steps_rejected"] += 1
            self._note("step_rejected", step=self.step, reason=verdict.reason,
                       suspects=list(verdict.suspects), norms=norms.tolist())
            self._redo = True
            return False
        key = keys.guard_replaced(self.step)
        if self.store.check([key]) and int(self.store.get(key)) < self.gen:
            # other hardware computed it again and got the same anomaly: the data's
            self._note("gradient_spike_kept", step=self.step, reason=verdict.reason,
                       norms=norms.tolist())
            self._rejected = None
            return True
        self._note("gradient_anomaly_persists", step=self.step, reason=verdict.reason,
                   suspects=list(verdict.suspects), norms=norms.tolist(),
                   reproduced=bool(np.array_equal(self._rejected[1], norms, equal_nan=True)))
        if self.rank in verdict.suspects:
            self.store.set(key, str(self.gen))
            self.finish()
            os._exit(EXIT_SUSPECT)   # the coordinator replaces this rank with a spare
        self._failed = True          # the others wait for the new generation
        return False

    def finish(self) -> None:
        """Stop background threads, the persister, and free the shared-memory slots."""
        self.follower.stop()
        self._finish_snapshot()
        if self.rank >= 0:
            self._note("finished", step=self.step, **{k: round(v, 3) if isinstance(v, float) else v
                                                      for k, v in {**self.stats, **self.pipeline.counts()}.items()})
        if self.clock.enabled:
            use = resource.getrusage(resource.RUSAGE_SELF)
            self._note("profile", steps=self.step, process_cpu_s=round(use.ru_utime + use.ru_stime, 3),
                       phases=self.clock.report(self.step))
        self.pipeline.close(self.settings.recovery_timeout_s)
        self.server.close()
        self.slots.close()

    # ------------------------------------------------------------------ collectives
    def _collective(self, issue) -> bool:
        """Run one collective, polling so a new generation or a timeout cancels it."""
        try:
            work = issue()
        except RuntimeError as exc:
            self._note("collective_error", error=str(exc)[:200])
            return False
        return self._await_work(work)

    def _rail_allreduce(self) -> bool:
        """The gradient all-reduce over the rails: a rail flap is handled inside (chunks
        re-run elsewhere); a new generation or the timeout ends it as a failed step."""
        self._set_phase("collective")
        try:
            why = self._rails.allreduce(self._flat, self.step, lambda: self._overtaken_gen(),
                                        self.settings.collective_timeout_s, self._mode.avoid)
        finally:
            self._set_phase("idle")
        for e in self._rails.new_events():
            self._note(f"rail_{e['event']}", step=e["step"], rail=e["rail"], reason=e.get("reason", ""),
                       **({"rails_used": e["rails_used"]} if "rails_used" in e else {}))
        if why:
            self._note("collective_error", error=f"rails: {why}"[:200])
        return not why

    def _await_work(self, work) -> bool:
        """Wait for a collective issued on ``self.group``; False (and the step failed) if
        it errs, times out, or a new generation overtakes it.

        Woken by the collective's completion, not by polling: polling with naps lagged a
        finished collective by 2.3 ms on average, ~27 ms of a 0.28 s FSDP2 step with its
        12 collectives (docs/benchmarks.md). The training thread waits in gloo's own
        ``wait(timeout)`` (C++, no GIL held), _WAKE_S at a time so that a new generation
        can cancel it; a future callback did this before, but it ran Python on gloo's
        thread, which then waited for the GIL before it went on with the next collective."""
        phase = self.progress.current.phase
        self._set_phase("collective")
        deadline = time.monotonic() + self.settings.collective_timeout_s
        t0 = time.perf_counter()
        try:
            if not self._wait_in_gloo(work, deadline):
                self._note("collective_cancelled", reason="new generation"
                           if self._overtaken_gen() else "timeout")
                self._failed = True
                return False
            self.clock.add("collective_wait", time.perf_counter() - t0)
            return True
        except RuntimeError as exc:
            self._note("collective_error", error=str(exc)[:200])
            self._failed = True
            return False
        finally:
            # FSDP2's collectives run inside the forward and backward: back to computing
            self._set_phase(phase if self.sharded and phase != "collective" else "idle")

    def _overtaken(self, deadline: float) -> bool:
        return self._overtaken_gen() or time.monotonic() > deadline

    def _wait_in_gloo(self, work, deadline: float) -> bool:
        """Wait for ``work`` in its own ``wait(timeout)``; False if overtaken. A failed
        collective raises."""
        while True:
            try:
                work.wait(_WAKE_TD)
                return True
            except RuntimeError:
                if work.is_completed():   # failed, or completed just after this wait timed out:
                    work.wait()           # returns, or raises the collective's own error
                    return True
            if self._overtaken(deadline):
                return False

    def _collective_allowed(self) -> bool:
        """May a collective of FSDP2's run now? Not once this step failed or a new
        generation exists (it would only wait for a peer that is gone)."""
        if self._failed or self._overtaken_gen() or self.group is None:
            self._failed = True
            return False
        return True

    def _collective_failed(self, why: str) -> None:
        self._note("collective_error", error=why[:200])
        self._failed = True

    def _final_barrier(self) -> bool:
        flag = torch.ones(1)
        ok = self._collective(lambda: self.group.allreduce([flag]))
        self._failed = not ok
        return ok

    # ------------------------------------------------------------------ snapshots
    def _live_recovery(self) -> bool:
        """Recovery from live state needs replicated (data-parallel) model and optimizer:
        the same condition under which replicas are deduplicated."""
        return self.settings.dedup_replicas and self.plan is not None and self.plan.world_size > 1

    def _live_copies(self) -> int:
        """How many ranks hold this rank's state live, itself included: a loss that leaves
        one of them needs no snapshot (--snapshot-every auto counts only the others). The
        world in data parallelism, the replicate dimension in HSDP, 1 for FSDP2; 1 also once
        the rank's part of its private bytes cannot go ahead (`_rank_part_holds`): a loss
        between its optimizer step and the next push then goes back to a snapshot."""
        if not self._live_recovery() or self._part_ok is False:
            return 1
        return self._replicas if self.sharded else self.plan.world_size

    def _holder(self, plan: Plan) -> int:
        """The worker that holds this rank's replica in ``plan`` (`membership.replica_holder`)."""
        return plan.ranks[replica_holder(self.rank, plan.world_size, self.ranks_per_node, self._replicas)]

    def _send_meta(self) -> None:
        """Send this step's private bytes (meta blob: RNG, optimizer scalars, data position;
        model buffers) to the replica holder before the step's compute starts: with them, a
        spare can take over at this very step from a survivor's live state.

        Synchronous on purpose (a few KiB, one round trip): a rank lost during the step has
        always delivered them. A frozen holder is killed by hang detection (1 s), which
        breaks the connection; one that still does not answer within 5 s costs this step's
        live replica only (a recovery then resumes from an older common step). Not sent
        when the rank's part of them, sent as the previous step's collectives finished,
        holds (`_send_rank_part`): the holder completes that part from its own.
        """
        if self._live_recovery() and not self._rank_part_holds():
            self._push_private(self.step, self._private[1], part=False)

    def _push_private(self, step: int, private: dict[str, bytes], part: bool) -> bool:
        try:
            if self._meta_target[0] != self.gen:
                plan = self.plan
                holder = self._holder(plan)
                self._meta_target = (self.gen, self.store.get(keys.worker_addr(holder)).decode(),
                                     plan.roles[self.rank])
            _, addr, role = self._meta_target
            replica.push_meta(addr, role, step, private, min(5.0, self.settings.replica_timeout_s), part=part)
            return True
        except (OSError, replica.ReplicaError, ValueError, RuntimeError) as exc:
            self._note("meta_push_failed", step=step, error=str(exc)[:200])
            return False

    def _send_rank_part(self) -> None:
        """Once a step's collectives are done (the step will commit), send the holder this
        rank's own part of the next step's private bytes (RNG states, buffers: what its
        replicas do not share). Without it, a rank lost between its optimizer step and the
        next step's push left its survivors a step ahead of the private bytes its holder
        had, and the job went back to the newest full snapshot (up to
        ``--snapshot-every`` steps). The part is taken now and checked at the next step's
        start against what the rank then holds: it is sent only once a check has passed
        and never again after one fails (a loop that draws random numbers after
        ``sync_gradients()``); a checked part stands in for that step's push."""
        if not self._live_recovery() or self._part_ok is False:
            return
        self._part = (self.gen, self.step + 1, self.state.rank_private())
        if self._part_ok and not self._push_private(self.step + 1, self._part[2], part=True):
            self._part = None   # not delivered: the next step's start sends all of them

    def _rank_part_holds(self) -> bool:
        """At a step's start: does the part sent for this step hold (see `_send_rank_part`)?
        True only if it was sent, to this generation's holder, and equals this rank's."""
        sent, self._part = self._part, None
        if sent is None or sent[:2] != (self.gen, self.step) or self._part_ok is False:
            return False
        if sent[2] != self.state.rank_private(self._private[1] if self._private[0] == self.step else None):
            self._note("rank_part_off", step=self.step, reason="RNG states or buffers changed "
                       "after sync_gradients(): each step's private bytes go at its start")
            self._part_ok = False
            return False
        was_sent, self._part_ok = bool(self._part_ok), True
        return was_sent

    def _capture_live(self) -> None:
        """Snapshot the live state at the start of ``self.step`` before a recovery.

        The step in flight was cancelled on every rank (no optimizer step ran), so the
        live model and optimizer are the state at the start of ``self.step``; offering it
        lets every member resume there instead of at the last periodic snapshot.
        """
        if self._live_recovery():
            self._capture_step_start(self.settings.replica_timeout_s)

    def _capture_step_start(self, timeout_s: float) -> bool:
        """Put the live model and optimizer, with the start-of-step meta and buffers, in a
        slot as the snapshot of ``self.step`` and publish its manifest; True if done.
        Only valid while no optimizer step of ``self.step`` has run."""
        if not self._live_ok:
            return False
        self._finish_snapshot()
        slot = self.slots.find(self.step)
        if slot is not None and slot.manifest is not None:
            return True
        if slot is None:   # else: captured this step, still being hashed by the pipeline
            if self._private[0] != self.step:
                if not self._at_step_start:
                    return False   # no start-of-step meta and buffers for this step
                # a rank that finished the previous step late, when the generation had
                # already changed: nothing of this step has run, so take them now
                self._private = (self.step, self.state.step_private(self.step))
            try:
                slot = self.slots.capture(self.state, self.step, timeout_s=timeout_s)
            except OSError as exc:
                self._note("live_capture_skipped", step=self.step, reason=str(exc)[:300])
                return False
            if slot is None:
                self._note("live_capture_skipped", step=self.step, reason="no free slot in time")
                return False
            # the cancelled step moved the RNG and the buffers: put the start's back
            self.slots.overwrite(slot, self._private[1])
            self.stats["live_captures"] += 1
        manifest = self.slots.build_manifest(slot, self.rank, self.plan.world_size)
        self.slots.publish_manifest(slot, manifest, self.role)
        return True

    def _time_snapshots(self) -> None:
        """--snapshot-every auto, at a step boundary: feed the step just done to the
        snapshot's cost (`cadence.SnapshotCost`), marked when a slot was being made during
        it (a one-time cost); two steps after a snapshot of the layout with the optimizer's
        state, have the next snapshot's slot made, on a thread, in a step no snapshot is
        measured on (unless snapshots come that often)."""
        made_before, self._made_seen = self._made_seen, self.slots.made
        if self._timed != self.step - 1:
            return   # the first step after a recovery: not measured, and no slot made in it
        self._snap_cost.add(self._last_step_s, self._timed - self._snap_begun,
                            made_slot=made_before != self._made_seen or self.slots.growing)
        self._snap_cost_s = self._snap_cost.cost_s()
        if self.step - self._snap_begun == 2 and self._snap_opt_entries > 0:
            self.slots.grow_one()

    def _maybe_snapshot(self) -> None:
        self._finish_snapshot()
        # The optimizer creates its state at its first step; the slots are then laid out
        # anew and older snapshots are gone, so take one at once rather than k steps later
        # (a rank lost before its next private bytes reach the holder needs a full one).
        new_layout = len(self.state.optimizer.state) != self._snap_opt_entries
        due = self._mode.degraded or self._force_persist or new_layout or cadence.snapshot_due(
            self.step, self.settings.snapshot_every_steps,
            cadence.parse((self._control_keys.at_boundary(self._last_step_s)[keys.SNAPSHOT_CADENCE] or b"").decode()))
        # under auto, a persist point is snapshotted whatever the interval (the window is 1)
        due = due or (self.settings.snapshot_auto and self._persist_due(self.step, consume=False))
        latest = self.slots.find(self.step)
        if not due or (latest is not None and latest.index == self.slots.latest):
            return
        self._snap_opt_entries = len(self.state.optimizer.state)
        self._set_phase("snapshot")
        overlap = self.settings.overlap_snapshots and not self._force_persist and not self._mode.degraded
        t0 = time.perf_counter()
        try:
            cap = self.slots.begin(
                self.state, self.step, timeout_s=self.settings.replica_timeout_s,
                midway=lambda: self.injector.maybe_fire("snapshot", self.rank, self.step),
                overlap=overlap)
        except OSError as exc:   # no host memory for a slot: train on, unprotected
            self._note("snapshot_failed", step=self.step, error=str(exc)[:300])
            return
        finally:
            self.stats["snapshot_stall_s"] += time.perf_counter() - t0
        if cap is None:
            self._note("snapshot_skipped", step=self.step, reason="no free slot in time")
            return
        self._snap_begun = self.step
        self._inflight = (cap, self._persist_root(self.step) if self._persist_due(self.step) else None)
        if self.sharded and overlap:
            # hash and push as soon as the copy is done, while forward and backward run:
            # the step's commit waits for the replica (_await_replica)
            with self.slots.cond:
                cap.slot.readers += 1
            self.pipeline.put(self._handoff(cap, cap.step, self._inflight[1]))
            self._inflight = (cap, _QUEUED)
        if not overlap:
            self._finish_snapshot()

    def _finish_snapshot(self) -> None:
        """Wait for the snapshot in flight (if any) and hand it to the pipeline."""
        if self._inflight is None:
            return
        (cap, persist), self._inflight = self._inflight, None
        t0 = time.perf_counter()
        try:
            slot = cap.wait()
        except RuntimeError as exc:
            self._note("snapshot_failed", step=cap.step, error=str(exc)[:200])
            return
        finally:
            self.stats["snapshot_stall_s"] += time.perf_counter() - t0
            self.clock.add("snapshot_copy_wait", time.perf_counter() - t0)
        self.stats["snapshots"] += 1
        self._snapshot_done(cap.step)
        if persist is _QUEUED:   # handed to the pipeline when it began
            return
        with self.slots.cond:
            slot.readers += 1
        self.pipeline.put(self._handoff(slot, cap.step, persist))

    def _maybe_save_dcp(self) -> None:
        """Sharded state: a DCP checkpoint at the persist cadence, at a `checkpoint_now`
        hint's step and at the end; decided from the step and the store alone, so every rank
        decides alike (a DCP save is a collective), whatever snapshots it already holds."""
        s = self.settings
        if not self.sharded or s.checkpoint_dir is None or self.step <= self._dcp_step:
            return
        controls = self._control_keys.at_boundary(self._last_step_s)
        hinted = (controls[keys.HINT_PERSIST_AT] is not None
                  and int(controls[keys.HINT_PERSIST_AT]) == self.step)
        raw = controls[keys.PERSIST_CADENCE] or b""
        if self._force_persist or hinted or cadence.persist_due(
                self.step, s.persist_every_steps, cadence.parse(raw.decode()), self._persist_window()):
            self._dcp_step = self.step
            self._save_dcp(self.step)

    def _save_dcp(self, step: int) -> None:
        """Sharded state: also write the step as a `torch.distributed.checkpoint` (DCP)
        checkpoint, ``<checkpoint_dir>/step_XXXXXXXX/dcp``, which users load with the tools
        they already have, at any world size (DCP reshards on load). Every rank persists the
        same steps, so every rank is here at the same step; the state is the step's start
        (no forward has run). Keys: ``model`` and ``optim``, as
        `torch.distributed.checkpoint.state_dict.get_state_dict` names them. A failure
        (a peer lost mid-save) is noted and cancels the step like a failed collective."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from seamguard.runtime.manifest import step_dir

        if not self._collective_allowed():
            return
        t0 = time.perf_counter()
        phase = self.progress.current.phase
        self._set_phase("persist")
        try:
            model_sd, optim_sd = get_state_dict(self.state.model, self.state.optimizer)
            # overwrite: a recovery writes the resumed step again (a loss may have cut it short)
            writer = dcp.FileSystemWriter(step_dir(self._persist_root(step), step) / "dcp", overwrite=True)
            with warnings.catch_warnings():   # "overwriting since self.overwrite=True"
                warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
                dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)
        except Exception as exc:  # noqa: BLE001 - garbage from a failed collective, I/O errors
            self._note("dcp_save_failed", step=step, error=f"{type(exc).__name__}: {exc}"[:300])
            self._failed = True
        finally:
            self._set_phase(phase)
            self.stats["dcp_save_s"] = self.stats.get("dcp_save_s", 0.0) + time.perf_counter() - t0
            self.stats["snapshot_stall_s"] += time.perf_counter() - t0

    def _persist_root(self, step: int) -> Path:
        """Where the snapshot of ``step`` is persisted: the job's own directory, or the one the
        control plane moved it to (read on the training thread, from a step every rank agrees on)."""
        raw = self._control_keys.at_boundary(self._last_step_s)[keys.PERSIST_TARGETS] or b""
        root = cadence.target_for(step, self.settings.checkpoint_dir, cadence.parse_targets(raw.decode()))
        if root != self.settings.checkpoint_dir and not under_roots(root, self.settings.roots):
            # the coordinator never publishes such a target: someone else wrote the key
            self._note("checkpoint_target_refused", step=step, dir=str(root)[:200])
            return self.settings.checkpoint_dir
        return root

    def _persist_due(self, step: int, consume: bool = True) -> bool:
        """Whether the snapshot of ``step`` is persisted; ``consume``: a `checkpoint_now`
        hint's step counts as done (False: only asking)."""
        s = self.settings
        if s.checkpoint_dir is None:
            return False
        controls = self._control_keys.at_boundary(self._last_step_s)
        if controls[keys.HINT_PERSIST_AT] is not None:
            self._persist_at = int(controls[keys.HINT_PERSIST_AT])
        if self._force_persist:
            return True
        if self._persist_at > self._hint_persisted and step >= self._persist_at:
            if consume:
                self._hint_persisted = self._persist_at
            return True
        raw = controls[keys.PERSIST_CADENCE] or b""
        if self._mode.degraded:   # every step is snapshotted: a persist point is this step or none
            return cadence.persist_due(step, s.persist_every_steps, cadence.parse(raw.decode()), 1,
                                       stepmodes.DEGRADED_PERSIST_DIVISOR)
        return cadence.persist_due(step, s.persist_every_steps, cadence.parse(raw.decode()), self._persist_window())

    def _persist_window(self) -> int:
        """Steps a persist point may lie before the step that persists it: the snapshot
        interval, as persists are taken from snapshots; 1 under ``--snapshot-every auto``,
        which snapshots every persist point."""
        return 1 if self.settings.snapshot_auto else self.settings.snapshot_every_steps

    def _read_step_mode(self) -> None:
        """The rails to stay off and degraded mode in force at this step (the coordinator
        fixes each change from a step every rank reads first: runtime/stepmodes.py)."""
        raw = self._control_keys.at_boundary(self._last_step_s)[keys.STEP_MODES] or b""
        mode = stepmodes.mode_at(self.step, stepmodes.parse(raw.decode()))
        if (mode.avoid, mode.degraded) != (self._mode.avoid, self._mode.degraded):
            self._note("step_mode", step=self.step, avoid=list(mode.avoid), degraded=mode.degraded)
        self._mode = mode

    def _settle_degraded(self) -> bool:
        """Degraded mode: the step commits only once its start-of-step snapshot is hashed,
        pushed to the replica holder and (if due) persisted, so no overlap is in flight when
        a node at risk fails. False if a new generation overtakes the wait."""
        self._finish_snapshot()
        t0 = time.perf_counter()
        nap_s = 0.0002
        try:
            while self.pipeline.unsettled():
                if self._failed or self._overtaken_gen():
                    self._failed = True
                    return False
                time.sleep(nap_s)
                nap_s = min(0.005, nap_s * 1.5)
        finally:
            self.stats["snapshot_stall_s"] += time.perf_counter() - t0
        return True

    # ------------------------------------------------------------------ persistence
    def _persist_final(self) -> None:
        """Persist the final state (every rank, same step) and wait, bounded, for it."""
        if self.settings.checkpoint_dir is None:
            return
        self._force_persist = True
        self._maybe_snapshot()
        self._maybe_save_dcp()
        self._force_persist = False
        deadline = time.monotonic() + self.settings.recovery_timeout_s
        while time.monotonic() < deadline and (self.pipeline.busy() or any(
                s.readers or s.pinned for s in self.slots.slots)):
            time.sleep(0.01)

    # ------------------------------------------------------------------ heartbeats
    def _beat_store(self) -> dist.Store:
        """A connection of its own to where this worker beats: its node's launcher's store
        (multi-node, etcd), else the job's."""
        return (_connect(*self._node_store, self.settings.recovery_timeout_s) if self._node_store
                else _connect(*self._addr, self.settings.recovery_timeout_s, self._store_url))

    # ------------------------------------------------------------------ published records
    def _overtaken_gen(self) -> bool:
        """A generation newer than this worker's was announced (the follower's Controls)."""
        return self.controls.current.gen_seen > self.gen

    def _set_phase(self, phase: str) -> None:
        """Publish where this worker is (the heartbeat sends it: runtime/records.py)."""
        self.progress.update(phase=phase, step=self.step, gen=self.gen, rank=self.rank)

    def _publish_boundary(self) -> None:
        """At a step boundary: the step begins computing; the last step's split with it."""
        auto = {"snap_cost_s": self._snap_cost_s, "copies": self._live_copies()} \
            if self.settings.snapshot_auto else {}
        self.progress.update(phase="compute", step=self.step, gen=self.gen, rank=self.rank,
                             compute_s=self._compute_s, comm_s=self._comm_s, stall_s=self._stall_s, **auto)

    def _handoff(self, source, step: int, persist: Path | None = None) -> Handoff:
        """A snapshot for the pipeline, with where this rank stands now."""
        plan = self.plan
        holder = self._holder(plan) if plan is not None and plan.world_size > 1 else -1
        return Handoff(source, step, self.gen, self.rank, self.role, self.world_size, holder, persist)

    def _snapshot_done(self, step: int) -> None:
        """The snapshot of ``step`` is complete in host memory."""
        self.progress.swap(lambda p: dataclasses.replace(p, snap_step=max(p.snap_step, step)))

    def _note(self, kind: str, **fields) -> None:
        """Record a worker-side event: on stderr (the node launcher's log) in the launch's
        log format, and in its events file, so recoveries can be explained from the logs."""
        rank = self.progress.current.rank   # the published rank: the pipeline thread notes too
        event = {"event": "worker", "kind": kind, "wid": self.wid, "pid": os.getpid(), "rank": rank, **fields}
        who = f"worker w{self.wid}" + (f" rank {rank}" if rank >= 0 else " (spare)") + f" pid {os.getpid()}"
        self.events.append(self.log.emit(event, who))

    def _title(self) -> None:
        """``ps`` names the worker by rank and generation (or as a spare)."""
        if self.rank >= 0 and self.plan is not None:
            set_title(f"seamguard: rank {self.rank}/{self.plan.world_size} gen {self.gen} (w{self.wid})")
        else:
            set_title(f"seamguard: spare w{self.wid} gen {self.gen}")

    # ------------------------------------------------------------------ recovery
    def _wait(self, key: str, gen: int, timeout_s: float, spare: bool = False) -> bytes:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.store.check([key]):
                return self.store.get(key)
            if self.controls.current.gen_seen > gen:
                raise GenerationChanged(key)
            self._check_job_done()
            if not spare and time.monotonic() > deadline:
                raise RecoveryError(f"worker {self.wid}: no {key!r} within {timeout_s}s")
            time.sleep(0.002)

    def _recover(self) -> None:
        """Follow the coordinator's generations until one recovers cleanly."""
        self._set_phase("recover")
        t0 = time.monotonic()
        self._finish_snapshot()
        self._abandon_group()
        prepare_s = round(time.monotonic() - t0, 4)   # the snapshot in flight, the old group
        while True:
            t_wait = time.monotonic()
            gen = self._next_generation()
            plan = Plan.from_json(self._wait(keys.plan(gen), gen, self.settings.recovery_timeout_s))
            phases = {"prepare": prepare_s, "wait_plan": round(time.monotonic() - t_wait, 4)}  # seconds per phase
            if self.wid not in plan.ranks:
                # a spare, or a replacement spare the plan does not list yet: keep waiting
                if self.wid in plan.spares or self.rank < 0:
                    self.gen, self.plan = gen, None
                    self.progress.update(gen=gen)
                    self._title()
                    continue
                self._note("evacuated", gen=gen)
                self.finish()
                os._exit(3)
            try:
                self._recover_into(gen, plan, phases)
                self.stats["recoveries"] += 1 if gen > 0 else 0
                self._title()
                self._note("recovered" if gen > 0 else "started", gen=gen, step=self.step,
                           seconds=time.monotonic() - t0, phases_s=phases)
                return
            except (JobFinished, JobFailed):
                raise
            except (GenerationChanged, RecoveryError, replica.ReplicaError, CheckpointError,
                    RuntimeError, OSError) as exc:
                self._note("recovery_failed", gen=gen, error=str(exc)[:300])
                try:
                    self.store.set(keys.recovered(gen, self.wid),
                                   json.dumps({"ok": False, "error": str(exc)[:300]}))
                except RuntimeError:
                    pass
                self._abandon_group()
                self.gen = gen
                self.progress.update(gen=gen)

    def _check_job_done(self) -> None:
        if self.store.check([keys.JOB_DONE]):
            if self.store.get(keys.JOB_DONE) != b"ok":
                raise JobFailed("the coordinator gave the job up; see the launcher's events")
            raise JobFinished()

    def _next_generation(self) -> int:
        """Block (bounded unless a spare) until a generation newer than ours exists."""
        spare = self.plan is None
        deadline = time.monotonic() + self.settings.recovery_timeout_s
        while True:
            if self.store.check([keys.GENERATION]):
                g = int(self.store.get(keys.GENERATION))
                if g > self.gen:
                    return g
            self._check_job_done()
            left_s = deadline - time.monotonic()
            if not spare and left_s <= 0:
                raise RecoveryError(f"worker {self.wid}: coordinator announced no new generation "
                                    f"within {self.settings.recovery_timeout_s}s")
            try:  # block until the coordinator wakes us (next generation or job end): no polling
                self.store.wait([keys.wake(self.gen + 1)],
                                datetime.timedelta(seconds=60.0 if spare else max(0.01, left_s)))
            except dist.DistStoreError:
                pass

    def _recover_into(self, gen: int, plan: Plan, phases: dict[str, float]) -> None:
        """Recover into generation ``gen``; the seconds of each phase go into ``phases``."""
        timeout = self.settings.recovery_timeout_s
        t = time.monotonic()

        def lap(name: str) -> None:
            nonlocal t
            now = time.monotonic()
            phases[name], t = round(now - t, 4), now
        rank, role = plan.ranks.index(self.wid), plan.roles[plan.ranks.index(self.wid)]
        if self.sharded and rank != self._mesh_rank:
            raise JobFailed(f"generation {gen} moves worker {self.wid} from rank {self._mesh_rank} "
                            f"to {rank}: an FSDP2 job keeps its ranks (it needs a spare per loss; "
                            f"to change its size, restart from a checkpoint)")
        if plan.max_step is None:   # a rollback throws the live state away
            self._capture_live()
        orphans = {}
        if role in plan.replaced and self.role < 0:
            self._adopt(plan.replaced[role], role)
            orphans = {str(role): sorted(self._orphans)}
        self.store.set(keys.have(gen, self.wid), json.dumps(
            {"step": self.step, "own": self.slots.steps(),
             "replicas": self.replicas.valid_steps(live=self.settings.dedup_replicas),
             "orphans": orphans}))
        lap("report_holdings")
        resume = json.loads(self._wait(keys.resume(gen), gen, timeout))
        lap("wait_resume_decision")
        self.gen, self.plan, self.rank, self.role = gen, plan, rank, role
        self.progress.update(gen=gen, rank=rank)
        step, source = int(resume["step"]), resume["source"]
        if source == "none":
            raise JobFailed(f"generation {gen}: no consistent state to recover from")
        self._live_ok = False  # until this recovery completes, the live state is in flux
        if source == "memory":
            self._restore_memory(plan, role, step)
        elif source == "disk":
            self._restore_disk(step, int(resume["world_size"]), rank,
                               Path(resume["dir"]) if resume.get("dir") else None)
        lap("restore_state")
        self.group = dist.ProcessGroupGloo(
            dist.PrefixStore(keys.group_prefix(gen), self.store), rank, plan.world_size,
            datetime.timedelta(seconds=self.settings.collective_timeout_s))
        if self.sharded:
            self._resilient.rebind(self.group)
            self._form_subgroups(gen, rank)
        lap("form_group")
        if self.settings.rails:
            self._close_rails()
            self._rails = RailSync(self.store, gen, rank, plan.world_size, self.settings.rails, timeout)
            lap("form_rails")
        if source == "fresh" and not self.sharded:
            self._broadcast_model()
        checksum = state_checksum(self.state.model, params_only=True)
        lap("checksum")
        self._verify_checksums(checksum)
        lap("verify_checksums")
        self.step = step
        self._dcp_step = step - 1   # every member writes the resumed step again if it is due
        self._failed = False
        # every member starts the guard's history afresh, so their verdicts stay equal
        self._norm_history, self._rejected, self._redo = [], None, False
        self._applied = -1   # a step the optimizer began before a rollback is to come again
        self._live_ok = self._at_step_start = True
        self._release_orphans()
        self.slots.forget_after(step)
        self.replicas.forget_after(step)
        if source != "memory":
            self.replicas.clear()
        self._set_phase("idle")
        # re-replicate the restored step to the new ring successor before moving on
        slot = self.slots.find(step)
        if slot is not None and slot.manifest is not None:
            with self.slots.cond:
                slot.readers += 1
            self.pipeline.put(self._handoff(slot, step))  # replicate, do not persist
        lap("release_and_rereplicate")
        self.store.set(keys.recovered(gen, self.wid),
                       json.dumps({"ok": True, "checksum": checksum, "step": step}))
        lap("report_recovered")

    def _adopt(self, lost_wid: int, role: int) -> None:
        """List the snapshots the lost worker of ``role`` left in this node's shared
        memory (from their manifests; the bytes are verified only if one is used)."""
        key = keys.worker_slots(lost_wid)
        if self.store.check([key]):
            self._orphans = find_orphans(self.store.get(key).decode(), role)

    def _release_orphans(self) -> None:
        """Delete a dead worker's slots once recovered (else they would hold host memory
        for the rest of the job), on a thread of their own: the kernel frees a slot's pages
        as it is unlinked, tens of milliseconds for a few slots of a large shard, which the
        job's first step after the recovery need not wait for."""
        paths = [p for _, path in self._orphans.values() for p in (path, path.with_name(path.name + ".json"))]
        self._orphans = {}
        if paths:
            threading.Thread(target=_unlink_all, args=(paths,), name="sg-release-orphans", daemon=True).start()

    def _restore_memory(self, plan: Plan, role: int, step: int) -> None:
        if role in plan.holders and step in self._orphans:
            # the snapshot the lost worker left in shared memory (chosen when no replica of
            # that step survived, e.g. its holder died too)
            manifest, path = self._orphans[step]
            try:
                payload = read_orphan(manifest, path, into=self.slots.staging(manifest.total_bytes))
            except (OSError, ValueError) as exc:
                raise RecoveryError(f"adopted snapshot unusable: {exc}") from exc
            tensors, meta = tensors_of(manifest, payload)
        elif role not in plan.holders:
            slot = self.slots.find(step)
            if slot is None:
                raise RecoveryError(f"worker {self.wid}: own snapshot of step {step} is gone")
            manifest = slot.manifest or self.slots.build_manifest(slot, self.rank, plan.world_size)
            tensors, meta = tensors_of(manifest, slot.array)
        else:
            return self._fetch_into_slot(plan, role, step)
        restored = self.state.restore(tensors, meta)
        self.sampler.check_state(restored["data"])

    def _fetch_into_slot(self, plan: Plan, role: int, step: int) -> None:
        """Restore ``role``'s replica of ``step`` from its holder, fetched straight into a
        snapshot slot that then is this worker's snapshot of the step
        (`SlotStore.receiving`): its first step takes no snapshot of its own (before, an
        HSDP spare's first step copied its 88 MB shard into a fresh slot). Without a slot
        (no host memory, none free in time) the replica is fetched as before."""
        holder = plan.holders[role]
        addr = self.store.get(keys.worker_addr(holder)).decode()
        slot = None

        def into(manifest) -> np.ndarray | None:
            nonlocal slot
            try:
                slot = self.slots.receiving(manifest, self.settings.replica_timeout_s)
            except OSError as exc:
                self._note("snapshot_failed", step=step, error=str(exc)[:300])
            return None if slot is None else slot.array

        try:
            manifest, payload = replica.fetch(addr, role, step, self.settings.replica_timeout_s, into=into)
            self._note("state_received", role=role, holder=holder, step=step, bytes=manifest.total_bytes)
            restored = self.state.restore(*tensors_of(manifest, payload))
            self.sampler.check_state(restored["data"])
        except BaseException:
            if slot is not None:
                self.slots.release(slot)
            raise
        if slot is not None:
            self.slots.kept(slot, manifest, role, self.rank, plan.world_size)
            self._snap_opt_entries = len(self.state.optimizer.state)
            self._snapshot_done(step)

    def _restore_disk(self, step: int, ckpt_world: int, rank: int, root: Path | None) -> None:
        root = root or self.settings.checkpoint_dir
        if root is None:
            raise RecoveryError("resume from disk requested but no checkpoint_dir is set")
        if Path(root) != self.settings.checkpoint_dir and not under_roots(root, self.settings.roots):
            raise RecoveryError(f"resume from {root} refused: not under the job's checkpoint roots")
        # data-parallel state is replicated: a rank beyond the saved world reads rank 0
        manifest, payload = read_checkpoint(root, step, rank if rank < ckpt_world else 0)
        tensors, meta = tensors_of(manifest, payload)
        restored = self.state.restore(tensors, meta)
        self.sampler.check_state(restored["data"])
        self.slots.forget_after(-1)
        self._note("restored_from_disk", step=step)

    def _broadcast_model(self) -> None:
        for t in self.state.model.state_dict().values():
            if not self._collective(lambda t=t: self.group.broadcast(t, 0)):
                raise RecoveryError("initial broadcast of the model failed")

    def _verify_checksums(self, checksum: str) -> None:
        """Every rank checks that the ranks which must hold identical parameters do
        (`identical_ranks`): a restore that went wrong anywhere stops the job here."""
        groups = identical_ranks(self.plan.world_size, self._replicas if self.sharded else 0)
        if not groups:   # FSDP over one dimension: shards differ; each was hash-verified on restore
            return
        mine = torch.tensor([int(checksum, 16) - (1 << 63)], dtype=torch.int64)
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.plan.world_size)]
        if not self._collective(lambda: self.group.allgather([out], [mine])):
            raise RecoveryError("checksum exchange failed")
        sums = [int(o) for o in out]
        for ranks in groups:
            if len({sums[r] for r in ranks}) > 1:
                raise RecoveryError(f"parameter checksums of ranks {ranks} disagree after recovery to "
                                    f"gen {self.gen}: {[hex(sums[r] + (1 << 63)) for r in ranks]}")

    def _close_rails(self) -> None:
        if self._rails is not None:
            self._rails.close()
            self._graveyard.append(self._rails)  # its gloo groups may still wait on a dead peer
            self._rails = None

    def _form_subgroups(self, gen: int, rank: int) -> None:
        """HSDP: this generation's gloo subgroup for each mesh dimension (under its store
        prefix), and the mesh's process groups pointed at them."""
        timeout = datetime.timedelta(seconds=self.settings.collective_timeout_s)
        for name, ranks in self._mesh_dims:
            sub = dist.ProcessGroupGloo(
                dist.PrefixStore(f"{keys.group_prefix(gen)}sub/{name}/", self.store),
                ranks.index(rank), len(ranks), timeout)
            self._subgroups[name] = sub
            self._mesh_groups[name].rebind(sub)

    def _abandon_group(self) -> None:
        self._close_rails()
        for sub in self._subgroups.values():
            try:
                sub.abort()
            except RuntimeError:
                pass
            self._graveyard.append(sub)
        self._subgroups = {}
        if self.group is not None:
            try:
                self.group.abort()
            except RuntimeError:
                pass
            self._graveyard.append(self.group)
            self.group = None
