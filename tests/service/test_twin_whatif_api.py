"""`GET /api/v1/twin/whatif` on a served controller: the twin calibrated on the service's own ledger.

A 256-GPU twin with its fault scenario, ticked 70 times: the service calibrates on the ledger the
controller wrote and answers per job and per controller variant, compared by default with the mode
and breaker this controller runs. Bad parameters are one-line 400s; a second what-if while one is
computed is a 429; the `Host` rule holds as for every read.
"""

from __future__ import annotations

import threading

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.service.whatif import MAX_VARIANTS, WhatIfService, router
from seamguard.app.sources import TwinSource
from seamguard.ledger import open_reader

URL = "/api/v1/twin/whatif"
AUTH = {"Authorization": "Bearer test-token-0123456789"}


@pytest.fixture(scope="module")
def served():
    r = Runner(TwinSource(gpus=256, minutes=6.0, seed=0, counterfactual=False), speed=0)
    r.advance(70)
    r.start()  # serves the mode switches; speed 0: no tick of its own
    s = Server(r, "test-token-0123456789").start()
    try:
        with httpx.Client(base_url=s.url, timeout=120.0, headers=AUTH) as c:
            yield c, r
    finally:
        s.stop()
        r.stop()


def test_answers_per_job_and_variant_against_the_live_policy(served) -> None:
    c, runner = served
    q = {"since": "0", "until": "340", "whatif": ["mode=dry_run", "breaker=0.001,off"], "draws": "2", "seeds": "2"}
    r = c.get(URL, params=q)
    assert r.status_code == 200, r.text
    d = r.json()
    assert (d["since_s"], d["until_s"], d["gpus"]) == (0.0, 340.0, 256)
    assert [j["job"] for j in d["jobs"]] == list(runner.snapshot().fleet.job_names)
    for j in d["jobs"]:
        assert j["interval_s"][0] <= j["interval_s"][1] <= j["interval_s"][2]
    w = d["whatif"]
    assert [v["variant"] for v in w["variants"]] == ["base", "mode=dry_run", "breaker=0.001", "breaker=off"]
    policy, base = runner.controller.policy, w["variants"][0]["settings"]
    assert base["mode"] == runner.snapshot().mode and base["breaker_max_fleet_fraction"] == policy.breaker.max_fleet_fraction
    assert base["breaker_window_s"] == policy.breaker.window_s and base["breaker_min_nodes"] == policy.breaker.min_nodes
    assert w["variants"][1]["settings"]["mode"] == "dry_run" and w["variants"][3]["settings"]["breaker_max_fleet_fraction"] == 1.0
    assert w["samples"]["done"] == 4 and w["incidents_in_window"]["hard"] > 0  # the scenario's faults, from the ledger
    assert d["measured"] and set(d["measured"]).isdisjoint(d["priors_used"])
    assert c.get(URL, params=q).json()["whatif"] == w  # the same window and seed: the same answer


@pytest.mark.parametrize("params,msg", [
    ({"whatif": "mode=maybe"}, "mode must be one of enforce, dry_run, got 'maybe'"),
    ({"whatif": "speed=3"}, "expected KNOB=VALUE"),
    ({"whatif": "breaker=2"}, "breaker_max_fleet_fraction must be in (0, 1]"),
    ({"since": "x"}, "since: 'x' is not a number of seconds"),
    ({"since": "300", "until": "100"}, "since (300) must be before until (100)"),
    ({"draws": "99"}, "draws: 99 is outside 1..8"),
    ({"seeds": "two"}, "seeds: 'two' is not a whole number"),
    ({"budget_s": "100"}, "budget_s: 100 is outside 0.1..30"),
    ({"base": "mode=dry_run"}, "give at least one whatif"),
    ({"whatif": "breaker=" + "0.1," * 60}, "at most 200"),
    ({"whatif": ["breaker=" + ",".join(f"0.0{k}" for k in range(1, 10)), "drain_min_slowdown=0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8"]},
     f"at most {MAX_VARIANTS} per request"),
])
def test_bad_parameters_are_one_line_400s(served, params, msg) -> None:
    c, _ = served
    r = c.get(URL, params=params)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and msg in detail and "\n" not in detail


def test_the_host_rule_holds(served) -> None:
    c, _ = served
    r = c.get(URL, params={"whatif": "mode=dry_run"}, headers={"Host": "rebound.example"})
    assert r.status_code == 400 and "Host" in r.json()["detail"]


def test_a_second_whatif_while_one_runs_is_429(served) -> None:
    _, runner = served
    reader = open_reader(runner.ledger_path)
    svc = WhatIfService(runner, reader)
    app = FastAPI()
    app.include_router(router(svc, "/api/v1", lambda: "operator"))
    computing = threading.Event()
    release = threading.Event()
    slow = svc.compute

    def held(*a, **kw):
        computing.set()
        release.wait(30)
        return slow(*a, **kw)

    svc.compute = held
    try:
        with TestClient(app) as tc:
            first: list = []
            t = threading.Thread(target=lambda: first.append(tc.get(URL, params={"until": "100", "draws": "1",
                                                                                   "seeds": "1"})))
            t.start()
            assert computing.wait(30)
            r = tc.get(URL, params={"until": "100"})
            assert r.status_code == 429 and "already being computed" in r.json()["detail"]
            release.set()
            t.join(60)
            assert first and first[0].status_code == 200, first
    finally:
        release.set()
        reader.close()


def test_the_base_follows_the_mode_the_controller_runs_now(served) -> None:
    c, runner = served
    auth = {"Authorization": "Bearer test-token-0123456789"}
    q = {"until": "100", "whatif": "drain_min_slowdown=0.3", "draws": "1", "seeds": "1"}
    try:
        for mode in ("dry_run", "enforce"):
            assert c.put("/api/v1/mode", json={"mode": mode}, headers=auth).status_code == 200
            variants_ = c.get(URL, params=q).json()["whatif"]["variants"]
            assert [v["settings"]["mode"] for v in variants_] == [mode, mode]
            assert variants_[1]["settings"]["drain_min_slowdown"] == 0.3
    finally:
        c.put("/api/v1/mode", json={"mode": runner.controller.policy.mode}, headers=auth)


def test_a_whatif_needs_the_operator_token(served) -> None:
    c, _ = served
    q = {"until": "100", "whatif": "mode=dry_run", "draws": "1", "seeds": "1"}
    assert c.get(URL, params=q, headers={"Authorization": ""}).status_code == 401
    assert c.get(URL, params=q, headers={"Authorization": "Bearer not-the-token"}).status_code == 401


def test_an_unknown_parameter_is_one_line_400_not_ignored(served) -> None:
    c, _ = served
    r = c.get(URL, params={"until": "100", "whatifs": "mode=dry_run"})
    assert r.status_code == 400 and "unknown query parameter 'whatifs'" in r.json()["detail"]
