"""Level-triggered reconciliation: desired state vs actual, apply the difference once.

Every change is recorded as pending in the ledger before the actuator is called and
closed after, so a controller killed between the two finds the pending row on restart
and settles it from the actuator's actual state instead of repeating the action.

A failure the actuator calls transient (``retryable``: a timeout, a busy API) is tried
again next tick; a permanent one (no such node, permission denied) is recorded once as
``refused`` and not re-applied every tick while the same decision stands.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from seamguard.act.base import ActionResult, Actuator, verb_of
from seamguard.decide.actions import Action, Decisions, Verb

log = logging.getLogger("seamguard.act")

# Protect the job before disrupting it; disrupt before relabelling.
_ORDER = {Verb.CHECKPOINT_NOW: 0, Verb.CHECKPOINT_INTERVAL: 0, Verb.MOVE_JOB: 1, Verb.DRAIN: 2, Verb.AVOID_STORAGE: 3,
          Verb.AVOID_LINK: 4, Verb.LABEL_DEGRADED: 5}


@dataclass(frozen=True)
class Change:
    op: str  # apply | revert
    key: str
    action: Action | None
    actuator: str
    status: str  # done | failed (retried next tick) | refused (permanent; not retried) | dry_run
    detail: str

    @property
    def verb(self) -> str:
        return (self.action.verb if self.action is not None else verb_of(self.key)).value


def observe_all(actuators: list[Actuator]) -> set[str]:
    """What is in effect: every actuator's held keys, except that a record-only actuator (the
    log) holds a key only for verbs no other configured actuator performs — its record of an
    apply must not hide another actuator's unfinished action (a Slurm move's later phases)."""
    held: set[str] = set()
    for act in actuators:
        keys = act.observe()
        if getattr(act, "records_only", False):
            done_elsewhere = set().union(*(o.verbs for o in actuators if o is not act))
            keys = {k for k in keys if verb_of(k) not in done_elsewhere}
        held |= keys
    return held


def diff(desired: dict[str, Action], actual: set[str], done_one_shots: set[str]) -> tuple[list[Action], list[str]]:
    """(actions to apply, keys to revert). Pure."""
    apply = [a for k, a in desired.items()
             if k not in actual and not (a.verb.one_shot and k in done_one_shots)]
    revert = [k for k in actual if k not in desired and not verb_of(k).one_shot]
    apply.sort(key=lambda a: (_ORDER[a.verb], a.key))
    revert.sort()
    return apply, revert


def reconcile(decisions: Decisions, actuators: list[Actuator], ledger, tick: int, enforce: bool,
              actual: set[str] | None = None) -> list[Change]:
    """Apply the difference between ``decisions`` and ``actual`` (what the actuators hold; observed
    here unless the caller observed it this tick already)."""
    actual = observe_all(actuators) if actual is None else actual
    done = ledger.done_keys() if ledger is not None else set()
    refused = ledger.refused_keys() if ledger is not None and enforce else set()
    apply, revert = diff({k: a for k, a in decisions.desired.items() if k not in refused}, actual, done | actual)
    changes: list[Change] = []
    for op, key, action in [("apply", a.key, a) for a in apply] + [("revert", k, None) for k in revert]:
        verb = action.verb if action else verb_of(key)
        for act in actuators:
            if verb not in act.verbs:
                continue
            if not enforce:
                ch = Change(op, key, action, act.name, "dry_run", "dry run: not applied")
                if ledger is not None:
                    ledger.record_dry_run(tick, decisions.t_s, op, key, verb.value, act.name)
            else:
                if ledger is not None:
                    ledger.begin_action(tick, decisions.t_s, op, key, verb.value, act.name)
                try:
                    res = act.apply(action) if action is not None else act.revert(key)
                except Exception as e:  # an actuator must never take the controller down
                    log.exception("actuator %s failed on %s %s", act.name, op, key)
                    res = ActionResult(False, f"{type(e).__name__}: {e}", retryable=True)
                status = "done" if res.ok else ("failed" if res.retryable else "refused")
                ch = Change(op, key, action, act.name, status, res.detail)
                if ledger is not None:
                    ledger.finish_action(key, op, ch.status, ch.detail)
            changes.append(ch)
    return changes
