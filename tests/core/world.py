"""An in-memory actuator for core tests: what it applied is in effect until reverted."""

from seamguard.act.base import ActionResult
from seamguard.decide.actions import Verb


class World:
    name = "world"
    verbs = frozenset(Verb)

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.applied: list[str] = []

    def observe(self) -> set[str]:
        return set(self.held)

    def apply(self, action):
        self.held.add(action.key)
        self.applied.append(action.key)
        return ActionResult(True, "ok")

    def revert(self, key):
        self.held.discard(key)
        return ActionResult(True, "ok")
