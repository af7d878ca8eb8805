"""The seamguard router's two adaptations besides re-routing: KV placement (which rail a transfer
takes) and shrinking a decode instance's batch (a cap on requests in flight there); and how both
show in Route.reason/evidence, the snapshot, /metrics and the dashboard. Pure: injected clock."""

from __future__ import annotations

import json

import pytest

from seamguard.gateway.config import GatewayConfigError, parse_gateway_config
from seamguard.gateway.dashboard import plain, render_dashboard
from seamguard.gateway.metrics import GatewayMetrics
from seamguard.gateway.routing import (
    Instance,
    Outcome,
    SeamguardOptions,
    SeamguardRouter,
    Shed,
    place_kv,
)
from seamguard.testbed.inference_pool import SHAPES, Engine, PoolTiming
from tests.gateway.routing_helpers import FAST, Clock, finish, hold

RAILS = 2


def rails(host: str) -> tuple[str, ...]:
    return tuple(f"{host}/rail{k}" for k in range(RAILS))


P = [Instance("p0", "http://p0", "prefill", "h0", rails("h0")), Instance("p1", "http://p1", "prefill", "h1", rails("h1"))]
D = [Instance("d0", "http://d0", "decode", "h2/rail0", rails("h2"), home_rail=0),
     Instance("d1", "http://d1", "decode", "h3/rail1", rails("h3"), home_rail=1)]
SLOW = 2.0


def key(r) -> tuple[str, str, int | None]:
    return (r.prefill.name, r.decode.name, r.kv_rail)


def sg(instances=P + D, **opts) -> tuple[SeamguardRouter, Clock]:
    c = Clock()
    return SeamguardRouter(instances, SeamguardOptions(**opts), clock=c), c


def serve(router, clock, n, dft_of, cls="interactive", tpot_of=lambda k: 0.02, step_s=0.1):
    out = []
    for _ in range(n):
        clock.t += step_s
        r = router.route(cls, 200)
        out.append(r)
        d = dft_of(key(r))
        router.first_token(r, d)
        router.finished(r, Outcome(True, ttft_s=d + 0.05, tpot_s=tpot_of(key(r)), decode_first_token_s=d,
                                   output_tokens=10))
    return out


# ---- KV placement ------------------------------------------------------------------------------

def test_place_kv_narrows_remote_hosts_to_the_chosen_rail():
    kv = {"remote_host": "10.0.0.1", "remote_hosts": ["10.0.0.1", "10.0.1.1", "10.0.2.1"], "transfer_id": "t"}
    assert place_kv(kv, 2) == {"remote_host": "10.0.2.1", "remote_hosts": ["10.0.2.1"], "transfer_id": "t"}
    assert place_kv(kv, None) is kv and place_kv(kv, 3) is kv and place_kv({"remote_host": "a"}, 0) == {"remote_host": "a"}


def test_healthy_transfers_stay_on_the_decode_instances_home_rail_without_a_reason():
    r, c = sg()
    routes = serve(r, c, 40, lambda k: FAST)
    assert {key(x) for x in routes} == {(p.name, d.name, d.home_rail) for p in P for d in D}
    assert all(x.reason == "" for x in routes)


def test_a_slow_rail_moves_the_pairs_kv_to_another_rail_instead_of_dropping_the_pair():
    r, c = sg()
    slow = lambda k: SLOW if k == ("p0", "d1", 1) else FAST  # noqa: E731  p0's rail1 NIC is gray
    serve(r, c, 24, slow)
    later = serve(r, c, 24, slow)
    pairs = [(x.prefill.name, x.decode.name, x.kv_rail) for x in later]
    assert ("p0", "d1", 1) not in pairs and ("p0", "d1", 0) in pairs  # the pair is kept, its KV on rail 0
    moved = [x for x in later if key(x) == ("p0", "d1", 0)]
    assert all("KV moved from rail 1 to rail 0" in x.reason and "avoided p0->d1/r1" in x.reason for x in moved)
    assert all(x.evidence["kv_rail"] == 0 and x.evidence["p0->d1/r1.latency_s"] == SLOW for x in moved)
    assert r.decisions["kv_rail"] >= len(moved) > 0  # the first moves came in the first 24 already
    snap = {(p["prefill"], p["decode"], p["rail"]): p for p in r.snapshot()["paths"]}
    assert snap[("p0", "d1", 1)]["admissible"]["interactive"] is False and snap[("p0", "d1", 1)]["home"]
    assert snap[("p0", "d1", 0)]["admissible"]["interactive"] and not snap[("p0", "d1", 0)]["home"]


def test_control_plane_state_of_one_rail_nic_blocks_that_rail_only_and_a_host_state_all():
    r, c = sg()
    r.update_fabric({"h0/rail1": "degraded"})
    got = {key(x) for x in serve(r, c, 40, lambda k: FAST)}
    assert ("p0", "d1", 1) not in got and ("p0", "d1", 0) in got and ("p1", "d1", 1) in got
    r.update_fabric({"h0": "degraded"})  # the whole prefill host
    got = {key(x) for x in serve(r, c, 40, lambda k: FAST)}
    assert not any(k[0] == "p0" for k in got)


def test_instances_without_rails_keep_one_path_per_pair_and_mismatched_rails_are_refused():
    plain_p = [Instance(i.name, i.url, i.role, i.nic) for i in P]
    plain_d = [Instance(i.name, i.url, i.role, i.nic) for i in D]
    r, c = sg(plain_p + plain_d)
    assert all(x.kv_rail is None for x in serve(r, c, 8, lambda k: FAST))
    with pytest.raises(ValueError, match="rails"):
        SeamguardRouter(P + [Instance("d2", "http://d2", "decode", None, rails("h4") + ("h4/rail2",))])
    with pytest.raises(ValueError, match="home_rail"):
        SeamguardRouter(P + [Instance("d2", "http://d2", "decode", None, rails("h4"), home_rail=2)])


def test_gateway_config_carries_rails_and_names_a_mismatch():
    base = {"version": 1, "router": "seamguard", "tenants": [{"name": "t", "keys": [{"name": "k", "key": "sk-123456789"}]}]}
    inst = [{"name": "p0", "url": "http://p0", "role": "prefill", "rails": ["h0/rail0", "h0/rail1"]},
            {"name": "d0", "url": "http://d0", "role": "decode", "rails": ["h2/rail0", "h2/rail1"], "home_rail": 1}]
    cfg = parse_gateway_config({**base, "instances": inst}, "gw.yaml")
    assert cfg.instance_list()[1].rails == ("h2/rail0", "h2/rail1") and cfg.instance_list()[1].home_rail == 1
    inst[1]["rails"] = ["h2/rail0"]
    with pytest.raises(GatewayConfigError, match="gw.yaml: router: .*rails"):
        parse_gateway_config({**base, "instances": inst}, "gw.yaml")


def test_emulated_decode_pulls_over_its_home_rail_unless_the_gateway_narrows_the_hosts():
    e = Engine("d1", "decode", SHAPES["qwen2.5-0.5b"], PoolTiming(), [], 0, ["10.9.1.4", "10.9.0.4"])
    kv = {"remote_host": "10.9.0.1", "remote_hosts": ["10.9.0.1", "10.9.1.1"]}
    assert e.kv_route(kv) == ("10.9.1.1", "10.9.1.4")  # home rail (1) first
    assert e.kv_route(place_kv(kv, 0)) == ("10.9.0.1", "10.9.0.4")


# ---- shrinking a decode instance's batch -------------------------------------------------------

def test_slow_tokens_shrink_the_decode_batch_then_it_grows_back_and_is_lifted():
    r, c = sg(tpot_budget_s={"interactive": 0.1, "batch": 0.25})  # target 0.8 x 0.1 = 0.08 s
    flights = hold(r, c, 16)
    on_d0 = [x for x in flights if x.decode.name == "d0"]
    assert len(on_d0) == 8 and r.batch_cap("d0") is None
    finish(r, on_d0[0], 0.09)  # over the target: cap = floor(0.75 x 8 in flight)
    assert r.batch_cap("d0") == 6
    # d0 now has 7 in flight, over its cap of 6: new work goes to d1 and says why
    nxt = hold(r, c, 4)
    assert all(x.decode.name == "d1" for x in nxt)
    assert all("batch shrunk on d0 (cap 6)" in x.reason and x.evidence["d0.batch_cap"] == 6.0 for x in nxt)
    assert r.decisions["batch_cap"] == 4
    snap = r.snapshot()
    assert snap["instances"]["d0"]["batch_cap"] == 6 and snap["recent"][-1]["kind"] == "batch_cap"
    # no second cut within the same window of samples; then good tokens raise the cap one by one
    for x in on_d0[1:4]:
        finish(r, x, 0.09)
    assert r.batch_cap("d0") == 6
    for x, cap in zip(on_d0[4:7], (7, 8, None)):  # +1 per good sample; past the 8 it started from: lifted
        finish(r, x, 0.02)
        assert r.batch_cap("d0") == cap


def test_batch_is_deferred_and_interactive_goes_over_when_every_decode_is_at_its_cap():
    r, c = sg(tpot_budget_s={"interactive": 0.1, "batch": 0.25}, batch_cap_min=2)
    flights = hold(r, c, 8)
    for d in ("d0", "d1"):
        finish(r, next(x for x in flights if x.decode.name == d), 0.2)
    assert r.batch_cap("d0") == 3 and r.batch_cap("d1") == 3
    with pytest.raises(Shed, match="batch cap") as e:
        r.route("batch", 100)
    assert e.value.evidence == {"d0.batch_cap": 3.0, "d1.batch_cap": 3.0}
    x = r.route("interactive", 100)
    assert "batch shrunk on d0 (cap 3), d1 (cap 3)" in x.reason


# ---- visible: /metrics and the dashboard -----------------------------------------------------

def test_rails_caps_and_departures_in_metrics_admin_json_and_dashboard():
    r, c = sg(tpot_budget_s={"interactive": 0.1, "batch": 0.25})
    slow = lambda k: SLOW if k == ("p0", "d1", 1) else FAST  # noqa: E731
    serve(r, c, 48, slow)
    flights = hold(r, c, 8)
    finish(r, next(x for x in flights if x.decode.name == "d0"), 0.3)
    m = GatewayMetrics(r).render().decode()
    assert 'seamguard_gateway_route_path_admissible{decode="d1",prefill="p0",rail="1",request_class="interactive"} 0.0' in m
    assert 'seamguard_gateway_route_path_admissible{decode="d1",prefill="p0",rail="0",request_class="interactive"} 1.0' in m
    assert 'seamguard_gateway_route_instance_load{instance="d0",kind="batch_cap"}' in m
    assert 'seamguard_gateway_route_decisions_total{kind="kv_rail"}' in m
    snap = r.snapshot()
    json.dumps(plain(snap), allow_nan=False)  # strict JSON for /admin/routing
    page = render_dashboard(snap)
    assert "KV moved from rail 1 to rail 0" in page and "p0-&gt;d1/r1" in page and "kv_rail" in page
    assert "transfer p90 2.000s" in page  # why p0->d1/r1 is not admissible
    assert "This router keeps no evidence" in render_dashboard(None)


def test_gateway_places_kv_on_the_router_rail_and_serves_routing_json_and_dashboard(gateway_factory, tmp_path):
    """Through the HTTP gateway: the decode instance receives remote_hosts narrowed to the rail the
    router chose (h0's rail1 NIC is degraded in the control plane), and the departure is in
    /admin/routing, /dashboard and /metrics."""
    import httpx
    import openai

    from seamguard.gateway.config import register_router
    from seamguard.gateway.routing import ROUTERS
    from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
    from tests.gateway.conftest import ADMIN, KEY_A, base_config

    def degraded_rail1(instances, clock=None, **options):
        r = SeamguardRouter(instances, SeamguardOptions(**options))
        r.update_fabric({"h0/rail1": "degraded"})
        return r

    register_router("rail-test", degraded_rail1)
    pb = FakeBackend(name="p0", kv_hosts=["10.7.0.1", "10.7.1.1"])
    db = FakeBackend(name="d0")
    try:
        with ThreadedServer(pb.app()) as ps, ThreadedServer(db.app()) as ds:
            cfg = base_config(ps.url, {"type": "sqlite", "path": str(tmp_path / "gw.db")}, router="rail-test",
                              instances=[{"name": "p0", "url": ps.url, "role": "prefill", "rails": list(rails("h0"))},
                                         {"name": "d0", "url": ds.url, "role": "decode", "rails": list(rails("h2")),
                                          "home_rail": 1}])
            url, _ = gateway_factory(cfg)
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0)
            raw = client.chat.completions.with_raw_response.create(model="fake-model", max_tokens=3, stream=True,
                                                                   messages=[{"role": "user", "content": "hi"}])
            assert raw.headers["x-seamguard-route"] == "p0->d0/r0"  # the rail the KV took, not d0's home rail
            list(raw.parse())
            kv = db.seen[-1]["kv_transfer_params"]
            assert kv["remote_hosts"] == ["10.7.0.1"] and kv["remote_host"] == "10.7.0.1"
            whole = httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_A}"},
                               json={"model": "fake-model", "max_tokens": 2,
                                     "messages": [{"role": "user", "content": "hi"}]})
            assert whole.status_code == 200 and whole.headers["x-seamguard-route"] == "p0->d0/r0"
            routing = httpx.get(url + "/admin/routing", headers=ADMIN).json()
            assert routing["router"] == "rail-test"
            last = routing["snapshot"]["recent"][-1]
            assert last["kind"] == "kv_rail" and last["path"] == "p0->d0/r0"
            assert "KV moved from rail 1 to rail 0" in last["reason"] and "control plane: h0/rail1=degraded" in last["reason"]
            page = httpx.get(url + "/dashboard", headers=ADMIN)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "KV moved from rail 1 to rail 0" in page.text and "h0/rail1" in page.text
            assert 'seamguard_gateway_route_decisions_total{kind="kv_rail"} 2.0' in httpx.get(url + "/metrics", headers=ADMIN).text
    finally:
        ROUTERS.pop("rail-test")


def test_a_prefilled_request_no_longer_loads_its_prefill_instance():
    """A request whose KV waits for its pull (e.g. on a crawling path) holds KV on the prefill
    instance, not its GPU: once prefilled it no longer counts against the prefill's load."""
    plain_p = [Instance(i.name, i.url, i.role, i.nic) for i in P]
    r, c = sg(plain_p + D)
    first = hold(r, c, 2)  # one on each prefill instance
    stuck = next(x for x in first if x.prefill.name == "p0")
    other = next(x for x in first if x.prefill.name == "p1")
    r.prefilled(stuck)
    nxt = hold(r, c, 1)[0]
    assert nxt.prefill.name == "p0"  # p0's GPU is free; p1 still prefills `other`
    r.prefilled(stuck)  # twice changes nothing
    r.finished(stuck, Outcome(True))
    r.finished(other, Outcome(True))  # never reported prefilled: released when it finishes
    r.finished(nxt, Outcome(True))
    assert r._in_prefill == {"p0": 0, "p1": 0}


@pytest.mark.parametrize("text, expected", [
    ('sglang:num_queue_reqs{model_name="m",tp_rank="0"} 4\nsglang:num_queue_reqs{model_name="m",tp_rank="1"} 3\n'
     'sglang:token_usage{model_name="m"} 0.52\nsglang:num_running_reqs{model_name="m"} 8\n',
     {"waiting": 7.0, "kv_usage": 0.52}),
    ("# TYPE tgi_queue_size gauge\ntgi_queue_size 5\ntgi_batch_current_size 12\n", {"waiting": 5.0}),
])
def test_sglang_and_tgi_metrics_feed_the_router(text, expected):
    from seamguard.gateway.routing import parse_vllm_metrics

    assert parse_vllm_metrics(text) == expected


def test_with_prefilled_reported_a_stall_is_timed_from_the_transfer_not_from_prefill_queueing():
    """A burst or a busy machine slows prefill for every path; only a transfer that has started
    and not produced its first token is evidence against its path."""
    plain_p = [Instance(i.name, i.url, i.role, i.nic) for i in P]
    plain_d = [Instance(i.name, i.url, i.role, i.nic) for i in D]
    r, c = sg(plain_p + plain_d)
    for x in hold(r, c, 16):  # history: 50 ms from prefilled to first token on every path
        r.prefilled(x)
        c.t += 0.05
        r.first_token(x, 0.05)
        r.finished(x, Outcome(True, ttft_s=0.1, tpot_s=0.02, decode_first_token_s=0.05, output_tokens=10))
    queued = hold(r, c, 4)  # one per path, all stuck in prefill for 3 s (a burst, a busy host)
    c.t += 3.0
    assert all(p["admissible"]["interactive"] for p in r.snapshot()["paths"])
    on_p0d1 = next(x for x in queued if (x.prefill.name, x.decode.name) == ("p0", "d1"))
    for x in queued:
        r.prefilled(x)
    c.t += 0.2  # the others' transfers are as fast as ever; p0->d1's has not produced a token
    for x in queued:
        if x is not on_p0d1:
            r.first_token(x, 0.05)
    c.t += 0.3
    snap = {(p["prefill"], p["decode"]): p for p in r.snapshot()["paths"]}
    assert snap[("p0", "d1")]["admissible"]["interactive"] is False
    assert snap[("p0", "d1")]["why"]["interactive"].startswith("transfer pending 0.500s vs peers' 0.050s")
    assert all(p["admissible"]["interactive"] for k, p in snap.items() if k != ("p0", "d1"))
