"""The training-process side of the runtime: `Runtime`, the step as a transaction.

A training script creates one `Runtime` (via `seamguard.runtime.init()`), registers its
model, optimizer and sampler, and iterates `steps()`. Each step is a transaction: the
gradient collective in `sync_gradients()` never raises into model code; a failure (a
peer's socket closed, the coordinator announced a new generation, the collective timed
out) cancels the step and the next iteration of `steps()` recovers: the broken group is
abandoned, every member restores the same step (own snapshot, a peer replica for a
spare, or the last verified checkpoint on storage), a new gloo group is formed under a
new store prefix, parameter checksums are compared, and training goes on.

`Runtime` is the façade and keeps the step transaction itself (the step loop and its
state: step, generation, rank, group, the failed latch); its parts each have one job: the
collectives and their cancellation (runtime/collectives.py), the gradient average and
step guard (runtime/gradients.py), the FSDP2 mesh (runtime/mesh.py), the membership
follower (runtime/follower.py: heartbeat, generations, control keys), the snapshot
schedule and pipeline (runtime/schedule.py on this thread, runtime/pipeline.py on its
own) and recovery (runtime/recovery.py). Threads exchange the immutable records of
runtime/records.py, never attributes; time comes from the injected clock
(runtime/clock.py). docs/runtime.md opens with the map.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import threading
from collections.abc import Callable
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist

from seamguard.runtime import chaos, keys, replica, shm, stepmodes
from seamguard.runtime import store as jobstore
from seamguard.runtime.clock import SYSTEM_CLOCK, Clock
from seamguard.runtime.collectives import Collectives
from seamguard.runtime.data import GlobalBatchSampler
from seamguard.runtime.eventlog import EventLog, name_threads_in_os, set_title
from seamguard.runtime.follower import ControlKeys, MembershipFollower
from seamguard.runtime.gradients import EXIT_SUSPECT, GradientSync, StepGuard
from seamguard.runtime.membership import Plan
from seamguard.runtime.mesh import Mesh
from seamguard.runtime.pipeline import SnapshotPipeline
from seamguard.runtime.profile import PhaseClock
from seamguard.runtime.recovery import JobFinished, Recovery
from seamguard.runtime.records import Board, Controls, Progress
from seamguard.runtime.schedule import SnapshotSchedule
from seamguard.runtime.settings import RuntimeSettings, StoreUrl, parse_store_url
from seamguard.runtime.shm import LAUNCHER_PID_ENV
from seamguard.runtime.snapshot import SlotStore, TrainingState

__all__ = ["EXIT_SUSPECT", "Runtime"]

TCP_STORE = StoreUrl("tcp")


def _connect(host: str, port: int, timeout_s: float, url: StoreUrl = TCP_STORE) -> dist.Store:
    return jobstore.connect(url, host, port, timeout_s)


def _host_port(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def _opener(where: tuple[str, int], timeout_s: float, url: StoreUrl = TCP_STORE) -> Callable[[], dist.Store]:
    """Opens a connection of its own to ``where``, for a thread of the runtime's: bound to
    its values now, so that thread reads nothing of the training thread's later."""
    return lambda: _connect(*where, timeout_s, url)


class Runtime:
    """One training process of a seamguard job (see module docstring and docs/runtime.md)."""

    def __init__(self, wid: int, master_addr: str, master_port: int, ranks_per_node: int,
                 settings: RuntimeSettings, run_id: str, advertise_host: str = "127.0.0.1",
                 store_url: StoreUrl = TCP_STORE, node_store: tuple[str, int] | None = None,
                 launcher_pid: int | None = None, mirror_lag_s: float = 0.0, clock: Clock = SYSTEM_CLOCK,
                 profile: bool = False, where: tuple[str, int] = ("localhost", 0)):
        """``mirror_lag_s``: how much older the node's mirror of the control counter may be
        (a node beat, when aggregated); ``clock``: where every part reads the time;
        ``profile``: add up where the time goes (SEAMGUARD_PROFILE=1; runtime/profile.py),
        fixed before the runtime's threads start; ``where``: (host as the topology names
        it, local GPU slot), which the heartbeat reports for the job's metrics."""
        self.wid = wid
        self.time = clock
        self.settings = settings
        self.ranks_per_node = ranks_per_node
        job_store = _opener((master_addr, master_port), settings.recovery_timeout_s, store_url)
        self.store = job_store()
        self.clock = PhaseClock(profile, clock)   # where the time goes (runtime/profile.py)
        # named by this process and its launcher: a later launcher sweeps them once both are gone (runtime/shm.py)
        self.slots = SlotStore(shm.slot_prefix(run_id, os.getpid(), wid, launcher_pid, shm.pid_namespace()),
                               settings.snapshot_slots, clock=self.clock)
        self.replicas = replica.ReplicaStore(self.slots)
        self.server = replica.ReplicaServer(self.replicas, advertise_host, settings.replica_timeout_s,
                                            settings.dedup_replicas, phases=self.clock)
        self.injector = chaos.from_env_without_store()
        self.plan: Plan | None = None
        self.gen = -1
        self.rank = -1
        self.role = -1  # whose state this worker continues; fixed once assigned
        self.group: dist.ProcessGroupGloo | None = None
        self._mode = stepmodes.NORMAL  # rails avoided, degraded: the control plane's, at this step
        # the records this thread shares with the membership follower's (records.py)
        self.progress: Board[Progress] = Board(Progress())
        self.controls: Board[Controls] = Board(Controls())
        self._control_keys = ControlKeys(self.store, self.controls, settings.heartbeat_interval_s,
                                         mirror_lag_s, clock)
        self._last_step_s = 0.0   # wall time between the last two step boundaries
        self.step = 0
        self.state: TrainingState | None = None
        self.sampler: GlobalBatchSampler | None = None
        self._failed = False
        self._live_ok = False  # the live model/optimizer hold exactly the start of self.step
        self._private: tuple[int, dict[str, bytes]] = (-1, {})  # start-of-step meta + buffers
        self._compute_s = 0.0   # the last step's split, for the job's metrics: compute before the
        self._stall_s = 0.0     # gradient collective, and the time the step waited for its
        self._t_compute = 0.0   # snapshot copy (published at each step boundary, with comm_s)
        self._local_n = 0
        self._timed: int | None = None   # step whose boundary was the last one passed (None: none since a recovery)
        self._applied = -1  # newest step the optimizer began to apply
        self._at_step_start = False  # between steps: live state = start of self.step
        self._prev_excepthook = None
        self.stats = {"snapshots": 0, "snapshot_stall_s": 0.0, "recoveries": 0, "live_captures": 0,
                      "steps_rejected": 0}   # the training thread's; the pipeline counts its own
        self.log = EventLog.from_environment()
        self._log_lock = threading.Lock()   # the pipeline's thread notes events too
        self.store.set(keys.worker_addr(wid), self.server.address)
        self.store.set(keys.worker_pid(wid), str(os.getpid()))
        self.store.set(keys.worker_slots(wid), self.slots.prefix)
        self._start_parts(job_store, node_store, run_id, where)

    def _start_parts(self, job_store: Callable[[], dist.Store], node_store: tuple[str, int] | None,
                     run_id: str, where: tuple[str, int]) -> None:
        """The parts of the façade (docs/runtime.md, module map); the threads of the
        pipeline and the follower get what they need now, before they start."""
        settings = self.settings
        self.collectives = Collectives(self)
        self.guard = StepGuard(self)
        self.gradients = GradientSync(self, self.guard)
        self.mesh = Mesh(self)
        self.recovery = Recovery(self)
        name_threads_in_os()   # top -H, perf and /proc tell the runtime's threads apart
        self.pipeline = SnapshotPipeline(self.slots, settings, self.progress, job_store, self.server.host,
                                         self.injector, self._note, self.clock, run_id)
        self.snapshots = SnapshotSchedule(self, self.pipeline)
        # heartbeats go to the node's launcher (multi-node, etcd), else to the job's store
        beat_store = _opener(node_store, settings.recovery_timeout_s) if node_store else job_store
        self.follower = MembershipFollower(
            self.wid, beat_store, settings.heartbeat_interval_s, self.progress, self.controls, where,
            self.time, self.clock, settings.snapshot_auto, self.pipeline.prepare_spare_slot)
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
        return cls(int(env["SEAMGUARD_WORKER_ID"]), env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                   int(env.get("SEAMGUARD_RANKS_PER_NODE", env.get("LOCAL_WORLD_SIZE", "1"))),
                   settings, env.get("SEAMGUARD_RUN_ID", "seamguard"),
                   env.get("SEAMGUARD_ADVERTISE_HOST", "127.0.0.1"),
                   parse_store_url(env.get("SEAMGUARD_STORE", ""), env.get("SEAMGUARD_RUN_ID", "seamguard")),
                   _host_port(env.get("SEAMGUARD_NODE_STORE", "")),
                   int(env.get(LAUNCHER_PID_ENV, "0")) or None, float(env.get("SEAMGUARD_NODE_BEAT_S", "0")),
                   profile=env.get("SEAMGUARD_PROFILE") == "1",
                   where=(env.get("SEAMGUARD_NODE_NAME") or socket.gethostname().split(".")[0],
                          int(env.get("LOCAL_RANK", "0"))))

    def register(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 sampler: GlobalBatchSampler) -> None:
        """Hand the runtime what it snapshots, replicates and restores."""
        self.state = TrainingState(model, optimizer, sampler.state_dict)
        # a snapshot still copying must be complete before the optimizer changes its source
        optimizer.register_step_pre_hook(lambda *_: self._before_optimizer())
        optimizer.register_step_post_hook(
            lambda *_: self.injector.maybe_fire("optimizer", self.rank, self.step))
        self.sampler = sampler
        self.gradients.register(model)   # sized per generation: gradients + one guard lane per rank
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
        return self.mesh.built

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
        return self.mesh.build(replicate)

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
                if self.collectives.final_barrier():
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
            if self.guard.redo:   # rejected by the step guard: the same step again, from its start
                self.guard.redo = False
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
            self.injector.maybe_fire("reduced", self.rank, self.step)
            if self.sharded:   # FSDP2's collectives ran in backward: its part goes once they are done
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
        self.snapshots.send_rank_part()   # before the all-reduce: see its docstring
        return self.gradients.average(self._local_n / self.sampler.global_batch)

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

    # ------------------------------------------------------------------ step modes
    def _read_step_mode(self) -> None:
        """The rails to stay off and degraded mode in force at this step (the coordinator
        fixes each change from a step every rank reads first: runtime/stepmodes.py)."""
        raw = self._control_keys.at_boundary(self._last_step_s)[keys.STEP_MODES] or b""
        mode = stepmodes.mode_at(self.step, stepmodes.parse(raw.decode()))
        if (mode.avoid, mode.degraded) != (self._mode.avoid, self._mode.degraded):
            self._note("step_mode", step=self.step, avoid=list(mode.avoid), degraded=mode.degraded)
        self._mode = mode

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
                             compute_s=self._compute_s, comm_s=self.gradients.comm_s, stall_s=self._stall_s, **auto)

    def _note(self, kind: str, **fields) -> None:
        """Record a worker-side event: on stderr (the node launcher's log) in the launch's
        log format, and in its events file, so recoveries can be explained from the logs."""
        rank = self.progress.current.rank   # the published rank: the pipeline thread notes too
        event = {"event": "worker", "kind": kind, "wid": self.wid, "pid": os.getpid(), "rank": rank, **fields}
        who = f"worker w{self.wid}" + (f" rank {rank}" if rank >= 0 else " (spare)") + f" pid {os.getpid()}"
        with self._log_lock:
            self.log.emit(event, who)

    def _title(self) -> None:
        """``ps`` names the worker by rank and generation (or as a spare)."""
        if self.rank >= 0 and self.plan is not None:
            set_title(f"seamguard: rank {self.rank}/{self.plan.world_size} gen {self.gen} (w{self.wid})")
        else:
            set_title(f"seamguard: spare w{self.wid} gen {self.gen}")
