"""Building a rail's gloo group and probing it.

Two rails built at once on a rank do not wait on each other.

A rank builds its rails' groups in parallel threads, all from the job's one store. A
TCPStore client serves one request at a time, and building a group blocks in the store
until every peer has published its address. If both builds shared the client, a rank whose
threads happened to start in the other order than a peer's would wait on the peer while
the peer waits on it, until gloo's timeout fails the rail (seen at start-up on a loaded host).
Real gloo groups over loopback; the two ranks are threads with a store client each.
"""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from seamguard.runtime.rails import RailSettings, build_gloo_group, probe_bandwidth

# Builds that wait on each other wait until this expires, whatever its length; a long one
# keeps a loaded machine from failing builds that do not.
TIMEOUT_S = 10.0


def _build(store: dist.Store, rank: int, rail: int, out: dict) -> None:
    try:
        pg = build_gloo_group(store, f"pg/{rail}/0/", rank, 2, "lo", TIMEOUT_S)
        x = torch.ones(4)
        pg.allreduce([x]).wait()
        out[(rank, rail)] = float(x[0])
    except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
        out[(rank, rail)] = f"{type(e).__name__}: {str(e)[:120]}"


@pytest.mark.timeout(60)
def test_rails_built_in_opposite_order_on_two_ranks_both_connect():
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=10))
               for _ in range(2)]
    out: dict = {}
    started = threading.Event()

    def rank0() -> None:  # its threads ran rail 1 first, then rail 0
        started.wait(5.0)
        _build(clients[0], 0, 1, out)
        _build(clients[0], 0, 0, out)

    keys_before = server.num_keys()
    first = threading.Thread(target=_build, args=(clients[1], 1, 0, out))  # rank 1: rail 0 first ...
    first.start()
    while server.num_keys() == keys_before and first.is_alive():  # ... it published its address and
        first.join(0.005)  # waits in the store for rank 0's
    threads = [first, threading.Thread(target=_build, args=(clients[1], 1, 1, out)),  # ... then rail 1
               threading.Thread(target=rank0)]
    for t in threads[1:]:
        t.start()
    started.set()
    for t in threads:
        t.join(30.0)
    assert out == {(r, rail): 2.0 for r in range(2) for rail in range(2)}, out


class _Done:
    def wait(self) -> None:
        pass


class _CountingGroup:
    """Stands in for a built group: counts the probe's allreduces."""

    def __init__(self) -> None:
        self.calls = 0

    def allreduce(self, tensors):
        self.calls += 1
        return _Done()


def _clock(round_s: list[float]):
    """A clock that advances by round_s[i] across the i-th allreduce (read before and after)."""
    ticks, t = [], 0.0
    for dt in round_s:
        ticks += [t, t + dt]
        t += dt + 1.0
    return iter(ticks).__next__


@pytest.mark.parametrize("round_s, want_s", [
    ([0.5, 0.02, 0.3], 0.02),    # a healthy rail whose first and last rounds waited on a late rank
    ([0.25, 0.22, 0.24], 0.22),  # a collapsed link: every round slow, the figure stays low
    ([0.05], 0.05),
])
def test_a_probe_reports_its_fastest_round(round_s, want_s):
    pg = _CountingGroup()
    bw = probe_bandwidth(pg, 1 << 20, len(round_s), clock=_clock(round_s))  # type: ignore[arg-type]
    assert pg.calls == len(round_s)
    assert bw == pytest.approx((1 << 20) / want_s)


def test_settings_reject_a_probe_of_no_rounds():
    with pytest.raises(ValueError, match="probe_rounds"):
        RailSettings(interfaces=("rail0",), probe_rounds=0)
