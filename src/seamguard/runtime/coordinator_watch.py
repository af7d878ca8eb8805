"""What the coordinator sees of its job: losses, and the pool of workers it may plan with.

The observing half of `Coordinator` (runtime/coordinator.py), a mixin it is built from:
each pass it reads process exits, the node records (off the node launchers' links,
runtime/nodelink.py, else the store) and heartbeats, judges them (detect.HeartbeatTracker,
detect.NodeTracker) and evacuation hints, evicts what it judged lost, and takes replacement
spares into the pool once ready. It reads the store (or its watched copy, etcd) and writes
only kill requests and the clearing of the evacuate hint; what to do about a loss is the
coordinator's (membership.next_plan). Its state lives on the `Coordinator` dataclass.
"""

from __future__ import annotations

import json
from dataclasses import replace

from seamguard.runtime import keys
from seamguard.runtime.detect import Beat


class MembershipWatch:
    """The coordinator's observation passes (mixed into `Coordinator`, whose fields they use)."""

    def _exited_before_registering(self) -> tuple[int, int] | None:
        """A worker that died before it registered (a bad script, a missing module): torchrun's
        ChildFailedError case, which ends the launch at once instead of at the start-up bound."""
        for w in self.all_workers:
            code = self._get(keys.exit_code(w))
            if code is not None and not self.store.check([keys.worker_addr(w)]):
                return w, int(code)
        return None

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

    def _evict(self, wid: int) -> None:
        self.lost.add(wid)
        self.tracker.forget(wid)
        self.store.set(keys.kill_request(wid), "1")
