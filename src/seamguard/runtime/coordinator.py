"""The coordinator: one decision maker per job for membership, rollback and recovery.

Runs inside the launcher of node 0, next to the rendezvous store. Each `tick()` it reads
process exits (reported by every node's launcher), heartbeats and control-plane hints
from the store, judges them (detect.HeartbeatTracker), and when a rank is lost writes
the next generation's plan (membership.next_plan), collects what every member holds,
chooses the newest common step (membership.resume_step) or the last verified checkpoint
on storage (manifest.latest_verified), and waits for every member to confirm recovery
with matching parameter checksums. A failed or timed-out recovery is retried from disk.
It never imports torch: the store handle is passed in.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from seamguard import hintauth
from seamguard.runtime import cadence, keys, stepmodes
from seamguard.runtime.detect import Beat, HeartbeatTracker, NodeTracker
from seamguard.runtime.manifest import complete_steps, latest_verified
from seamguard.runtime.membership import Plan, initial_plan, next_plan, resume_step
from seamguard.runtime.metrics import JobView, RankView, StepClock
from seamguard.runtime.settings import LaunchSettings, RuntimeSettings, checkpoint_roots, under_roots


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
HINT_COUNTERS = (keys.HINT_CHECKPOINT, keys.HINT_INTERVAL_N, keys.HINT_TARGET_N,
                 keys.HINT_AVOID_RAILS_N, keys.HINT_DEGRADED_N, keys.HINT_ROLLBACK_N)
HINT_KEYS = (*HINT_COUNTERS, keys.HINT_EVACUATE)


@dataclass
class Coordinator:
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

    # ---------------------------------------------------------------- observation
    def _exited_before_registering(self) -> tuple[int, int] | None:
        """A worker that died before it registered (a bad script, a missing module): torchrun's
        ChildFailedError case, which ends the launch at once instead of at the start-up bound."""
        for w in self.all_workers:
            code = self._get(keys.exit_code(w))
            if code is not None and not self.store.check([keys.worker_addr(w)]):
                return w, int(code)
        return None

    def _hint_value(self, key: str, raw: bytes | None = None) -> str | None:
        """The value of the signed hint under ``key`` (read from the store unless given),
        or None when it is unsigned, forged, replayed or stale: refused, one event each."""
        raw = self._get(key) if raw is None else raw
        try:
            return self.hints.admit(key, (raw or b"").decode())
        except (hintauth.HintRefused, UnicodeDecodeError) as exc:
            self.log({"event": "hint_refused", "channel": "store", "hint": key,
                      "reason": getattr(exc, "reason", "unsigned"), "detail": str(exc)[:200]})
            return None

    def _roots(self) -> tuple[Path, ...]:
        """Where the job's checkpoint directories may be (settings.checkpoint_roots)."""
        return checkpoint_roots(self.checkpoint_dir, tuple(self._job_setting("checkpoint_roots")))

    def _read_hints(self) -> dict[str, bytes]:
        """This pass's hint keys (HINT_KEYS, all created at start): in one request, or from
        the watched copy (etcd). The copy may still show an evacuation this coordinator has
        already cleared: a value older than the clearing is not read again."""
        mirror = self._watched()
        if mirror is None:
            return dict(zip(HINT_KEYS, keys.read_existing(self.store, list(HINT_KEYS))))
        found = mirror.get_prefix(keys.HINT_PREFIX)
        if mirror.revision_of(keys.HINT_EVACUATE) < self._evacuate_cleared_rev:
            found.pop(keys.HINT_EVACUATE, None)
        return {k: found[k] for k in HINT_KEYS if k in found}

    def _peek_watched(self, key: str) -> bytes | None:
        """A key that only ever appears (joined spares, ready marks): from the watched copy
        where there is one (a copy behind the store shows it a pass later), else the store."""
        mirror = self._watched()
        return self._get(key) if mirror is None else mirror.get(key)

    def _read_joined(self) -> None:
        """Replacement spares started by node launchers enter the pool once ready."""
        raw = self._peek_watched(keys.JOINED_COUNT)
        while raw is not None and self._joined_seen < int(raw):
            wid = self._peek_watched(keys.joined(self._joined_seen + 1))
            if wid is None:
                break
            self._joined_seen += 1
            self.joined.append(int(wid))
        in_plan = set(self.plan.ranks) | set(self.plan.spares)
        fresh = [w for w in self.joined if w not in in_plan and w not in self.lost
                 and self._peek_watched(keys.ready(w)) is not None]
        if fresh:
            self.plan = replace(self.plan, spares=self.plan.spares + fresh)
            self.log({"event": "spare_ready", "wids": fresh})

    def _node_records(self) -> dict[int, dict]:
        """Each node's latest aggregated record: off its link (`link_records`), else
        keys.node_beats in the store (one range read)."""
        names = [str(n) for n in range(self.settings.nnodes)]
        records = {int(n): json.loads(raw) for n, raw in self._family(keys.NODE_PREFIX, names).items()}
        for node, rec in self.link_records().items():   # the newer of the two, by the node's counter
            if node not in records or rec["n"] >= records[node]["n"]:
                records[node] = rec
        return records

    def _family(self, prefix: str, names: list[str]) -> dict[str, bytes]:
        """keys.read_family, served from a watched local copy where the store offers one
        (etcd: the job-wide families read every tick cost the store nothing per tick)."""
        mirror = self._watched()
        return keys.read_family(self.store if mirror is None else mirror, prefix, names)

    def _watched(self):
        """The watched local copy of the whole job's keys where the store offers one (etcd),
        else None. One copy, one stream: changes arrive in the order they were made (a
        worker's done mark before its exit code, as written)."""
        if not hasattr(self.store, "mirror"):
            return None
        if "" not in self._mirrors:
            self._mirrors[""] = self.store.mirror(keys.ROOT + "/")
        return self._mirrors[""]

    def _pause_grace(self, now: float) -> None:
        """A pass that comes more than a quarter of the hang timeout after the previous one
        means this process did not run (2 cores shared by 20 runnable processes left a
        launcher without the CPU for 1.9 s): beats that arrived meanwhile could not be
        seen, so the trackers do not count the gap as silence. A loss is then judged up to
        the gap later; it is never judged on what was not observed."""
        gap_s, self._ticked_s = now - self._ticked_s, now
        if gap_s > self.settings.hang_timeout_s / 4:
            self.tracker.observer_paused(gap_s)
            self.nodes.observer_paused(gap_s)

    def _judge_nodes(self, now: float) -> set[int]:
        """A node whose launcher closed its link to this one without a goodbye, or stopped
        writing its record, is lost with all its workers."""
        if not self.settings.aggregate:
            return set()
        self._records = self._node_records()  # this tick's; _read_beats uses them too
        for node, rec in self._records.items():
            self.nodes.observe(node, rec["n"], {int(w) for w in rec["beats"]}, now)
        verdicts = []
        for node, why in self._links_closed.items():
            wids = self.nodes.link_closed(node, self._initial_workers(node))
            if wids is not None:
                verdicts.append((node, wids, f"its launcher's link to the coordinator closed ({why})"))
        self._links_closed = {}
        verdicts += [(node, wids, f"node record silent {silent:.2f}s > {self.settings.hang_timeout_s}s")
                     for node, wids, silent in self.nodes.verdicts(now)]
        out = set()
        for node, wids, evidence in verdicts:
            gone = {w for w in wids if w not in self.lost and w not in self.finished}
            self.log({"event": "node_lost", "node": node, "wids": sorted(gone), "evidence": evidence})
            for w in gone:
                self._evict(w)
            out |= gone
        return out

    def _initial_workers(self, node: int) -> set[int]:
        """The workers the node's launcher started (its ranks and spares), by the launch layout."""
        per_node = self.settings.nproc + self.settings.spares
        return set(range(node * per_node, (node + 1) * per_node))

    def _read_beats(self, wids: list[int]) -> dict[int, dict]:
        """The latest heartbeat of each of ``wids`` that has one: from the node records
        (aggregated: one range read) or from each worker's own key (one node, TCPStore)."""
        if self.settings.aggregate:
            merged: dict[int, dict] = {}
            for rec in self._records.values():
                merged.update({int(w): hb for w, hb in rec["beats"].items()})
            return {w: merged[w] for w in wids if w in merged}
        known = [w for w in wids if w in self._beating]
        raws = dict(zip(known, keys.read_existing(self.store, [keys.heartbeat(w) for w in known])))
        for w in wids:
            if w not in self._beating and (raw := self._get(keys.heartbeat(w))) is not None:
                raws[w] = raw
                self._beating.add(w)   # heartbeat keys are never deleted
        return {w: json.loads(r) for w, r in raws.items()}

    def _read_exits(self, fresh: bool = False) -> set[int]:
        """Workers that exited: lost, or finished (a done mark beside exit code 0).
        ``fresh``: read the store itself, not its watched copy, which may not have the
        exit code this node's launcher has just written yet (one pass, 50 ms, later)."""
        out = set()
        watched = [w for w in self.all_workers if w not in self.lost and w not in self.finished]
        family = (lambda prefix, names: keys.read_family(self.store, prefix, names)) if fresh else self._family
        codes = family(keys.EXIT_PREFIX, [str(w) for w in watched])
        dones = family(keys.DONE_PREFIX, list(codes)) if codes else {}
        for w in watched:
            code = codes.get(str(w))
            if code is None:
                continue
            if int(code) == 0 and str(w) in dones:
                self.finished.add(w)
                continue
            self.lost.add(w)
            out.add(w)
            self.log({"event": "detected", "wid": w, "kind": "exited", "code": int(code)})
        return out

    def _judge_heartbeats(self, now: float) -> set[int]:
        active = [w for w in self.plan.ranks if w not in self.lost and w not in self.finished]
        for w, hb in self._read_beats(active).items():
            self.tracker.observe(w, Beat(hb["n"], hb["step"], hb["phase"], hb["compute_s"]), now)
            self._furthest_step = max(self._furthest_step, int(hb["step"]))
            self._steps.advance(self._furthest_step, now)
            self._beats[w] = hb
        out = set()
        for v in self.tracker.verdicts(active, now):
            if v.kind == "straggler" and not self.settings.evacuate_stragglers:
                self.log({"event": "straggler", "wid": v.wid, "evidence": v.evidence})
                continue
            self.log({"event": "detected", "wid": v.wid, "kind": v.kind, "evidence": v.evidence})
            self._evict(v.wid)
            out.add(v.wid)
        return out

    def _read_evacuations(self) -> set[int]:
        raw = self._hints.get(keys.HINT_EVACUATE)
        if not raw:
            return set()
        if self._watched() is not None:   # the copy shows the old value until the clearing arrives
            self._evacuate_cleared_rev = self.store.put(keys.HINT_EVACUATE, "")
        else:
            self.store.set(keys.HINT_EVACUATE, "")
        value = self._hint_value(keys.HINT_EVACUATE, raw)
        out = set()
        for r in filter(None, (value or "").split(",")):
            if not r.strip().isdigit():
                continue
            r = int(r)
            if 0 <= r < self.plan.world_size:
                w = self.plan.ranks[r]
                self.log({"event": "detected", "wid": w, "kind": "evacuate_hint", "rank": r})
                self._evict(w)
                self._suspect_hosts.add(self._host_of(w))
                out.add(w)
        return out

    def _host_of(self, wid: int) -> str:
        """The address a worker registered from, less its port: its node on this job's network."""
        return (self._get(keys.worker_addr(wid)) or b"").decode().rpartition(":")[0]

    def _spares_on_suspect_hosts(self) -> frozenset[int]:
        """Spares on a node a rank was evacuated from: replacements go elsewhere while another is left."""
        if not self._suspect_hosts:
            return frozenset()
        return frozenset(w for w in self.plan.spares if self._host_of(w) in self._suspect_hosts)

    def _ahead_step(self) -> int | None:
        """A step far enough ahead that every rank reads a key set now before reaching it:
        3 steps, plus in steps of the job's pace how far the ranks may be past the steps
        their beats report (0.5 s, or the beats' staleness if longer) and the age of the
        keys.CONTROL_N reading a rank may rely on (Runtime._controls: one heartbeat, and
        one node beat through the node's mirror). The pace is the shortest compute time
        (before the collective) a rank's last step took: the ranks step together, so it
        can only understate the step time, and one slow step cannot shrink the margin.
        None until a beat reports one: the caller asks again next tick, so a change asked
        for as the job starts lands a few steps ahead, not an arbitrary number."""
        beats = list(self._read_beats(self.plan.ranks).values())
        step_s = min((b["compute_s"] for b in beats if b["compute_s"] > 0), default=0.0)
        if step_s <= 0:
            return None
        stale_s = self._job_setting("heartbeat_interval_s") + (
            self.settings.node_beat_s if self.settings.aggregate else 0.0)
        margin = 3 + min(1000, math.ceil((max(0.5, stale_s) + stale_s) / step_s))
        return max(b["step"] for b in beats) + margin

    def _read_checkpoint_hint(self) -> None:
        """A `checkpoint_now` hint: persist at the nearest step every rank learns of in time."""
        raw = self._hints.get(keys.HINT_CHECKPOINT)
        if raw is None or int(raw) <= self._hint_checkpoint or (target := self._ahead_step()) is None:
            return
        self._hint_checkpoint = int(raw)
        if self._hint_value(keys.HINT_CHECKPOINT_REQ) is None:
            return
        self.store.set(keys.HINT_PERSIST_AT, str(target))
        self._controls_changed()
        self.log({"event": "checkpoint_hint", "persist_at": target})

    def _checkpoint_roots(self) -> list[Path]:
        """Every directory the job's checkpoints may be in: its own, then those it was moved to."""
        if self.checkpoint_dir is None:
            return []
        used = cadence.targets_used(self.checkpoint_dir,
                                    cadence.parse_targets((self._get(keys.PERSIST_TARGETS) or b"").decode()))
        roots = self._roots()   # a target written into the store by anyone else is not read from
        return [d for d in used if d == self.checkpoint_dir or under_roots(d, roots)]

    def _read_target_hint(self) -> None:
        """A checkpoint directory (off a slow storage path) -> every rank persists there from a step all agree on."""
        raw = self._hints.get(keys.HINT_TARGET_N)
        if (raw is None or int(raw) <= self._hint_target or self.checkpoint_dir is None
                or (ahead := self._ahead_step()) is None):
            return
        self._hint_target = int(raw)
        want = self._hint_value(keys.HINT_TARGET)
        if want is None:
            return
        want = want.strip() or "default"
        if want != "default" and not under_roots(want, self._roots()):
            self.hints.refused["outside_roots"] += 1
            self.log({"event": "hint_refused", "channel": "store", "hint": keys.HINT_TARGET,
                      "reason": "outside_roots", "detail": f"{want[:120]} is not under "
                      f"{', '.join(str(r) for r in self._roots())} (--checkpoint-roots)"})
            return
        entries = cadence.parse_targets((self._get(keys.PERSIST_TARGETS) or b"").decode())
        start = max(ahead, entries[-1].start_step + 1 if entries else 0)
        entries += (cadence.TargetEntry(start, "" if want == "default" else want),)
        self.store.set(keys.PERSIST_TARGETS, cadence.format_targets(entries))
        self._controls_changed()
        self.log({"event": "checkpoint_dir", "dir": want, "from_step": start})

    def _read_interval_hint(self) -> None:
        """A checkpoint interval in seconds -> steps at the job's pace, from a step every rank agrees on."""
        raw = self._hints.get(keys.HINT_INTERVAL_N)
        if raw is None or int(raw) <= self._hint_interval:
            return
        pace_s = self._steps.seconds_per_step()
        if not pace_s or pace_s <= 0 or (ahead := self._ahead_step()) is None:
            return  # the job's pace is not known yet (its first steps): asked again next tick
        self._hint_interval = int(raw)   # read once: the signed value is taken once
        want = (self._hint_value(keys.HINT_INTERVAL_S) or "").strip()
        try:
            seconds = None if want == "default" else float(want)
            if seconds is not None and not 0 < seconds < math.inf:
                raise ValueError(want)
            every = cadence.every_steps_for(seconds, pace_s)
        except ValueError:
            if want:
                self.log({"event": "hint_refused", "channel": "store", "hint": keys.HINT_INTERVAL_S,
                          "reason": "malformed", "detail": f"expected seconds or 'default', got {want[:40]!r}"})
            return
        entries = cadence.parse((self._get(keys.PERSIST_CADENCE) or b"").decode())
        start = max(ahead, entries[-1].start_step + 1 if entries else 0)
        entries += (cadence.CadenceEntry(start, every),)
        self.store.set(keys.PERSIST_CADENCE, cadence.format_entries(entries))
        self._controls_changed()
        self.log({"event": "checkpoint_interval", "interval": want, "every_steps": every, "from_step": start})

    def _controls_changed(self) -> None:
        """After writing a key ranks obey from a step (keys.CONTROL_KEYS): tell them to read
        those keys again (they look at the counter with the generation, every heartbeat)."""
        self.store.add(keys.CONTROL_N, 1)

    @cached_property
    def _job_settings(self) -> RuntimeSettings:
        """The workers' RuntimeSettings, as the launch passed them (read once)."""
        return RuntimeSettings.from_env(self.settings.env)

    def _job_setting(self, name: str) -> Any:
        return getattr(self._job_settings, name)

    def _job_rails(self) -> tuple[str, ...]:
        return tuple(self._job_setting("rails"))

    def _tune_snapshot_interval(self) -> None:
        """``--snapshot-every auto``: Daly's interval (cadence.auto_every_steps) for the
        snapshot cost the ranks measured (the costliest rank's: the job waits for it) and
        the job's failure rate (one rank's, ``rank_mttf_h``, times the ranks), in steps at
        the job's pace; published from a step every rank agrees on when it moves by more
        than cadence.retune allows."""
        if self.phase != "running" or not self._job_setting("snapshot_auto"):
            return
        costs = [self._beats[w].get("snap_cost_s") for w in self.plan.ranks if w in self._beats]
        known = [c for c in costs if c is not None]
        step_s = self._steps.seconds_per_step()
        if not known or not step_s:
            return
        mttf_h = float(self._job_setting("rank_mttf_h"))
        copies = min(int(self._beats[w].get("copies", 1)) for w in self.plan.ranks if w in self._beats)
        mttf_s = cadence.uncovered_mttf_s(mttf_h * 3600.0, self.plan.world_size, copies, self._exposed_s())
        every = cadence.auto_every_steps(max(known), step_s, mttf_s)
        current = self._snap_entries[-1].every_steps if self._snap_entries else int(
            self._job_setting("snapshot_every_steps"))
        if not cadence.retune(current, every) or (ahead := self._ahead_step()) is None:
            return
        start = max(ahead, self._snap_entries[-1].start_step + 1 if self._snap_entries else 0)
        self._snap_entries = (*self._snap_entries, cadence.CadenceEntry(start, every))[-cadence.KEEP_ENTRIES:]
        self.store.set(keys.SNAPSHOT_CADENCE, cadence.format_entries(self._snap_entries))
        self._controls_changed()
        self.log({"event": "snapshot_interval", "every_steps": every, "from_step": start,
                  "cost_s": round(max(known), 4), "step_s": round(step_s, 4), "rank_mttf_h": mttf_h,
                  "ranks": self.plan.world_size, "live_copies": copies,
                  "uncovered_mttf_h": round(mttf_s / 3600.0, 6) if math.isfinite(mttf_s) else None})

    def _exposed_s(self) -> float:
        """How long a shard can stand with one live copy fewer: from a loss until its
        replacement holds the state again, which is the hang timeout (a loss can go unseen
        that long) plus the slowest recovery this job has had from detection to resumed,
        or, before any, the bound on one (recovery_timeout_s)."""
        recovery_s = self._slowest_recovery_s or float(self._job_setting("recovery_timeout_s"))
        return self.settings.hang_timeout_s + recovery_s

    def _read_step_mode_hints(self) -> None:
        """Rails to stay off and degraded mode -> a step mode from a step every rank agrees on."""
        n_avoid, n_degraded = self._hints.get(keys.HINT_AVOID_RAILS_N), self._hints.get(keys.HINT_DEGRADED_N)
        new_avoid = n_avoid is not None and int(n_avoid) > self._hint_avoid
        new_degraded = n_degraded is not None and int(n_degraded) > self._hint_degraded
        if not (new_avoid or new_degraded) or (ahead := self._ahead_step()) is None:
            return
        entries = stepmodes.parse((self._get(keys.STEP_MODES) or b"").decode())
        now = entries[-1] if entries else stepmodes.NORMAL
        avoid, degraded, note = now.avoid, now.degraded, ""
        if new_avoid:
            self._hint_avoid = int(n_avoid)
            text = self._hint_value(keys.HINT_AVOID_RAILS)
            if text is not None:
                try:
                    asked = stepmodes.parse_avoid_file(text)
                except ValueError as exc:
                    self.log({"event": "hint_refused", "channel": "store", "hint": keys.HINT_AVOID_RAILS,
                              "reason": "malformed", "detail": str(exc)[:200]})
                else:
                    avoid, note = stepmodes.rails_to_avoid(self._job_rails(), asked)
        if new_degraded:
            self._hint_degraded = int(n_degraded)
            degraded = {"on": True, "off": False}.get((self._hint_value(keys.HINT_DEGRADED) or "").strip(),
                                                      degraded)
        if (avoid, degraded) == (now.avoid, now.degraded):
            if note:
                self.log({"event": "step_mode_unchanged", "avoid_rails": list(avoid), "note": note})
            return
        start = max(ahead, entries[-1].start_step + 1 if entries else 0)
        entries += (stepmodes.StepMode(start, avoid, degraded),)
        self.store.set(keys.STEP_MODES, stepmodes.format_modes(entries))
        self._controls_changed()
        self.log({"event": "step_mode", "avoid_rails": list(avoid), "degraded": degraded, "from_step": start,
                  **({"note": note} if note else {})})

    def _read_rollback_hint(self, now: float) -> bool:
        """A rollback request (e.g. corruption found after it was persisted): every rank
        goes back, in place, to the requested step or the newest persisted one, from its
        own host-memory copy where it still has one (the runtime keeps the newest
        persisted snapshot), else from storage. True if a rollback generation started."""
        raw = self._hints.get(keys.HINT_ROLLBACK_N)
        if raw is None or int(raw) <= self._hint_rollback:
            return False
        self._hint_rollback = int(raw)
        value = self._hint_value(keys.HINT_ROLLBACK_TO)
        if value is None or not value.strip().lstrip("-").isdigit():
            return False
        asked = int(value)
        complete = sorted({st for d in self._checkpoint_roots() for st in complete_steps(d)}, reverse=True)
        target = (complete[0] if complete else None) if asked < 0 else asked
        if target is None or target not in complete:
            # only a step every rank persisted is sure to exist somewhere (the copies in
            # host memory speed it up); anything else would end the job: refuse, go on
            self.log({"event": "rollback_rejected", "asked": asked, "persisted": complete,
                      "reason": "no complete persisted checkpoint to go back to" if target is None
                      else f"step {target} is not a complete persisted checkpoint"})
            return False
        self.log({"event": "rollback_requested", "to_step": target})
        self._detected_at_s = now   # the request is what `since_detection_s` counts from
        self._replan(set(), now, reason=f"rollback to step {target}", max_step=target)
        return True

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

    def _evict(self, wid: int) -> None:
        self.lost.add(wid)
        self.tracker.forget(wid)
        self.store.set(keys.kill_request(wid), "1")

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
