"""Pure planning of membership generations and of the rollback step.

The coordinator calls these with what it observed; they decide who holds which rank
after a loss (a spare takes the lost rank's place, else the group shrinks), who holds
whose replica, and the newest step every member can restore. No clock, no I/O, so the
decisions are tested with tables (tests/runtime/test_membership.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Plan:
    """Membership of one generation.

    ranks[r] is the worker id running rank r; roles[r] is the worker id whose state rank
    r continues (itself, or the lost worker a spare replaces); holders maps a role to the
    worker that held its replica in the previous generation.
    """

    gen: int
    ranks: list[int]
    roles: list[int]
    spares: list[int]
    holders: dict[int, int] = field(default_factory=dict)
    replaced: dict[int, int] = field(default_factory=dict)
    """role -> the lost worker that last ran it: its shared-memory snapshots outlive its
    process, so a newcomer on the same node can adopt them."""
    lost: list[int] = field(default_factory=list)
    reason: str = ""
    force_disk: bool = False
    max_step: int | None = None
    """A rollback generation: resume at the newest step not after this one (newer
    snapshots belong to a future being thrown away)."""

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> "Plan":
        raw = json.loads(text)
        raw["holders"] = {int(k): int(v) for k, v in raw.get("holders", {}).items()}
        raw["replaced"] = {int(k): int(v) for k, v in raw.get("replaced", {}).items()}
        return Plan(**raw)


def replica_holder(rank: int, world_size: int, ranks_per_node: int, replicas: int = 1) -> int:
    """Rank that holds rank `rank`'s replica.

    Data parallelism or FSDP over one mesh dimension (``replicas`` 1): the same local slot
    on the next node; with one node simply the next rank (ring). Placing the replica a node
    away means losing a whole node never loses both a state and its replica.

    HSDP (``replicas`` R > 1, rank r in row r // (W/R) of the (R, W/R) mesh): a peer in
    the replicate dimension, which holds the same shard, so the holder already has every
    byte but the rank-private ones. The offset is the smallest multiple k*(W/R), 1 <= k < R,
    with ranks_per_node <= k*(W/R) <= W - ranks_per_node, which puts every rank's peer on
    another node and maps ranks one to one; where no multiple does (one node), k = 1.
    """
    if world_size < 2:
        return rank
    if replicas > 1 and world_size % replicas == 0:
        row = world_size // replicas
        offsets = [k * row for k in range(1, replicas)]
        off = next((o for o in offsets if ranks_per_node <= o <= world_size - ranks_per_node), offsets[0])
        return (rank + off) % world_size
    step = ranks_per_node if world_size > ranks_per_node else 1
    return (rank + step) % world_size


def identical_ranks(world_size: int, replicas: int) -> list[list[int]]:
    """Groups of ranks whose parameters must be bit-identical after a recovery.
    ``replicas`` 0: data parallelism, every rank holds the whole model; 1: FSDP over one
    mesh dimension, every shard is different (no group); R > 1: HSDP, each column of the
    (R, W/R) mesh holds one shard R times."""
    if replicas == 0:
        return [list(range(world_size))]
    if replicas == 1 or world_size % replicas:
        return []
    row = world_size // replicas
    return [list(range(col, world_size, row)) for col in range(row)]


def initial_plan(trainers: list[int], spares: list[int]) -> Plan:
    return Plan(gen=0, ranks=list(trainers), roles=list(trainers), spares=list(spares),
                reason="start")


def next_plan(current: Plan, lost: set[int], ranks_per_node: int, reason: str,
              force_disk: bool = False, pending: bool = False,
              max_step: int | None = None, avoid: frozenset[int] = frozenset(),
              replicas: int = 1) -> Plan:
    """Replace every lost rank by a spare (lowest id first, spares in `avoid` — on a node
    being evacuated — only when no other is left) or drop it (shrink).

    `pending` says the current generation never finished recovering: its newcomers hold
    no state yet, so their roles still come from the holders recorded before (carried
    over; if such a holder is lost too, memory recovery is impossible and the caller
    falls back to disk). Lost spares are simply removed. `max_step` makes the new
    generation a rollback (a pending rollback's cap carries over). `replicas`: the job's
    HSDP replica groups (`replica_holder`). Raises ValueError when no rank would remain.
    """
    if max_step is None and pending:
        max_step = current.max_step
    spares = [w for w in current.spares if w not in lost]
    ranks: list[int] = []
    roles: list[int] = []
    holders: dict[int, int] = dict(current.holders) if pending else {}
    replaced: dict[int, int] = dict(current.replaced) if pending else {}
    old_world = current.world_size
    for r, (wid, role) in enumerate(zip(current.ranks, current.roles)):
        if wid not in lost:
            ranks.append(wid)
            roles.append(role)
            continue
        holder = current.ranks[replica_holder(r, old_world, ranks_per_node, replicas)]
        if spares:
            ranks.append(spares.pop(next((i for i, w in enumerate(spares) if w not in avoid), 0)))
            roles.append(role)
            holders.setdefault(role, holder)
            replaced.setdefault(role, wid)
        else:
            holders.pop(role, None)
            replaced.pop(role, None)
    if not ranks:
        raise ValueError(f"generation {current.gen}: every rank lost ({sorted(lost)}), "
                         "nothing left to continue")
    return Plan(gen=current.gen + 1, ranks=ranks, roles=roles, spares=spares,
                holders=holders, replaced=replaced, lost=sorted(lost & set(current.ranks + current.spares)),
                reason=reason, force_disk=force_disk, max_step=max_step)


def resume_step(plan: Plan, holdings: dict[int, dict]) -> int | None:
    """Newest step that every rank of `plan` can restore from memory, or None.

    holdings[wid] = {"own": [steps], "replicas": {role: [steps]}, "orphans": {role:
    [steps]}} as each member published it. A rank continuing its own role needs the step
    in its own snapshots; a spare continuing a lost role needs it in that role's replica at
    the recorded holder (when the holder survived) or among the lost worker's snapshots it
    adopted from shared memory ("orphans", same node). A rollback generation only
    considers steps up to ``plan.max_step``. With no common step the caller falls back
    to disk.
    """
    if plan.force_disk:
        return None
    common: set[int] | None = None
    for wid, role in zip(plan.ranks, plan.roles):
        if role not in plan.holders:
            steps = set(holdings.get(wid, {}).get("own", []))
        else:
            holder = plan.holders.get(role)
            steps = set()
            if holder is not None and holder in plan.ranks:
                replicas = holdings.get(holder, {}).get("replicas", {})
                steps = set(replicas.get(str(role), replicas.get(role, [])))
            orphans = holdings.get(wid, {}).get("orphans", {})
            steps |= set(orphans.get(str(role), orphans.get(role, [])))
            if not steps:
                return None
        common = steps if common is None else common & steps
    if common and plan.max_step is not None:
        common = {s for s in common if s <= plan.max_step}
    if not common:
        return None
    return max(common)
