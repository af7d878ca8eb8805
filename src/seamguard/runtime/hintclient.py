"""The controller's hints for a job that `seamguard launch` did not start: read, verified, folded.

A torchrun (or Lightning, or Hugging Face Trainer) job has no launcher polling its
``--hint-dir``; its rank 0 reads the directory itself through this client, at the step
boundaries the job hook (runtime/jobhook.py) agrees on with the other ranks. The files,
their values and the reading of them are the same protocol the launcher uses
(seamguard/hintfiles.py), and every file must be signed with the job's key
(seamguard/hintauth.py): an unsigned, forged, replayed or stale one is refused, logged
and counted. No torch here: the fold (:func:`fold`) is pure, the reader is the edge.

What such a job can act on: ``checkpoint_now`` (save at the agreed step),
``checkpoint_interval_s`` (save when that many seconds passed since the last save),
``checkpoint_dir`` (the next saves go there; it must be under the checkpoint roots, as
for a launched job) and ``degraded``. ``evacuate_rank_<r>``, ``rollback*`` and
``avoid_rails`` need the launcher's spares, snapshots and rails: they are removed with a
``hint_ignored`` event saying so.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from seamguard import hintauth, hintfiles
from seamguard.runtime.settings import checkpoint_roots, under_roots


@dataclass(frozen=True)
class JobHints:
    """What the controller asks of the job, as rank 0 last read it (immutable, swapped whole)."""

    checkpoint_seq: int = 0
    """``checkpoint_now`` hints taken so far: each one is one save."""
    checkpoint_dir: str | None = None
    """Where the next saves go; None: the job's own directory."""
    dir_seq: int = 0
    """``checkpoint_dir`` hints taken so far (the ranks fetch the path when it grows)."""
    interval_s: float | None = None
    """Save at least this often (seconds); None: only the job's own saves."""
    degraded: bool = False


def fold(h: JobHints, name: str, value: str, roots: tuple[Path, ...]) -> tuple[JobHints, dict | None]:
    """``h`` after one admitted hint file, and an event when the hint is not taken (None: taken).

    Pure but for resolving the symbolic links of a ``checkpoint_dir`` (settings.under_roots)."""
    why = hintfiles.VALUE_ERRORS[name](value) if name in hintfiles.VALUE_ERRORS else None
    if why is not None:
        return h, {"event": "hint_ignored", "hint": name, "detail": why}
    want = value.strip()
    if name == hintfiles.CHECKPOINT_NOW:
        return replace(h, checkpoint_seq=h.checkpoint_seq + 1), None
    if name == hintfiles.CHECKPOINT_INTERVAL:
        return replace(h, interval_s=None if want == hintfiles.DEFAULT else float(want)), None
    if name == hintfiles.DEGRADED:
        return replace(h, degraded=want == "on"), None
    if name == hintfiles.CHECKPOINT_DIR:
        if want != hintfiles.DEFAULT and not under_roots(want, roots):
            return h, {"event": "hint_refused", "hint": name, "reason": "outside_roots",
                       "detail": f"{want[:120]} is not under {', '.join(map(str, roots)) or 'any checkpoint root'}"}
        return replace(h, checkpoint_dir=None if want == hintfiles.DEFAULT else want, dir_seq=h.dir_seq + 1), None
    return h, {"event": "hint_ignored", "hint": name,
               "detail": "needs `seamguard launch` (spares, snapshots, rails): a job hook does not act on it"}


class HintReader:
    """Rank 0's reader of one job's hint directory: :meth:`poll` takes the signed files there
    and returns the hints in force. ``log``: where refusals and ignored hints go (one event
    each); ``refusals()`` counts them by reason for the job's metrics."""

    def __init__(self, hint_dir: Path, key: bytes, checkpoint_dir: Path | None,
                 roots: tuple[str, ...] = (), log: Callable[[dict], None] = lambda e: None) -> None:
        self.hint_dir = Path(hint_dir)
        self.gate = hintauth.HintGate(key)
        self.roots = checkpoint_roots(checkpoint_dir, tuple(roots))
        self.hints = JobHints()
        self._log = log
        self._other = collections.Counter()   # refusals after the signature: outside_roots

    @classmethod
    def for_job(cls, hint_dir: Path, checkpoint_dir: Path | None, key_file: Path | None = None,
                roots: tuple[str, ...] = (), log: Callable[[dict], None] = lambda e: None) -> HintReader:
        """Take the job's key as `seamguard launch` does (hintauth.job_key: an operator's
        ``key_file``, else a fresh one written to ``<hint_dir>/.hint-key`` for the controller
        to sign with). ValueError names the key file and what is wrong."""
        return cls(hint_dir, hintauth.job_key(Path(hint_dir), key_file), checkpoint_dir, roots, log)

    def poll(self) -> JobHints:
        def refused(name: str, exc: ValueError) -> None:
            if not isinstance(exc, hintauth.HintRefused):
                self._other["unsigned"] += 1   # not text at all (the gate counts its own refusals)
            self._log({"event": "hint_refused", "hint": name, "reason": getattr(exc, "reason", "unsigned"),
                       "detail": str(exc)[:200]})

        for name, value in hintfiles.take_files(self.hint_dir, self.gate.admit, refused):
            self.hints, event = fold(self.hints, name, value, self.roots)
            if event is not None:
                if event["event"] == "hint_refused":
                    self._other[event["reason"]] += 1
                self._log(event)
        return self.hints

    def refusals(self) -> dict[str, int]:
        """Refused hints by reason (the signature's and ``outside_roots``)."""
        out = self.gate.refusals()
        for reason, n in self._other.items():
            out[reason] = out.get(reason, 0) + n
        return out
