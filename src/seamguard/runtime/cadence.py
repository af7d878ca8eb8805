"""Which steps a job persists, and where: its own interval and directory, or the ones the
control plane asked for.

The controller asks for a checkpoint interval in seconds (the checkpoint planner's Young
interval at the job's hazard while its nodes are at risk); the coordinator turns it into
steps at the job's measured seconds per step and fixes the step from which it holds, far
enough ahead that every rank has read it before (the same rule as ``checkpoint_now``).
Every rank then decides from the same entries, so they persist the same steps and each
checkpoint is complete. Entries only grow (the newest few are kept): a rank that read a
newer entry early still agrees with one that did not for every step before its start.
The same holds for the checkpoint target: a ``checkpoint_dir`` hint (the controller
moving a job's checkpoints off a slow storage path) becomes an entry ``[start, root]``
from which every rank writes there; restores look in every directory the job used.
Pure; the store keys and the hint files are in keys.py and launcher.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

KEEP_ENTRIES = 4


@dataclass(frozen=True)
class CadenceEntry:
    start_step: int
    every_steps: int  # 0: back to the job's own --persist-every

    def __post_init__(self) -> None:
        if self.start_step < 0 or self.every_steps < 0:
            raise ValueError(f"cadence entry {self}: start_step and every_steps must be >= 0")


def parse(raw: str) -> tuple[CadenceEntry, ...]:
    """``"start:every;start:every"`` (starts increasing) -> entries."""
    out = []
    for part in filter(None, raw.split(";")):
        start, sep, every = part.partition(":")
        if not sep:
            raise ValueError(f"cadence entry {part!r}: expected 'start:every'")
        out.append(CadenceEntry(int(start), int(every)))
    return tuple(out)


def format_entries(entries: tuple[CadenceEntry, ...]) -> str:
    return ";".join(f"{e.start_step}:{e.every_steps}" for e in entries[-KEEP_ENTRIES:])


def every_steps_for(interval_s: float | None, step_s: float | None) -> int:
    """Steps between persists for an interval in seconds (None: the job's own interval)."""
    if interval_s is None:
        return 0
    if step_s is None or step_s <= 0:
        raise ValueError("the job's seconds per step are not known yet")
    return max(1, round(interval_s / step_s))


def persist_due(step: int, own_every_steps: int, entries: tuple[CadenceEntry, ...], window_steps: int = 1,
                divisor: int = 1) -> bool:
    """Whether the snapshot of ``step`` is persisted: a persist point of the rule in force
    (the newest entry that has started, else the job's own every-k) lies in the last
    ``window_steps`` steps (the snapshot interval: points between snapshots are taken at
    the next one, as every rank snapshots the same steps). ``divisor``: persist points come
    that many times as often (degraded mode, runtime/stepmodes.py)."""
    every, start = own_every_steps, 0
    for e in entries:
        if e.start_step <= step:
            every, start = (e.every_steps, e.start_step) if e.every_steps else (own_every_steps, 0)
    if every > 0 and divisor > 1:
        every = max(1, every // divisor)
    if every <= 0 or step < start:
        return False
    point = start + (step - start) // every * every
    return point > 0 and point > step - max(window_steps, 1)


# ---- where: the checkpoint target, moved off a slow storage path ---------------------------
@dataclass(frozen=True)
class TargetEntry:
    start_step: int
    root: str  # "" : back to the job's own --checkpoint-dir


def parse_targets(raw: str) -> tuple[TargetEntry, ...]:
    """JSON ``[[start, root], ...]`` (starts increasing) -> entries."""
    if not raw:
        return ()
    try:
        return tuple(TargetEntry(int(s), str(r)) for s, r in json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"checkpoint targets {raw[:80]!r}: expected [[start, root], ...]") from exc


def format_targets(entries: tuple[TargetEntry, ...]) -> str:
    return json.dumps([[e.start_step, e.root] for e in entries[-KEEP_ENTRIES:]])


def target_for(step: int, own: Path, entries: tuple[TargetEntry, ...]) -> Path:
    """The directory the snapshot of ``step`` is persisted to: the newest entry that has started, else the job's own."""
    root = ""
    for e in entries:
        if e.start_step <= step:
            root = e.root
    return Path(root) if root else own


def targets_used(own: Path, entries: tuple[TargetEntry, ...]) -> list[Path]:
    """Every directory a checkpoint of this job may be in, its own first."""
    out = [own]
    for e in entries:
        if e.root and Path(e.root) not in out:
            out.append(Path(e.root))
    return out
