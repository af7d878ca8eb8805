"""The actuator contract: observe what is in effect, apply a desired action, revert one.

Actuators are the only code that changes the world. Each handles some verbs, reports
only the actions it (seamguard) owns, and never undoes what it did not do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from seamguard.decide.actions import Action, ActionKey, Verb


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
