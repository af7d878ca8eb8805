"""The actuator contract: observe what is in effect, apply a desired action, revert one.

Actuators are the only code that changes the world. Each handles some verbs, reports
only the actions it (seamguard) owns, and never undoes what it did not do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.decide.actions import Action, ActionKey, Verb

JOB_CLASS_COLUMNS = frozenset(c for c in ADMISSIBILITY_COLUMNS if c != "checkpoint_restore")


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    detail: str = ""
    retryable: bool = False  # a transient failure (timeout, busy) worth retrying next tick


class Actuator(Protocol):
    name: str
    verbs: frozenset[Verb]

    def observe(self) -> set[str]:
        """Keys of seamguard-owned actions currently in effect (and one-shots done)."""
        ...

    def apply(self, action: Action) -> ActionResult: ...

    def revert(self, key: str) -> ActionResult: ...


def verb_of(key: str) -> Verb:
    return ActionKey.parse(key).verb


def label_value(classes: list[str] | tuple[str, ...]) -> str:
    """The value of a label_degraded key as the planner spells it, from the classes a node carries.

    The admissible columns in their fixed order, or "none" when no job class is among them
    (checkpoint_restore alone is not a job class: such a node takes no new work).
    """
    have = set(classes)
    if not have & JOB_CLASS_COLUMNS:
        return "none"
    return ",".join(c for c in ADMISSIBILITY_COLUMNS if c in have)
