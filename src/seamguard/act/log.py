"""An actuator that only writes what it would do, durably, as JSON lines.

It is also a faithful world for dry runs and tests: `observe` replays its own file, so
a controller restarted mid-tick sees exactly which actions already happened.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from seamguard.act.base import ActionResult, verb_of
from seamguard.decide.actions import Action, Verb


class LogActuator:
    name = "log"
    verbs = frozenset(Verb)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a torn last line from a crash: that write never completed
        return out

    def observe(self) -> set[str]:
        held: set[str] = set()
        for r in self.records():
            if r["op"] == "apply":
                held.add(r["key"])
            elif r["op"] == "revert":
                held.discard(r["key"])
        return held

    def apply(self, action: Action) -> ActionResult:
        self._write({"op": "apply", "key": action.key, "verb": action.verb.value, "target": action.target,
                     "params": dict(action.params), "reason": action.reason})
        return ActionResult(True, f"logged to {self.path}")

    def revert(self, key: str) -> ActionResult:
        if verb_of(key).one_shot:
            return ActionResult(True, "one-shot action: nothing to revert")
        self._write({"op": "revert", "key": key, "verb": verb_of(key).value})
        return ActionResult(True, f"logged to {self.path}")
