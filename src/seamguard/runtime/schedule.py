"""The training thread's half of the snapshot pipeline: when this rank takes, persists and
replicates its state.

At each step boundary the step transaction (runtime/worker.py) asks this part to snapshot
when one is due (every k steps, ``--snapshot-every auto``'s interval, a persist point, a
new optimizer layout, degraded mode), and the copy overlaps the step's forward and
backward; it is finished before the optimizer changes what it copies. A finished copy goes
to the pipeline's thread (runtime/pipeline.py) as one immutable Handoff. This part also
sends the start-of-step private bytes (RNG, optimizer scalars, data position, buffers) to
the replica holder, so a spare can take over at the very step a rank was lost in; writes
FSDP2's DCP checkpoints; captures the live state for a recovery or an uncaught exception;
and decides persist points from the control keys (``checkpoint_now`` hints, cadence and
target changes). It runs on the training thread only.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from seamguard.runtime import cadence, keys, replica, stepmodes
from seamguard.runtime.membership import Plan, replica_holder
from seamguard.runtime.pipeline import Handoff, SnapshotPipeline
from seamguard.runtime.settings import under_roots

_QUEUED = "queued"   # a snapshot in flight that is already in the pipeline's queue


class SnapshotSchedule:
    """When this rank snapshots, persists and sends its private bytes (module docstring)."""

    def __init__(self, rt, pipeline: SnapshotPipeline) -> None:
        """``rt``: the worker's step transaction (runtime/worker.py), whose step, state and
        membership this part reads on the training thread; ``pipeline``: where snapshots go."""
        self.rt = rt
        self.pipeline = pipeline
        self._time = rt.time
        self._inflight = None  # (Capture, persist?) of a snapshot still copying
        self.snap_opt_entries = -1  # optimizer state entries at the last snapshot
        self._snap_begun = -1   # step of the last snapshot begun
        self._snap_cost = cadence.SnapshotCost()   # --snapshot-every auto: what a snapshot costs
        self.snap_cost_s: float | None = None      # its estimate, published (made as samples come)
        self._made_seen = 0   # slots.made at the last step boundary
        self._persist_at = -1
        self._hint_persisted = -1
        self._force_persist = False
        self.dcp_step = -1       # FSDP2: newest step this rank wrote (or skips) as a DCP checkpoint
        self._meta_target: tuple[int, str, int] = (-1, "", -1)  # (gen, holder address, role)
        self._part: tuple[int, int, dict[str, bytes]] | None = None  # (gen, step, rank_private()) sent
        self._part_ok: bool | None = None   # the parts sent so far held (None: none checked yet)

    def live_recovery(self) -> bool:
        """Recovery from live state needs replicated (data-parallel) model and optimizer:
        the same condition under which replicas are deduplicated."""
        rt = self.rt
        return rt.settings.dedup_replicas and rt.plan is not None and rt.plan.world_size > 1

    def live_copies(self) -> int:
        """How many ranks hold this rank's state live, itself included: a loss that leaves
        one of them needs no snapshot (--snapshot-every auto counts only the others). The
        world in data parallelism, the replicate dimension in HSDP, 1 for FSDP2; 1 also once
        the rank's part of its private bytes cannot go ahead (`_rank_part_holds`): a loss
        between its optimizer step and the next push then goes back to a snapshot."""
        rt = self.rt
        if not self.live_recovery() or self._part_ok is False:
            return 1
        return rt.mesh.replicas if rt.sharded else rt.plan.world_size

    def _holder(self, plan: Plan) -> int:
        """The worker that holds this rank's replica in ``plan`` (`membership.replica_holder`)."""
        rt = self.rt
        return plan.ranks[replica_holder(rt.rank, plan.world_size, rt.ranks_per_node, rt.mesh.replicas)]

    def send_meta(self) -> None:
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
        rt = self.rt
        if self.live_recovery() and not self._rank_part_holds():
            self._push_private(rt.step, rt._private[1], part=False)

    def _push_private(self, step: int, private: dict[str, bytes], part: bool) -> bool:
        rt = self.rt
        try:
            if self._meta_target[0] != rt.gen:
                plan = rt.plan
                holder = self._holder(plan)
                self._meta_target = (rt.gen, rt.store.get(keys.worker_addr(holder)).decode(),
                                     plan.roles[rt.rank])
            _, addr, role = self._meta_target
            replica.push_meta(addr, role, step, private, min(5.0, rt.settings.replica_timeout_s), part=part)
            return True
        except (OSError, replica.ReplicaError, ValueError, RuntimeError) as exc:
            rt._note("meta_push_failed", step=step, error=str(exc)[:200])
            return False

    def send_rank_part(self) -> None:
        """After a step's compute and before its gradient all-reduce (FSDP2: once its
        collectives in backward are done), send the holder this rank's own part of the
        next step's private bytes (RNG states, buffers: what its replicas do not share).
        Without it, a rank lost between its optimizer step and the next step's push left
        its survivors a step ahead of the private bytes its holder had, and the job went
        back to the newest full snapshot (up to ``--snapshot-every`` steps). Sent before
        the all-reduce, not after it: a survivor commits the step only once every rank
        joined the all-reduce, so every rank's part has then reached its holder (sent
        after it, a rank lost between the two left the job 9 steps back at
        ``--snapshot-every 10``; tests/runtime/test_recovery_boundary.py). The part is taken
        now and checked at the next step's start against what the rank then holds: it is
        sent only once a check has passed and never again after one fails (a loop that
        draws random numbers after ``sync_gradients()``); a checked part stands in for
        that step's push. A step cancelled after it was sent (a failed all-reduce, a
        step-guard redo) is no harm: a recovery drops private bytes newer than its
        resume step, and a redo sends the part again."""
        rt = self.rt
        if not self.live_recovery() or self._part_ok is False:
            return
        self._part = (rt.gen, rt.step + 1, rt.state.rank_private())
        if self._part_ok and not self._push_private(rt.step + 1, self._part[2], part=True):
            self._part = None   # not delivered: the next step's start sends all of them

    def _rank_part_holds(self) -> bool:
        """At a step's start: does the part sent for this step hold (see `_send_rank_part`)?
        True only if it was sent, to this generation's holder, and equals this rank's."""
        rt = self.rt
        sent, self._part = self._part, None
        if sent is None or sent[:2] != (rt.gen, rt.step) or self._part_ok is False:
            return False
        if sent[2] != rt.state.rank_private(rt._private[1] if rt._private[0] == rt.step else None):
            rt._note("rank_part_off", step=rt.step, reason="RNG states or buffers changed "
                       "after sync_gradients(): each step's private bytes go at its start")
            self._part_ok = False
            return False
        was_sent, self._part_ok = bool(self._part_ok), True
        return was_sent

    def capture_live(self) -> None:
        """Snapshot the live state at the start of ``rt.step`` before a recovery.

        The step in flight was cancelled on every rank (no optimizer step ran), so the
        live model and optimizer are the state at the start of ``rt.step``; offering it
        lets every member resume there instead of at the last periodic snapshot.
        """
        rt = self.rt
        if self.live_recovery():
            self.capture_step_start(rt.settings.replica_timeout_s)

    def capture_step_start(self, timeout_s: float) -> bool:
        """Put the live model and optimizer, with the start-of-step meta and buffers, in a
        slot as the snapshot of ``rt.step`` and publish its manifest; True if done.
        Only valid while no optimizer step of ``rt.step`` has run."""
        rt = self.rt
        if not rt._live_ok:
            return False
        self.finish_snapshot()
        if rt.slots.published(rt.step) is not None:
            return True
        slot = rt.slots.find(rt.step)
        if slot is None:   # else: captured this step, still being hashed by the pipeline
            if rt._private[0] != rt.step:
                if not rt._at_step_start:
                    return False   # no start-of-step meta and buffers for this step
                # a rank that finished the previous step late, when the generation had
                # already changed: nothing of this step has run, so take them now
                rt._private = (rt.step, rt.state.step_private(rt.step))
            try:
                slot = rt.slots.capture(rt.state, rt.step, timeout_s=timeout_s)
            except OSError as exc:
                rt._note("live_capture_skipped", step=rt.step, reason=str(exc)[:300])
                return False
            if slot is None:
                rt._note("live_capture_skipped", step=rt.step, reason="no free slot in time")
                return False
            # the cancelled step moved the RNG and the buffers: put the start's back
            rt.slots.overwrite(slot, rt._private[1])
            rt.stats["live_captures"] += 1
        manifest = rt.slots.build_manifest(slot, rt.rank, rt.plan.world_size)
        rt.slots.publish_manifest(slot, manifest, rt.role)
        return True

    def time_snapshots(self) -> None:
        """--snapshot-every auto, at a step boundary: feed the step just done to the
        snapshot's cost (`cadence.SnapshotCost`), marked when a slot was being made during
        it (a one-time cost); two steps after a snapshot of the layout with the optimizer's
        state, have the next snapshot's slot made, on a thread, in a step no snapshot is
        measured on (unless snapshots come that often)."""
        rt = self.rt
        made_before, self._made_seen = self._made_seen, rt.slots.made
        if rt._timed != rt.step - 1:
            return   # the first step after a recovery: not measured, and no slot made in it
        self._snap_cost.add(rt._last_step_s, rt._timed - self._snap_begun,
                            made_slot=made_before != self._made_seen or rt.slots.growing)
        self.snap_cost_s = self._snap_cost.cost_s()
        if rt.step - self._snap_begun == 2 and self.snap_opt_entries > 0:
            rt.slots.grow_one()

    def maybe_snapshot(self) -> None:
        rt = self.rt
        self.finish_snapshot()
        # The optimizer creates its state at its first step; the slots are then laid out
        # anew and older snapshots are gone, so take one at once rather than k steps later
        # (a rank lost before its next private bytes reach the holder needs a full one).
        new_layout = len(rt.state.optimizer.state) != self.snap_opt_entries
        due = rt._mode.degraded or self._force_persist or new_layout or cadence.snapshot_due(
            rt.step, rt.settings.snapshot_every_steps,
            cadence.parse((rt._control_keys.at_boundary(rt._last_step_s)[keys.SNAPSHOT_CADENCE] or b"").decode()))
        # under auto, a persist point is snapshotted whatever the interval (the window is 1)
        due = due or (rt.settings.snapshot_auto and self._persist_due(rt.step, consume=False))
        if not due or rt.slots.latest_step() == rt.step:
            return
        self.snap_opt_entries = len(rt.state.optimizer.state)
        rt._set_phase("snapshot")
        overlap = rt.settings.overlap_snapshots and not self._force_persist and not rt._mode.degraded
        t0 = self._time.perf_counter()
        try:
            cap = rt.slots.begin(
                rt.state, rt.step, timeout_s=rt.settings.replica_timeout_s,
                midway=lambda: rt.injector.maybe_fire("snapshot", rt.rank, rt.step),
                overlap=overlap)
        except OSError as exc:   # no host memory for a slot: train on, unprotected
            rt._note("snapshot_failed", step=rt.step, error=str(exc)[:300])
            return
        finally:
            rt.stats["snapshot_stall_s"] += self._time.perf_counter() - t0
        if cap is None:
            rt._note("snapshot_skipped", step=rt.step, reason="no free slot in time")
            return
        self._snap_begun = rt.step
        self._inflight = (cap, self._persist_root(rt.step) if self._persist_due(rt.step) else None)
        if rt.sharded and overlap:
            # hash and push as soon as the copy is done, while forward and backward run:
            # the step's commit waits for the replica (_await_replica)
            with rt.slots.cond:
                cap.slot.readers += 1
            self.pipeline.put(self.handoff(cap, cap.step, self._inflight[1]))
            self._inflight = (cap, _QUEUED)
        if not overlap:
            self.finish_snapshot()

    def finish_snapshot(self) -> None:
        """Wait for the snapshot in flight (if any) and hand it to the pipeline."""
        rt = self.rt
        if self._inflight is None:
            return
        (cap, persist), self._inflight = self._inflight, None
        t0 = self._time.perf_counter()
        try:
            slot = cap.wait()
        except RuntimeError as exc:
            rt._note("snapshot_failed", step=cap.step, error=str(exc)[:200])
            return
        finally:
            rt.stats["snapshot_stall_s"] += self._time.perf_counter() - t0
            rt.clock.add("snapshot_copy_wait", self._time.perf_counter() - t0)
        rt.stats["snapshots"] += 1
        self.snapshot_done(cap.step)
        if persist is _QUEUED:   # handed to the pipeline when it began
            return
        with rt.slots.cond:
            slot.readers += 1
        self.pipeline.put(self.handoff(slot, cap.step, persist))

    def maybe_save_dcp(self) -> None:
        """Sharded state: a DCP checkpoint at the persist cadence, at a `checkpoint_now`
        hint's step and at the end; decided from the step and the store alone, so every rank
        decides alike (a DCP save is a collective), whatever snapshots it already holds."""
        rt = self.rt
        s = rt.settings
        if not rt.sharded or s.checkpoint_dir is None or rt.step <= self.dcp_step:
            return
        controls = rt._control_keys.at_boundary(rt._last_step_s)
        hinted = (controls[keys.HINT_PERSIST_AT] is not None
                  and int(controls[keys.HINT_PERSIST_AT]) == rt.step)
        raw = controls[keys.PERSIST_CADENCE] or b""
        if self._force_persist or hinted or cadence.persist_due(
                rt.step, s.persist_every_steps, cadence.parse(raw.decode()), self._persist_window()):
            self.dcp_step = rt.step
            self._save_dcp(rt.step)

    def _save_dcp(self, step: int) -> None:
        """Sharded state: also write the step as a `torch.distributed.checkpoint` (DCP)
        checkpoint, ``<checkpoint_dir>/step_XXXXXXXX/dcp``, which users load with the tools
        they already have, at any world size (DCP reshards on load). Every rank persists the
        same steps, so every rank is here at the same step; the state is the step's start
        (no forward has run). Keys: ``model`` and ``optim``, as
        `torch.distributed.checkpoint.state_dict.get_state_dict` names them. A failure
        (a peer lost mid-save) is noted and cancels the step like a failed collective."""
        rt = self.rt
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from seamguard.runtime.manifest import step_dir

        if not rt.collectives.allowed():
            return
        t0 = self._time.perf_counter()
        phase = rt.progress.current.phase
        rt._set_phase("persist")
        try:
            model_sd, optim_sd = get_state_dict(rt.state.model, rt.state.optimizer)
            # overwrite: a recovery writes the resumed step again (a loss may have cut it short)
            writer = dcp.FileSystemWriter(step_dir(self._persist_root(step), step) / "dcp", overwrite=True)
            with warnings.catch_warnings():   # "overwriting since self.overwrite=True"
                warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
                dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=writer)
        except Exception as exc:  # noqa: BLE001 - garbage from a failed collective, I/O errors
            rt._note("dcp_save_failed", step=step, error=f"{type(exc).__name__}: {exc}"[:300])
            rt._failed = True
        finally:
            rt._set_phase(phase)
            rt.stats["dcp_save_s"] = rt.stats.get("dcp_save_s", 0.0) + self._time.perf_counter() - t0
            rt.stats["snapshot_stall_s"] += self._time.perf_counter() - t0

    def _persist_root(self, step: int) -> Path:
        """Where the snapshot of ``step`` is persisted: the job's own directory, or the one the
        control plane moved it to (read on the training thread, from a step every rank agrees on)."""
        rt = self.rt
        raw = rt._control_keys.at_boundary(rt._last_step_s)[keys.PERSIST_TARGETS] or b""
        root = cadence.target_for(step, rt.settings.checkpoint_dir, cadence.parse_targets(raw.decode()))
        if root != rt.settings.checkpoint_dir and not under_roots(root, rt.settings.roots):
            # the coordinator never publishes such a target: someone else wrote the key
            rt._note("checkpoint_target_refused", step=step, dir=str(root)[:200])
            return rt.settings.checkpoint_dir
        return root

    def _persist_due(self, step: int, consume: bool = True) -> bool:
        """Whether the snapshot of ``step`` is persisted; ``consume``: a `checkpoint_now`
        hint's step counts as done (False: only asking)."""
        rt = self.rt
        s = rt.settings
        if s.checkpoint_dir is None:
            return False
        controls = rt._control_keys.at_boundary(rt._last_step_s)
        if controls[keys.HINT_PERSIST_AT] is not None:
            self._persist_at = int(controls[keys.HINT_PERSIST_AT])
        if self._force_persist:
            return True
        if self._persist_at > self._hint_persisted and step >= self._persist_at:
            if consume:
                self._hint_persisted = self._persist_at
            return True
        raw = controls[keys.PERSIST_CADENCE] or b""
        if rt._mode.degraded:   # every step is snapshotted: a persist point is this step or none
            return cadence.persist_due(step, s.persist_every_steps, cadence.parse(raw.decode()), 1,
                                       stepmodes.DEGRADED_PERSIST_DIVISOR)
        return cadence.persist_due(step, s.persist_every_steps, cadence.parse(raw.decode()), self._persist_window())

    def _persist_window(self) -> int:
        """Steps a persist point may lie before the step that persists it: the snapshot
        interval, as persists are taken from snapshots; 1 under ``--snapshot-every auto``,
        which snapshots every persist point."""
        rt = self.rt
        return 1 if rt.settings.snapshot_auto else rt.settings.snapshot_every_steps

    def settle_degraded(self) -> bool:
        """Degraded mode: the step commits only once its start-of-step snapshot is hashed,
        pushed to the replica holder and (if due) persisted, so no overlap is in flight when
        a node at risk fails. False if a new generation overtakes the wait."""
        return self._wait_for_pipeline(self.pipeline.unsettled, commit_wait=False)

    def persist_final(self) -> None:
        """Persist the final state (every rank, same step) and wait, bounded, for it."""
        rt = self.rt
        if rt.settings.checkpoint_dir is None:
            return
        self._force_persist = True
        self.maybe_snapshot()
        self.maybe_save_dcp()
        self._force_persist = False
        deadline = self._time.monotonic() + rt.settings.recovery_timeout_s
        while self._time.monotonic() < deadline and (self.pipeline.busy() or rt.slots.in_use()):
            self._time.sleep(0.01)

    def await_replica(self) -> bool:
        """Sharded state: commit the step only once its start-of-step snapshot has reached
        the replica holder (hashed, pushed, acknowledged), since no peer holds this rank's
        shard. A rank lost during step s+1 has then delivered the start of step s: the job
        resumes at s, at most one completed step is redone. False if a new generation
        overtakes the wait."""
        return self._wait_for_pipeline(self.pipeline.busy, commit_wait=True)

    def _wait_for_pipeline(self, pending, commit_wait: bool) -> bool:
        """Finish this step's snapshot, then wait while ``pending()`` (backing off from 0.2 ms
        to 5 ms), charging the wait to the snapshot stall (and to ``commit_wait`` in the step
        profile); False, and the rank marked failed, if a new generation overtakes it."""
        rt = self.rt
        self.finish_snapshot()
        t0 = self._time.perf_counter()
        nap_s = 0.0002
        try:
            while pending():
                if rt._failed or rt._overtaken_gen():
                    rt._failed = True
                    return False
                self._time.sleep(nap_s)
                nap_s = min(0.005, nap_s * 1.5)
        finally:
            waited_s = self._time.perf_counter() - t0
            rt.stats["snapshot_stall_s"] += waited_s
            if commit_wait:
                rt.clock.add("commit_wait", waited_s)
        return True

    def handoff(self, source, step: int, persist: Path | None = None) -> Handoff:
        """A snapshot for the pipeline, with where this rank stands now."""
        rt = self.rt
        plan = rt.plan
        holder = self._holder(plan) if plan is not None and plan.world_size > 1 else -1
        return Handoff(source, step, rt.gen, rt.rank, rt.role, rt.world_size, holder, persist)

    def snapshot_done(self, step: int) -> None:
        """The snapshot of ``step`` is complete in host memory."""
        rt = self.rt
        rt.progress.swap(lambda p: dataclasses.replace(p, snap_step=max(p.snap_step, step)))
