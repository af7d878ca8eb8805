"""The control loop: Frame -> assess -> decide -> act, every step in the ledger.

The controller owns the only mutable state of the core (history, state vectors,
breaker) and hands it to the pure stages each tick. Time comes from the frames it is
given, so the same controller runs live, in a backtest and inside the twin. A tick
that fails (bad data, a bug) is recorded and skipped; the controller keeps running.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass, field, replace

import numpy as np

from seamguard.act.base import Actuator
from seamguard.act.reconcile import Change, observe_all, reconcile
from seamguard.assess.assessment import ASSESSED_KINDS, Assessment, assess, initial_states
from seamguard.assess.baselines import Baselines
from seamguard.assess.overrides import Pin, apply_pins
from seamguard.assess.quality import FreezeState, FreezeView, bad_scopes, scope_masks, step_freeze
from seamguard.assess.propagation import all_dependents
from seamguard.assess.states import STATE_BY_LABEL, State, StateVector
from seamguard.decide.actions import Decisions
from seamguard.decide.breaker import BreakerState
from seamguard.decide.planner import DecideState, decide
from seamguard.decide.policy import Policy, PolicyError, check_mode
from seamguard.fleet.model import KIND_BY_LABEL, Fleet, Kind
from seamguard.ledger.sqlite import Fenced, Ledger
from seamguard.observe.frame import Frame
from seamguard.observe.history import History

log = logging.getLogger("seamguard.control")

_SV_FIELDS = ("state", "dwell", "above_degrade", "above_quarantine", "below_exit", "entered_t_s")

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_TRIM_THRESHOLD_BYTES = 2**31 - 1  # the largest an int takes: free memory at the heap's top is kept


def retain_freed_memory() -> bool:
    """Let the memory a tick frees serve the next tick (glibc malloc; elsewhere nothing changes).

    glibc serves every block of 32 MiB or more (at a million GPUs, each kind's evidence
    matrices: 224 MiB for the GPUs' 28 channels) from a fresh ``mmap`` and returns it on
    free, so every tick faulted its matrices in again, page by page and (numpy asks for huge
    pages) with the kernel compacting memory for them: most of a 1M-GPU tick's growth over
    10x the 100k tick. With ``mmap`` off and the heap kept, the next tick reuses the same
    pages; the process keeps its peak (the tick's working set) instead of returning it between
    ticks. Values are unchanged. Returns whether the allocator took the setting."""
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own policy
        return False
    return ok


@dataclass
class TickReport:
    tick: int
    t_s: float
    assessment: Assessment | None
    decisions: Decisions | None
    changes: list[Change] = field(default_factory=list)
    assess_s: float = 0.0
    decide_s: float = 0.0
    act_s: float = 0.0
    tick_s: float = 0.0
    error: str = ""


class Controller:
    def __init__(self, fleet: Fleet, policy: Policy, actuators: list[Actuator] | None = None,
                 ledger: Ledger | None = None, tick_s: float = 15.0, mode: str | None = None) -> None:
        self.fleet = fleet
        self.policy = policy
        retain_freed_memory()
        self.actuators = list(actuators or [])
        self.ledger = ledger
        self.mode = check_mode(mode or policy.mode)
        if policy.breaker.enabled and policy.breaker.window_s < tick_s:
            raise PolicyError(f"breaker.window_s: {policy.breaker.window_s:g} s is shorter than one tick "
                              f"({tick_s:g} s): the rate bound would count nothing")
        self.history = History(tick_s, default_depth=2, depth_by_signal=policy.assess.history_depths(tick_s))
        self.states: dict[Kind, StateVector] = initial_states(fleet)
        # Per-entity baselines (assess/baselines.py): learned online, persisted in the snapshot.
        self.baselines = Baselines.initial(fleet, policy.assess.baselines)
        self.unnamed: dict = {}  # assess/unnamed.py's state per kind (relearned after a restart)
        self.node_state = np.zeros(fleet.count(Kind.NODE), dtype=np.int8)
        self.dstate = DecideState()
        self.freeze = FreezeState()
        self.tick_no = 0
        self.last: TickReport | None = None
        self.pins: dict[tuple[Kind, int], Pin] = {}
        self._deps = all_dependents(fleet)
        if ledger is not None:
            self._restore()
        if not policy.breaker.enabled:
            log.warning("the safety breaker is disabled by the policy (breaker.enabled: false): nothing bounds "
                        "how much of the fleet this controller may take out of service")
            if ledger is not None:
                ledger.record_failsafe_event(self.tick_no, 0.0, "breaker_disabled", "breaker",
                                             "breaker.enabled: false in the policy")

    # ---- state across restarts ------------------------------------------------------
    def _restore(self) -> None:
        assert self.ledger is not None
        self.tick_no = self.ledger.last_tick() + 1
        snap = self.ledger.load_snapshot()
        if snap is not None:
            _, arrays = snap
            states = {}
            for kind in ASSESSED_KINDS:
                cols = [arrays.get(f"{kind.label}.{f}") for f in _SV_FIELDS]
                if any(c is None or c.shape[0] != self.fleet.count(kind) for c in cols):
                    log.warning("ledger snapshot does not match this fleet's %s; starting that kind fresh",
                                kind.label)
                    states[kind] = self.states[kind]
                    continue
                states[kind] = StateVector(*cols)
            self.states = states
            ns = arrays.get("node.state")
            if ns is not None and ns.shape[0] == self.fleet.count(Kind.NODE):
                self.node_state = ns.astype(np.int8)
            if any(k.startswith("baseline.") for k in arrays):
                self.baselines, stale = Baselines.from_arrays(arrays, self.fleet, self.policy.assess.baselines)
                if stale:
                    log.warning("ledger snapshot's baselines do not match this fleet's %s; those warm up again",
                                ", ".join(stale))
        d = self.ledger.get_meta("decide_state")
        if d:
            self.dstate = DecideState.from_json(d)
            self.freeze = FreezeState.from_json(d.get("freeze"))
        saved = self.ledger.get_meta("mode")
        if saved and saved.get("mode") == "dry_run" and self.mode == "enforce":
            # An operator switched this controller to dry run; a restart does not undo that.
            log.warning("restart: staying in dry_run, set by %s before the restart (the config says enforce); "
                        "switch to enforce through the API when ready", saved.get("by", "an operator"))
            self.mode = "dry_run"
        settled = self.ledger.settle_pending(observe_all(self.actuators))
        if settled:
            log.warning("restart: settled %d action(s) left pending by the previous controller", settled)
        self._restore_pins()

    def _restore_pins(self) -> None:
        """Put back the pins the ledger has in force. One this fleet cannot take (the entity
        is gone, the kind has no state machine, the state is unknown) is skipped with a
        warning and an event; its row stays in the ledger."""
        assert self.ledger is not None
        for row in self.ledger.pins():
            label, name = row["kind"], row["name"]
            kind = KIND_BY_LABEL.get(label)
            state = STATE_BY_LABEL.get(row["state"])
            why = ""
            if kind is None or kind not in ASSESSED_KINDS:
                why = f"kind {label!r} cannot be pinned"
            elif state is None:
                why = f"unknown state {row['state']!r}"
            else:
                try:
                    index = self.fleet.index_of(kind, name)
                except KeyError:
                    why = f"no {label} named {name!r} in this fleet"
            if why:
                log.warning("restart: pin of %s %r to %s (by %s: %s) not restored: %s; it stays in the ledger",
                            label, name, row["state"], row["by"], row["note"], why)
                self.ledger.record_pin_not_restored(self.tick_no, label, name, why)
                continue
            assert kind is not None and state is not None
            self.pins[(kind, index)] = Pin(kind, index, name, state, row["note"], row["by"], row["created_wall_s"])
        if self.pins:
            log.warning("restart: %d operator pin(s) restored from the ledger: %s", len(self.pins),
                        ", ".join(f"{p.kind.label} {p.entity}={p.state.label}" for p in self.pins.values()))

    def _persist(self) -> None:
        assert self.ledger is not None
        arrays = {f"{k.label}.{f}": getattr(sv, f) for k, sv in self.states.items() for f in _SV_FIELDS}
        arrays["node.state"] = self.node_state
        arrays.update(self.baselines.to_arrays())
        self.ledger.save_snapshot(self.tick_no, arrays)
        self._save_decide_state(self.dstate, self.freeze)

    def _save_decide_state(self, dstate: DecideState, freeze: FreezeState) -> None:
        assert self.ledger is not None
        self.ledger.set_meta("decide_state", {**dstate.to_json(), "freeze": freeze.to_json()})

    # ---- operator controls -------------------------------------------------------------
    @property
    def breaker(self) -> BreakerState:
        return self.dstate.breaker

    def set_mode(self, mode: str, by: str = "operator") -> None:
        """Switch dry_run/enforce; recorded, so a restarted controller keeps an operator's dry_run."""
        check_mode(mode)
        if mode != self.mode:
            log.warning("mode %s -> %s by %s", self.mode, mode, by)
        self.mode = mode
        if self.ledger is not None:
            self.ledger.set_meta("mode", {"mode": mode, "by": by})

    @property
    def failsafe(self) -> FreezeState:
        """The scopes frozen for want of data (``failsafe.frozen_scopes()``), for /metrics and the dashboard."""
        return self.freeze

    def reset_breaker(self, by: str = "operator", why: str = "") -> None:
        """A person resets a tripped breaker; who and why go in the ledger with what it had tripped on."""
        before = self.dstate.breaker
        self.dstate = replace(self.dstate, breaker=before.reset())
        log.warning("breaker reset by %s: %s (was %s)", by, why or "no reason given",
                    before.reason if before.tripped else "not tripped")
        if self.ledger is not None:
            t_s = self.last.t_s if self.last is not None else 0.0
            with self.ledger.transaction():
                self.ledger.record_failsafe_event(
                    self.tick_no, t_s, "breaker_reset", "breaker",
                    f"{why or 'no reason given'} (was {'tripped: ' + before.reason if before.tripped else 'not tripped'})",
                    by)
                self._save_decide_state(self.dstate, self.freeze)

    def pin(self, kind: Kind, name: str, state: State, note: str, by: str = "operator",
            since_wall_s: float = 0.0) -> Pin:
        """Hold an assessed entity in ``state`` from the next tick until unpinned.

        With a ledger the pin is recorded (and restored by a controller started on it)."""
        if kind not in ASSESSED_KINDS:
            raise ValueError(f"cannot pin a {kind.label}: only {', '.join(k.label for k in ASSESSED_KINDS)} "
                             "have a state machine")
        p = Pin(kind, self.fleet.index_of(kind, name), name, State(state), note, by, since_wall_s)
        if self.ledger is not None:
            self.ledger.record_pin(self.tick_no, kind.label, name, p.state.label, note, by,
                                   since_wall_s)
        self.pins[(kind, p.index)] = p
        return p

    def unpin(self, kind: Kind, name: str, by: str = "operator") -> Pin | None:
        """Release a pin; the state machine carries on from the pinned state."""
        p = self.pins.pop((kind, self.fleet.index_of(kind, name)), None)
        if p is not None and self.ledger is not None:
            self.ledger.record_unpin(self.tick_no, kind.label, name, by)
        return p

    def set_fleet(self, fleet: Fleet) -> None:
        """Adopt a new placement (same entities, jobs moved)."""
        if fleet is self.fleet:
            return
        if fleet.summary() != self.fleet.summary():
            raise ValueError("set_fleet: entity counts changed; restart the controller with the new topology")
        self.fleet = fleet
        self._deps = all_dependents(fleet)

    # ---- one tick -------------------------------------------------------------------------
    def tick(self, frame: Frame) -> TickReport:
        t0 = time.perf_counter()
        tick = self.tick_no
        rep = TickReport(tick, frame.t_s, None, None)
        enforce = self.mode == "enforce"
        try:
            if self.ledger is not None:
                self.ledger.begin_tick(tick, frame.t_s, self.mode, frame.flags)
            bad, seen = bad_scopes(self.fleet, frame, self.policy.failsafe, self.freeze.seen, self.history)
            freeze, freeze_events = step_freeze(self.freeze, bad, seen, frame.t_s, self.policy.failsafe)
            hold = scope_masks(self.fleet, [s for s in freeze.scopes if not s.rewarming]) if freeze.scopes else None
            view = FreezeView(freeze.scopes, scope_masks(self.fleet, freeze.scopes)) if freeze.scopes else None
            if freeze_events:
                for ev, scope, why in freeze_events:
                    log.warning("failsafe: %s %s: %s", ev, scope, why)
            a = assess(self.fleet, frame, self.history, self.states, self.policy.assess, self._deps,
                       self.node_state, hold=hold, frozen=freeze.scopes, base=self.baselines,
                       unnamed=self.unnamed)
            baselines = a.baselines
            if self.pins:
                a = apply_pins(self.fleet, a, self.pins, {k: sv.state for k, sv in self.states.items()},
                               self.node_state, self.policy.assess.admissibility)
            self.history.push(frame)
            t1 = time.perf_counter()
            in_effect = observe_all(self.actuators)
            decisions, dstate = decide(self.fleet, a, self.policy, self.dstate, in_effect, view)
            t2 = time.perf_counter()
            events: list[tuple[str, str]] = []
            if dstate.breaker.tripped and not self.dstate.breaker.tripped:
                log.warning("breaker tripped: %s", dstate.breaker.reason)
            if self.ledger is not None:
                self.ledger.record_transitions(tick, a.transitions)
                # The decisions admitted, the breaker that admitted them and the freeze commit
                # together, before any actuator is called: a controller killed after an
                # actuator acted still finds what it admitted counted.
                with self.ledger.transaction():
                    events = self.ledger.record_decisions(tick, frame.t_s, decisions.desired, decisions.held)
                    self._save_decide_state(dstate, freeze)
                    for ev, scope, why in freeze_events:
                        self.ledger.record_failsafe_event(tick, frame.t_s, ev, scope, why)
                    if dstate.breaker.tripped and not self.dstate.breaker.tripped:
                        self.ledger.record_failsafe_event(tick, frame.t_s, "breaker_tripped", "breaker",
                                                          dstate.breaker.reason)
            if enforce:
                changes = reconcile(decisions, self.actuators, self.ledger, tick, enforce=True, actual=in_effect)
            else:
                # Dry run: report each change once, when the decision first appears or is withdrawn.
                new = {k for ev, k in events if ev == "decided"} if self.ledger is not None else set(decisions.desired)
                shown = Decisions(decisions.t_s, {k: v for k, v in decisions.desired.items() if k in new})
                changes = reconcile(shown, self.actuators, self.ledger, tick, enforce=False, actual=in_effect)
            t3 = time.perf_counter()
            self.states = {k: a.kinds[k].states for k in ASSESSED_KINDS}
            self.node_state = a.node_state
            if baselines is not None:
                self.baselines = baselines
            self.unnamed = a.unnamed if a.unnamed is not None else self.unnamed
            self.dstate = dstate
            self.freeze = freeze
            rep = TickReport(tick, frame.t_s, a, decisions, changes, t1 - t0, t2 - t1, t3 - t2)
        except Fenced:  # a deposed leader (HA): its tick ends at its first refused write
            raise
        except Exception as e:  # the controller outlives any one bad tick
            log.exception("tick %d at t=%.1f failed; state kept from the previous tick", tick, frame.t_s)
            rep.error = f"{type(e).__name__}: {e}"
        rep.tick_s = time.perf_counter() - t0
        if self.ledger is not None:
            if rep.error:
                self.ledger.set_meta(f"tick_error.{tick}", rep.error)
            else:
                self._persist()
            self.ledger.finish_tick(tick, rep.tick_s)
        self.tick_no += 1
        self.last = rep
        return rep
