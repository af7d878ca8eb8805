"""The HTTP API against a real server on loopback, over a twin with injected faults."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from seamguard.fleet.model import Kind
from seamguard.twin.faults import FaultKind

from .conftest import fault_entity

BAD = ["degraded", "checkpoint_unsafe", "quarantine", "harmful", "failed"]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c


def test_summary_counts_cover_the_fleet(http, runner):
    s = http.get("/api/v1/summary").json()
    fleet = runner.snapshot().fleet
    assert s["tick"] == runner.snapshot().tick >= 69
    for kind in ("cooling_loop", "rack", "node", "gpu", "nic", "link", "storage", "job"):
        assert sum(s["states"][kind].values()) == fleet.count(Kind[kind.upper()])
    assert sum(s["domains"]["compute"].values()) == fleet.count(Kind.GPU) + fleet.count(Kind.NODE)
    assert s["mode"] in ("enforce", "dry_run")
    assert s["useful_throughput"] is not None and 0 < s["useful_throughput"] <= 1


def test_entity_filters_sort_and_pages(http, runner):
    q = "&".join(f"state={x}" for x in BAD)
    first = http.get(f"/api/v1/entities?kind=gpu&{q}&sort=gfs&limit=7").json()
    total = first["total"]
    assert total > 0 and all(e["state"] in BAD for e in first["items"])
    gfs = [e["gfs"] for e in first["items"]]
    assert gfs == sorted(gfs, reverse=True)
    names = []
    for off in range(0, total, 50):
        page = http.get(f"/api/v1/entities?kind=gpu&{q}&limit=50&offset={off}").json()
        names += [e["name"] for e in page["items"]]
    assert len(names) == len(set(names)) == total
    view = runner.snapshot().kinds[Kind.GPU]
    assert total == int((view.state != 0).sum())
    loop = first["items"][0]["loop"]
    by_loop = http.get(f"/api/v1/entities?kind=gpu&loop={loop}&limit=1000").json()
    assert by_loop["total"] == int((view.loop == runner.snapshot().fleet.index_of(Kind.COOLING_LOOP, loop)).sum())
    assert all(e["loop"] == loop for e in by_loop["items"])


def test_bad_parameters_get_clear_4xx(http):
    r = http.get("/api/v1/entities?kind=switch")
    assert r.status_code == 422 and "gpu" in r.text  # lists the kinds it accepts
    r = http.get("/api/v1/entities?kind=gpu&limit=0")
    assert r.status_code == 422 and "limit" in r.text
    r = http.get("/api/v1/entities?kind=gpu&loop=loop-999")
    assert r.status_code == 404 and "loop-999" in r.json()["detail"]
    r = http.get("/api/v1/entities/gpu/gpu999/gpu9")
    assert r.status_code == 404 and "no gpu named 'gpu999/gpu9'" in r.json()["detail"]
    r = http.get("/api/v1/entities?kind=gpu&domain=fabric")
    assert r.status_code == 400 and "compute" in r.json()["detail"]
    r = http.get("/api/v1/admissibility?job_class=training")
    assert r.status_code == 422 and "high_sync_training" in r.text


def test_faulty_gpu_shows_its_evidence_history_signals_and_action(http, runner):
    src = runner.source
    gpu = fault_entity(src, FaultKind.GPU_ECC_ESCALATION)
    d = http.get(f"/api/v1/entities/gpu/{gpu}?points=20").json()
    assert d["entity"]["state"] != "healthy"
    channels = {r["channel"] for r in d["evidence"]}
    assert {"xid", "sbe_rate"} & channels
    assert d["history"] and d["history"][0]["to_state"] == d["entity"]["state"]
    assert d["entered_by"] is not None and d["entered_by"]["reasons"]
    assert d["why"].startswith(d["entity"]["state"])
    sig = {s["name"]: s for s in d["signals"]}
    ecc = sig["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]["values"]
    assert len(ecc) == 20 and ecc[-1] > ecc[0]  # the escalating error counter
    assert d["parents"]["node"] == gpu.split("/")[0]
    assert any(a["verb"] == "drain" and a["target"] == d["parents"]["node"] for a in d["actions"])


def test_admissibility_matches_the_assessment(http, runner):
    a = runner.snapshot().assessment
    summ = http.get("/api/v1/admissibility/summary").json()
    assert summ["admissible"]["high_sync_training"] == int(a.admissible[:, 0].sum())
    r = http.get("/api/v1/admissibility?job_class=high_sync_training&limit=1000").json()
    assert r["admissible"] == len(r["nodes"]) == int(a.admissible[:, 0].sum())
    bad_nodes = {e["name"] for e in http.get("/api/v1/entities?kind=node&state=quarantine&state=failed&limit=1000").json()["items"]}
    assert bad_nodes and not bad_nodes & set(r["nodes"])


def test_jobs_decisions_actions_timeline_throughput(http, runner):
    jobs = http.get("/api/v1/jobs").json()
    assert len(jobs) == runner.snapshot().fleet.count(Kind.JOB)
    assert any(j["exposed_to"] for j in jobs)
    assert all(j["useful_throughput"] is not None for j in jobs)
    acts = http.get("/api/v1/actions?status=done&limit=500").json()
    assert acts and all(a["status"] == "done" for a in acts)
    assert any(a["reason"].startswith("seamguard:") for a in acts)
    decs = http.get("/api/v1/decisions?event=decided&limit=5").json()
    assert decs and all(d["event"] == "decided" and d["reason"] for d in decs)
    tl = http.get("/api/v1/timeline?limit=300").json()
    assert {e["type"] for e in tl} == {"transition", "action"}
    tp = http.get("/api/v1/throughput").json()
    assert len(tp["series"]) == runner.snapshot().tick + 1
    assert tp["useful_with_control"] > tp["useful_without_control"]  # the default scenario: control pays


def test_map_groups_loop_rack_node_gpu(http, runner):
    m = http.get("/api/v1/map").json()
    fleet = runner.snapshot().fleet
    assert not m["aggregated"] and len(m["detail"]) == fleet.count(Kind.COOLING_LOOP)
    codes = "".join(g for d in m["detail"] for r in d["racks"] for g in r["gpu_states"])
    names = [n for d in m["detail"] for r in d["racks"] for ns in r["gpu_names"] for n in ns]
    view = runner.snapshot().kinds[Kind.GPU]
    expect = {fleet.gpu_names[i]: int(view.state[i]) for i in range(view.count)}
    assert len(names) == fleet.count(Kind.GPU)
    assert all(expect[n] == int(c) for n, c in zip(names, codes))
    one = http.get(f"/api/v1/map?loop={fleet.loop_names[1]}").json()
    assert len(one["detail"]) == 1 and one["detail"][0]["loop"] == fleet.loop_names[1]


def test_metrics_render_the_snapshot(http, runner):
    text = http.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    snap = runner.snapshot()
    per_kind: dict[str, float] = {}
    for smp in fams["seamguard_entities"].samples:
        per_kind[smp.labels["kind"]] = per_kind.get(smp.labels["kind"], 0) + smp.value
    assert per_kind["gpu"] == snap.fleet.count(Kind.GPU)
    bad_gpu = sum(s.value for s in fams["seamguard_entities"].samples if s.labels["kind"] == "gpu" and s.labels["state"] != "healthy")
    assert bad_gpu == int((snap.kinds[Kind.GPU].state != 0).sum())
    assert any(s.value > 0 for s in fams["seamguard_actions"].samples if s.labels["status"] == "done")
    count = next(s for s in fams["seamguard_tick_duration_seconds"].samples if s.name.endswith("_count"))
    assert count.value == snap.counters.ticks
    assert len(text.splitlines()) < 400  # bounded: no per-entity series
    assert fams["seamguard_leader"].samples[0].value == 1  # no ha: this replica acts


def test_leader_gauge_follows_the_term(runner):
    from seamguard.app.service.metrics import make_registry, render
    term = {"leading": True}
    reg = make_registry(runner.snapshot, lambda: term["leading"])
    def leader() -> float:
        fams = {f.name: f for f in text_string_to_metric_families(render(reg).decode())}
        return fams["seamguard_leader"].samples[0].value
    assert leader() == 1
    term["leading"] = False  # deposed: a follower exports 0, so sum() over replicas counts leaders
    assert leader() == 0


def test_mutations_need_the_token(http, auth):
    for method, path, body in (("PUT", "/api/v1/mode", {"mode": "dry_run"}), ("POST", "/api/v1/breaker/reset", {"why": "x"}),
                               ("PUT", "/api/v1/pins/gpu/gpu000/gpu0", {"state": "failed", "note": "x"}),
                               ("DELETE", "/api/v1/pins/gpu/gpu000/gpu0", None)):
        r = http.request(method, path, json=body)
        assert r.status_code == 401 and "Bearer" in r.json()["detail"], (method, path)
        assert r.headers["www-authenticate"] == "Bearer"
        r = http.request(method, path, json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "not accepted" in r.json()["detail"]
    assert http.get("/api/v1/summary").json()["pins"] == 0


def test_mode_breaker_and_pin_round_trip(http, runner, auth):
    assert http.put("/api/v1/mode", json={"mode": "dry_run"}, headers=auth).json()["mode"] == "dry_run"
    assert runner.controller.mode == "dry_run"
    assert http.put("/api/v1/mode", json={"mode": "sometimes"}, headers=auth).status_code == 422
    assert http.put("/api/v1/mode", json={"mode": "enforce"}, headers=auth).json()["mode"] == "enforce"
    assert http.post("/api/v1/breaker/reset", json={}, headers=auth).status_code == 422  # a reset says why
    br = http.post("/api/v1/breaker/reset", json={"why": "storm understood"}, headers=auth).json()
    assert br["tripped"] is False and runner.controller.breaker.tripped is False
    fs = http.get("/api/v1/failsafe").json()
    reset = [e for e in fs["events"] if e["event"] == "breaker_reset"]
    assert reset and "storm understood" in reset[-1]["detail"] and reset[-1]["by"]
    # nodes that died with their cooling loop are dark: their rack or loop is frozen, or (where the
    # twin serves their last values again) each such node as a stale exporter, never the fleet
    assert all(f["scope"].startswith(("rack:", "cooling_loop:", "stale:gpu:")) for f in fs["frozen"]), fs["frozen"]
    gpu = "gpu001/gpu4"
    r = http.put(f"/api/v1/pins/gpu/{gpu}", json={"state": "quarantine", "note": "thermal paste check"}, headers=auth)
    assert r.status_code == 200 and r.json()["entity"] == gpu
    assert http.put("/api/v1/pins/node/gpu001", json={"state": "failed", "note": "x"}, headers=auth).status_code == 422
    assert http.put("/api/v1/pins/gpu/gpu999/gpu0", json={"state": "failed", "note": "x"}, headers=auth).status_code == 404
    runner.advance(1)
    d = http.get(f"/api/v1/entities/gpu/{gpu}").json()
    assert d["entity"]["state"] == "quarantine" and d["entity"]["pinned"]
    assert "thermal paste check" in d["why"] and d["pin"]["note"] == "thermal paste check"
    assert "operator_pin" in d["history"][0]["reasons"][0]["channel"]
    assert http.delete(f"/api/v1/pins/gpu/{gpu}", headers=auth).status_code == 200
    assert http.delete(f"/api/v1/pins/gpu/{gpu}", headers=auth).status_code == 404
    assert http.get("/api/v1/pins").json() == []


def test_snapshots_are_immutable_across_ticks(runner):
    before = runner.snapshot()
    copies = {k: (v.state.copy(), v.gfs.copy()) for k, v in before.kinds.items()}
    adm = before.assessment.admissible.copy()
    runner.advance(3)
    after = runner.snapshot()
    assert after.tick == before.tick + 3
    for k, (st, g) in copies.items():
        assert np.array_equal(before.kinds[k].state, st) and np.array_equal(before.kinds[k].gfs, g, equal_nan=True)
    assert np.array_equal(before.assessment.admissible, adm)


def test_healthz_and_dashboard_assets(http):
    h = http.get("/healthz").json()
    assert h["status"] == "ok" and h["controller_running"]
    page = http.get("/")
    assert page.status_code == 200 and "fleetmap" in page.text
    for asset in ("/static/app.js", "/static/style.css"):
        assert http.get(asset).status_code == 200
    spec = http.get("/openapi.json").json()
    assert "/api/v1/entities/{kind}/{name}" in spec["paths"] and "HTTPBearer" in spec["components"]["securitySchemes"]


def test_healthz_fails_when_the_controller_loop_died(tmp_path):
    """A dead controller thread is a failed /healthz (503), never a cheerful 200."""
    from fastapi.testclient import TestClient

    from seamguard.app.runner import Runner
    from seamguard.app.service.api import create_app
    from seamguard.app.sources import TwinSource

    r = Runner(TwinSource(gpus=64, minutes=2.0, seed=0, counterfactual=False), speed=1000.0,
               ledger_path=tmp_path / "l.sqlite")
    client = TestClient(create_app(r, "t0ken"), base_url="http://127.0.0.1")  # a Host the service answers
    r.start()
    try:
        assert client.get("/healthz").status_code == 200

        def boom(snap):
            raise MemoryError("simulated")

        r._publish = boom  # the next tick dies outside the controller's own per-tick guard
        deadline = time.monotonic() + 10
        while not r.fatal and time.monotonic() < deadline:
            time.sleep(0.01)
        h = client.get("/healthz")
        assert h.status_code == 503 and h.json()["status"] == "failed" and "MemoryError" in h.json()["error"]
    finally:
        r.stop()
