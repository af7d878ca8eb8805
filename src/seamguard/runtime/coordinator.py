"""The coordinator: one decision maker per job for membership, rollback and recovery.

Runs inside the launcher of node 0, next to the rendezvous store. Each `tick()` it reads
process exits (reported by every node's launcher), heartbeats and control-plane hints
from the store, judges them (detect.HeartbeatTracker), and when a rank is lost writes
the next generation's plan (membership.next_plan), collects what every member holds,
chooses the newest common step (membership.resume_step) or the last verified checkpoint
on storage (manifest.latest_verified), and waits for every member to confirm recovery
with matching parameter checksums. A failed or timed-out recovery is retried from disk.
It never imports torch: the store handle is passed in.

Three modules make it, one job each: this one holds the state, the pass (`tick`) and the
generations (plans, resume choice, recovery); runtime/coordinator_watch.py observes
(exits, node records, heartbeats, evacuations, joined spares); runtime/coordinator_controls.py
turns hints into control keys. HINT_KEYS and HINT_COUNTERS are re-exported from here.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from seamguard import hintauth
from seamguard.runtime import keys
from seamguard.runtime.coordinator_controls import HINT_COUNTERS, HINT_KEYS, ControlHints
from seamguard.runtime.coordinator_watch import MembershipWatch
from seamguard.runtime.detect import HeartbeatTracker, NodeTracker
from seamguard.runtime.manifest import latest_verified
from seamguard.runtime.membership import Plan, initial_plan, next_plan, resume_step
from seamguard.runtime.metrics import JobView, RankView, StepClock
from seamguard.runtime.settings import LaunchSettings

__all__ = ["FULL_READ_S", "HINT_COUNTERS", "HINT_KEYS", "Coordinator"]


# Each pass reads what may have changed, cheaply: the hint keys in one request (HINT_KEYS,
# all created at start), the heartbeats in one, and the families of keys that only ever
# appear (exits, done marks, joined spares) only when the store's key count moved, or at
# least every FULL_READ_S. Before, a pass was ~30 store round trips, 20 passes a second:
# most of the launcher's CPU in the FSDP2 --quick job (docs/benchmarks.md).
# On etcd a steady pass sends no request at all: the hints, the joined spares and the key
# families come from the watched copy of the job's keys (store.PrefixMirror). Reading the
# 7 hint keys one request each, the joined count and the key count every pass had been
# 180 of the 240 requests a second etcd served in a failure-free 2-host job.
FULL_READ_S = 0.5


@dataclass
class Coordinator(MembershipWatch, ControlHints):
    store: Any
    settings: LaunchSettings
    trainers: list[int]
    spares: list[int]
    checkpoint_dir: Path | None
    recovery_timeout_s: float
    log: Callable[[dict], None]
    clock: Callable[[], float] = time.monotonic
    hint_key: bytes = field(default_factory=lambda: os.urandom(hintauth.KEY_BYTES), repr=False)
    """The job's hint key (runtime/hintauth.py): only hints signed with it are taken."""
    plan: Plan | None = None
    phase: str = "starting"  # starting | recovering | running | done | failed
    lost: set[int] = field(default_factory=set)
    finished: set[int] = field(default_factory=set)
    recoveries: int = 0
    _resume_written: bool = False
    _phase_since_s: float = 0.0
    _detected_at_s: float = 0.0
    _hint_checkpoint: int = 0
    _hint_rollback: int = 0
    _hint_interval: int = 0
    _hint_target: int = 0
    _hint_avoid: int = 0
    _hint_degraded: int = 0
    _suspect_hosts: set[str] = field(default_factory=set)  # nodes ranks were evacuated from
    joined: list[int] = field(default_factory=list)  # replacement spares, ready or not
    _joined_seen: int = 0
    _deferred: set[int] = field(default_factory=set)  # losses waiting for replacement spares
    _deferred_since_s: float = 0.0
    _furthest_step: int = 0  # the furthest step any rank's heartbeat reported (for steps redone)
    _beats: dict = field(default_factory=dict)  # wid -> its last heartbeat (for metrics)
    _records: dict = field(default_factory=dict)  # node -> its aggregated record, this tick
    _mirrors: dict = field(default_factory=dict)  # a watched local copy of the job's keys (etcd)
    _steps: StepClock = field(default_factory=StepClock)
    _hints: dict = field(default_factory=dict)  # this tick's hint keys (HINT_KEYS), read at once
    _beating: set = field(default_factory=set)  # workers whose heartbeat key exists (read in one request)
    _new_keys: keys.NewKeys = field(default_factory=lambda: keys.NewKeys(FULL_READ_S))
    _links_closed: dict = field(default_factory=dict)  # node -> why its launcher's link closed, unjudged
    _ticked_s: float = 0.0  # when the last pass ran (_pause_grace)
    _evacuate_cleared_rev: int = 0  # etcd revision of the last clearing of HINT_EVACUATE
    _snap_entries: tuple = ()  # --snapshot-every auto: the snapshot interval entries published
    _slowest_recovery_s: float = 0.0  # detection to resumed, the slowest recovery so far
    tracker: HeartbeatTracker = field(init=False)
    nodes: NodeTracker = field(init=False)
    hints: hintauth.HintGate = field(init=False)
    link_records: Callable[[], dict] = dict
    """Each node's newest record as its launcher's link delivered it (nodelink.LinkServer):
    a node writes its record to the store only while it has no link."""

    def __post_init__(self) -> None:
        s = self.settings
        self.tracker = HeartbeatTracker(s.hang_timeout_s, s.stall_timeout_s, s.straggler_factor,
                                        s.straggler_window)
        self.nodes = NodeTracker(s.hang_timeout_s, own_node=s.node_rank)
        self.hints = hintauth.HintGate(self.hint_key)
        self._phase_since_s = self._ticked_s = self.clock()
        # every hint key exists from the start, so each pass reads them all in one request
        for k in HINT_COUNTERS:
            self.store.add(k, 0)
        if not self.store.check([keys.HINT_EVACUATE]):
            self.store.set(keys.HINT_EVACUATE, "")
        self.store.add(keys.CONTROL_N, 0)   # before any generation: ranks read both at once

    @property
    def all_workers(self) -> list[int]:
        return self.trainers + self.spares + self.joined

    def _get(self, key: str) -> bytes | None:
        return self.store.get(key) if self.store.check([key]) else None

    def tick(self, exited: bool = False, links_closed: tuple[tuple[int, str], ...] = ()) -> str:
        """One pass of observe → judge → act; returns the phase. ``exited``: the caller
        saw a worker exit (its code is in the store), so exits are read whatever the key
        count says. ``links_closed``: (node, why) for each node launcher whose link to
        this one closed without a goodbye since the last pass (runtime/nodelink.py)."""
        if self.phase in ("done", "failed"):
            return self.phase
        now = self.clock()
        self._pause_grace(now)
        self._links_closed.update(links_closed)
        if self.phase == "starting":
            if self._links_closed:
                node, why = next(iter(self._links_closed.items()))
                return self._fail(f"node {node}'s launcher went away ({why}) before every worker registered")
            early = self._exited_before_registering()
            if early:
                w, code = early
                return self._fail(f"worker w{w} exited with code {code} before it registered "
                                  "(its error is above in the launcher's output)")
            if all(self.store.check([keys.worker_addr(w)]) for w in self.all_workers):
                self._start_generation(initial_plan(self.trainers, self.spares), now)
            elif now - self._phase_since_s > self.settings.startup_timeout_s:
                return self._fail("not every worker registered within "
                                  f"{self.settings.startup_timeout_s}s")
            return self.phase
        appeared = self._watched() is not None or exited or self._new_keys.appeared(self.store, now)
        self._hints = self._read_hints()
        if appeared or self._deferred:
            self._read_joined()
        newly_lost = ((self._read_exits(fresh=exited) if appeared else set()) | self._judge_nodes(now)
                      | self._judge_heartbeats(now) | self._read_evacuations())
        self._read_checkpoint_hint()
        self._read_interval_hint()
        self._read_target_hint()
        self._read_step_mode_hints()
        self._tune_snapshot_interval()
        if appeared and self._job_complete():
            self.phase = "done"
            self.store.set(keys.JOB_DONE, "ok")
            self.store.set(keys.wake(self.plan.gen + 1), "done")
            self.log({"event": "job_done", "gen": self.plan.gen})
            return self.phase
        members = set(self.plan.ranks) | set(self.plan.spares)
        lost = (newly_lost & members) | self._deferred
        if lost and not self.finished:
            if not self._deferred:
                self._detected_at_s = now
            if self._wait_for_spares(lost, now):
                return self.phase
            self._deferred = set()
            return self._replan(lost, now, reason="lost " + ", ".join(f"w{w}" for w in sorted(lost)))
        if self.phase == "running" and self._read_rollback_hint(now):
            return self.phase
        if self.phase == "recovering":
            self._advance_recovery(now)
        return self.phase

    def take_over(self, dead: int, dead_workers: set[int], grace_s: float) -> str:
        """Go on with a job whose coordinator, on node ``dead``, was lost (its lease expired,
        runtime/election.py): the generation, its plan and recovery phase, the joined spares
        and the hint counters are read back from the store; exits and done marks on the next
        pass. The dead node's workers (its launch layout's and ``dead_workers``, those its
        last stored record listed) are lost at once, in one verdict; every other node gets
        ``grace_s`` to link to this launcher before its silence counts. Returns the phase."""
        now = self.clock()
        raw = self._get(keys.GENERATION)
        plan = None if raw is None else self._get(keys.plan(int(raw)))
        if plan is None:
            return self._fail(f"node {dead}'s launcher, the coordinator, was lost before the job's first generation")
        self.plan = Plan.from_json(plan)
        self.recoveries = self.plan.gen   # every generation after the first was a recovery
        self._hints_taken_up_to_now()
        self._read_joined()
        gen = self.plan.gen
        self._resume_written = self._get(keys.resume(gen)) is not None
        done = [self._get(keys.recovered(gen, w)) for w in self.plan.ranks] if self._resume_written else [None]
        running = all(r is not None and json.loads(r)["ok"] for r in done)
        self.phase, self._phase_since_s, self._detected_at_s = ("running" if running else "recovering"), now, now
        for node in range(self.settings.nnodes):
            if node not in (dead, self.settings.node_rank):
                self.nodes.observe(node, -1, self._initial_workers(node), now + grace_s)
        self.nodes.members[dead] = self._initial_workers(dead) | set(dead_workers)
        self._links_closed[dead] = "it was the coordinator's node and its lease expired"
        self.log({"event": "took_over", "node": self.settings.node_rank, "from_node": dead, "gen": gen,
                  "phase": self.phase})
        return self.phase

    def view(self, job: str) -> JobView:
        """What the job's metrics show now (seamguard.runtime.metrics)."""
        ranks = []
        if self.plan is not None:
            for r, w in enumerate(self.plan.ranks):
                hb = self._beats.get(w)
                if hb is not None and w not in self.lost:
                    ranks.append(RankView(r, w, str(hb.get("host", "")), int(hb.get("local", r)), int(hb["step"]),
                                          float(hb["compute_s"]), str(hb["phase"]), float(hb.get("comm_s", 0.0)),
                                          float(hb.get("stall_s", 0.0)), int(hb.get("snap_step", -1)),
                                          int(hb.get("persisted_step", -1))))
        return JobView(job, tuple(ranks), self.plan.gen if self.plan else -1, self._furthest_step,
                       self._steps.seconds_per_step(), self.recoveries, len(self.lost),
                       tuple(sorted(self.hints.refusals().items())))

    # ---------------------------------------------------------------- losses
    def _wait_for_spares(self, lost: set[int], now: float) -> bool:
        """Hold a replan while replacements being started would avoid a shrink (bounded).

        Replacement processes need a few seconds to start; shrinking a job because they
        were not ready yet would keep it smaller for the rest of its life."""
        s = self.settings
        ready = len([w for w in self.plan.spares if w not in lost])
        deficit = len(lost & set(self.plan.ranks)) - ready
        starting = [w for w in self.joined if w not in self.lost
                    and w not in self.plan.spares and w not in self.plan.ranks]
        # With no rank left the only other way on is failing the job; a rank judged unresponsive
        # while its process still exits (a GPU process freeing pinned memory takes seconds) has no
        # replacement starting yet: its launcher starts one once the process is gone.
        none_left = not [w for w in self.plan.ranks if w not in lost]
        if not s.replenish_spares or deficit <= 0 or not (starting or none_left):
            return False
        if not self._deferred:
            self._deferred, self._deferred_since_s = set(lost), now
            self.log({"event": "waiting_for_spares", "lost": sorted(lost), "deficit": deficit})
            return True
        self._deferred |= lost
        return now - self._deferred_since_s < s.spare_wait_s

    def _job_complete(self) -> bool:
        alive = [w for w in self.plan.ranks if w not in self.lost]
        return bool(alive) and len(self._family(keys.DONE_PREFIX, [str(w) for w in alive])) == len(alive)

    # ---------------------------------------------------------------- generations
    def _start_generation(self, plan: Plan, now: float) -> None:
        previous = set(self.plan.ranks) if self.plan else set()
        self.plan = plan
        self.store.set(keys.plan(plan.gen), plan.to_json())
        self.store.set(keys.GENERATION, str(plan.gen))
        self.store.set(keys.wake(plan.gen), "1")
        self.phase, self._phase_since_s, self._resume_written = "recovering", now, False
        for w in plan.ranks:
            if w not in previous:  # a member already being watched keeps its evidence
                self.tracker.forget(w)
        self.log({"event": "plan", "gen": plan.gen, "ranks": plan.ranks, "roles": plan.roles,
                  "spares": plan.spares, "reason": plan.reason, "force_disk": plan.force_disk})

    def _replan(self, lost: set[int], now: float, reason: str, force_disk: bool = False,
                max_step: int | None = None) -> str:
        self.recoveries += 1
        if self.recoveries > self.settings.max_recoveries:
            return self._fail(f"more than {self.settings.max_recoveries} recoveries")
        try:
            plan = next_plan(self.plan, lost, self.settings.nproc, reason, force_disk,
                             pending=self.phase == "recovering", max_step=max_step,
                             avoid=self._spares_on_suspect_hosts(),
                             replicas=int(self._get(keys.MESH_REPLICAS) or 1))
        except ValueError as exc:
            return self._fail(str(exc))
        self._start_generation(plan, now)
        return self.phase

    def _advance_recovery(self, now: float) -> None:
        gen = self.plan.gen
        if now - self._phase_since_s > self.recovery_timeout_s:
            self.log({"event": "recovery_timeout", "gen": gen})
            self._replan(set(), now, reason=f"recovery of gen {gen} timed out", force_disk=True)
            return
        if not self._resume_written:
            holdings = {}
            for w in self.plan.ranks:
                raw = self._get(keys.have(gen, w))
                if raw is None:
                    return
                holdings[w] = json.loads(raw)
            # where each member stands (its heartbeat may not have said yet): for steps redone
            self._furthest_step = max([self._furthest_step, *(int(h.get("step", 0)) for h in holdings.values())])
            self.store.set(keys.resume(gen), json.dumps(self._choose_resume(holdings)))
            self._resume_written = True
            return
        results = {}
        for w in self.plan.ranks:
            raw = self._get(keys.recovered(gen, w))
            if raw is None:
                return
            results[w] = json.loads(raw)
        if all(r["ok"] for r in results.values()):
            self.phase = "running"
            step = results[self.plan.ranks[0]]["step"]
            if gen:
                self._slowest_recovery_s = max(self._slowest_recovery_s, now - self._detected_at_s)
            self.log({"event": "resumed", "gen": gen, "step": step,
                      "checksum": results[self.plan.ranks[0]]["checksum"],
                      "recovery_s": now - self._phase_since_s,
                      "since_detection_s": now - self._detected_at_s if gen else None,
                      "steps_redone": max(0, self._furthest_step - step) if gen else None})
            return
        errors = {w: r.get("error") for w, r in results.items() if not r["ok"]}
        self.log({"event": "recovery_failed", "gen": gen, "errors": errors})
        self._replan(set(), now, reason=f"recovery of gen {gen} failed", force_disk=True)

    def _choose_resume(self, holdings: dict[int, dict]) -> dict:
        """The newest state every rank can restore: memory, else (or if newer) storage."""
        step = resume_step(self.plan, holdings) if self.plan.gen > 0 else None
        found, root = None, None
        for d in self._checkpoint_roots():   # newest verified over every directory the job used
            why: list[str] = []
            got = latest_verified(d, why, newer_than=-1 if step is None else step, at_most=self.plan.max_step)
            for line in why:
                self.log({"event": "checkpoint_rejected", "detail": line})
            if got is not None and (found is None or got[0] > found[0]):
                found, root = got, d
        if step is not None and found is None:
            choice = {"source": "memory", "step": step}
        else:
            if found is not None:
                choice = {"source": "disk", "step": found[0], "world_size": found[1], "dir": str(root)}
            elif self.plan.gen == 0:
                choice = {"source": "fresh", "step": 0}
            else:
                # never continue from a state we cannot prove consistent
                self._fail(f"gen {self.plan.gen}: no common in-memory step and no verified "
                           "checkpoint to fall back to")
                choice = {"source": "none", "step": -1}
        self.log({"event": "resume_chosen", "gen": self.plan.gen, **choice, "holdings": holdings})
        return choice

    def _fail(self, why: str) -> str:
        self.phase = "failed"
        self.store.set(keys.JOB_DONE, "failed")
        self.store.set(keys.wake(self.plan.gen + 1 if self.plan else 0), "failed")
        self.log({"event": "job_failed", "reason": why})
        return self.phase
