"""The job's membership in etcd, written only when it changes, and the coordinator's election.

Why this exists: etcd is where membership must survive any node (docs/runtime.md, "Many
nodes"), but liveness changes every beat and now travels over the launchers' links
(`runtime/liveness.py`). What is left for etcd is small and rare: which workers each node
holds, the membership generation, and who coordinates. `Roster` writes the first two
only when they change (a node joins, leaves or changes its workers: one transaction, the
generation bumped in it), so a stable job of any size sends etcd no writes.

The coordinator is elected, not fixed on node 0: every node's launcher campaigns for one
key bound to its own lease (``lease_s``, 5 s: a coordinator starved of CPU for a few
seconds, as when a thousand launchers connect at once on a loaded host, must not lose it;
the ranks train on through a failover, so its length costs no work), the first to create it coordinates and the
key's value is the address of its liveness hub (with the hub's id), which the other launchers read to know
where to report. Its create revision is a fencing token: every membership write compares
it, so a deposed coordinator cannot write. When the coordinator's node dies its lease
expires, another launcher wins, rebuilds the membership from etcd (`load`) and the
launchers reconnect to it; no rank is restarted. The pattern is the HA controller's
(app/leader.py), kept here so the runtime does not import the control plane.

Client: aetcd (etcd's v3 gRPC API, asyncio; runtime/etcd_client.py), every call bounded
by the client's timeout. Keys under ``/seamguard/<run-id>/roster/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from seamguard.runtime.etcd_client import connect  # noqa: F401 (the roster's client; re-exported)

TXN_OPS = 100   # etcd refuses a transaction of more than --max-txn-ops (128 by default)




def changes(old: dict[int, frozenset[int]], new: dict[int, frozenset[int]]
            ) -> tuple[dict[int, frozenset[int]], list[int]]:
    """What turns membership ``old`` into ``new``: the nodes to (re)write, the nodes to delete."""
    puts = {n: w for n, w in new.items() if old.get(n) != w}
    return puts, sorted(set(old) - set(new))


@dataclass(frozen=True)
class Term:
    """This launcher coordinates with fencing ``token`` under ``lease_id``; token 0: it does not."""

    token: int = 0
    lease_id: int = 0


class Roster:
    """One launcher's view of the job's membership and election in etcd (see module docstring)."""

    def __init__(self, client, run_id: str, lease_s: int = 5) -> None:
        if lease_s < 2:
            raise ValueError(f"roster lease_s: {lease_s} s is below etcd's minimum lease of 2 s")
        self.client = client
        self.lease_s = lease_s
        self.root = f"/seamguard/{run_id}/roster/".encode()
        self.leader_key = self.root + b"coordinator"
        self.gen_key = self.root + b"gen"
        self.term = Term()
        self.gen = 0
        self.members: dict[int, frozenset[int]] = {}
        self.writes = 0

    def _node_key(self, node: int) -> bytes:
        return self.root + b"node/" + str(node).encode()

    # ---- election ---------------------------------------------------------------------
    async def campaign(self, address: str) -> bool:
        """Try once to become the coordinator, advertising ``address`` (host:port#hub)."""
        if await self.client.get(self.leader_key) is not None:
            return False
        lease = await self.client.lease(self.lease_s)
        tx = self.client.transactions
        ok, responses = await self.client.transaction(
            compare=[tx.create(self.leader_key) == 0],
            success=[tx.put(self.leader_key, address.encode(), lease=lease)], failure=[])
        if not ok:
            await self.client.revoke_lease(lease.id)
            return False
        self.term = Term(int(responses[0].response_put.header.revision), lease.id)
        return True

    async def renew(self) -> bool:
        """Keep the lease; False (and the term dropped) when it is gone or another holds the key."""
        if not self.term.token:
            return False
        reply = await self.client.refresh_lease(self.term.lease_id)
        held = await self.client.get(self.leader_key)
        if reply is None or reply.TTL <= 0 or held is None or held.create_revision != self.term.token:
            self.term = Term()
            return False
        return True

    async def resign(self) -> None:
        lease_id, self.term = self.term.lease_id, Term()
        if lease_id:
            await self.client.revoke_lease(lease_id)

    async def coordinator(self) -> str | None:
        """The elected coordinator's hub address (``host:port#hub``, liveness.py), None
        while nobody holds the key."""
        held = await self.client.get(self.leader_key)
        return None if held is None else held.value.decode()

    # ---- membership ---------------------------------------------------------------------
    async def load(self) -> tuple[int, dict[int, frozenset[int]]]:
        """The membership etcd holds (what a new coordinator starts from)."""
        members: dict[int, frozenset[int]] = {}
        gen = 0
        prefix = self.root + b"node/"
        for kv in await self.client.get_prefix(prefix):
            members[int(kv.key[len(prefix):])] = frozenset(json.loads(kv.value))
        got = await self.client.get(self.gen_key)
        if got is not None:
            gen = int(got.value)
        self.gen, self.members = gen, members
        return gen, dict(members)

    async def write(self, new: dict[int, frozenset[int]]) -> int:
        """Make etcd hold ``new``; nothing is sent when it already does. Each transaction is
        fenced by the term and bumps the generation. Returns the transactions sent;
        PermissionError when this launcher no longer coordinates."""
        puts, deletes = changes(self.members, new)
        ops = [(n, w) for n, w in sorted(puts.items())] + [(n, None) for n in deletes]
        if not ops:
            return 0
        if not self.term.token:
            raise PermissionError("roster: this launcher does not coordinate")
        tx = self.client.transactions
        sent = 0
        for i in range(0, len(ops), TXN_OPS - 1):
            batch = ops[i:i + TXN_OPS - 1]
            gen = self.gen + 1
            requests = [tx.put(self._node_key(n), json.dumps(sorted(w)).encode()) if w is not None
                        else tx.delete(self._node_key(n)) for n, w in batch]
            ok, _ = await self.client.transaction(
                compare=[tx.create(self.leader_key) == self.term.token],
                success=requests + [tx.put(self.gen_key, str(gen).encode())], failure=[])
            if not ok:
                self.term = Term()
                raise PermissionError("roster: another launcher coordinates now (fencing token changed)")
            sent += 1
            self.gen = gen
            for n, w in batch:
                if w is None:
                    self.members.pop(n, None)
                else:
                    self.members[n] = w
        self.writes += sent
        return sent

    async def revision(self) -> int:
        """etcd's current revision: it moves with every write to the cluster."""
        reply = await self.client.get_prefix(self.root + b"gen")
        return int(reply.header.revision)
