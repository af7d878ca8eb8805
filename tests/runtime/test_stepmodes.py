"""Step modes (runtime/stepmodes.py): which rails a job stays off and whether it runs degraded,
from a step every rank agrees on; the coordinator turns the launcher's hint keys into them."""

from __future__ import annotations

import json

import pytest

from seamguard import hintauth
from seamguard.runtime import cadence, keys, stepmodes
from seamguard.runtime.coordinator import Coordinator
from seamguard.runtime.settings import LaunchSettings
from seamguard.runtime.stepmodes import StepMode

from .test_coordinator import DictStore, beat, finish_generation


def test_mode_at_takes_the_newest_started_entry_and_round_trips():
    entries = (StepMode(10, ("rail0",)), StepMode(20, (), True), StepMode(30))
    assert stepmodes.parse(stepmodes.format_modes(entries)) == entries
    assert stepmodes.mode_at(9, entries) == stepmodes.NORMAL
    assert stepmodes.mode_at(10, entries).avoid == ("rail0",)
    assert stepmodes.mode_at(25, entries) == StepMode(20, (), True)
    assert stepmodes.mode_at(99, entries) == StepMode(30)
    with pytest.raises(ValueError, match="step modes"):
        stepmodes.parse('[["x"]]')


def test_avoid_file_parsing_names_the_bad_line():
    assert stepmodes.parse_avoid_file("rail0 3\nrail1\n") == {"rail0": 3, "rail1": stepmodes.SEVERITY_UNKNOWN}
    assert stepmodes.parse_avoid_file("default\n") == {}
    with pytest.raises(ValueError, match="line 2"):
        stepmodes.parse_avoid_file("rail0 3\nrail1 bad\n")


@pytest.mark.parametrize("asked, avoid, note", [
    ({"rail0": 3}, ("rail0",), ""),
    ({"rail0": 5, "rail1": 3}, ("rail0",), "keeping rail1"),          # all asked: the least bad stays
    ({"rail0": 3, "rail1": 3}, ("rail1",), "keeping rail0"),          # a tie: the job's own order
    ({"rail9": 3}, (), "not rails of this job: rail9"),
    ({}, (), ""),
])
def test_never_zero_rails(asked, avoid, note):
    got, why = stepmodes.rails_to_avoid(("rail0", "rail1"), asked)
    assert got == avoid and note in why and (not note or why)


def test_degraded_persists_twice_as_often():
    due = [s for s in range(1, 41) if cadence.persist_due(s, 10, (), 1, stepmodes.DEGRADED_PERSIST_DIVISOR)]
    assert due == [5, 10, 15, 20, 25, 30, 35, 40]
    entries = (cadence.CadenceEntry(20, 4),)  # a controller's interval in force: halved as well
    assert [s for s in range(20, 31) if cadence.persist_due(s, 10, entries, 1, 2)] == [20, 22, 24, 26, 28, 30]


def _running(rails=("rail0", "rail1")):
    store, log = DictStore(), []
    s = LaunchSettings(script=["x.py"], nproc=2, env={"SEAMGUARD_SETTINGS": json.dumps({"rails": list(rails)})})
    c = Coordinator(store, s, [0, 1], [], None, 30.0, log.append, clock=lambda: 0.0)
    for w in (0, 1):
        store.set(keys.worker_addr(w), "h:1")
    c.tick()
    finish_generation(c, store, {})
    return c, store, log


def test_coordinator_fixes_each_change_ahead_of_every_rank():
    c, store, log = _running()
    beat(store, 0, 1, 40)
    beat(store, 1, 1, 41)
    hintauth.send(store, keys.HINT_AVOID_RAILS, "rail0 3\n", c.hint_key, keys.HINT_AVOID_RAILS_N)
    c.tick()
    (first,) = stepmodes.parse(store.get(keys.STEP_MODES).decode())
    assert first.avoid == ("rail0",) and not first.degraded and first.start_step > 41
    hintauth.send(store, keys.HINT_DEGRADED, "on", c.hint_key, keys.HINT_DEGRADED_N)
    c.tick()
    second = stepmodes.parse(store.get(keys.STEP_MODES).decode())[-1]
    assert second.avoid == ("rail0",) and second.degraded and second.start_step > first.start_step
    # every rail asked: the least bad is kept, and the log says why
    hintauth.send(store, keys.HINT_AVOID_RAILS, "rail0 5\nrail1 3\n", c.hint_key, keys.HINT_AVOID_RAILS_N)
    c.tick()
    assert not [e for e in log if e["event"] == "step_mode" and e["avoid_rails"] == ["rail0", "rail1"]]
    unchanged = [e for e in log if e["event"] == "step_mode_unchanged"]
    assert unchanged and "keeping rail1" in unchanged[-1]["note"]
    # handed back: normal running from a later step; the same request again changes nothing
    hintauth.send(store, keys.HINT_AVOID_RAILS, "default\n", c.hint_key, keys.HINT_AVOID_RAILS_N)
    hintauth.send(store, keys.HINT_DEGRADED, "off", c.hint_key, keys.HINT_DEGRADED_N)
    c.tick()
    entries = stepmodes.parse(store.get(keys.STEP_MODES).decode())
    assert entries[-1].avoid == () and not entries[-1].degraded and len(entries) == 3
    store.add(keys.HINT_DEGRADED_N, 1)
    c.tick()
    assert stepmodes.parse(store.get(keys.STEP_MODES).decode()) == entries


def test_launcher_turns_the_hint_files_into_store_keys_and_refuses_bad_ones(tmp_path, capsys):
    from seamguard.runtime.launcher import _hint_files

    store, gate = DictStore(), hintauth.HintGate(b"k" * 32)
    hintauth.write_hint_file(tmp_path, "avoid_rails", "rail0 3\nrail1 very-bad\n", gate.key)
    hintauth.write_hint_file(tmp_path, "degraded", "maybe\n", gate.key)
    _hint_files(store, tmp_path, gate)
    err = capsys.readouterr().err
    assert "avoid_rails: line 2" in err and "expected 'on' or 'off', got 'maybe'" in err
    assert not store.check([keys.HINT_AVOID_RAILS_N]) and not store.check([keys.HINT_DEGRADED_N])
    assert list(tmp_path.iterdir()) == []  # consumed either way: a bad request is not retried
    hintauth.write_hint_file(tmp_path, "avoid_rails", "rail1 3\n", gate.key)
    hintauth.write_hint_file(tmp_path, "degraded", "on\n", gate.key)
    _hint_files(store, tmp_path, gate)
    # forwarded signed with the job's key, under the store key's name
    assert gate.admit(keys.HINT_AVOID_RAILS, store.get(keys.HINT_AVOID_RAILS).decode()) == "rail1 3\n"
    assert store.get(keys.HINT_AVOID_RAILS_N) == b"1"
    assert gate.admit(keys.HINT_DEGRADED, store.get(keys.HINT_DEGRADED).decode()) == "on"
    assert store.get(keys.HINT_DEGRADED_N) == b"1"
