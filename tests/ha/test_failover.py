"""An HA controller on a live fleet: two `seamguard run` replicas with ``ha:`` over the
twin served through a real Prometheus, one shared PostgreSQL ledger, etcd for the lease
(testbed/ha_pair.py). The leader is killed with SIGKILL, cut off from etcd (its proxy
blocked: a partition that leaves it the ledger), and frozen past its lease; each time a
follower must take over within 2 tick periods of the lease's end, from the ledger, and
nothing may be acted twice, lost, or acted by a replica whose lease had ended.
"""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

from conftest import subprocess_env
from seamguard.testbed.ha_pair import HaFleet, audit, takeovers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with HaFleet(tmp_path_factory.mktemp("ha"), env=subprocess_env(), minutes=10.0) as f:
        assert f.wait_leader(60) is not None, "no replica took the lease"
        time.sleep(3 * f.period_s)
        yield f


def _stable_leader(fleet: HaFleet):
    """The current leader once it has ticked (a loaded machine can move the lease between tests)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ev = fleet.watch.holder()
        if ev is not None and _term_of(fleet, ev.revision)["first_tick_wall_s"] is not None:
            return ev
        time.sleep(0.05)
    raise AssertionError("no leader ticked within 60 s")


def _term_of(fleet: HaFleet, token: int) -> dict:
    """The ledger's record of the term (empty until the new leader has taken the ledger)."""
    return next((t for t in takeovers(fleet.ledger_url) if t["token"] == token), {"first_tick_wall_s": None})


def _last_write_wall(fleet: HaFleet, token: int) -> float:
    with psycopg.connect(fleet.ledger_url) as conn:
        ticks = conn.execute("SELECT MAX(GREATEST(wall_started, COALESCE(wall_finished, 0))) FROM ticks "
                             "WHERE fence = %s", (token,)).fetchone()[0]
        acts = conn.execute("SELECT MAX(wall_time) FROM actions WHERE fence = %s", (token,)).fetchone()[0]
    return max(x for x in (ticks, acts, 0.0) if x is not None)


def _ledger_order(fleet: HaFleet, old_token: int, new_token: int) -> None:
    """Every row the old term wrote precedes every row of the new term in the ledger."""
    with psycopg.connect(fleet.ledger_url) as conn:
        for table, col in (("ticks", "tick"), ("actions", "id")):
            old_max, new_min = conn.execute(
                f"SELECT (SELECT MAX({col}) FROM {table} WHERE fence = %s), "
                f"(SELECT MIN({col}) FROM {table} WHERE fence = %s)", (old_token, new_token)).fetchone()
            assert old_max is None or new_min is None or old_max < new_min, \
                f"{table}: the cut-off leader wrote {col} {old_max} after the next leader's {new_min}"


def _clean(fleet: HaFleet) -> None:
    a = audit(fleet.ledger_url, fleet.actions_file, fleet.watch.snapshot())
    assert (a["duplicated"], a["lost"], a["unledgered"], a["double_led"], a["reverted_on_takeover"]["undone"]) \
        == (0, 0, 0, 0, 0), a


def _takeover_after(fleet: HaFleet, old_token: int, timeout_s: float = 30.0):
    """(the old lease's end as etcd saw it, the next term)."""
    gone = fleet.watch.wait_for(lambda e: e.kind == "delete" and e.revision == old_token, timeout_s)
    assert gone is not None, "the old lease never ended"
    new = fleet.wait_leader(timeout_s)
    assert new is not None and new.revision > old_token
    deadline = time.monotonic() + timeout_s
    while _term_of(fleet, new.revision)["first_tick_wall_s"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return gone, _term_of(fleet, new.revision)


def test_a_killed_leader_is_replaced_within_two_ticks_of_its_lease_ending(fleet):
    old = _stable_leader(fleet)
    fleet.kill(old.holder)
    gone, term = _takeover_after(fleet, old.revision)
    assert term["holder"] != old.holder
    takeover_s = term["first_tick_wall_s"] - gone.wall_s
    assert takeover_s <= 2 * fleet.period_s, (takeover_s, fleet.period_s)
    fleet.launch(old.holder)  # back as a follower
    time.sleep(3 * fleet.period_s)
    _clean(fleet)


def test_a_leader_cut_off_from_etcd_stops_acting_before_its_lease_ends(fleet):
    old = _stable_leader(fleet)
    cut = fleet.partition(old.holder)
    try:
        gone, term = _takeover_after(fleet, old.revision)
        last = _last_write_wall(fleet, old.revision)
        # Its writes stop at its local deadline, a third of a lease before etcd can end it: each write
        # checks the deadline and the newest token in its own transaction. A row's wall time is taken
        # after that check, so a process stalled between the two (a loaded 2-core machine) may date
        # its last row past the lease's end; the write then raises Fenced and nothing follows it. What
        # must hold is that it never overlaps the next leader, in the ledger's own order (the fence row
        # is locked by every write, so the order of rows is the order of terms); the two processes'
        # wall clocks are read at different points of their transactions and only bound it.
        # It was an acting leader when cut: its last row is within a few ticks of the cut. Whether it
        # writes again after the cut is not required: its local deadline (2/3 of a 2 s lease after its
        # last renewal) may come before its next tick, and then stopping without a write is correct.
        assert cut - last < 3 * fleet.period_s, ("the leader was not acting when it was cut", cut, last)
        _ledger_order(fleet, old.revision, term["token"])
        assert last < gone.wall_s + fleet.period_s, "the cut-off leader went on writing well past its lease"
        assert term["holder"] != old.holder
        assert term["first_tick_wall_s"] - gone.wall_s <= 2 * fleet.period_s
        log = fleet.members[old.holder].log.read_text()
        assert "stops acting" in log
    finally:
        fleet.heal(old.holder)
    time.sleep(3 * fleet.period_s)
    assert _last_write_wall(fleet, old.revision) == last  # healed, it follows: its old term writes nothing
    _clean(fleet)


def test_a_leader_frozen_past_its_lease_writes_nothing_when_it_wakes(fleet):
    """SIGSTOP the leader (a long GC pause, a stalled VM) until a follower leads; SIGCONT it:
    its late writes are refused and it becomes a follower."""
    old = _stable_leader(fleet)
    proc = fleet.members[old.holder].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        gone, term = _takeover_after(fleet, old.revision)
        frozen_last = _last_write_wall(fleet, old.revision)
    finally:
        proc.send_signal(signal.SIGCONT)
    time.sleep(4 * fleet.period_s)
    assert _last_write_wall(fleet, old.revision) == frozen_last < gone.wall_s
    assert fleet.leader() == term["holder"]
    assert "stops acting" in fleet.members[old.holder].log.read_text()
    _clean(fleet)
