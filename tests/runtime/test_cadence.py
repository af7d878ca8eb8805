"""The persist cadence every rank derives from the same store entries (runtime/cadence.py)."""

import math

import pytest

from seamguard.runtime.cadence import (GPU_MTTF_H, MAX_EVERY_STEPS, CadenceEntry, SnapshotCost, auto_every_steps,
                                      every_steps_for, format_entries, parse, persist_due, retune, snapshot_due,
                                      uncovered_mttf_s)


def due(steps, own, entries=(), window=1):
    return [s for s in steps if persist_due(s, own, entries, window)]


def test_the_jobs_own_interval_until_an_entry_starts_then_the_entrys():
    assert due(range(0, 31), 10) == [10, 20, 30]
    e = (CadenceEntry(14, 3),)
    assert due(range(0, 24), 10, e) == [10, 14, 17, 20, 23]
    back = e + (CadenceEntry(22, 0),)  # "default": the job's own rule again
    assert due(range(0, 41), 10, back) == [10, 14, 17, 20, 30, 40]
    assert due(range(0, 40), 0) == [] and due(range(0, 40), 0, (CadenceEntry(5, 0),)) == []


def test_points_between_snapshots_are_taken_at_the_next_snapshot():
    snaps = range(0, 40, 4)  # every rank snapshots every 4th step
    assert due(snaps, 0, (CadenceEntry(6, 5),), window=4) == [8, 12, 16, 24, 28, 32, 36]
    # each point 6, 11, 16, ..., 36 lands in exactly one snapshot window
    points = range(6, 40, 5)
    assert len(due(snaps, 0, (CadenceEntry(6, 5),), window=4)) == len([p for p in points if p < 37])


def test_ranks_that_read_a_newer_entry_early_agree_on_every_earlier_step():
    old = (CadenceEntry(10, 4),)
    new = old + (CadenceEntry(30, 7),)
    assert due(range(0, 30), 50, old) == due(range(0, 30), 50, new)


def test_round_trip_keeps_the_newest_entries_and_rejects_garbage():
    entries = tuple(CadenceEntry(10 * i, i) for i in range(6))
    assert parse(format_entries(entries)) == entries[-4:]
    assert parse("") == ()
    with pytest.raises(ValueError, match="start:every"):
        parse("12")
    with pytest.raises(ValueError, match=">= 0"):
        parse("5:-1")


def test_seconds_become_steps_at_the_jobs_pace():
    assert every_steps_for(600.0, 0.25) == 2400 and every_steps_for(0.1, 0.25) == 1
    assert every_steps_for(None, None) == 0
    with pytest.raises(ValueError, match="not known"):
        every_steps_for(60.0, None)


# ---- --snapshot-every auto: which steps are snapshotted, and how often -------------------
def snapped(steps, own, entries=()):
    return [s for s in steps if snapshot_due(s, own, entries)]


def test_snapshot_steps_follow_the_own_interval_then_each_entry_from_its_start():
    assert snapped(range(0, 31), 10) == [0, 10, 20, 30]
    e = (CadenceEntry(14, 7),)
    assert snapped(range(0, 40), 10, e) == [0, 10, 21, 28, 35]
    assert snapped(range(0, 52), 10, e + (CadenceEntry(40, 0),)) == [0, 10, 21, 28, 35, 40, 50]
    # a rank that read the newer entry early agrees with one that did not, before its start
    assert snapped(range(0, 40), 10, e) == snapped(range(0, 40), 10, e + (CadenceEntry(40, 3),))


@pytest.mark.parametrize("cost_s, step_s, mttf_s, lo, hi", [
    # about Young's sqrt(2 d M) / step: 0.5 s snapshots, a job failing every 100 h, 0.65 s
    # steps: sqrt(2 x 0.5 x 360000) = 600 s, 923 steps
    (0.5, 0.65, 100 * 3600, 920, 926),
    # four times the cost: twice the interval
    (2.0, 0.65, 100 * 3600, 1843, 1849),
    # a failure every 10 minutes and a 1 s snapshot: sqrt(1200) = 34.6 s, Daly's 34.0 s
    (1.0, 1.0, 600, 33, 35),
    # a snapshot that costs more than twice the time between failures: Daly's limit, M itself
    (50.0, 5.0, 20.0, 4, 4),
])
def test_auto_interval_is_dalys_for_the_cost_and_failure_rate(cost_s, step_s, mttf_s, lo, hi):
    assert lo <= auto_every_steps(cost_s, step_s, mttf_s) <= hi


def test_auto_interval_counts_an_unmeasurable_cost_as_1ms_and_rejects_nonsense():
    assert auto_every_steps(0.0, 1.0, 3600) == auto_every_steps(1e-3, 1.0, 3600) == 3
    with pytest.raises(ValueError, match="step_s"):
        auto_every_steps(0.1, 0.0, 3600)


@pytest.mark.parametrize("current, wanted, moves", [
    (10, 10, False), (10, 14, False), (10, 16, True), (10, 7, False), (10, 6, True), (1, 2, True)])
def test_the_interval_moves_only_for_a_change_beyond_the_factor(current, wanted, moves):
    assert retune(current, wanted) is moves


def test_snapshot_cost_is_the_snapshot_and_next_steps_excess_over_the_steps_between():
    c = SnapshotCost()
    for since, step_s in [(0, 1.4), (1, 0.8), (2, 0.6), (3, 0.62), (4, 0.58)]:
        c.add(step_s, since)
    assert c.cost_s() == pytest.approx((1.4 - 0.6) + (0.8 - 0.6))
    c2 = SnapshotCost()
    c2.add(0.7, 0)
    c2.add(0.7, 1)
    assert c2.cost_s() is None   # no step without a snapshot seen yet
    c2.add(0.9, 5)               # a plain step slower than the snapshot's: costs nothing
    assert c2.cost_s() == 0.0


def test_a_step_in_which_a_slot_was_made_is_not_a_snapshots_recurring_cost():
    c = SnapshotCost()
    # the layout's first snapshot: its slot made in the step (a one-time cost), and the next
    c.add(2.7, 0, made_slot=True)
    c.add(0.9, 1, made_slot=True)
    c.add(1.6, 2, made_slot=True)   # a slot made ahead in a step between: not a plain step either
    c.add(0.6, 3)
    assert c.cost_s() == pytest.approx((2.7 - 0.6) + (0.9 - 0.6))   # nothing better seen yet
    c.add(0.7, 0)                   # a snapshot into a slot made before it
    assert c.cost_s() == pytest.approx((0.7 - 0.6) + (0.9 - 0.6))   # the step after: still the first's
    c.add(0.65, 1)
    assert c.cost_s() == pytest.approx((0.7 - 0.6) + (0.65 - 0.6))
    c.add(2.5, 0, made_slot=True)   # a later made slot changes nothing once clean steps are seen
    c.add(0.9, 1, made_slot=True)
    assert c.cost_s() == pytest.approx((0.7 - 0.6) + (0.65 - 0.6))


@pytest.mark.parametrize("mttf_s, ranks, copies, window_s, expected_s", [
    # FSDP2: every loss needs a snapshot: one rank's MTTF over the ranks
    (3600.0, 4, 1, 10.0, 900.0),
    # HSDP, 2 copies of each shard: both lost within the window, M^2 / (ranks * W)
    (3600.0, 4, 2, 10.0, 3600.0**2 / (4 * 10.0)),
    # 3 copies (data parallelism on 3 ranks): M^3 / (3! * W^2)
    (3600.0, 3, 3, 10.0, 3600.0**3 / (6 * 10.0**2)),
    # a window as long as a rank's MTTF: never rarer than every failure
    (10.0, 4, 2, 100.0, 2.5),
    # more copies than ranks counts as the ranks
    (3600.0, 2, 4, 10.0, 3600.0**2 / (2 * 10.0)),
])
def test_failures_a_live_copy_covers_are_not_counted(mttf_s, ranks, copies, window_s, expected_s):
    assert uncovered_mttf_s(mttf_s, ranks, copies, window_s) == pytest.approx(expected_s)


def test_a_loss_no_snapshot_is_needed_for_gives_the_longest_interval():
    assert uncovered_mttf_s(3600.0, 4, 2, 0.0) == math.inf
    assert auto_every_steps(0.1, 1.0, math.inf) == MAX_EVERY_STEPS
    # Llama 3's rate on 16,384 ranks, 5 s steps, a 0.5 s snapshot: every failure counted,
    # every 21 steps (105 s); HSDP with 2 copies and 61 s exposed, every ~36,500 (about 2 days)
    every = auto_every_steps(0.5, 5.0, uncovered_mttf_s(GPU_MTTF_H * 3600, 16384, 1, 61.0))
    hsdp = auto_every_steps(0.5, 5.0, uncovered_mttf_s(GPU_MTTF_H * 3600, 16384, 2, 61.0))
    assert 20 <= every <= 22 and 36_000 <= hsdp <= 37_000
    with pytest.raises(ValueError, match="copies"):
        uncovered_mttf_s(3600.0, 4, 0, 10.0)


def test_a_cost_hidden_in_the_steps_noise_is_counted_at_the_noise():
    import random

    rng = random.Random(0)
    c = SnapshotCost()
    for i in range(40):   # steps of 0.6 s +- 0.05 whether or not a snapshot was taken
        c.add(0.6 + rng.gauss(0, 0.05), i % 5)
    sigma_floor = 1.2533 * 0.05 * math.sqrt(1 / 8 + 1 / 24)
    assert 0.5 * sigma_floor < c.cost_s() < 3 * sigma_floor
    clear = SnapshotCost()
    for i in range(40):   # a 0.3 s snapshot stands far above the same noise: measured as is
        clear.add(0.6 + rng.gauss(0, 0.05) + (0.3 if i % 5 == 0 else 0.0), i % 5)
    assert clear.cost_s() == pytest.approx(0.3, abs=0.08)
