"""Decode lanes per TPOT budget in the seamguard router: batch work (looser TPOT budget) packed
onto the decode instances already holding it, interactive work kept off them, each lane's batch
cap aimed at the budget of the classes it holds, and a lane's slower steps not mistaken for a
sick instance. Decision tables; pure: injected clock, no I/O."""

from __future__ import annotations

import pytest

from seamguard.gateway.routing import (
    Instance,
    SeamguardOptions,
    SeamguardRouter,
)
from tests.gateway.routing_helpers import Clock, finish, hold

P = [Instance("p0", "http://p0", "prefill", "h0"), Instance("p1", "http://p1", "prefill", "h1")]
D = [Instance(f"d{j}", f"http://d{j}", "decode", f"h{2 + j}") for j in range(3)]
BUDGETS = {"interactive": 0.1, "batch": 0.25}  # TPOT; batch's is the looser one


def sg(**opts) -> tuple[SeamguardRouter, Clock]:
    c = Clock()
    return SeamguardRouter(P + D, SeamguardOptions(**{"tpot_budget_s": BUDGETS, **opts}), clock=c), c


def decodes(routes) -> list[str]:
    return [x.decode.name for x in routes]


def test_batch_packs_onto_one_lane_and_interactive_keeps_off_it_and_both_say_why():
    r, c = sg()
    batch = hold(r, c, 6, "batch")
    lane = batch[0].decode.name
    assert decodes(batch) == [lane] * 6  # least loaded picked the first; the rest packed onto it
    assert "packed onto " + lane in batch[1].reason and batch[1].evidence[f"{lane}.batch_in_flight"] == 1.0
    inter = hold(r, c, 8, "interactive")
    assert lane not in decodes(inter) and set(decodes(inter)) == {d.name for d in D} - {lane}
    assert r.decisions["lane"] >= 5
    snap = r.snapshot()["instances"]
    assert snap[lane]["lane"] == 1 and snap[lane]["batch_in_flight"] == 6
    assert all(snap[d]["lane"] == 0 for d in set(decodes(inter)))


def test_without_lanes_or_with_one_tpot_budget_every_class_is_placed_by_load():
    for opts in ({"class_lanes": False}, {"tpot_budget_s": {"interactive": 0.1, "batch": 0.1}}):
        r, c = sg(**opts)
        batch = hold(r, c, 6, "batch")
        assert sorted(decodes(batch)) == ["d0", "d0", "d1", "d1", "d2", "d2"], opts
        assert all(x.reason == "" for x in batch)


def test_interactive_uses_the_lane_when_no_other_decode_instance_can_take_it():
    r, c = sg()
    lane = hold(r, c, 4, "batch")[0].decode.name
    others = [d.name for d in D if d.name != lane]
    for o in others:
        r.update_load(o, kv_usage=0.99)  # KV full on both: out while another can take the work
    assert decodes(hold(r, c, 2, "interactive")) == [lane, lane]


def test_a_lane_holding_only_batch_is_capped_against_the_batch_budget_a_mixed_one_against_interactive():
    # TPOT 0.15 s: over 0.8 x 0.1 (interactive), under 0.8 x 0.25 (batch)
    r, c = sg()
    batch = hold(r, c, 8, "batch")
    lane = batch[0].decode.name
    for x in batch[:3]:
        finish(r, x, 0.15)
    assert r.batch_cap(lane) is None
    r2, c2 = sg(class_lanes=False)  # the same samples without lanes: the interactive target cuts the cap
    flights = hold(r2, c2, 12, "batch")
    on = [x for x in flights if x.decode.name == "d0"]
    finish(r2, on[0], 0.15)
    assert r2.batch_cap("d0") == 3  # floor(0.75 x 4: the 3 in flight and the one that finished)


def test_interactive_in_flight_on_a_lane_brings_back_the_interactive_target():
    r, c = sg()
    for o in ("d1", "d2"):
        r.update_load(o, kv_usage=0.99)  # every request lands on d0
    batch = hold(r, c, 6, "batch")
    inter = hold(r, c, 2, "interactive")
    assert set(decodes(batch + inter)) == {"d0"}
    finish(r, batch[0], 0.15)  # 0.15 s with interactive requests in the step: over their 0.08 s target
    assert r.batch_cap("d0") == 6  # floor(0.75 x 8: the 7 in flight and the one that finished)


@pytest.mark.parametrize("lane_tpot, out_for_batch, out_for_interactive", [
    (0.20, False, True),  # a busy lane: 4x its peers but within batch's budget
    (0.50, True, True),  # stalled: over every budget
    (0.09, False, False),  # 3x its peers yet within even the interactive budget
])
def test_slow_tokens_are_out_for_a_class_only_over_that_class_budget(lane_tpot, out_for_batch, out_for_interactive):
    r, c = sg(class_lanes=False)
    for _ in range(60):
        c.t += 0.1
        x = r.route("batch", 200)
        finish(r, x, lane_tpot if x.decode.name == "d2" else 0.03)
    paths = [p for p in r.snapshot()["paths"] if p["decode"] == "d2"]
    assert all(p["admissible"]["batch"] is not out_for_batch for p in paths)
    assert all(p["admissible"]["interactive"] is not out_for_interactive for p in paths)


def test_interactive_keeps_off_a_decode_instance_whose_tokens_are_over_its_budget():
    r, c = sg(class_lanes=True)
    for _ in range(30):  # sequential batch work: no lane forms (nothing in flight), d1's steps are slow
        c.t += 0.1
        x = r.route("batch", 200)
        finish(r, x, 0.12 if x.decode.name == "d1" else 0.05)
    inter = hold(r, c, 6, "interactive")
    assert "d1" not in decodes(inter)
    assert any("kept off d1: its TPOT p90 0.120s is over the interactive budget" in x.reason for x in inter)
