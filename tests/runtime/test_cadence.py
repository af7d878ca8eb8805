"""The persist cadence every rank derives from the same store entries (runtime/cadence.py)."""

import pytest

from seamguard.runtime.cadence import CadenceEntry, every_steps_for, format_entries, parse, persist_due


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
