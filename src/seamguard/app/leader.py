"""Which replica of an HA controller leads: an etcd lease, and the term it gives.

`seamguard run` with ``ha:`` (docs/ha.md) runs an `Elector` beside the controller loop.
Each replica campaigns for one key (``ha.key``): the first to create it, attached to its
own lease of ``lease_s``, leads; the key's revision is its fencing token, which every
ledger write of its term carries and checks (ledger/sqlite.py `Fence`). The leader renews
its lease every ``lease_s / 4``; a follower polls the key and campaigns as soon as etcd
has deleted it (the lease expired, or the leader resigned on a clean stop).

A leader stops acting before its lease can end. Each renewal sent at monotonic time t
gives it a term that allows acting until ``t + lease_s * ACT_SHARE`` (the lease, granted
at or after t, ends no earlier than ``t + lease_s``): when renewals fail (etcd down, the
leader cut off), `Term.may_act` turns false a third of a lease before etcd can let
another replica in, with no message needed. The share left is for an action already
past its ledger check (docs/ha.md says what it covers and what it does not).

Client: aetcd, etcd's v3 gRPC API (asyncio), on a loop in the elector's own thread; the
controller thread only reads the immutable `Term` the elector publishes (swapped whole
under a lock). Every RPC is bounded by ``rpc_timeout_s``; a client that fails is closed
and a fresh one (next endpoint) opened.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from seamguard.lease import ACT_SHARE, RENEWALS_PER_LEASE, Term, renewed

log = logging.getLogger("seamguard.leader")


@dataclass(frozen=True)
class LeaseSettings:
    """One replica's part in the election (from the run config's ``ha:``)."""

    endpoints: tuple[str, ...]
    """etcd client endpoints, host:port (an http:// prefix is accepted and dropped)."""
    name: str
    """This replica's name: the key's value, the ledger's record of who led."""
    lease_s: int = 3
    """The lease's TTL in seconds: how long a dead leader holds the fleet without a controller."""
    key: str = "/seamguard/controller/leader"
    poll_s: float = 0.1
    """How often a follower looks at the key."""

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("ha.etcd: at least one endpoint is needed")
        if self.lease_s < 2:
            raise ValueError(f"ha.lease_s: {self.lease_s} s is below etcd's minimum lease of 2 s")

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / RENEWALS_PER_LEASE

    @property
    def act_window_s(self) -> float:
        return self.lease_s * ACT_SHARE

    @property
    def rpc_timeout_s(self) -> float:
        return max(0.2, self.lease_s / RENEWALS_PER_LEASE)

    def host_ports(self) -> list[tuple[str, int]]:
        out = []
        for ep in self.endpoints:
            hp = ep.split("://", 1)[-1].rstrip("/")
            host, _, port = hp.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"ha.etcd: {ep!r} is not host:port")
            out.append((host, int(port)))
        return out


FOLLOWING = Term()  # what the elector knows while it does not lead


class Elector:
    """Campaigns for and keeps the lease on a thread of its own; `term()` is what it knows now."""

    def __init__(self, settings: LeaseSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._term = FOLLOWING
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease_id: int | None = None
        self._token = 0  # the key's revision while this replica holds the lease
        self._resign = threading.Event()
        self._key = settings.key.encode()
        self._endpoint = 0
        self._failing = False  # etcd's last call failed: further failures are logged at debug

    # ---- read by the controller thread ------------------------------------------------
    def term(self) -> Term:
        with self._lock:
            return self._term

    def may_act(self, token: int) -> bool:
        """This replica still leads with ``token`` and its local deadline has not passed."""
        t = self.term()
        return t.token == token and t.may_act(self.clock())

    def resign(self) -> None:
        """Give the lease up now (the ledger refused this term: a newer one exists)."""
        self._publish(FOLLOWING)
        self._resign.set()

    def _publish(self, term: Term) -> None:
        with self._lock:
            self._term = term

    # ---- the elector's thread ---------------------------------------------------------------
    def start(self) -> Elector:
        if self._thread is None:
            self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="seamguard-elector",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Resign (the lease revoked: a follower takes over at once) and end the thread."""
        self._publish(FOLLOWING)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    async def _main(self) -> None:
        import aetcd

        while not self._stop.is_set():
            host, port = self.settings.host_ports()[self._endpoint % len(self.settings.endpoints)]
            client = aetcd.Client(host=host, port=port, timeout=self.settings.rpc_timeout_s)
            try:
                await self._session(client)
            except Exception as e:  # etcd unreachable or erroring: a fresh client, the next endpoint
                # One warning per outage, not one per retry (a retry comes every fraction of a second).
                (log.debug if self._failing else log.warning)(
                    "etcd %s:%d: %s: %s (retrying)", host, port, type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "")
                self._failing = True
                self._endpoint += 1
                self._expire_if_past_deadline()
                await asyncio.sleep(self.settings.poll_s)
            finally:
                if self._stop.is_set():
                    await self._revoke(client)
                try:
                    await asyncio.wait_for(client.close(), self.settings.rpc_timeout_s)
                except Exception:  # noqa: BLE001 - closing a broken channel
                    pass

    def _expire_if_past_deadline(self) -> None:
        t = self.term()
        if t.token and not t.may_act(self.clock()):
            log.error("lease not renewed in time: stopped acting (token %d)", t.token)
            self._publish(FOLLOWING)

    async def _session(self, client) -> None:
        await client.connect()
        while not self._stop.is_set():
            if self._failing and self._lease_id is None:
                await client.get(self._key)  # answered: the outage is over
                log.warning("etcd answers again")
                self._failing = False
            if self._resign.is_set():
                self._resign.clear()
                await self._revoke(client)
            if self._lease_id is None:
                if not await self._campaign(client):
                    await asyncio.sleep(self.settings.poll_s)
                    continue
            else:  # renew first: a session that starts after a failed call has no time to lose
                await self._renew(client)
            await asyncio.sleep(self.settings.renew_every_s)

    async def _campaign(self, client) -> bool:
        if await client.get(self._key) is not None:
            return False
        sent = self.clock()
        lease = await client.lease(self.settings.lease_s)
        ok, responses = await client.transaction(
            compare=[client.transactions.create(self._key) == 0],
            success=[client.transactions.put(self._key, self.settings.name.encode(), lease=lease)],
            failure=[])
        if not ok:
            await client.revoke_lease(lease.id)
            return False
        self._lease_id = lease.id
        token = self._token = int(responses[0].response_put.header.revision)
        self._publish(renewed(token, sent, self.settings.lease_s))
        log.warning("%s leads: lease %x, token %d", self.settings.name, lease.id, token)
        return True

    async def _renew(self, client) -> None:
        sent = self.clock()
        token = self._token
        reply = await asyncio.wait_for(client.refresh_lease(self._lease_id), self.settings.rpc_timeout_s)
        held = await client.get(self._key)
        if reply is None or reply.TTL <= 0 or held is None or held.create_revision != token or not token:
            log.error("%s lost the lease (token %d): following", self.settings.name, token)
            self._lease_id, self._token = None, 0
            self._publish(FOLLOWING)
            return
        self._publish(renewed(token, sent, min(reply.TTL, self.settings.lease_s)))
        if self._failing:
            log.warning("etcd answers again; %s still leads (token %d)", self.settings.name, token)
            self._failing = False

    async def _revoke(self, client) -> None:
        lease_id, self._lease_id, self._token = self._lease_id, None, 0
        self._publish(FOLLOWING)
        if lease_id is None:
            return
        try:
            await asyncio.wait_for(client.revoke_lease(lease_id), self.settings.rpc_timeout_s)
            log.warning("%s resigned (lease %x revoked)", self.settings.name, lease_id)
        except Exception as e:  # noqa: BLE001 - it expires by itself within lease_s
            log.warning("%s could not revoke its lease (%s); it expires within %d s", self.settings.name,
                        type(e).__name__, self.settings.lease_s)
