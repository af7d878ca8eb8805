"""Actuator for jobs run by seamguard's resilient runtime: control-plane hints.

The runtime's documented channel (docs/runtime.md) is a hint directory per job that its
launcher polls. This actuator turns two decisions into hint files:

- ``checkpoint_now`` (one-shot): a file ``checkpoint_now``; every rank persists the next
  snapshot;
- ``checkpoint_interval`` (held): a file ``checkpoint_interval_s`` with the interval in
  seconds; reverting it writes ``default`` (the job's own ``--persist-every`` again), and
  only when the reverted key is the one the job runs with — a newer interval applied in the
  same tick is not undone;
- ``avoid_storage`` of the storage path a job checkpoints to: a file ``checkpoint_dir``
  naming the job's next candidate directory on a storage path not avoided
  (``checkpoint_dirs``: job -> {storage path: directory}, its own first); reverting it
  writes ``default`` (the job's own directory again) once no avoided path is left behind
  it, else the next candidate;
- ``drain`` of a node that runs ranks of the job (the launcher's ``.placement.json`` in the
  hint directory names each rank's node): a file ``evacuate_rank_<r>`` per rank there, so
  hot spares on other nodes take them before the node fails (the runtime prefers spares
  off an evacuated node). Reverting the drain has nothing to undo in the job;
- ``avoid_link`` of a NIC's own link (``<node>/<nic>~<switch>``, or the NIC ``<node>/<nic>``)
  on a node that runs ranks of the job: a held file ``avoid_rails`` listing every rail the
  job's held avoid_link keys name, one ``<rail> <severity>`` a line (``rail_names`` maps a
  NIC to the interface name the job's ``--rails`` uses; default: the NIC's own name); the
  job's all-reduce leaves them from a step every rank agrees on (never its last rail).
  Reverting a key rewrites the file without that rail (``default``: none), and only for a
  key this actuator recorded. Switch-to-switch links are routing, not a job's: no hint;
- ``degraded`` (held) rides ``checkpoint_interval``: the planner holds an interval for a
  job exactly while its nodes are at risk (decide/intervals.py), so delivering one also
  writes ``degraded`` = ``on`` (every step snapshotted, snapshot push and persist
  synchronous, persists twice as often: runtime/stepmodes.py), and reverting the interval
  the job runs with writes ``off``.

Operators switch the last two off per actuator (``avoid_rails: false``, ``degraded: false``
in the runtime actuator's config): the actuator then neither takes avoid_link nor writes
``degraded``.

Files are written atomically (temp file, fsync, rename) and signed with the job's hint key
(runtime/hintauth.py), read afresh for every hint from ``<hint dir>/.hint-key`` (the key
the job's launcher writes there, mode 0600, at every launch) or the file ``key_files``
names for the job: a job refuses a hint that is not signed with its key. The controller
therefore runs as the user that launched the job, or is given the key file. The actuator
keeps its own record of what it delivered, in the same directory, so a restarted
controller knows which hints are in effect and never asks twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from seamguard.act.base import ActionResult, verb_of
from seamguard.assess.states import STATE_BY_LABEL
from seamguard.decide.actions import Action, ActionKey, Verb
from seamguard import hintauth, hintfiles

APPLIED_LOG = ".seamguard-hints.jsonl"
# the hint-file protocol, shared with the job's launcher: seamguard/hintfiles.py
_FILE = {Verb.CHECKPOINT_NOW: hintfiles.CHECKPOINT_NOW, Verb.CHECKPOINT_INTERVAL: hintfiles.CHECKPOINT_INTERVAL,
         Verb.AVOID_STORAGE: hintfiles.CHECKPOINT_DIR}
PLACEMENT_FILE = hintfiles.PLACEMENT_FILE  # written by `seamguard launch`
AVOID_RAILS_FILE, DEGRADED_FILE = hintfiles.AVOID_RAILS, hintfiles.DEGRADED
SEVERITY_UNKNOWN = hintfiles.SEVERITY_UNKNOWN  # an avoid_link whose reason names no state: the worst


def nic_of_link(entity: str) -> str | None:
    """The NIC an avoid_link names: ``<node>/<nic>~<switch>`` (a NIC's own link, as the fleet
    names it) or ``<node>/<nic>``; None for a switch-to-switch link."""
    nic = entity.partition("~")[0]
    node, _, own = nic.rpartition("/")
    return nic if node and own else None


def severity_of(reason: str) -> int:
    """The state an avoid_link's reason names (``seamguard: <state> ...``), as a number."""
    words = reason.split()
    state = STATE_BY_LABEL.get(words[1]) if len(words) > 1 and words[0] == "seamguard:" else None
    return int(state) if state is not None else SEVERITY_UNKNOWN


def ranks_on(d: Path, node: str) -> list[int]:
    """The job's ranks on ``node``, from the placement its launcher publishes (none if unknown)."""
    try:
        return hintfiles.ranks_on((d / PLACEMENT_FILE).read_text(encoding="utf-8"), node)
    except (OSError, UnicodeDecodeError):
        return []


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class RuntimeHintActuator:
    name = "runtime"
    verbs = frozenset(_FILE) | {Verb.DRAIN}

    def __init__(self, hint_dirs: dict[str, Path],
                 checkpoint_dirs: dict[str, dict[str, Path]] | None = None,
                 rail_names: dict[str, str] | None = None, avoid_rails: bool = True, degraded: bool = True,
                 key_files: dict[str, Path] | None = None) -> None:
        """``hint_dirs``: job name -> the directory its `seamguard launch --hint-dir` polls;
        ``checkpoint_dirs``: job name -> {storage path name: a checkpoint directory on it},
        the job's own ``--checkpoint-dir`` first; ``rail_names``: NIC name -> the rail
        interface its jobs' ``--rails`` name it by; ``avoid_rails``/``degraded``: False
        turns that hint off; ``key_files``: job name -> its hint key file, where it is not
        ``<hint dir>/.hint-key`` (`seamguard launch --hint-key-file`)."""
        self.hint_dirs = {job: Path(d) for job, d in hint_dirs.items()}
        self._key_files = {Path(self.hint_dirs[job]): Path(f) for job, f in (key_files or {}).items()
                           if job in self.hint_dirs}
        self.checkpoint_dirs = {job: {s: Path(d) for s, d in m.items()} for job, m in (checkpoint_dirs or {}).items()}
        self.rail_names = dict(rail_names or {})
        self.degraded = degraded
        if not self.checkpoint_dirs:  # nothing to move: avoid_storage is not this actuator's
            self.verbs = self.verbs - {Verb.AVOID_STORAGE}
        if avoid_rails:
            self.verbs = self.verbs | {Verb.AVOID_LINK}

    def _records(self, d: Path) -> list[dict]:
        log = d / APPLIED_LOG
        if not log.exists():
            return []
        out = []
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line: that delivery never completed
            if isinstance(rec, dict) and isinstance(rec.get("key"), str):
                out.append(rec)
        return out

    def observe(self) -> set[str]:
        """Checkpoints delivered, drains evacuated and not reverted, and the interval each job
        runs with (the last delivered, unless reverted)."""
        held: set[str] = set()
        for d in self.hint_dirs.values():
            interval: str | None = None
            for rec in self._records(d):
                key, revert = rec["key"], rec.get("op") == "revert"
                if verb_of(key) == Verb.CHECKPOINT_INTERVAL:
                    interval = (None if key == interval else interval) if revert else key
                elif revert:
                    held.discard(key)
                else:
                    held.add(key)
            if interval is not None:
                held.add(interval)
        return held

    def apply(self, action: Action) -> ActionResult:
        if action.verb == Verb.DRAIN:
            return self._evacuate(action)
        if action.verb == Verb.AVOID_LINK:
            return self._avoid_rail(action)
        if action.verb == Verb.AVOID_STORAGE:
            return self._retarget(action.key, avoided=self._avoided() | {action.target})
        d = self.hint_dirs.get(action.target)
        if d is None:
            return ActionResult(True, f"job {action.target!r} is not run by the seamguard runtime here: "
                                      "no hint directory configured, nothing to do")
        if action.verb == Verb.CHECKPOINT_INTERVAL:
            text = action.param("interval_s") or ActionKey.parse(action.key).value
            try:
                if float(text) <= 0:
                    raise ValueError
            except ValueError:
                return ActionResult(False, f"{action.key}: interval {text!r} is not a positive number of seconds")
        else:
            text = action.reason
        res = self._deliver(d, _FILE[action.verb], text + "\n", {"key": action.key, "reason": action.reason})
        if res.ok and action.verb == Verb.CHECKPOINT_INTERVAL and self.degraded:
            return self._deliver(d, DEGRADED_FILE, hintfiles.degraded_text(True), None)
        return res

    def _avoid_rail(self, action: Action) -> ActionResult:
        """avoid_link of a NIC's link -> each job with ranks on its node stays off that rail."""
        nic = nic_of_link(action.target)
        if nic is None:
            return ActionResult(True, f"{action.target} is not a NIC's own link: no job's rail to avoid")
        node = nic.rpartition("/")[0]
        rail = self.rail_names.get(nic, nic.rpartition("/")[2])
        moved = []
        for job, d in self.hint_dirs.items():
            if not ranks_on(d, node):
                continue
            rec = {"key": action.key, "job": job, "rail": rail, "severity": severity_of(action.reason),
                   "reason": action.reason}
            rails = self._avoided_rails(d)
            rails[rail] = max(rails.get(rail, 0), rec["severity"])
            res = self._write_avoid_file(d, rails)
            if res.ok:
                res = self._deliver_record(d, rec)
            if not res.ok:
                return res
            moved.append(job)
        if not moved:
            return ActionResult(True, f"no seamguard-runtime rank runs on {node}: no rail to avoid")
        return ActionResult(True, f"{', '.join(moved)} stay off rail {rail} ({nic})")

    def _avoided_rails(self, d: Path, without: str | None = None) -> dict[str, int]:
        """Rail -> worst severity over the avoid_link keys held in ``d`` (``without`` one key)."""
        held: dict[str, dict] = {}
        for rec in self._records(d):
            if verb_of(rec["key"]) != Verb.AVOID_LINK:
                continue
            if rec.get("op") == "revert":
                held.pop(rec["key"], None)
            elif "rail" in rec:
                held[rec["key"]] = rec
        out: dict[str, int] = {}
        for key, rec in held.items():
            if key != without:
                out[rec["rail"]] = max(out.get(rec["rail"], 0), int(rec.get("severity", SEVERITY_UNKNOWN)))
        return out

    def _write_avoid_file(self, d: Path, rails: dict[str, int]) -> ActionResult:
        return self._deliver(d, AVOID_RAILS_FILE, hintfiles.avoid_rails_text(rails), None)

    def _evacuate(self, action: Action) -> ActionResult:
        moved = []
        for job, d in self.hint_dirs.items():
            ranks = ranks_on(d, action.target)
            if not ranks:
                continue
            for r in ranks:
                res = self._deliver(d, hintfiles.evacuate_file(r), action.reason + "\n", None)
                if not res.ok:
                    return res
            res = self._deliver_record(d, {"key": action.key, "job": job, "ranks": ranks, "reason": action.reason})
            if not res.ok:
                return res
            moved.append(f"{job} ranks {','.join(map(str, ranks))}")
        if not moved:
            return ActionResult(True, f"no seamguard-runtime rank runs on {action.target}: nothing to evacuate")
        return ActionResult(True, f"evacuating {'; '.join(moved)} off {action.target} to hot spares")

    def _avoided(self) -> set[str]:
        return {ActionKey.parse(k).entity for k in self.observe() if verb_of(k) == Verb.AVOID_STORAGE}

    def _retarget(self, key: str, avoided: set[str], revert: bool = False) -> ActionResult:
        """Point each job at its first candidate directory on a storage path not avoided
        ("default": its own), writing the hint only where that changes; record the key."""
        notes = []
        for job, candidates in self.checkpoint_dirs.items():
            d = self.hint_dirs.get(job)
            if d is None or not candidates:
                continue
            ok = [name for name in candidates if name not in avoided]
            want = None if not ok else hintfiles.DEFAULT if ok[0] == next(iter(candidates)) else str(candidates[ok[0]])
            rec = {"key": key, **({"op": "revert"} if revert else {})}
            if want is None:
                notes.append(f"{job}: every checkpoint path is avoided; its checkpoints stay where they are")
            elif want != self._target_of(d):
                res = self._deliver(d, _FILE[Verb.AVOID_STORAGE], want + "\n", None)
                if not res.ok:
                    return res
                rec["target"] = want
                notes.append(f"{job} checkpoints to {want}")
            res = self._deliver_record(d, rec)
            if not res.ok:
                return res
        return ActionResult(True, "; ".join(notes) or "no job's checkpoint target changes")

    def _target_of(self, d: Path) -> str:
        """The checkpoint target last written for the job (``default`` if none)."""
        target = hintfiles.DEFAULT
        for rec in self._records(d):
            target = rec.get("target", target)
        return target

    def revert(self, key: str) -> ActionResult:
        ak = ActionKey.parse(key)
        if ak.verb == Verb.AVOID_STORAGE:
            return self._retarget(key, avoided=self._avoided() - {ak.entity}, revert=True)
        if ak.verb == Verb.AVOID_LINK:
            return self._unavoid_rail(key)
        if ak.verb == Verb.DRAIN:
            for d in self.hint_dirs.values():
                if any(r["key"] == key for r in self._records(d)):
                    res = self._deliver_record(d, {"key": key, "op": "revert"})
                    if not res.ok:
                        return res
            return ActionResult(True, "the job's ranks stay where the evacuation put them")
        if ak.verb != Verb.CHECKPOINT_INTERVAL:
            return ActionResult(True, "one-shot hint: nothing to revert")
        d = self.hint_dirs.get(ak.entity)
        if d is None:
            return ActionResult(True, f"job {ak.entity!r} has no hint directory: nothing to revert")
        if key not in self.observe():
            # a newer interval replaced it (or it was never delivered): the job keeps that one
            res = self._deliver_record(d, {"key": key, "op": "revert"})
            return ActionResult(True, "a newer interval is in effect: the job keeps it") if res.ok else res
        res = self._deliver(d, _FILE[Verb.CHECKPOINT_INTERVAL], hintfiles.interval_text(None),
                            {"key": key, "op": "revert"})
        if res.ok and self.degraded:
            return self._deliver(d, DEGRADED_FILE, hintfiles.degraded_text(False), None)
        return res

    def _unavoid_rail(self, key: str) -> ActionResult:
        """Each job that stays off a rail for ``key`` goes back to it, unless another held key avoids it too."""
        back = []
        for job, d in self.hint_dirs.items():
            if key not in self._avoided_keys(d):
                continue  # not ours here: never undo what this actuator did not do
            res = self._write_avoid_file(d, self._avoided_rails(d, without=key))
            if res.ok:
                res = self._deliver_record(d, {"key": key, "op": "revert"})
            if not res.ok:
                return res
            back.append(job)
        return ActionResult(True, f"{', '.join(back)} may use the rail again" if back else
                            "no job stays off a rail for this key: nothing to revert")

    def _avoided_keys(self, d: Path) -> set[str]:
        held: set[str] = set()
        for rec in self._records(d):
            if verb_of(rec["key"]) == Verb.AVOID_LINK:
                (held.discard if rec.get("op") == "revert" else held.add)(rec["key"])
        return held

    def _deliver(self, d: Path, name: str, text: str, record: dict | None) -> ActionResult:
        """Write a signed hint file, then (if given) the record that it was delivered."""
        key_file = hintauth.key_file_for(d, self._key_files.get(d))
        try:
            key = hintauth.read_key(key_file)
        except ValueError as e:
            return ActionResult(False, f"{d}: cannot sign the hint ({e}); is the job launched with "
                                       "this --hint-dir?", retryable=True)
        try:
            d.mkdir(parents=True, exist_ok=True)
            hintauth.write_hint_file(d, name, text, key)
            if record is not None:
                _append(d / APPLIED_LOG, record)
        except OSError as e:
            return ActionResult(False, f"{d}: cannot write the hint: {e.strerror}", retryable=True)
        return ActionResult(True, f"hint written to {d / name}: {text.strip()[:80]}")

    @staticmethod
    def _deliver_record(d: Path, record: dict) -> ActionResult:
        try:
            d.mkdir(parents=True, exist_ok=True)
            _append(d / APPLIED_LOG, record)
        except OSError as e:
            return ActionResult(False, f"{d}: cannot record the hint: {e.strerror}", retryable=True)
        return ActionResult(True, "recorded")
