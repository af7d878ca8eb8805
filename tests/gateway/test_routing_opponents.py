"""The opponents of benchmarks/inference_routing.py (benchmarks/routing_opponents.py) behave as
the benchmark says they do: power of two choices takes the less loaded of its two picks; a path
ejected by outlier detection gets no traffic for its ejection time and returns after; the
prefix scorer prefers the instance that holds the prompt's prefix, and load when none does."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from seamguard.gateway.routing import ROUTERS, Instance, Outcome, make_router

ROOT = Path(__file__).resolve().parents[2]


def _mod():
    spec = importlib.util.spec_from_file_location("routing_opponents", ROOT / "benchmarks" / "routing_opponents.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    return m


ops = _mod()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def unified(n: int) -> list[Instance]:
    return [Instance(f"u{i}", f"http://u{i}:8000") for i in range(n)]


def disagg(rails: bool) -> list[Instance]:
    r = lambda h: tuple(f"h{h}/rail{j}" for j in range(2)) if rails else ()  # noqa: E731
    return [Instance("p0", "http://p0", "prefill", "h0", r(0)),
            Instance("d0", "http://d0", "decode", "h1/rail0", r(1), home_rail=0),
            Instance("d1", "http://d1", "decode", "h2/rail1", r(2), home_rail=1)]


def test_p2c_takes_the_less_loaded_of_its_two_picks():
    router = ops.P2CEjection(unified(2), clock=Clock(), seed=3)
    held = [router.route("interactive", 10) for _ in range(5)]  # never finished: they stay in flight
    # with two instances every pick is the pair, so each request goes to the one with fewer in flight
    counts = [sum(1 for r in held if r.decode.name == n) for n in ("u0", "u1")]
    assert sorted(counts) == [2, 3]
    for r in held:
        router.finished(r, Outcome(ok=True, ttft_s=0.1, decode_first_token_s=0.1))
    busy = [router.route("interactive", 10) for _ in range(4)]
    assert {r.decode.name for r in busy} == {"u0", "u1"}


def test_p2c_paths_follow_rail_access():
    assert {r for _, _, r in ops._paths(disagg(rails=True))} == {0, 1}
    assert {r for _, _, r in ops._paths(disagg(rails=False))} == {None}


def test_ejected_path_gets_no_traffic_for_its_ejection_time_then_returns():
    clock = Clock()
    router = ops.P2CEjection(unified(3), clock=clock, seed=1)
    s = router.s
    failures = 0
    while failures < s.consecutive_failures:  # fail every request that lands on u1
        r = router.route("interactive", 10)
        bad = r.decode.name == "u1"
        router.finished(r, Outcome(ok=not bad, ttft_s=0.1, decode_first_token_s=0.1))
        failures += bad
    assert router.ejected() == {("", "u1", None)}
    clock.t += s.base_ejection_s - 1.0
    during = [router.route("interactive", 10) for _ in range(200)]
    assert "u1" not in {r.decode.name for r in during}
    clock.t += 2.0  # past the ejection time: back in rotation
    after = [router.route("interactive", 10) for _ in range(200)]
    assert "u1" in {r.decode.name for r in after}


def test_late_first_tokens_count_as_failures_and_the_cap_holds():
    clock = Clock()
    router = ops.P2CEjection(unified(3), clock=clock, seed=2)
    for _ in range(60):  # u0 and u2 both answer past the interactive timeout: only one may be out
        r = router.route("interactive", 10)
        slow = r.decode.name != "u1"
        router.finished(r, Outcome(ok=True, ttft_s=5.0 if slow else 0.1, decode_first_token_s=0.1))
    assert len(router.ejected()) == 1  # 10 % of 3 paths, but at least one


def test_latency_outlier_is_ejected_at_the_sweep():
    clock = Clock()
    router = ops.P2CEjection(unified(3), clock=clock, seed=4)
    for _ in range(60):
        r = router.route("batch", 10)  # batch timeout 10 s: no request counts as failed
        router.finished(r, Outcome(ok=True, ttft_s=0.5, decode_first_token_s=3.0 if r.decode.name == "u2" else 0.2))
    assert router.ejected() == set()
    clock.t += router.s.interval_s
    router.route("batch", 10)
    assert router.ejected() == {("", "u2", None)}


def test_prefix_scorer_prefers_the_instance_holding_the_prefix():
    router = ops.PrefixKVScorer(unified(3))
    doc = tuple(range(256))
    first = router.route("interactive", 256, prefix=doc)
    router.finished(first, Outcome(ok=True))
    again = router.route("interactive", 300, prefix=doc + (7,) * 44)
    assert again.decode.name == first.decode.name


def test_prefix_scorer_without_a_shared_prefix_goes_by_queue_and_kv():
    router = ops.PrefixKVScorer(unified(3))
    router.update_load("u0", waiting=8, kv_usage=0.2)
    router.update_load("u1", waiting=0, kv_usage=0.9)
    router.update_load("u2", waiting=0, kv_usage=0.1)
    assert router.route("interactive", 100).decode.name == "u2"


def test_opponents_register_by_name():
    before = dict(ROUTERS)
    try:
        ops.register()
        for name in ops.OPPONENTS:
            assert make_router(name, disagg(rails=True)).route("interactive", 10).decode.role == "decode"
    finally:  # the table is the gateway's: leave it as other tests expect it
        ROUTERS.clear()
        ROUTERS.update(before)


def _bench():
    spec = importlib.util.spec_from_file_location("inference_routing", ROOT / "benchmarks" / "inference_routing.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    return m


def test_quick_keeps_every_router_and_arm_repeated_on_levels_of_the_full_design():
    bench = _bench()
    assert bench.REPS["quick"] >= 2
    assert set(bench.QUICK_UTILIZATIONS) <= set(bench.UTILIZATIONS)
    assert set(bench.OPPONENT_QUICK_UTILIZATIONS) <= set(bench.OPPONENT_UTILIZATIONS)
    assert {"round_robin", "least_outstanding", "seamguard", *ops.OPPONENTS} <= {
        r for arm in bench.OPPONENT_ARMS.values() for r in arm}
    for windows in (bench.WINDOWS_S, bench.OPPONENT_WINDOWS_S):
        for duration_s, (start_s, end_s) in windows.values():
            assert 0.0 < start_s < end_s <= duration_s  # a healthy window, then the degraded one, inside the run
        assert windows["quick"][0] < windows["full"][0]
    cuts = bench.quick_cuts(bench.OPPONENT_UTILIZATIONS, bench.OPPONENT_WINDOWS_S)
    assert cuts["full_levels"] == list(bench.OPPONENT_UTILIZATIONS)
    assert cuts["full_duration_s"] == bench.OPPONENT_WINDOWS_S["full"][0] > bench.OPPONENT_WINDOWS_S["quick"][0]


def test_a_bad_utilization_list_is_one_line_naming_it():
    bench = _bench()
    assert bench.parse_utilizations("0.5, 0.9", (0.3,)) == [0.5, 0.9]
    assert bench.parse_utilizations(None, (0.3,)) == [0.3]
    for bad in ("0.5,x", "-0.5", ","):
        try:
            bench.parse_utilizations(bad, (0.3,))
        except SystemExit as e:
            assert bad in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(f"{bad!r} accepted")
