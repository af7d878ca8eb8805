"""The training-process side of the runtime: `Runtime`, the step as a transaction.

A training script creates one `Runtime` (via `seamguard.runtime.init()`), registers its
model, optimizer and sampler, and iterates `steps()`. Each step is a transaction: the
gradient collective in `sync_gradients()` never raises into model code; a failure (a
peer's socket closed, the coordinator announced a new generation, the collective timed
out) cancels the step and the next iteration of `steps()` recovers: the broken group is
abandoned, every member restores the same step (own snapshot, a peer replica for a
spare, or the last verified checkpoint on storage), a new gloo group is formed under a
new store prefix, parameter checksums are compared, and training goes on.

`Runtime` is the façade and keeps the step transaction itself (the step loop, gradient
sync, the step guard, collectives); its parts each have one job: the membership follower
(runtime/follower.py: heartbeat, generations, control keys), the snapshot schedule and
pipeline (runtime/schedule.py on this thread, runtime/pipeline.py on its own) and
recovery (runtime/recovery.py). Threads exchange the immutable records of
runtime/records.py, never attributes; time comes from the injected clock
(runtime/clock.py). docs/runtime.md opens with the map.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import resource
import socket
import sys
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist

from seamguard.runtime import chaos, fsdp, keys, replica, shm, stepmodes
from seamguard.runtime import store as jobstore
from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.clock import SYSTEM_CLOCK, Clock
from seamguard.runtime.eventlog import EventLog, name_threads_in_os, set_title
from seamguard.runtime.follower import ControlKeys, MembershipFollower
from seamguard.runtime.guard import GuardSettings, judge_gradients
from seamguard.runtime.membership import Plan
from seamguard.runtime.pipeline import SnapshotPipeline
from seamguard.runtime.profile import PhaseClock
from seamguard.runtime.rail_sync import RailSync
from seamguard.runtime.recovery import JobFinished, Recovery
from seamguard.runtime.records import Board, Controls, Progress
from seamguard.runtime.settings import RuntimeSettings, StoreUrl, parse_store_url
from seamguard.runtime.shm import LAUNCHER_PID_ENV
from seamguard.runtime.schedule import SnapshotSchedule
from seamguard.runtime.snapshot import SlotStore, TrainingState

EXIT_SUSPECT = 75
"""Exit status of a rank that left because its gradient stayed anomalous on recompute."""


TCP_STORE = StoreUrl("tcp")


def _connect(host: str, port: int, timeout_s: float, url: StoreUrl = TCP_STORE) -> dist.Store:
    return jobstore.connect(url, host, port, timeout_s)


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
        self.step = 0
        self.state: TrainingState | None = None
        self.sampler: GlobalBatchSampler | None = None
        self._flat: torch.Tensor | None = None
        self._failed = False
        self._live_ok = False  # the live model/optimizer hold exactly the start of self.step
        self._private: tuple[int, dict[str, bytes]] = (-1, {})  # start-of-step meta + buffers
        self._compute_s = 0.0   # the last step's split, for the job's metrics: compute before the
        self._comm_s = 0.0      # gradient collective, the collective itself, and the time the step
        self._stall_s = 0.0     # waited for its snapshot copy (published at each step boundary)
        self._t_compute = 0.0
        self._local_n = 0
        self._timed: int | None = None   # step whose boundary was the last one passed (None: none since a recovery)
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
        self.recovery = Recovery(self)
        name_threads_in_os()   # top -H, perf and /proc tell the runtime's threads apart
        self.pipeline = SnapshotPipeline(
            self.slots, settings, self.progress,
            lambda: _connect(*self._addr, settings.recovery_timeout_s, store_url),
            self.server.host, self.injector, self._note, self.clock, run_id)
        self.snapshots = SnapshotSchedule(self, self.pipeline)
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
        self.snapshots.finish_snapshot()
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
                        and self._applied != self.step and self.snapshots.capture_step_start(timeout_s=5.0))
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
            rank, world_size = self.recovery.await_rank()
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
            self.recovery.recover()  # generation 0, or a spare waiting for a rank
        except JobFinished:
            return
        t_last = self.time.perf_counter()
        while True:
            if self._failed or self._overtaken_gen():
                try:
                    self.recovery.recover()
                except JobFinished:
                    return  # finished without us (we had already been replaced)
                t_last = self.time.perf_counter()   # a recovery is no step: read CONTROL_N afresh
                self._timed = None
            if self.step >= total_steps:
                if self._final_barrier():
                    break
                continue
            t_boundary = self.time.perf_counter()
            self._last_step_s, t_last = t_boundary - t_last, t_boundary
            if self.settings.snapshot_auto:
                self.snapshots.time_snapshots()
            self._timed = self.step
            if self._private[0] != self.step and (self.settings.step_guard or self.snapshots.live_recovery()
                                                  or self.settings.crash_capture):
                self._private = (self.step, self.state.step_private(self.step))
            self._read_step_mode()
            self.snapshots.send_meta()
            stall_before_s = self.stats["snapshot_stall_s"]
            with self.clock.phase("snapshot_begin"):
                self.snapshots.maybe_snapshot()
            self.snapshots.maybe_save_dcp()
            self.injector.maybe_fire("step", self.rank, self.step, forget_memory=self.slots.close)
            self.clock.add("step_boundary", self.time.perf_counter() - t_boundary)
            self._publish_boundary()
            self._t_compute = self.time.perf_counter()
            self._at_step_start = False
            idx = self.sampler.indices(self.step, self.rank, self.world_size)
            self._local_n = len(idx)
            t_yield = self.time.perf_counter()
            yield self.step, idx
            self.clock.add("step_body", self.time.perf_counter() - t_yield)
            self._stall_s = self.stats["snapshot_stall_s"] - stall_before_s   # published at the next boundary
            if self._redo:   # rejected by the step guard: the same step again, from its start
                self._redo = False
                self.state.restore_private(self._private[1])
            elif not self._failed:
                self.step += 1
                self._at_step_start = True
        self._set_phase("done")
        self.snapshots.persist_final()
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
            self.snapshots.finish_snapshot()
        if ok:
            self.snapshots.send_rank_part()
        return ok

    def _sync_gradients(self) -> bool:
        assert self.sampler is not None and self.plan is not None
        self._compute_s = self.time.perf_counter() - self._t_compute
        if self._failed or self._overtaken_gen():
            self._failed = True
            return False
        if self.sharded:   # FSDP2 reduce-scattered the gradients in backward, on our group
            return self.snapshots.await_replica()
        if self._mode.degraded and not self.snapshots.settle_degraded():
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
        t_comm = self.time.perf_counter()
        ok = self._rail_allreduce() if self._rails is not None else \
            self._collective(lambda: self.group.allreduce([self._flat]))
        self._comm_s = self.time.perf_counter() - t_comm
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
        self.snapshots.finish_snapshot()
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
        deadline = self.time.monotonic() + self.settings.collective_timeout_s
        t0 = self.time.perf_counter()
        try:
            if not self._wait_in_gloo(work, deadline):
                self._note("collective_cancelled", reason="new generation"
                           if self._overtaken_gen() else "timeout")
                self._failed = True
                return False
            self.clock.add("collective_wait", self.time.perf_counter() - t0)
            return True
        except RuntimeError as exc:
            self._note("collective_error", error=str(exc)[:200])
            self._failed = True
            return False
        finally:
            # FSDP2's collectives run inside the forward and backward: back to computing
            self._set_phase(phase if self.sharded and phase != "collective" else "idle")

    def _overtaken(self, deadline: float) -> bool:
        return self._overtaken_gen() or self.time.monotonic() > deadline

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

















    def _read_step_mode(self) -> None:
        """The rails to stay off and degraded mode in force at this step (the coordinator
        fixes each change from a step every rank reads first: runtime/stepmodes.py)."""
        raw = self._control_keys.at_boundary(self._last_step_s)[keys.STEP_MODES] or b""
        mode = stepmodes.mode_at(self.step, stepmodes.parse(raw.decode()))
        if (mode.avoid, mode.degraded) != (self._mode.avoid, self._mode.degraded):
            self._note("step_mode", step=self.step, avoid=list(mode.avoid), degraded=mode.degraded)
        self._mode = mode


    # ------------------------------------------------------------------ persistence

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
        auto = {"snap_cost_s": self.snapshots.snap_cost_s, "copies": self.snapshots.live_copies()} \
            if self.settings.snapshot_auto else {}
        self.progress.update(phase="compute", step=self.step, gen=self.gen, rank=self.rank,
                             compute_s=self._compute_s, comm_s=self._comm_s, stall_s=self._stall_s, **auto)



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














