"""Control-plane hints -> the control keys every rank obeys from a step they all agree on.

The controlling half of `Coordinator` (runtime/coordinator.py), a mixin it is built from:
it reads the job's signed hint keys (HINT_KEYS, written by the launcher from hint files,
runtime/hintbridge.py) and turns them into a persist step (`checkpoint_now`), a persist
cadence (cadence.CadenceEntry), a checkpoint directory (cadence.TargetEntry), step modes
(stepmodes.StepMode), a rollback generation, and, for ``--snapshot-every auto``, the
snapshot interval (Daly's, cadence.auto_every_steps). Each takes effect from a step far
enough ahead (`_ahead_step`) that every rank reads it first; keys.CONTROL_N tells them to.
Its state lives on the `Coordinator` dataclass.
"""

from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import Any

from seamguard import hintauth
from seamguard.runtime import cadence, keys, stepmodes
from seamguard.runtime.manifest import complete_steps
from seamguard.runtime.settings import RuntimeSettings, checkpoint_roots, under_roots

HINT_COUNTERS = (keys.HINT_CHECKPOINT, keys.HINT_INTERVAL_N, keys.HINT_TARGET_N,
                 keys.HINT_AVOID_RAILS_N, keys.HINT_DEGRADED_N, keys.HINT_ROLLBACK_N)
HINT_KEYS = (*HINT_COUNTERS, keys.HINT_EVACUATE)


class ControlHints:
    """The coordinator's hint handling (mixed into `Coordinator`, whose fields it uses)."""

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

    def _hints_taken_up_to_now(self) -> None:
        """A coordinator taking over (Coordinator.take_over): every hint its predecessor
        could have taken counts as taken (its effects are in the control keys already),
        so none is carried out twice."""
        now = dict(zip(HINT_COUNTERS, keys.read_existing(self.store, list(HINT_COUNTERS))))
        self._hint_checkpoint, self._hint_interval = int(now[keys.HINT_CHECKPOINT]), int(now[keys.HINT_INTERVAL_N])
        self._hint_target, self._hint_avoid = int(now[keys.HINT_TARGET_N]), int(now[keys.HINT_AVOID_RAILS_N])
        self._hint_degraded, self._hint_rollback = int(now[keys.HINT_DEGRADED_N]), int(now[keys.HINT_ROLLBACK_N])

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

    def _controls_changed(self) -> None:
        """After writing a key ranks obey from a step (keys.CONTROL_KEYS): tell them to read
        those keys again (they look at the counter with the generation, every heartbeat)."""
        self.store.add(keys.CONTROL_N, 1)

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

    def _roots(self) -> tuple[Path, ...]:
        """Where the job's checkpoint directories may be (settings.checkpoint_roots)."""
        return checkpoint_roots(self.checkpoint_dir, tuple(self._job_setting("checkpoint_roots")))

    def _checkpoint_roots(self) -> list[Path]:
        """Every directory the job's checkpoints may be in: its own, then those it was moved to."""
        if self.checkpoint_dir is None:
            return []
        used = cadence.targets_used(self.checkpoint_dir,
                                    cadence.parse_targets((self._get(keys.PERSIST_TARGETS) or b"").decode()))
        roots = self._roots()   # a target written into the store by anyone else is not read from
        return [d for d in used if d == self.checkpoint_dir or under_roots(d, roots)]

    @cached_property
    def _job_settings(self) -> RuntimeSettings:
        """The workers' RuntimeSettings, as the launch passed them (read once)."""
        return RuntimeSettings.from_env(self.settings.env)

    def _job_setting(self, name: str) -> Any:
        return getattr(self._job_settings, name)

    def _job_rails(self) -> tuple[str, ...]:
        return tuple(self._job_setting("rails"))
