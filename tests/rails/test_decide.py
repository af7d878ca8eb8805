"""The pure agreement step: same votes -> same decision, gray detection, rebuild gating."""

from __future__ import annotations

from seamguard.runtime.rails import BUILDING, DEAD, LIVE, Agreed, RailSettings, RailState, Vote, decide

S = RailSettings(interfaces=("rail0", "rail1"), gray_ratio=0.25, gray_steps=2, stable_s=0.3,
                 probe_interval_s=1.0)


def vote(rank, ok=(True, True), failed=(), up=(5.0, 5.0), built=None, bw=None, t=100.0, chunk_s=None):
    return Vote(rank, list(ok), list(failed), list(up), built or {}, bw or {}, t, chunk_s or {})


def live2():
    return Agreed([RailState(LIVE, 0), RailState(LIVE, 0)])


def test_a_chunk_commits_only_if_every_rank_finished_it():
    a = live2()
    d = decide(a, [vote(0), vote(1, ok=(False, True), failed=[0])], S)
    assert d.commit_chunks == [False, True]
    assert d.newly_dead == [0] and a.rails[0].status == DEAD and a.rails[1].status == LIVE


def test_decision_does_not_depend_on_vote_order():
    vs = [vote(0, bw={0: 1e9, 1: 1e9}), vote(1, failed=[1], bw={0: 1e9}), vote(2, ok=(True, False))]
    a1, a2 = live2(), live2()
    d1, d2 = decide(a1, vs, S), decide(a2, list(reversed(vs)), S)
    assert d1 == d2 and a1 == a2


def test_gray_needs_consecutive_slow_steps_and_the_slowest_rank_counts():
    a = live2()
    slow = [vote(0, bw={0: 1e9, 1: 1e9}), vote(1, bw={0: 1e9, 1: 1e8})]  # rank 1 sees rail 1 at 10 %
    assert decide(a, slow, S).newly_dead == []
    assert a.rails[1].slow_count == 1
    assert decide(a, slow, S).newly_dead == [1]
    assert a.rails[1].status == DEAD and a.rails[1].reason.startswith("gray")
    b = live2()
    fast_again = [vote(0, bw={0: 1e9, 1: 1e9}), vote(1, bw={0: 1e9, 1: 9e8})]
    decide(b, slow, S)
    decide(b, fast_again, S)
    assert b.rails[1].slow_count == 0 and b.rails[1].status == LIVE


def test_gray_needs_a_lag_beyond_scheduling_noise_not_just_a_low_ratio():
    # 1.6 MB chunks: 41 ms vs 9 ms is a ratio of 0.22 but only a 32 ms lag (a loaded host)
    noise = [vote(0, bw={0: 38e6, 1: 172e6}, chunk_s={0: 0.041, 1: 0.009}), vote(1, bw={0: 40e6, 1: 180e6})]
    a = live2()
    assert decide(a, noise, S).newly_dead == [] and decide(a, noise, S).newly_dead == []
    assert a.rails[0].slow_count == 0
    # a collapsed link: 0.3 s behind
    gray = [vote(0, bw={0: 5e6, 1: 172e6}, chunk_s={0: 0.31, 1: 0.01}), vote(1, bw={0: 5e6, 1: 180e6})]
    b = live2()
    decide(b, gray, S)
    assert decide(b, gray, S).newly_dead == [0]
    assert b.rails[0].reason.startswith("gray") and "300 ms behind" in b.rails[0].reason


def test_dead_rail_rebuilds_only_when_every_carrier_is_stable_and_probe_interval_passed():
    a = Agreed([RailState(DEAD, 0, last_try_t_s=99.5), RailState(LIVE, 0)])
    assert decide(a, [vote(0, t=100.0), vote(1)], S).start_builds == []  # 0.5 s since last try
    assert decide(a, [vote(0, t=101.0), vote(1, up=(0.1, 5.0))], S).start_builds == []  # host 1 unstable
    d = decide(a, [vote(0, t=101.0), vote(1)], S)
    assert d.start_builds == [0] and a.rails[0].status == BUILDING and a.rails[0].gen == 1


def test_build_goes_live_when_all_ranks_built_it_with_a_healthy_probe():
    a = Agreed([RailState(BUILDING, 1), RailState(LIVE, 0)], bw_ref_bytes_per_s=1e9)
    assert decide(a, [vote(0, built={0: (1, True, 9e8)}), vote(1)], S).newly_live == []  # rank 1 pending
    assert a.rails[0].status == BUILDING
    d = decide(a, [vote(0, built={0: (1, True, 9e8)}), vote(1, built={0: (1, True, 8e8)})], S)
    assert d.newly_live == [0] and a.rails[0].status == LIVE


def test_stale_or_failed_or_gray_probes_keep_the_rail_out():
    a = Agreed([RailState(BUILDING, 2), RailState(LIVE, 0)], bw_ref_bytes_per_s=1e9)
    decide(a, [vote(0, built={0: (1, True, 9e8)}), vote(1, built={0: (1, True, 9e8)})], S)  # old gen
    assert a.rails[0].status == BUILDING
    decide(a, [vote(0, built={0: (2, True, 9e8)}), vote(1, built={0: (2, False, 0.0)})], S)
    assert a.rails[0].status == DEAD and a.rails[0].reason == "rebuild failed"
    b = Agreed([RailState(BUILDING, 1), RailState(LIVE, 0)], bw_ref_bytes_per_s=1e9)
    decide(b, [vote(0, built={0: (1, True, 9e8)}), vote(1, built={0: (1, True, 1e7)})], S)
    assert b.rails[0].status == DEAD and b.rails[0].reason.startswith("probe gray")


def test_a_few_slow_steps_do_not_lower_the_bar_for_a_gray_rails_probe():
    # rail 0 is out and being rebuilt; rail 1 ran at 100 MB/s for 20 steps, then a busy
    # host slowed the last 5 to 10 MB/s. A probe at 9 MB/s (a 50 Mbit link) is still gray.
    a = Agreed([RailState(DEAD, 0, last_try_t_s=1e9), RailState(LIVE, 0)])
    for bw in [100e6] * 20 + [10e6] * 5:
        decide(a, [vote(0, bw={1: bw}), vote(1, bw={1: bw})], S)
    a.rails[0].status, a.rails[0].gen = BUILDING, 1
    probe = {0: (1, True, 9e6)}
    decide(a, [vote(0, built=probe, bw={1: 10e6}), vote(1, built=probe, bw={1: 10e6})], S)
    assert a.rails[0].status == DEAD and a.rails[0].reason.startswith("probe gray")
