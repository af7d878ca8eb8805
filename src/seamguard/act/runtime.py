"""Actuator for jobs run by seamguard's resilient runtime: control-plane hints.

The runtime's documented channel (docs/runtime.md) is a hint directory per job that its
launcher polls: a file named `checkpoint_now` makes every rank persist the next
snapshot. This actuator turns `checkpoint_now` decisions for a job into that file. It
writes the file atomically (temp file, fsync, rename) and keeps its own record of the
keys it delivered in the same directory, so a restarted controller never asks twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from seamguard.act.base import ActionResult
from seamguard.decide.actions import Action, Verb

APPLIED_LOG = ".seamguard-hints.jsonl"


class RuntimeHintActuator:
    name = "runtime"
    verbs = frozenset({Verb.CHECKPOINT_NOW})

    def __init__(self, hint_dirs: dict[str, Path]) -> None:
        """``hint_dirs``: job name -> the directory its `seamguard launch --hint-dir` polls."""
        self.hint_dirs = {job: Path(d) for job, d in hint_dirs.items()}

    def observe(self) -> set[str]:
        held: set[str] = set()
        for d in self.hint_dirs.values():
            log = d / APPLIED_LOG
            if log.exists():
                for line in log.read_text(encoding="utf-8").splitlines():
                    try:
                        held.add(json.loads(line)["key"])
                    except (json.JSONDecodeError, KeyError):
                        continue  # a torn last line: that delivery never completed
        return held

    def apply(self, action: Action) -> ActionResult:
        d = self.hint_dirs.get(action.target)
        if d is None:
            return ActionResult(True, f"job {action.target!r} is not run by the seamguard runtime here: "
                                      "no hint directory configured, nothing to do")
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / ".checkpoint_now.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(action.reason + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, d / "checkpoint_now")
            with open(d / APPLIED_LOG, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": action.key, "reason": action.reason}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as e:
            return ActionResult(False, f"{d}: cannot write the hint: {e.strerror}", retryable=True)
        return ActionResult(True, f"hint written to {d / 'checkpoint_now'}")

    def revert(self, key: str) -> ActionResult:
        return ActionResult(True, "one-shot hint: nothing to revert")
