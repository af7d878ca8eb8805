"""Decision tables for the routers (pure: injected clock, no I/O) and the vLLM /metrics parser."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from seamguard.gateway.routing import (ROUTERS, Instance, LeastOutstanding, Outcome, RoundRobin, SeamguardOptions,
                                       SeamguardRouter, Shed, make_router, parse_vllm_metrics)
from seamguard.gateway.routing_feeds import fetch_fabric_states

P = [Instance("p0", "http://p0", "prefill", "h0"), Instance("p1", "http://p1", "prefill", "h1")]
D = [Instance("d0", "http://d0", "decode", "h2/rail0"), Instance("d1", "http://d1", "decode", "h3/rail1")]
FAST, SLOW = 0.03, 2.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def pair(r) -> tuple[str, str]:
    return (r.prefill.name, r.decode.name)


def serve(router, clock, n, dft_of, cls="interactive", step_s=0.1, hold=False):
    """n requests one after another; each path's transfer takes dft_of(path). Routes returned."""
    out = []
    for _ in range(n):
        clock.t += step_s
        r = router.route(cls, 200)
        out.append(r)
        if not hold:
            d = dft_of(pair(r))
            router.first_token(r, d)
            router.finished(r, Outcome(True, ttft_s=d + 0.05, tpot_s=0.02, decode_first_token_s=d, output_tokens=10))
    return out


def sg(**opts) -> tuple[SeamguardRouter, Clock]:
    c = Clock()
    return SeamguardRouter(P + D, SeamguardOptions(**opts), clock=c), c


# ---- baselines -------------------------------------------------------------------------------

def test_round_robin_cycles_each_role_and_rejects_bad_pools():
    rr = RoundRobin(P + D)
    assert [pair(rr.route("interactive", 1)) for _ in range(3)] == [("p0", "d0"), ("p1", "d1"), ("p0", "d0")]
    with pytest.raises(ValueError):
        RoundRobin(P)
    with pytest.raises(ValueError):
        RoundRobin(P + [Instance("u", "http://u", "unified")])


def test_least_outstanding_counts_in_flight_and_breaks_ties_in_turn():
    lo = LeastOutstanding(P + D)
    a = lo.route("interactive", 1)
    b = lo.route("interactive", 1)
    assert {pair(a), pair(b)} == {("p0", "d0"), ("p1", "d1")} or len({a.prefill.name, b.prefill.name}) == 2
    lo.finished(a, Outcome(True))
    c = lo.route("interactive", 1)
    assert pair(c) == pair(a)  # the freed instances are the least busy
    assert lo.outstanding(a.decode.name) == 1 and lo.outstanding(b.decode.name) == 1
    lo.finished(a, Outcome(True))  # a route already finished changes nothing
    assert lo.outstanding(b.decode.name) == 1


def test_registry_and_factory():
    assert set(ROUTERS) == {"round_robin", "least_outstanding", "seamguard"}
    assert isinstance(make_router("seamguard", P + D, peer_ratio=4.0), SeamguardRouter)
    assert make_router("seamguard", P + D, peer_ratio=4.0).options.peer_ratio == 4.0
    assert isinstance(make_router("least_outstanding", P + D, peer_ratio=4.0), LeastOutstanding)
    with pytest.raises(ValueError, match="unknown router"):
        make_router("fastest", P + D)
    with pytest.raises(TypeError):
        make_router("seamguard", P + D, no_such_option=1)


# ---- seamguard: measured paths ---------------------------------------------------------------

def test_healthy_paths_use_every_pair_with_no_reason():
    r, c = sg()
    routes = serve(r, c, 40, lambda p: FAST)
    assert {pair(x) for x in routes} == {(p.name, d.name) for p in P for d in D}
    assert all(x.reason == "" and x.evidence == {} for x in routes)


@pytest.mark.parametrize("cls, slow_path_used", [("interactive", False), ("batch", False)])
def test_slow_path_is_out_for_interactive_and_last_resort_for_batch(cls, slow_path_used):
    r, c = sg()
    serve(r, c, 24, lambda p: SLOW if p == ("p0", "d1") else FAST)
    later = serve(r, c, 24, lambda p: SLOW if p == ("p0", "d1") else FAST, cls=cls)
    assert (("p0", "d1") in {pair(x) for x in later}) is slow_path_used
    if cls == "interactive":
        assert all("avoided p0->d1" in x.reason and x.evidence["p0->d1.latency_s"] == SLOW for x in later)
    snap = {(x["prefill"], x["decode"]): x for x in r.snapshot()["paths"]}
    assert snap[("p0", "d1")]["admissible"] == {"interactive": False, "batch": True}
    assert snap[("p0", "d1")]["latency_s"] == SLOW and snap[("p1", "d0")]["admissible"]["interactive"]


def test_batch_takes_a_slow_path_within_its_budget_when_nothing_fine_for_everyone_is_left():
    r, c = sg()
    serve(r, c, 24, lambda p: SLOW if p == ("p0", "d1") else FAST)
    r.update_fabric({"h1": "degraded", "h2/rail0": "degraded"})  # every other path out for interactive
    used = {pair(x) for x in serve(r, c, 12, lambda p: SLOW if p == ("p0", "d1") else FAST, cls="batch")}
    assert ("p0", "d1") in used


def test_slow_path_excess_must_matter_against_the_budget():
    """3x slower but the excess is tiny next to the TTFT budget: not a reason to avoid it."""
    r, c = sg()
    routes = serve(r, c, 60, lambda p: 0.09 if p == ("p0", "d1") else 0.02)
    assert ("p0", "d1") in {pair(x) for x in routes[-20:]}


def test_jitter_counts_the_upper_quantile_not_the_median():
    r, c = sg()
    n = [0]

    def dft(p):
        n[0] += 1
        return (SLOW if n[0] % 3 == 0 else FAST) if p == ("p1", "d0") else FAST

    routes = serve(r, c, 80, dft)
    late = [x for x in routes[-20:]]
    assert ("p1", "d0") not in {pair(x) for x in late}
    assert any("p1->d0" in x.reason and x.evidence.get("p1->d0.latency_s", 0) > 1.0 for x in late)


def test_a_stalled_transfer_is_seen_before_it_ends():
    r, c = sg()
    serve(r, c, 16, lambda p: FAST)
    c.t += 0.1
    stuck = None
    while stuck is None:  # route until p0->d1 is chosen, and leave it pending
        x = r.route("interactive", 200)
        if pair(x) == ("p0", "d1"):
            stuck = x
        else:
            r.first_token(x, FAST)
            r.finished(x, Outcome(True, 0.1, 0.02, FAST, 5))
    c.t += 1.0  # no first token after a second, when peers take 0.03 s
    after = serve(r, c, 8, lambda p: FAST)
    assert ("p0", "d1") not in {pair(x) for x in after}
    assert "pending" in after[0].reason and after[0].evidence["p0->d1.oldest_pending_s"] >= 1.0


def test_probe_with_batch_then_recovery():
    r, c = sg(probe_after_s=5.0)
    serve(r, c, 24, lambda p: 5.0 if p == ("p0", "d1") else FAST)  # out for batch too (10 s budget)
    c.t += 6.0
    probe = r.route("batch", 200)
    assert pair(probe) == ("p0", "d1") and probe.reason.startswith("probe")
    r.first_token(probe, FAST)
    r.finished(probe, Outcome(True, 0.1, 0.02, FAST, 5))
    # the link is healthy again: probes bring its quantile down, then interactive work returns
    for _ in range(10):
        c.t += 6.0
        x = r.route("batch", 200)
        r.first_token(x, FAST)
        r.finished(x, Outcome(True, 0.1, 0.02, FAST, 5))
    assert ("p0", "d1") in {pair(x) for x in serve(r, c, 20, lambda p: FAST)}


def test_old_evidence_is_forgotten():
    r, c = sg(forget_after_s=30.0, probe_after_s=1e9)
    serve(r, c, 24, lambda p: SLOW if p == ("p0", "d1") else FAST)
    c.t += 31.0
    assert ("p0", "d1") in {pair(x) for x in serve(r, c, 8, lambda p: FAST, hold=True)}


def test_a_decode_instance_with_slow_tokens_is_out_until_a_probe_is_in_line():
    r, c = sg(probe_after_s=5.0)
    for _ in range(40):
        c.t += 0.1
        x = r.route("batch", 200)
        r.first_token(x, FAST)
        tpot = 0.5 if x.decode.name == "d1" else 0.02  # d1's steps stall: 2 tokens/s
        r.finished(x, Outcome(True, 0.1, tpot, FAST, 20))
    later = serve(r, c, 10, lambda p: FAST, cls="interactive")
    assert {pair(x)[1] for x in later} == {"d0"}
    assert "decode d1 TPOT p90 0.500s" in later[0].reason and later[0].evidence["p0->d1.decode_tpot_s"] == 0.5
    c.t += 6.0
    probe = r.route("batch", 200)
    assert probe.decode.name == "d1" and probe.reason.startswith("probe")
    r.first_token(probe, FAST)
    r.finished(probe, Outcome(True, 0.1, 0.02, FAST, 20))
    assert "d1" in {pair(x)[1] for x in serve(r, c, 10, lambda p: FAST)}


def test_failed_requests_are_slow_samples():
    r, c = sg()
    for _ in range(40):
        c.t += 0.1
        x = r.route("interactive", 200)
        if pair(x) == ("p1", "d1"):
            c.t += 3.0
            r.finished(x, Outcome(False))
        else:
            r.first_token(x, FAST)
            r.finished(x, Outcome(True, 0.1, 0.02, FAST, 5))
    assert ("p1", "d1") not in {pair(x) for x in serve(r, c, 8, lambda p: FAST)}


# ---- seamguard: control plane, load, shedding ------------------------------------------------

@pytest.mark.parametrize("states, cls, excluded", [
    ({"h3/rail1": "degraded"}, "interactive", {("p0", "d1"), ("p1", "d1")}),
    ({"h3/rail1": "degraded"}, "batch", {("p0", "d1"), ("p1", "d1")}),  # admissible, but the last resort
    ({"h3/rail1~leaf1": "harmful"}, "batch", {("p0", "d1"), ("p1", "d1")}),  # the NIC's link
    ({"h0/mlx5_1": "failed"}, "interactive", {("p0", "d0"), ("p0", "d1")}),  # any NIC of prefill host h0
    ({"h2/rail0": "healthy", "other/nic": "failed"}, "interactive", set()),
])
def test_control_plane_states_make_paths_inadmissible_per_class(states, cls, excluded):
    r, c = sg()
    r.update_fabric(states)
    used = {pair(x) for x in serve(r, c, 24, lambda p: FAST, cls=cls)}
    assert used == {(p.name, d.name) for p in P for d in D} - excluded


def test_control_plane_reason_names_the_nic():
    r, c = sg()
    r.update_fabric({"h3/rail1": "degraded"})
    x = r.route("interactive", 100)
    assert "control plane: h3/rail1=degraded" in x.reason and x.evidence["p0->d1.severity"] == 1.0


def test_batch_is_shed_when_no_path_is_admissible_and_interactive_takes_the_least_bad():
    r, c = sg()
    r.update_fabric({"h2/rail0": "failed", "h3/rail1": "degraded"})
    x = r.route("interactive", 100)
    assert pair(x)[1] == "d1" and x.reason.startswith("no admissible path")
    r.update_fabric({"h2/rail0": "failed", "h3/rail1": "failed"})
    with pytest.raises(Shed) as e:
        r.route("batch", 100)
    assert e.value.retry_after_s > 0 and "no path admissible" in e.value.reason
    assert r.decisions["shed_no_path"] == 1


def test_batch_is_deferred_while_interactive_ttft_nears_its_budget_and_a_path_is_out():
    r, c = sg(defer_share=0.6)
    r.update_fabric({"h3/rail1": "degraded"})
    for _ in range(8):  # interactive TTFTs at 0.7 of a 1 s budget
        c.t += 0.1
        x = r.route("interactive", 100)
        r.first_token(x, FAST)
        r.finished(x, Outcome(True, ttft_s=0.7, tpot_s=0.02, decode_first_token_s=FAST, output_tokens=5))
    with pytest.raises(Shed, match="deferred"):
        r.route("batch", 100)
    outcomes = []  # never starved: at most defer_max_share of recent batch requests deferred
    for _ in range(20):
        try:
            r.route("batch", 100)
            outcomes.append(False)
        except Shed:
            outcomes.append(True)
    assert 0.3 <= sum(outcomes) / len(outcomes) <= 0.6
    r.update_fabric({})  # nothing out: batch flows again even with slow interactive TTFTs
    assert r.route("batch", 100).decode is not None


def test_queue_depth_and_kv_pressure_steer_work():
    r, c = sg()
    r.update_load("d0", waiting=5, kv_usage=0.2)
    assert {pair(x)[1] for x in serve(r, c, 6, lambda p: FAST)} == {"d1"}
    r.update_load("d0", waiting=0, kv_usage=0.2)
    r.update_load("d1", waiting=0, kv_usage=0.97)
    assert {pair(x)[1] for x in serve(r, c, 6, lambda p: FAST)} == {"d0"}
    c.t += 60.0  # stale load is ignored
    assert {pair(x)[1] for x in serve(r, c, 6, lambda p: FAST)} == {"d0", "d1"}


def test_unified_instances_are_routed_by_load():
    u = [Instance("u0", "http://u0"), Instance("u1", "http://u1")]
    c = Clock()
    r = SeamguardRouter(u, clock=c)
    r.update_load("u0", waiting=3)
    x = r.route("interactive", 10)
    assert x.prefill is None and x.decode.name == "u1"


# ---- inputs --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ('# HELP x\nvllm:num_requests_waiting{model_name="m"} 3\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n',
     {"waiting": 3.0, "kv_usage": 0.5}),
    ('vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} 2\n'
     'vllm:gpu_cache_usage_perc{engine="0"} 0.25\nvllm:gpu_cache_usage_perc{engine="1"} 0.75\n',
     {"waiting": 3.0, "kv_usage": 0.75}),  # V0 name; engines summed (waiting) and maxed (usage)
    ("vllm:kv_cache_usage_perc 0.1\nvllm:gpu_cache_usage_perc 0.9\n", {"kv_usage": 0.1}),  # V1 name first
    ("vllm:num_requests_waiting NaN\ngarbage line\n", {}),
    ("tgi_queue_size 4\nvllm:num_requests_waiting NaN\n", {"waiting": 4.0}),  # a NaN series is not there
])
def test_parse_vllm_metrics(text, expected):
    assert parse_vllm_metrics(text) == expected


def test_fetch_fabric_states_pages_through_nics_and_links():
    items = {"nic": [{"name": f"n{i}/mlx5_0", "state": "degraded"} for i in range(3)],
             "link": [{"name": "n9/mlx5_1~leaf1", "state": "failed"}]}
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        q = req.url.params
        seen.append(q)
        assert q.get_list("state") == ["degraded", "checkpoint_unsafe", "quarantine", "harmful", "failed"]
        rows, off, lim = items[q["kind"]], int(q["offset"]), int(q["limit"])
        return httpx.Response(200, json={"total": len(rows), "limit": lim, "offset": off,
                                         "items": rows[off:off + lim]})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await fetch_fabric_states(client, "http://ctl:8080/", page=2)

    got = asyncio.run(go())
    assert got == {"n0/mlx5_0": "degraded", "n1/mlx5_0": "degraded", "n2/mlx5_0": "degraded",
                   "n9/mlx5_1~leaf1": "failed"}
    assert [(q["kind"], q["offset"]) for q in seen] == [("nic", "0"), ("nic", "2"), ("link", "0")]


def test_one_slow_transfer_on_a_path_that_just_turned_slow_takes_it_out_until_a_sample_is_back_in_line():
    """The first slow transfer after a path degrades is evidence enough for interactive work (a
    tenth of the window would otherwise have to be slow first); the next sample in line ends it."""
    r, c = sg(probe_after_s=5.0)
    serve(r, c, 24, lambda p: FAST)
    slow = [True]

    def dft(p):
        if p == ("p0", "d1") and slow[0]:
            slow[0] = False
            return 0.8   # one transfer at 0.8 s: within a 1 s budget, 27x its peers
        return FAST

    routes = serve(r, c, 12, dft)
    hit = next(i for i, x in enumerate(routes) if pair(x) == ("p0", "d1"))
    after = routes[hit + 1:]
    assert after and ("p0", "d1") not in {pair(x) for x in after}
    assert "latest transfer 0.800s" in after[0].reason
    c.t += 6.0   # idle for probe_after_s: out for interactive only, it is probed with batch
    probe = r.route("batch", 200)
    assert pair(probe) == ("p0", "d1") and probe.reason.startswith("probe")
    r.first_token(probe, FAST)
    r.finished(probe, Outcome(True, 0.1, 0.02, FAST, 5))   # a sample back in line ...
    assert ("p0", "d1") in {pair(x) for x in serve(r, c, 12, lambda p: FAST)}   # ... brings interactive back

