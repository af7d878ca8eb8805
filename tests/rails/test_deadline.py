"""The per-chunk deadline: pure functions given numbers (no clock), and its agreement.

`op_deadline` turns a rail's recent chunk times into its deadline; `overdue` says whether
a chunk still running is given up; `decide` keeps the agreed chunk times every rank uses.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seamguard.runtime.rails import (
    LIVE,
    Agreed,
    OpDeadline,
    RailSettings,
    RailState,
    Vote,
    decide,
    op_deadline,
    overdue,
)

S = RailSettings(interfaces=("rail0", "rail1"), op_deadline_min_s=0.25, op_deadline_max_s=1.0,
                 op_deadline_factor=3.0, op_deadline_window_chunks=50, op_deadline_warmup_chunks=5)
FAST = [0.02] * 50


@pytest.mark.parametrize("recent, want_s, basis", [
    ([], 1.0, "warm-up"),                                    # no chunk times yet: the ceiling
    ([0.02] * 4, 1.0, "warm-up"),                            # still too few
    ([0.02] * 5, 0.25, "floor"),                             # 3 x 0.02 = 0.06, raised to the floor
    ([0.02] * 49 + [0.1], 0.3, "slowest"),                   # 3 x the slowest
    (FAST + [0.2] * 3, 0.6, "slowest"),                      # a burst of slow-but-successful chunks raises it
    (FAST + [5.0], 1.0, "ceiling"),                          # never above the ceiling: a dead rail is caught
    ([0.2] + FAST, 0.25, "floor"),                           # the burst has left the 50-chunk window
    ([0.2] + [0.02] * 49, 0.6, "slowest"),                   # ... but not before it has
])
def test_deadline_decision_table(recent, want_s, basis):
    d = op_deadline(recent, S)
    assert d.deadline_s == pytest.approx(want_s)
    assert basis in d.basis


@given(st.lists(st.floats(min_value=0.0, max_value=1e3, allow_nan=False), max_size=120))
def test_deadline_stays_between_floor_and_ceiling_and_covers_the_slowest_recent_chunk(recent):
    d = op_deadline(recent, S).deadline_s
    assert S.op_deadline_min_s <= d <= S.op_deadline_max_s
    window = recent[-S.op_deadline_window_chunks:]
    if len(window) >= S.op_deadline_warmup_chunks:
        assert d >= min(S.op_deadline_max_s, S.op_deadline_factor * max(window)) - 1e-12


D = OpDeadline(0.25, "test")


@pytest.mark.parametrize("own_s, since_other_s, gives_up, why", [
    (0.10, 0.05, False, ""),            # within its deadline
    (0.60, None, False, ""),            # no rail finished yet: a slow peer delays all rails alike; wait
    (1.01, None, True, "ceiling"),      # ... but never past the ceiling (every rail dead, or a hung peer)
    (0.60, 0.10, False, ""),            # another rail finished only 0.1 s ago: this one gets its own 0.25 s
    (0.60, 0.30, True, "deadline"),     # 0.3 s after another rail finished: a silent failure of this rail
    (0.20, 0.90, False, ""),            # its clock started late (queued behind another chunk): still in time
    (1.01, 0.05, True, "ceiling"),      # the ceiling bounds it whatever the other rails do
])
def test_overdue_decision_table(own_s, since_other_s, gives_up, why):
    reason = overdue(own_s, since_other_s, D, S)
    assert bool(reason) == gives_up
    assert why in reason


@given(st.floats(0.0, 100.0), st.one_of(st.none(), st.floats(0.0, 100.0)),
       st.floats(S.op_deadline_min_s, S.op_deadline_max_s))
def test_a_dead_rail_is_given_up_by_the_ceiling_and_a_live_one_not_before_the_floor(own_s, since_other_s, d_s):
    reason = overdue(own_s, since_other_s, OpDeadline(d_s, ""), S)
    if own_s > S.op_deadline_max_s:
        assert reason
    if own_s <= S.op_deadline_min_s:
        assert not reason


def vote(rank, chunk_s):
    return Vote(rank, [True, True], [], [5.0, 5.0], {}, {}, 100.0, chunk_s)


def test_agreed_chunk_times_are_the_slowest_ranks_whatever_the_vote_order():
    vs = [vote(0, {0: 0.02, 1: 0.03}), vote(1, {0: 0.05}), vote(2, {0: 0.01, 1: 0.04})]
    a1, a2 = Agreed([RailState(LIVE), RailState(LIVE)]), Agreed([RailState(LIVE), RailState(LIVE)])
    d1, d2 = decide(a1, vs, S), decide(a2, list(reversed(vs)), S)
    assert d1 == d2 and a1 == a2
    assert d1.chunk_s == {0: 0.05, 1: 0.04}
    assert a1.rails[0].recent_chunk_s == [0.05] and a1.rails[1].recent_chunk_s == [0.04]


def test_agreed_window_is_bounded_and_a_rail_without_times_keeps_its_own():
    a = Agreed([RailState(LIVE, recent_chunk_s=[0.02] * 50), RailState(LIVE, recent_chunk_s=[0.03])])
    decide(a, [vote(0, {0: 0.9}), vote(1, {})], S)
    assert len(a.rails[0].recent_chunk_s) == 50 and a.rails[0].recent_chunk_s[-1] == 0.9
    assert a.rails[1].recent_chunk_s == [0.03]
    assert a.rails[0].deadline(S).deadline_s == 1.0  # 3 x 0.9, cut to the ceiling


def test_vote_carries_chunk_times_through_json():
    v = vote(1, {0: 0.02, 1: 0.5})
    assert Vote.from_json(v.to_json()) == v


@pytest.mark.parametrize("bad", [
    {"op_deadline_max_s": 2.0},                                 # not below gloo's own timeout (2 s)
    {"op_deadline_min_s": 0.6, "op_deadline_max_s": 0.5},       # floor above the ceiling
    {"op_deadline_min_s": 0.0},
    {"op_deadline_factor": 0.5},
    {"op_deadline_warmup_chunks": 60, "op_deadline_window_chunks": 50},
])
def test_settings_reject_an_unbounded_or_inconsistent_deadline(bad):
    with pytest.raises(ValueError):
        RailSettings(interfaces=("rail0",), **bad)
