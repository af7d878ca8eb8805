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
The in-memory snapshot interval follows the same entries when the job runs with
``--snapshot-every auto``: the coordinator turns the snapshot's measured cost and the job's
failure rate into Daly's interval (the checkpoint planner's formula, seamguard/reliability.py) and
publishes it as ``[start, every]`` entries, so every rank snapshots the same steps
(:func:`snapshot_due`). Each rank measures the cost as what a snapshot adds to the step it
is taken in and to the next one (:class:`SnapshotCost`).
Pure; the store keys and the hint files are in keys.py and launcher.py.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from seamguard.reliability import GPU_MTTF_H, daly_interval_s  # noqa: F401 (GPU_MTTF_H: re-exported for settings.py)

KEEP_ENTRIES = 4

AUTO_START_EVERY = 10
"""``--snapshot-every auto``: the interval until the coordinator has measured a snapshot's
cost (it needs steps with and without one)."""


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


def every_at(step: int, own_every_steps: int, entries: tuple[CadenceEntry, ...]) -> tuple[int, int]:
    """(every, start) of the rule in force at ``step``: the newest entry that has started,
    else the job's own every-k from step 0 (an entry of 0 goes back to it)."""
    every, start = own_every_steps, 0
    for e in entries:
        if e.start_step <= step:
            every, start = (e.every_steps, e.start_step) if e.every_steps else (own_every_steps, 0)
    return every, start


def snapshot_due(step: int, own_every_steps: int, entries: tuple[CadenceEntry, ...]) -> bool:
    """Whether ``step`` is a snapshot step of the interval in force (``--snapshot-every``
    from step 0, or under ``auto`` the coordinator's entries, each from ``every`` steps
    after its start: a new interval adds no snapshot of its own)."""
    every, start = every_at(step, own_every_steps, entries)
    return (step > start or start == 0) and (step - start) % max(every, 1) == 0


MAX_EVERY_STEPS = 10**9
"""The longest interval `auto_every_steps` gives: no periodic snapshot in any real run
(persist points and a new layout are still snapshotted)."""


def auto_every_steps(cost_s: float, step_s: float, job_mttf_s: float) -> int:
    """Steps between snapshots: Daly's interval for a snapshot costing ``cost_s`` of the
    job's time and a job that fails every ``job_mttf_s`` on average, at ``step_s`` a step
    (at least 1). A snapshot that costs nothing measurable is still counted as 1 ms."""
    if step_s <= 0 or job_mttf_s <= 0:
        raise ValueError(f"step_s and job_mttf_s must be > 0, got {step_s}, {job_mttf_s}")
    return max(1, round(min(daly_interval_s(max(cost_s, 1e-3), job_mttf_s) / step_s, MAX_EVERY_STEPS)))


def uncovered_mttf_s(rank_mttf_s: float, ranks: int, copies: int, window_s: float) -> float:
    """Mean time between the failures a snapshot must cover, for a job of ``ranks`` ranks
    each failing every ``rank_mttf_s`` on average, whose state is held live by ``copies``
    ranks each (1: FSDP2, every loss needs a snapshot; R: HSDP's replicate dimension;
    the world: data parallelism). A loss is covered by a live copy unless every copy of
    one shard is lost within ``window_s`` (until a replacement holds it again): for
    independent failures, with ``ranks / copies`` shards, the rate of that is
    ``ranks / copies * copies! * λ^copies * window^(copies-1)`` (λ = 1 / rank_mttf_s; the
    mean time to data loss of R-way replication with repair, as in Patterson, Gibson and
    Katz's RAID analysis: docs/sources.md), and never more than every failure's,
    ``ranks * λ``."""
    if rank_mttf_s <= 0 or ranks < 1 or copies < 1 or window_s < 0:
        raise ValueError(f"rank_mttf_s > 0, ranks >= 1, copies >= 1, window_s >= 0 expected, got "
                         f"{rank_mttf_s}, {ranks}, {copies}, {window_s}")
    lam = 1.0 / rank_mttf_s
    every_failure = ranks * lam
    copies = min(copies, ranks)
    rate = ranks / copies * math.factorial(copies) * lam ** copies * window_s ** (copies - 1)
    rate = min(every_failure, rate)
    return math.inf if rate == 0 else 1.0 / rate


def retune(current: int, wanted: int, factor: float = 1.5) -> bool:
    """Whether to move from ``current`` steps between snapshots to ``wanted``: only for a
    change of more than ``factor`` either way, so that noise in the measured cost does not
    publish a new entry at every look."""
    return wanted > current * factor or wanted * factor < current


@dataclass
class SnapshotCost:
    """What a snapshot costs a rank, in seconds of its steps: the median duration of the
    steps snapshots were taken in, and of the steps right after them (the hash and the
    push run on), each less the median of the steps between, summed. Steps with a
    recovery in them are not fed. None until each kind has been seen.

    A step in which a snapshot slot was being made (``made_slot``: reserved and mapped, a
    one-time cost per slot, 3-7x a snapshot's recurring cost on 2 shared cores:
    docs/benchmarks.md) is left out of the steps between; a snapshot step so marked, and
    the step after it, count only while no unmarked one has been seen. A cost the steps'
    noise hides is counted at the noise's level (`_resolution_s`)."""

    _kinds: dict = field(default_factory=lambda: {k: deque(maxlen=24 if k == "plain" else 8)
                                                  for k in ("snap", "after", "plain", "snap_first", "after_first")})
    _first: bool = False   # the last snapshot fed waited for its slot to be made

    def add(self, step_s: float, steps_since_snapshot: int, made_slot: bool = False) -> None:
        if steps_since_snapshot == 0:
            self._first = made_slot
        kind = {0: "snap", 1: "after"}.get(steps_since_snapshot, "plain")
        if kind == "plain" and made_slot:
            return
        if kind != "plain" and self._first:
            kind += "_first"
        self._kinds[kind].append(step_s)

    def cost_s(self) -> float | None:
        k = self._kinds
        if not k["plain"]:
            return None
        base = statistics.median(k["plain"])
        snap, after = (k[kind] or k[kind + "_first"] for kind in ("snap", "after"))
        if not snap or not after:
            return None
        total = sum(max(0.0, statistics.median(seen) - base) for seen in (snap, after))
        return max(total, self._resolution_s(len(snap), base))

    def _resolution_s(self, n_snap: int, plain_median_s: float) -> float:
        """The smallest cost these samples can tell from none: the standard error of the
        difference of two medians (1.2533 sigma / sqrt(n) each; sigma from the plain steps'
        median absolute deviation, 1.4826 MAD). A snapshot cheaper than the steps' own
        noise is counted at the noise, so that noise does not take the interval down to
        every step and back at each look."""
        plain = self._kinds["plain"]
        if len(plain) < 3:
            return 0.0
        sigma = 1.4826 * statistics.median([abs(x - plain_median_s) for x in plain])
        return 1.2533 * sigma * math.sqrt(1.0 / n_snap + 1.0 / len(plain))


def persist_due(step: int, own_every_steps: int, entries: tuple[CadenceEntry, ...], window_steps: int = 1,
                divisor: int = 1) -> bool:
    """Whether the snapshot of ``step`` is persisted: a persist point of the rule in force
    (the newest entry that has started, else the job's own every-k) lies in the last
    ``window_steps`` steps (the snapshot interval: points between snapshots are taken at
    the next one, as every rank snapshots the same steps). ``divisor``: persist points come
    that many times as often (degraded mode, runtime/stepmodes.py)."""
    every, start = every_at(step, own_every_steps, entries)
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
