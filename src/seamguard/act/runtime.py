"""Actuator for jobs run by seamguard's resilient runtime: control-plane hints.

The runtime's documented channel (docs/runtime.md) is a hint directory per job that its
launcher polls. This actuator turns two decisions into hint files:

- ``checkpoint_now`` (one-shot): a file ``checkpoint_now``; every rank persists the next
  snapshot;
- ``checkpoint_interval`` (held): a file ``checkpoint_interval_s`` with the interval in
  seconds; reverting it writes ``default`` (the job's own ``--persist-every`` again), and
  only when the reverted key is the one the job runs with — a newer interval applied in the
  same tick is not undone.

Files are written atomically (temp file, fsync, rename). The actuator keeps its own record
of what it delivered, in the same directory, so a restarted controller knows which hints
are in effect and never asks twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from seamguard.act.base import ActionResult, verb_of
from seamguard.decide.actions import Action, ActionKey, Verb

APPLIED_LOG = ".seamguard-hints.jsonl"
_FILE = {Verb.CHECKPOINT_NOW: "checkpoint_now", Verb.CHECKPOINT_INTERVAL: "checkpoint_interval_s"}


def _write_durable(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class RuntimeHintActuator:
    name = "runtime"
    verbs = frozenset(_FILE)

    def __init__(self, hint_dirs: dict[str, Path]) -> None:
        """``hint_dirs``: job name -> the directory its `seamguard launch --hint-dir` polls."""
        self.hint_dirs = {job: Path(d) for job, d in hint_dirs.items()}

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
        """Checkpoints delivered, and the interval each job runs with (the last delivered, unless reverted)."""
        held: set[str] = set()
        for d in self.hint_dirs.values():
            interval: str | None = None
            for rec in self._records(d):
                if verb_of(rec["key"]) != Verb.CHECKPOINT_INTERVAL:
                    held.add(rec["key"])
                elif rec.get("op") == "revert":
                    interval = None if rec["key"] == interval else interval
                else:
                    interval = rec["key"]
            if interval is not None:
                held.add(interval)
        return held

    def apply(self, action: Action) -> ActionResult:
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
        return self._deliver(d, _FILE[action.verb], text + "\n", {"key": action.key, "reason": action.reason})

    def revert(self, key: str) -> ActionResult:
        ak = ActionKey.parse(key)
        if ak.verb != Verb.CHECKPOINT_INTERVAL:
            return ActionResult(True, "one-shot hint: nothing to revert")
        d = self.hint_dirs.get(ak.entity)
        if d is None:
            return ActionResult(True, f"job {ak.entity!r} has no hint directory: nothing to revert")
        if key not in self.observe():
            # a newer interval replaced it (or it was never delivered): the job keeps that one
            return self._record_only(d, {"key": key, "op": "revert"})
        return self._deliver(d, _FILE[Verb.CHECKPOINT_INTERVAL], "default\n", {"key": key, "op": "revert"})

    @staticmethod
    def _deliver(d: Path, name: str, text: str, record: dict) -> ActionResult:
        try:
            d.mkdir(parents=True, exist_ok=True)
            _write_durable(d / name, text)
            _append(d / APPLIED_LOG, record)
        except OSError as e:
            return ActionResult(False, f"{d}: cannot write the hint: {e.strerror}", retryable=True)
        return ActionResult(True, f"hint written to {d / name}: {text.strip()[:80]}")

    @staticmethod
    def _record_only(d: Path, record: dict) -> ActionResult:
        try:
            _append(d / APPLIED_LOG, record)
        except OSError as e:
            return ActionResult(False, f"{d}: cannot record the revert: {e.strerror}", retryable=True)
        return ActionResult(True, "a newer interval is in effect: the job keeps it")
