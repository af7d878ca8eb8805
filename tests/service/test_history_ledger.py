"""The dashboard's history reads on both ledger backends: SQLite (embedded) and PostgreSQL
(an HA pair's shared ledger, Debian's server started here as in tests/ha).

A controller writes 25 ticks in which 16 GPUs go bad; the reader's time-range queries and
the grouped transition counts the state history replays must answer the same on both.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from seamguard.act import LogActuator
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.fleet import FleetShape, generate_fleet
from seamguard.ledger import open_ledger, open_reader
from seamguard.testbed.postgres_server import PostgresServer
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=128), seed=2)
_db_numbers = itertools.count()


@pytest.fixture(scope="module")
def postgres():
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def written(request, tmp_path):
    """A ledger target after 25 ticks of a controller, and a reader on it."""
    target = (str(tmp_path / "ledger.sqlite") if request.param == "sqlite"
              else request.getfixturevalue("postgres").create_database(f"history_{next(_db_numbers)}"))
    ledger = open_ledger(target)
    ctl = Controller(FLEET, default_policy(mode="enforce"), [LogActuator(tmp_path / "a.jsonl")], ledger, tick_s=5.0)
    twin = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4)
    frames = []
    for i in range(25):
        f = twin.step()
        frames.append(f.t_s)
        if i >= 3:
            twin.gpu_sbe[:16] += 20
        assert ctl.tick(f).error == ""
    reader = open_reader(target)
    yield ledger, reader, frames[0]
    reader.close()
    ledger.close()


def test_range_reads_keep_rows_between_since_and_until(written):
    ledger, reader, first_t_s = written
    trs = ledger.transitions()
    ts = sorted({t["t_s"] for t in trs})
    assert len(ts) >= 2
    since, until = ts[0] + 0.1, ts[-1]
    got = reader.transitions(since_t_s=since, until_t_s=until)
    assert got == [t for t in trs if since <= t["t_s"] <= until] and 0 < len(got) < len(trs)
    early = reader.transitions(until_t_s=ts[0])
    assert early == [t for t in trs if t["t_s"] <= ts[0]] and 0 < len(early) < len(trs)
    acts = ledger.actions()
    cut = sorted(a["t_s"] for a in acts)[len(acts) // 2]
    assert reader.actions(since_t_s=cut) == [a for a in acts if a["t_s"] >= cut] != []
    assert reader.decisions(until_t_s=cut) == [d for d in ledger.decisions() if d["t_s"] <= cut] != []
    assert reader.first_tick_t_s() == first_t_s


def test_grouped_transition_counts_add_up_to_the_transitions(written):
    ledger, reader, _ = written
    trs = [t for t in ledger.transitions() if t["kind"] == "gpu"]
    since = min(t["t_s"] for t in trs) - 1.0
    rows = reader.transition_counts("gpu", since_t_s=since)
    ticks = [r["tick"] for r in rows]
    assert ticks == sorted(ticks, reverse=True)
    assert Counter({(r["tick"], r["from_state"], r["to_state"]): r["n"] for r in rows}) == \
        Counter((t["tick"], t["from_state"], t["to_state"]) for t in trs)
    last = max(ticks)
    assert reader.transition_counts("gpu", since_t_s=since, upto_tick=last - 1) == [r for r in rows if r["tick"] < last]
    assert reader.transition_counts("gpu", since_t_s=max(t["t_s"] for t in trs)) == []
