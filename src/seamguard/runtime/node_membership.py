"""One launcher's part in membership at scale: report its node, coordinate when elected.

Why this exists: it joins the two halves — liveness over the links (`runtime/liveness.py`)
and membership plus election in etcd (`runtime/roster.py`) — the way every node's
launcher runs them, so the coordinator is no longer fixed on node 0. Each launcher:

- listens with its own `LivenessHub` (an idle socket until it is elected);
- reports its node's beats, signed with the job's link key (`liveness.link_key`), to
  whichever hub the election key names (`NodeReporter`);
  when it finds no key (the coordinator's lease expired), it campaigns with its own hub's
  address, so a failover needs no extra traffic while a coordinator lives;
- once elected: rebuilds the membership from etcd (`Roster.load`), gives every node it
  lists one hang timeout plus ``takeover_grace_s`` to reconnect, then every
  ``beat_s / 2`` judges the links (as of the pass's start, once every line that had
  arrived by then is read: a coordinator short of CPU judges late, never falsely) and
  writes the membership to etcd if it changed (nodes lost or joined), and renews its
  lease every ``lease_s / 4``; a failed renewal steps it down (its hub closes, the
  launchers look again).

`lost` lists each verdict (node, workers, why, coordinator's node) for the launcher to act
on; ranks are never restarted by a failover itself.

The etcd client runs on an event loop of its own thread (`etcd_client.EtcdThread`, as
app/leader.py runs its elector): a coordinator short of CPU reads thousands of queued lines in one pass
of its hub's loop, and its lease renewals must not wait behind them (on one loop, at 10k
simulated ranks on a loaded host, they did, and the lease expired).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from seamguard.runtime.etcd_client import EtcdThread
from seamguard.runtime.linkwire import PendingLinks, pending_limit
from seamguard.runtime.liveness import LivenessHub, NodeReporter
from seamguard.runtime.roster import Roster, Term

log = logging.getLogger("seamguard.membership")


@dataclass(frozen=True)
class Loss:
    node: int
    workers: frozenset[int]
    why: str
    judged_by: int


class NodeMembership:
    """See the module docstring. ``beats()`` returns this node's workers' (counter, step)."""

    def __init__(self, roster: Roster, run_id: str, node: int, beats, key: bytes, beat_s: float = 0.25,
                 hang_timeout_s: float = 1.0, host: str = "127.0.0.1", takeover_grace_s: float = 1.0,
                 nodes: int = 0) -> None:
        self.roster, self.run_id, self.node, self.key = roster, run_id, node, key
        self.beat_s, self.hang_timeout_s, self.host = beat_s, hang_timeout_s, host
        self.takeover_grace_s = takeover_grace_s
        self.nodes = nodes   # the job's nodes, if known: every one may connect at once (a failover)
        self.reporter = NodeReporter(run_id, node, beat_s, key, self._locate, beats)
        self.hub: LivenessHub | None = None
        self.address = ""
        self.lost: list[Loss] = []
        self.terms = 0
        self._coordinating: asyncio.Task | None = None
        self._write_failing = False
        self._stop: asyncio.Event | None = None
        self.etcd = EtcdThread("seamguard-roster")   # every roster call runs there (the module docstring says why)

    @property
    def coordinates(self) -> bool:
        return self._coordinating is not None and not self._coordinating.done()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        await self._open_hub()
        try:
            await self.reporter.run(stop)
        finally:
            try:
                if self._coordinating is not None:
                    await asyncio.wait_for(self._coordinating, 4 * self.beat_s + self.roster.lease_s)
                if self.roster.term.token:
                    await asyncio.wait_for(self.etcd.call(self.roster.resign()), self.roster.lease_s)
            finally:
                if self.hub is not None:
                    await self.hub.close()
                self.etcd.close()

    async def _open_hub(self) -> None:
        self.hub = LivenessHub(self.run_id, self.hang_timeout_s, self.key,
                               pending=PendingLinks(pending_limit(self.nodes)))
        await self.hub.start(self.host)
        self.address = self.hub.address   # host:port#hub: lines signed for an earlier hub are refused

    async def _locate(self) -> str | None:
        where = await self.etcd.call(self.roster.coordinator())
        if where is not None or self.coordinates:
            return where
        if await self.etcd.call(self.roster.campaign(self.address)):
            self.terms += 1
            self._coordinating = asyncio.create_task(self._coordinate())
            return await self.etcd.call(self.roster.coordinator())
        return None

    async def _coordinate(self) -> None:
        hub, stop = self.hub, self._stop
        _, members = await self.etcd.call(self.roster.load())
        now = time.monotonic()
        for n, workers in members.items():   # each node gets a timeout plus the grace to reconnect
            hub.tracker.observe(n, -1, set(workers), now + self.takeover_grace_s)
        keeper = asyncio.wrap_future(self.etcd.submit(self._keep_lease(stop)))   # on the etcd thread
        try:
            while not stop.is_set() and not keeper.done():
                for node, workers, why in await hub.judge_now():   # once what had arrived is read
                    self.lost.append(Loss(node, frozenset(workers), why, self.node))
                await self._write_members(hub)
                try:
                    await asyncio.wait_for(stop.wait(), self.beat_s / 2)
                except asyncio.TimeoutError:
                    pass
            if keeper.done() and not stop.is_set():
                raise PermissionError("the coordinator's lease was lost")
        except Exception as exc:  # noqa: BLE001 - etcd failing, or deposed: step down, others take over
            log.warning("node %d stops coordinating: %s: %s", self.node, type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "")
            await self._step_down(hub)
        finally:
            keeper.cancel()

    async def _write_members(self, hub: LivenessHub) -> None:
        """Make etcd hold the hub's membership. A slow or failing etcd is retried on the
        next pass (the write is level-triggered: the difference is sent again) while the
        lease lasts (`_keep_lease` judges that); only a changed fencing token deposes."""
        try:
            await self.etcd.call(self.roster.write({n: frozenset(w) for n, w in hub.members().items()}))
            if self._write_failing:
                log.warning("node %d: etcd takes the membership again", self.node)
            self._write_failing = False
        except PermissionError:
            raise
        except Exception as exc:  # noqa: BLE001 - etcd slow or unreachable: the next pass sends it again
            if not self._write_failing:   # one line an outage, not one a pass
                log.warning("node %d: membership not written (%s): retried every pass while the lease lasts",
                            self.node, type(exc).__name__)
            self._write_failing = True

    async def _step_down(self, hub: LivenessHub) -> None:
        """Stop coordinating: give the lease back (another launcher may win at once, not a
        lease later), close the hub (the launchers look again), open a fresh one."""
        try:
            await asyncio.wait_for(self.etcd.call(self.roster.resign()), self.roster.lease_s / 4)
        except Exception:  # noqa: BLE001 - the lease then expires by itself within lease_s
            self.roster.term = Term()
        await hub.close()
        await self._open_hub()

    async def _keep_lease(self, stop: asyncio.Event) -> None:
        """Renew every ``lease_s / 4``; returns when the lease is gone, or when no renewal
        has succeeded for two thirds of it (etcd unreachable: stop before another may lead).
        Runs on the etcd thread's loop: ``stop`` (the caller's loop's) is only looked at."""
        last_ok_s = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(self.roster.lease_s / 4)
            if stop.is_set():
                return
            sent_s = time.monotonic()
            try:
                if not await self.roster.renew():
                    return
                last_ok_s = sent_s
            except Exception as exc:  # noqa: BLE001 - a slow or failed call: retry while the lease lasts
                if time.monotonic() - last_ok_s > self.roster.lease_s * 2 / 3:
                    log.warning("node %d could not renew its lease: %s", self.node, type(exc).__name__)
                    return
