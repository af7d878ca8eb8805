"""Which node's launcher coordinates a job whose store is etcd: a leader key on a lease.

Why this exists: the coordinator ran in node 0's launcher only, so node 0's loss ended
the job. With the job-wide store in etcd (``--store etcd://``) the job's state outlives
any node, so another node's launcher can take the coordinator's place (launcher.py) if
exactly one does so at a time and a deposed one writes nothing after its successor began.

The election: every launcher of the job may campaign for one key, keys.COORDINATOR,
attached to a lease of its own (``lease_s``); the first to create it coordinates. Its
value is the holder's node rank; its create revision is the term's fencing token. The
holder renews the lease every ``lease_s / 4`` on a thread of its own (a launcher busy in
a long pass cannot delay it). A renewal sent at monotonic time t lets the holder act
until ``t + lease_s * ACT_SHARE``: the lease, renewed at or after t, ends no earlier than
``t + lease_s``, so a holder whose renewals stop reaching etcd (cut off, starved of CPU,
etcd down) stops acting a third of a lease before etcd can let another launcher in, with
no message needed. The other launchers learn of the loss when the key is gone (the lease
expired) and campaign then.

Fencing: `FencedStore` sends every ``set``/``put`` of the coordinator as one etcd
transaction that compares the leader key's create revision with the term's token, so a
coordinator that lost its term cannot write a plan, a resume choice or the job's end
after another took over; it raises `Deposed` instead.

The control plane's HA controller (app/leader.py) uses the same lease arithmetic
(seamguard/lease.py, in the bottom layer both may import); the election itself is this
module's, on the job store's client (runtime/store.py, aetcd).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from seamguard.lease import ACT_SHARE, RENEWALS_PER_LEASE, Term, renewed  # noqa: F401 - ACT_SHARE: for callers
from seamguard.runtime import keys


class Deposed(RuntimeError):
    """A fenced write found another launcher's term (or none): this one coordinates no more."""


class Election:
    """One launcher's part in its job's election (see the module docstring). ``store``: the
    job's EtcdStore; ``node``: this launcher's node rank (the key's value)."""

    def __init__(self, store, node: int, lease_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        if lease_s < 2:
            raise ValueError(f"coordinator lease: {lease_s} s is below etcd's minimum lease of 2 s")
        self.store, self.node, self.lease_s, self.clock = store, node, lease_s, clock
        self._term = Term()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lease = 0
        self._thread: threading.Thread | None = None

    def holder(self) -> int | None:
        """The node whose launcher coordinates now (None: nobody, the key is gone)."""
        raw = keys.peek(self.store, keys.COORDINATOR)
        return None if raw is None else int(raw)

    def campaign(self) -> bool:
        """Try once to coordinate; True when this launcher now holds the key (and renews it)."""
        sent_s = self.clock()
        lease = self.store.grant_lease(self.lease_s)
        token = self.store.put_if_absent(keys.COORDINATOR, str(self.node), lease)
        if not token:
            self.store.revoke(lease)
            return False
        self._lease = lease
        self._publish(renewed(token, sent_s, self.lease_s))
        self._stop.clear()
        self._thread = threading.Thread(target=self._keep, name="sg-coordinator-lease", daemon=True)
        self._thread.start()
        return True

    def term(self) -> Term:
        with self._lock:
            return self._term

    def may_act(self) -> bool:
        return self.term().may_act(self.clock())

    def renew_once(self) -> bool:
        """One renewal (the lease thread's step): the term extended, or dropped when etcd
        says the lease has expired. A renewal that gets no answer changes nothing: the term
        runs out by itself. False when this launcher coordinates no more."""
        term = self.term()
        if not term.token:
            return False
        sent_s = self.clock()
        try:
            ttl_s = self.store.keep_alive(self._lease, timeout_s=self.lease_s / RENEWALS_PER_LEASE)
        except (RuntimeError, OSError):   # unreachable: acting stops when the term runs out
            return term.may_act(self.clock())
        self._publish(renewed(term.token, sent_s, self.lease_s) if ttl_s > 0 else Term())
        return ttl_s > 0

    def resign(self) -> None:
        """Stop renewing and give the key up (a successor may campaign at once)."""
        lease, self._lease = self._lease, 0
        self._publish(Term())
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.lease_s)
            self._thread = None
        if lease:
            try:
                self.store.revoke(lease)
            except (RuntimeError, OSError):
                pass   # the lease ends by itself

    def fenced(self, store) -> FencedStore:
        """``store`` with every write checked against this launcher's term."""
        return FencedStore(store, self)

    def _keep(self) -> None:
        while not self._stop.wait(self.lease_s / RENEWALS_PER_LEASE):
            if not self.renew_once() and not self.term().token:
                return

    def _publish(self, term: Term) -> None:
        with self._lock:
            self._term = term


class FencedStore:
    """The coordinator's view of the job's store: reads pass through; ``set`` and ``put``
    are one transaction each that writes only while the leader key is this term's
    (`Deposed` otherwise). Counters (``add``) are not fenced: a stale increment only
    makes a counter skip a value."""

    def __init__(self, store, election: Election) -> None:
        self._store, self._election = store, election

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def set(self, key: str, value) -> None:
        self.put(key, value)

    def put(self, key: str, value, lease: int | None = None) -> int:
        token = self._election.term().token
        revision = self._store.put_fenced(key, value, keys.COORDINATOR, token) if token else 0
        if not revision:
            raise Deposed(f"node {self._election.node} coordinates no more (the coordinator key is another "
                          f"launcher's or gone): its write of {key!r} was refused")
        return revision
