"""An actuator that only writes what it would do, durably, as JSON lines.

It is also a faithful world for dry runs and tests: `observe` replays its own file, so
a controller restarted mid-tick sees exactly which actions already happened.

Each record is one line written with one `write` and fsynced before `apply` returns. A
line torn by a crash (power loss) is skipped on reading, and the next write starts on a
fresh line so the torn tail cannot swallow it. Lines that are not records (garbage,
other encodings, JSON that is not an object with `op` and `key`) are skipped, never
raised: this file is read on every tick.
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
    records_only = True  # what it holds is a record, not an effect (act/reconcile.observe_all)

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, record: dict) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        with open(self.path, "a+b") as fh:
            end = fh.seek(0, os.SEEK_END)
            if end:
                fh.seek(end - 1)
                if fh.read(1) != b"\n":
                    line = b"\n" + line  # a torn tail: start on a fresh line
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def records(self) -> list[dict]:
        """Every well-formed record, in order (torn or foreign lines skipped)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out = []
        for line in data.decode("utf-8", "replace").splitlines():
            if line.strip():
                try:
                    r = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    continue  # a torn line from a crash: that write never completed
                if isinstance(r, dict) and r.get("op") in ("apply", "revert") and isinstance(r.get("key"), str):
                    out.append(r)
        return out

    def observe(self) -> set[str]:
        held: set[str] = set()
        for r in self.records():
            if r["op"] == "apply":
                held.add(r["key"])
            else:
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
