"""From which step a running job stays off some rails and runs degraded, at the control plane's word.

Two held hints change how a job runs, never what it computes:

- ``avoid_rails``: rails (NICs) the control plane wants the job's gradient all-reduce off
  (an ``avoid_link`` on a NIC of a node the job runs on). A rail's gloo group spans every
  rank, so the whole job leaves it. Never all of them: if every rail of the job is asked
  to be avoided, the least bad one (lowest state severity, then the job's own order) is
  kept and the reason is logged;
- ``degraded``: while the job's nodes are at risk, every step is snapshotted, the snapshot
  and its replica push and persist are synchronous (done before the step commits), and
  persists come twice as often.

The coordinator turns each request into an entry ``StepMode(start_step, avoid, degraded)``
from a step far enough ahead that every rank reads it first (the rule of cadence.py), so
every rank switches at the same step boundary and never inside a collective. Entries only
grow; the newest few are kept. Pure; the store keys and hint files are in keys.py and
launcher.py, the effect in rail_sync.py and worker.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from seamguard import hintfiles

KEEP_ENTRIES = 4
SEVERITY_UNKNOWN = hintfiles.SEVERITY_UNKNOWN  # a rail asked to be avoided without a state: the worst
DEGRADED_PERSIST_DIVISOR = 2  # degraded: persist points of the rule in force, twice as often


@dataclass(frozen=True)
class StepMode:
    start_step: int
    avoid: tuple[str, ...] = ()  # rail interface names the all-reduce stays off
    degraded: bool = False

    def __post_init__(self) -> None:
        if self.start_step < 0:
            raise ValueError(f"step mode {self}: start_step must be >= 0")


NORMAL = StepMode(0)


def parse(raw: str) -> tuple[StepMode, ...]:
    """The store's JSON ``[[start, [rail, ...], degraded], ...]`` -> entries ("" -> none)."""
    if not raw:
        return ()
    try:
        return tuple(StepMode(int(start), tuple(str(r) for r in avoid), bool(degraded))
                     for start, avoid, degraded in json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"step modes {raw[:120]!r}: expected [[start, [rails], degraded], ...] ({exc})") from None


def format_modes(entries: tuple[StepMode, ...]) -> str:
    return json.dumps([[e.start_step, list(e.avoid), e.degraded] for e in entries[-KEEP_ENTRIES:]])


def mode_at(step: int, entries: tuple[StepMode, ...]) -> StepMode:
    """The entry in force at ``step``: the newest that has started, else normal running."""
    now = NORMAL
    for e in entries:
        if e.start_step <= step:
            now = e
    return now


parse_avoid_file = hintfiles.parse_avoid_rails   # the avoid_rails hint file (hintfiles.py)


def rails_to_avoid(job_rails: tuple[str, ...], asked: dict[str, int]) -> tuple[tuple[str, ...], str]:
    """The job's rails to stay off, and a note when that is less than was asked.

    Rails the job does not run on are ignored. If every rail of the job is asked for, the
    least bad one (lowest severity, then the job's own order) is kept: a job with no rail
    cannot train, and doing less than asked is safe where doing more is not."""
    avoid = [r for r in job_rails if r in asked]
    notes = [f"not rails of this job: {','.join(sorted(set(asked) - set(job_rails)))}"] \
        if set(asked) - set(job_rails) else []
    if job_rails and len(avoid) == len(job_rails):
        keep = min(job_rails, key=lambda r: (asked[r], job_rails.index(r)))
        avoid.remove(keep)
        notes.append(f"every rail was asked to be avoided: keeping {keep}, the least bad "
                     f"(severity {asked[keep]}), so the job still has a rail")
    return tuple(avoid), "; ".join(notes)
