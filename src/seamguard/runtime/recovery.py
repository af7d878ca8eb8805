"""Recovery: a worker's way from a failed step or a new generation back to training.

The coordinator announces a generation with a plan (who is which rank, who holds whose
replica) and, once every member reported what it holds, the step to resume from and where
it comes from (own snapshot, a peer's replica, a dead worker's slots left in shared
memory, or the last verified checkpoint on storage). ``Recovery.recover`` follows those
generations on the training thread until one succeeds: it abandons the broken process
groups, restores the state, forms the new gloo group (and rails, HSDP subgroups) under
the generation's store prefix, checks parameter checksums across the ranks that must
agree, and re-replicates the restored step. It is the step transaction's (runtime/worker.py)
part for recovery: it runs on the training thread and sets that thread's state.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from seamguard.runtime import keys, replica
from seamguard.runtime.checksum import state_checksum
from seamguard.runtime.manifest import CheckpointError, read_checkpoint
from seamguard.runtime.membership import Plan, identical_ranks
from seamguard.runtime.rail_sync import RailSync
from seamguard.runtime.settings import RAIL_MODES, under_roots
from seamguard.runtime.packing import find_orphans, read_orphan, tensors_of


class RecoveryError(Exception):
    """A recovery attempt failed; the coordinator plans another (eventually from disk)."""


class GenerationChanged(Exception):
    """The coordinator moved to a newer generation while this process was waiting."""


class JobFinished(Exception):
    """The job ended while this process was waiting (a spare that was never needed)."""


class JobFailed(RuntimeError):
    """The coordinator gave the job up (no consistent state left); see the launcher log."""


def _unlink_all(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


class Recovery:
    """Recovery of one worker (module docstring): the training thread calls ``recover()``
    when its step failed or a newer generation was announced, and ``await_rank()`` when
    FSDP2 needs the rank before the model is sharded."""

    def __init__(self, rt) -> None:
        """``rt``: the worker's step transaction (runtime/worker.py), whose state a
        recovery sets: the generation, plan, rank, role, step and process groups."""
        self.rt = rt
        self._time = rt.time
        self._orphans: dict[int, tuple] = {}  # step -> (manifest, path) a dead worker left
        self._graveyard: list = []  # abandoned groups: destroying one can block on a dead peer

    def await_rank(self) -> tuple[int, int]:
        """(rank, world size) of the first generation that gives this worker a rank;
        a spare waits for it (it counts as ready: everything is imported)."""
        rt = self.rt
        rt.store.set(keys.ready(rt.wid), "1")
        while True:
            gen = self._next_generation()
            try:
                plan = Plan.from_json(self._wait(keys.plan(gen), gen,
                                                 rt.settings.recovery_timeout_s, spare=True))
            except GenerationChanged:
                continue
            if rt.wid in plan.ranks:
                return plan.ranks.index(rt.wid), plan.world_size
            rt.gen = gen   # not in this one: wait for a newer generation
            rt.progress.update(gen=gen)

    def _wait(self, key: str, gen: int, timeout_s: float, spare: bool = False) -> bytes:
        rt = self.rt
        deadline = self._time.monotonic() + timeout_s
        while True:
            if rt.store.check([key]):
                return rt.store.get(key)
            if rt.controls.current.gen_seen > gen:
                raise GenerationChanged(key)
            self._check_job_done()
            if not spare and self._time.monotonic() > deadline:
                raise RecoveryError(f"worker {rt.wid}: no {key!r} within {timeout_s}s")
            self._time.sleep(0.002)

    def recover(self) -> None:
        """Follow the coordinator's generations until one recovers cleanly."""
        rt = self.rt
        rt._set_phase("recover")
        t0 = self._time.monotonic()
        rt.snapshots.finish_snapshot()
        self._abandon_group()
        prepare_s = round(self._time.monotonic() - t0, 4)   # the snapshot in flight, the old group
        while True:
            t_wait = self._time.monotonic()
            gen = self._next_generation()
            plan = Plan.from_json(self._wait(keys.plan(gen), gen, rt.settings.recovery_timeout_s))
            phases = {"prepare": prepare_s, "wait_plan": round(self._time.monotonic() - t_wait, 4)}  # seconds per phase
            if rt.wid not in plan.ranks:
                # a spare, or a replacement spare the plan does not list yet: keep waiting
                if rt.wid in plan.spares or rt.rank < 0:
                    rt.gen, rt.plan = gen, None
                    rt.progress.update(gen=gen)
                    rt._title()
                    continue
                rt._note("evacuated", gen=gen)
                rt.finish()
                os._exit(3)
            try:
                self._recover_into(gen, plan, phases)
                rt.stats["recoveries"] += 1 if gen > 0 else 0
                rt._title()
                rt._note("recovered" if gen > 0 else "started", gen=gen, step=rt.step,
                           seconds=self._time.monotonic() - t0, phases_s=phases)
                return
            except (JobFinished, JobFailed):
                raise
            except (GenerationChanged, RecoveryError, replica.ReplicaError, CheckpointError,
                    RuntimeError, OSError) as exc:
                rt._note("recovery_failed", gen=gen, error=str(exc)[:300])
                try:
                    rt.store.set(keys.recovered(gen, rt.wid),
                                   json.dumps({"ok": False, "error": str(exc)[:300]}))
                except RuntimeError:
                    pass
                self._abandon_group()
                rt.gen = gen
                rt.progress.update(gen=gen)

    def _check_job_done(self) -> None:
        rt = self.rt
        if rt.store.check([keys.JOB_DONE]):
            if rt.store.get(keys.JOB_DONE) != b"ok":
                raise JobFailed("the coordinator gave the job up; see the launcher's events")
            raise JobFinished()

    def _next_generation(self) -> int:
        """Block (bounded unless a spare) until a generation newer than ours exists."""
        rt = self.rt
        spare = rt.plan is None
        deadline = self._time.monotonic() + rt.settings.recovery_timeout_s
        while True:
            if rt.store.check([keys.GENERATION]):
                g = int(rt.store.get(keys.GENERATION))
                if g > rt.gen:
                    return g
            self._check_job_done()
            left_s = deadline - self._time.monotonic()
            if not spare and left_s <= 0:
                raise RecoveryError(f"worker {rt.wid}: coordinator announced no new generation "
                                    f"within {rt.settings.recovery_timeout_s}s")
            try:  # block until the coordinator wakes us (next generation or job end): no polling
                rt.store.wait([keys.wake(rt.gen + 1)],
                                datetime.timedelta(seconds=60.0 if spare else max(0.01, left_s)))
            except dist.DistStoreError:
                pass

    def _recover_into(self, gen: int, plan: Plan, phases: dict[str, float]) -> None:
        """Recover into generation ``gen``; the seconds of each phase go into ``phases``."""
        rt = self.rt
        t = self._time.monotonic()

        def lap(name: str) -> None:
            nonlocal t
            now = self._time.monotonic()
            phases[name], t = round(now - t, 4), now
        rank, role = plan.ranks.index(rt.wid), plan.roles[plan.ranks.index(rt.wid)]
        if rt.sharded and rank != rt.mesh.rank:
            raise JobFailed(f"generation {gen} moves worker {rt.wid} from rank {rt.mesh.rank} "
                            f"to {rank}: an FSDP2 job keeps its ranks (it needs a spare per loss; "
                            f"to change its size, restart from a checkpoint)")
        self._report_holdings(gen, plan, role)
        lap("report_holdings")
        resume = json.loads(self._wait(keys.resume(gen), gen, rt.settings.recovery_timeout_s))
        lap("wait_resume_decision")
        rt.gen, rt.plan, rt.rank, rt.role = gen, plan, rank, role
        rt.progress.update(gen=gen, rank=rank)
        step, source = int(resume["step"]), resume["source"]
        if source == "none":
            raise JobFailed(f"generation {gen}: no consistent state to recover from")
        rt._live_ok = False  # until this recovery completes, the live state is in flux
        if source == "memory":
            self._restore_memory(plan, role, step)
        elif source == "disk":
            self._restore_disk(step, int(resume["world_size"]), rank,
                               Path(resume["dir"]) if resume.get("dir") else None)
        lap("restore_state")
        self._form_groups(gen, rank, plan, lap)
        if source == "fresh" and not rt.sharded:
            self._broadcast_model()
        checksum = state_checksum(rt.state.model, params_only=True)
        lap("checksum")
        self._verify_checksums(checksum)
        lap("verify_checksums")
        self._resume_at(step, source)
        lap("release_and_rereplicate")
        rt.store.set(keys.recovered(gen, rt.wid),
                     json.dumps({"ok": True, "checksum": checksum, "step": step}))
        lap("report_recovered")

    def _report_holdings(self, gen: int, plan: Plan, role: int) -> None:
        """Tell the coordinator which steps this worker can restore in ``gen`` (its own
        snapshots, the replicas it holds, a dead worker's slots it adopted), after taking
        its live state as a snapshot when that is the state to offer."""
        rt = self.rt
        if plan.max_step is None:   # a rollback throws the live state away
            rt.snapshots.capture_live()
        orphans = {}
        if role in plan.replaced and rt.role < 0:
            self._adopt(plan.replaced[role], role)
            orphans = {str(role): sorted(self._orphans)}
        rt.store.set(keys.have(gen, rt.wid), json.dumps(
            {"step": rt.step, "own": rt.slots.steps(),
             "replicas": rt.replicas.valid_steps(live=rt.settings.dedup_replicas),
             "orphans": orphans}))

    def _form_groups(self, gen: int, rank: int, plan: Plan, lap: Callable[[str], None]) -> None:
        """The generation's gloo group under its store prefix (and the FSDP mesh, rails)."""
        rt = self.rt
        rt.group = dist.ProcessGroupGloo(
            dist.PrefixStore(keys.group_prefix(gen), rt.store), rank, plan.world_size,
            datetime.timedelta(seconds=rt.settings.collective_timeout_s))
        if rt.sharded:
            rt.mesh.bind(gen, rank, rt.group)
        lap("form_group")
        if rt.settings.rails:
            rt.collectives.close_rails(self._graveyard)
            rt.collectives.rails = RailSync(rt.store, gen, rank, plan.world_size, rt.settings.rails,
                                            rt.settings.recovery_timeout_s, self._time,
                                            chunks=RAIL_MODES[rt.settings.rail_mode])
            lap("form_rails")

    def _resume_at(self, step: int, source: str) -> None:
        """The restored state is verified: train on from ``step``, forget what is newer, and
        re-replicate the restored step to the new ring successor before moving on."""
        rt = self.rt
        rt.step = step
        rt.snapshots.dcp_step = step - 1   # every member writes the resumed step again if it is due
        rt._failed = False
        rt.guard.reset()   # every member starts the guard's history afresh: their verdicts stay equal
        rt._applied = -1   # a step the optimizer began before a rollback is to come again
        rt._live_ok = rt._at_step_start = True
        self._release_orphans()
        rt.slots.forget_after(step)
        rt.replicas.forget_after(step)
        if source != "memory":
            rt.replicas.clear()
        rt._set_phase("idle")
        mine = rt.slots.published(step)
        if mine is not None:
            with rt.slots.cond:
                mine[0].readers += 1
            rt.pipeline.put(rt.snapshots.handoff(mine[0], step))  # replicate, do not persist

    def _adopt(self, lost_wid: int, role: int) -> None:
        """List the snapshots the lost worker of ``role`` left in this node's shared
        memory (from their manifests; the bytes are verified only if one is used)."""
        rt = self.rt
        key = keys.worker_slots(lost_wid)
        if rt.store.check([key]):
            self._orphans = find_orphans(rt.store.get(key).decode(), role)

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
        rt = self.rt
        if role in plan.holders and step in self._orphans:
            # the snapshot the lost worker left in shared memory (chosen when no replica of
            # that step survived, e.g. its holder died too)
            manifest, path = self._orphans[step]
            try:
                payload = read_orphan(manifest, path, into=rt.slots.staging(manifest.total_bytes))
            except (OSError, ValueError) as exc:
                raise RecoveryError(f"adopted snapshot unusable: {exc}") from exc
            tensors, meta = tensors_of(manifest, payload)
        elif role not in plan.holders:
            slot = rt.slots.find(step)
            if slot is None:
                raise RecoveryError(f"worker {rt.wid}: own snapshot of step {step} is gone")
            mine = rt.slots.published(step)
            manifest = mine[1] if mine else rt.slots.build_manifest(slot, rt.rank, plan.world_size)
            tensors, meta = tensors_of(manifest, slot.array)
        else:
            return self._fetch_into_slot(plan, role, step)
        restored = rt.state.restore(tensors, meta)
        rt.sampler.check_state(restored["data"])

    def _fetch_into_slot(self, plan: Plan, role: int, step: int) -> None:
        """Restore ``role``'s replica of ``step`` from its holder, fetched straight into a
        snapshot slot that then is this worker's snapshot of the step
        (`SlotStore.receiving`): its first step takes no snapshot of its own (before, an
        HSDP spare's first step copied its 88 MB shard into a fresh slot). Without a slot
        (no host memory, none free in time) the replica is fetched as before."""
        rt = self.rt
        holder = plan.holders[role]
        addr = rt.store.get(keys.worker_addr(holder)).decode()
        slot = None

        def into(manifest) -> np.ndarray | None:
            nonlocal slot
            try:
                slot = rt.slots.receiving(manifest, rt.settings.replica_timeout_s)
            except OSError as exc:
                rt._note("snapshot_failed", step=step, error=str(exc)[:300])
            return None if slot is None else slot.array

        try:
            manifest, payload = replica.fetch(addr, role, step, rt.settings.replica_timeout_s, into=into)
            rt._note("state_received", role=role, holder=holder, step=step, bytes=manifest.total_bytes)
            restored = rt.state.restore(*tensors_of(manifest, payload))
            rt.sampler.check_state(restored["data"])
        except BaseException:
            if slot is not None:
                rt.slots.release(slot)
            raise
        if slot is not None:
            rt.slots.kept(slot, manifest, role, rt.rank, plan.world_size)
            rt.snapshots.snap_opt_entries = len(rt.state.optimizer.state)
            rt.snapshots.snapshot_done(step)

    def _restore_disk(self, step: int, ckpt_world: int, rank: int, root: Path | None) -> None:
        rt = self.rt
        root = root or rt.settings.checkpoint_dir
        if root is None:
            raise RecoveryError("resume from disk requested but no checkpoint_dir is set")
        if Path(root) != rt.settings.checkpoint_dir and not under_roots(root, rt.settings.roots):
            raise RecoveryError(f"resume from {root} refused: not under the job's checkpoint roots")
        # data-parallel state is replicated: a rank beyond the saved world reads rank 0
        manifest, payload = read_checkpoint(root, step, rank if rank < ckpt_world else 0)
        tensors, meta = tensors_of(manifest, payload)
        restored = rt.state.restore(tensors, meta)
        rt.sampler.check_state(restored["data"])
        rt.slots.forget_after(-1)
        rt._note("restored_from_disk", step=step)

    def _broadcast_model(self) -> None:
        rt = self.rt
        for t in rt.state.model.state_dict().values():
            if not rt.collectives.run(lambda t=t: rt.group.broadcast(t, 0)):
                raise RecoveryError("initial broadcast of the model failed")

    def _verify_checksums(self, checksum: str) -> None:
        """Every rank checks that the ranks which must hold identical parameters do
        (`identical_ranks`): a restore that went wrong anywhere stops the job here."""
        rt = self.rt
        groups = identical_ranks(rt.plan.world_size, rt.mesh.replicas if rt.sharded else 0)
        if not groups:   # FSDP over one dimension: shards differ; each was hash-verified on restore
            return
        mine = torch.tensor([int(checksum, 16) - (1 << 63)], dtype=torch.int64)
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(rt.plan.world_size)]
        if not rt.collectives.run(lambda: rt.group.allgather([out], [mine])):
            raise RecoveryError("checksum exchange failed")
        sums = [int(o) for o in out]
        for ranks in groups:
            if len({sums[r] for r in ranks}) > 1:
                raise RecoveryError(f"parameter checksums of ranks {ranks} disagree after recovery to "
                                    f"gen {rt.gen}: {[hex(sums[r] + (1 << 63)) for r in ranks]}")

    def _abandon_group(self) -> None:
        """Abort this generation's groups (rails, HSDP subgroups, the world group); they
        are kept, not destroyed: destroying one can block on a dead peer."""
        rt = self.rt
        rt.collectives.close_rails(self._graveyard)
        rt.mesh.abandon(self._graveyard)
        if rt.group is not None:
            try:
                rt.group.abort()
            except RuntimeError:
                pass
            self._graveyard.append(rt.group)
            rt.group = None
