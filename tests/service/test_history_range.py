"""History by time range: the ledger's record and the controller's series between since and until.

A served twin (conftest's runner: 70 ticks of 5 simulated seconds) is asked for windows of
its own past; every answer is checked against what the ledger and the snapshot hold, and
every malformed range gets a one-line 400 naming the parameter.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from seamguard.app.service.render import replay_counts, STATE_LABELS
from seamguard.app.service.timerange import MAX_SPAN_S, groups, parse
from seamguard.fleet.model import Kind


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c


@pytest.mark.parametrize("query, says", [
    ("since=abc", "since: 'abc' is not a number of seconds"),
    ("until=nan", "until: 'nan' is outside"),
    ("since=-5", "since: '-5' is outside"),
    ("since=100&until=100", "since (100) must be before until (100)"),
    ("since=300&until=200", "since (300) must be before until (200)"),
    (f"since=0&until={MAX_SPAN_S + 1:.0f}", "spans 31.0 days"),
    ("since=" + "1" * 40, "since: 40 characters"),
])
def test_bad_ranges_get_a_one_line_400(http, query, says):
    for path in ("/api/v1/timeline", "/api/v1/transitions", "/api/v1/decisions", "/api/v1/actions",
                 "/api/v1/history/fleet", "/api/v1/history/states", "/api/v1/entities/gpu/gpu000/gpu0"):
        r = http.get(f"{path}?{query}")
        detail = r.json()["detail"]
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert isinstance(detail, str) and "\n" not in detail and says in detail, (path, detail)


def test_record_reads_keep_only_rows_inside_the_range(http, runner):
    every = runner.ledger.transitions(limit=100_000)
    ts = sorted({t["t_s"] for t in every})
    assert len(ts) >= 4, "the scenario made too few transitions to cut a window from"
    since, until = ts[1], ts[-2]
    got = http.get(f"/api/v1/transitions?since={since}&until={until}&limit=1000").json()
    want = [t for t in every if since <= t["t_s"] <= until]
    assert len(got) == len(want) > 0 and all(since <= t["t_s"] <= until for t in got)
    assert len(got) < len(every)
    acts = runner.ledger.actions(limit=100_000)
    a_ts = sorted({a["t_s"] for a in acts})
    cut = a_ts[len(a_ts) // 2]
    later = http.get(f"/api/v1/actions?since={cut}&limit=1000").json()
    assert len(later) == sum(a["t_s"] >= cut for a in acts) and all(a["t_s"] >= cut for a in later)
    tl = http.get(f"/api/v1/timeline?until={cut}&limit=500").json()
    assert tl and all(e["t_s"] <= cut for e in tl)
    assert any(e["t_s"] > cut for e in http.get("/api/v1/timeline?limit=500").json())


def test_fleet_series_in_a_range_holds_only_its_ticks(http, runner):
    s = runner.snapshot()
    t_all = [p.t_s for p in s.fleet_history]
    since, until = t_all[10], t_all[30]
    h = http.get(f"/api/v1/history/fleet?since={since}&until={until}").json()
    assert h["t_s"] == t_all[10:31]
    assert h["held_since_t_s"] == t_all[0]
    # Thinned: each point is the last tick of one of 5 equal spans, its coolant their mean.
    thinned = http.get(f"/api/v1/history/fleet?since={since}&until={until}&points=5").json()
    t = thinned["t_s"]
    assert len(t) == 5 and since < t[0] and t[-1] == until and t == sorted(t)
    flow = {p.t_s: float(p.coolant[0, 0]) for p in s.fleet_history}
    prev = since - 1e-9
    for k, tk in enumerate(t):
        span = [flow[x] for x in t_all if prev < x <= tk]
        assert thinned["loops"][0]["flow_lpm"][k] == pytest.approx(np.mean(span), abs=1e-3), tk
        prev = tk


def test_state_counts_replayed_from_the_ledger_match_the_controller_at_every_tick(http, runner):
    """The ledger replay agrees with the counts the controller held at each tick it kept."""
    s = runner.snapshot()
    pts = s.fleet_history
    r = http.get(f"/api/v1/history/states?kind=gpu&since={pts[0].t_s}&until={s.t_s}&points=2000").json()
    assert r["complete_since_t_s"] >= pts[0].t_s and r["moves"] > 0
    tick_t = np.array([p.t_s for p in pts])
    checked = 0
    for k, t in enumerate(r["t_s"]):
        # counts hold from one tick to the next: a sample shows the latest tick at or before it
        j = int(np.searchsorted(tick_t, t + 1e-9, side="right")) - 1
        assert [r["counts"][x][k] for x in STATE_LABELS] == list(pts[j].gpu_counts), t
        checked += 1
    assert checked >= 300 and len({tuple(p.gpu_counts) for p in pts}) > 1  # the counts did change
    # a week: longer than anything held in memory; starts where the ledger does
    week = http.get(f"/api/v1/history/states?kind=node&since=0&until={s.t_s}&points=50").json()
    assert len(week["t_s"]) == 50 and week["t_s"][-1] == s.t_s
    assert [week["counts"][x][-1] for x in STATE_LABELS] == [s.kinds[Kind.NODE].counts()[x] for x in STATE_LABELS]


def test_entity_detail_in_a_range(http, runner):
    rows = [t for t in runner.ledger.transitions(limit=100_000) if t["kind"] == "gpu"]
    name = max({t["entity"] for t in rows}, key=lambda n: sum(t["entity"] == n for t in rows))
    mine = sorted((t for t in rows if t["entity"] == name), key=lambda t: t["t_s"])
    first = mine[0]
    since, until = first["t_s"] + 0.5, runner.snapshot().t_s
    d = http.get(f"/api/v1/entities/gpu/{name}?since={since}&until={until}&points=1000").json()
    assert d["since_t_s"] == since and d["until_t_s"] == until
    assert all(since <= h["t_s"] <= until for h in d["history"])
    assert len(d["history"]) == sum(since <= t["t_s"] <= until for t in mine)
    assert d["state_at_since"] == first["to_state"]  # what the transition before the range left it in
    assert d["gfs_series"]["t_s"] and all(since <= t <= until for t in d["gfs_series"]["t_s"])
    for sig in d["signals"]:
        assert all(since <= t <= until for t in sig["t_s"])
        if sig["peer_p50"]:
            assert len(sig["peer_p50"]) == len(sig["t_s"])
    before = http.get(f"/api/v1/entities/gpu/{name}?until={first['t_s'] - 0.5}").json()
    assert before["history"] == [] and before["state_at_since"] == first["from_state"]


def test_parse_and_groups_are_total():
    assert parse(None, None).since_t_s is None and parse("", "5").until_t_s == 5.0
    # 10 samples in 3 equal spans of [0, 9]: [0, 3), [3, 6), [6, 9]; fewer samples than points: one each
    assert groups(np.arange(10.0), 3).tolist() == [0, 3, 6] and groups([1.0, 2.0, 3.0], 10).tolist() == [0, 1, 2]
    assert groups(np.arange(5.0), 1).tolist() == [0] and groups([], 5).tolist() == []
    assert groups([0.0, 0.1, 0.2, 50.0, 99.0, 100.0], 2).tolist() == [0, 3]  # uneven times: spans, not counts


def test_replay_undoes_moves_newest_first():
    moves = [{"tick": 3, "t_s": 30.0, "from_state": "degraded", "to_state": "failed", "n": 1},
             {"tick": 2, "t_s": 20.0, "from_state": "healthy", "to_state": "degraded", "n": 2}]
    now = {"healthy": 8, "degraded": 1, "failed": 1}
    got = replay_counts(now, moves, np.array([10.0, 20.0, 25.0, 30.0, 35.0]))
    h, d, f = (STATE_LABELS.index(x) for x in ("healthy", "degraded", "failed"))
    assert got[:, h].tolist() == [10, 8, 8, 8, 8]
    assert got[:, d].tolist() == [0, 2, 2, 1, 1]
    assert got[:, f].tolist() == [0, 0, 0, 1, 1]
