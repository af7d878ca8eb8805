"""A rank's own part of the next step's private bytes (RNG states, buffers), sent to its
replica holder once a step's collectives are done: how the holder completes it, and the
check at the next step's start that decides whether it can stand in for that step's push."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import torch

from seamguard.runtime.snapshot import META, TrainingState, with_rank_private
from seamguard.runtime.clock import SYSTEM_CLOCK
from seamguard.runtime.schedule import SnapshotSchedule


def _state(lr: float) -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    return TrainingState(model, torch.optim.AdamW(model.parameters(), lr=lr))


def test_the_holder_completes_a_rank_part_with_its_own_settings_and_position():
    holder, rank = _state(lr=0.5), _state(lr=0.5)
    rank.model[1].running_mean.fill_(3.0)   # a buffer only the rank has
    torch.manual_seed(1234)                 # and its RNG state
    part = rank.rank_private()
    want_rng = pickle.loads(part[META])["rng"]
    torch.manual_seed(99)
    merged = with_rank_private(holder.meta(step=9), part)
    meta = pickle.loads(merged[META])
    assert meta["step"] == 9 and meta["data"] == {"step": 9}
    assert [g["lr"] for g in meta["groups"]] == [0.5]
    assert meta["rng"]["torch"] == want_rng["torch"] and meta["rng"]["python"] == want_rng["python"]
    assert merged["model/1.running_mean"] == part["model/1.running_mean"]
    assert torch.frombuffer(bytearray(merged["model/1.running_mean"]), dtype=torch.float32).tolist() == [3.0] * 4


def _rank(state: TrainingState, part_ok=None) -> SnapshotSchedule:
    """A rank's snapshot schedule, on the part of a Runtime that `_rank_part_holds` uses."""
    rt = SimpleNamespace(gen=2, step=9, state=state, time=SYSTEM_CLOCK,
                         _private=(9, state.step_private(9)))   # taken at step 9's start
    r = SnapshotSchedule(rt, pipeline=None)
    r._part_ok, r.notes = part_ok, []
    rt._note = lambda kind, **fields: r.notes.append(kind)
    return r


def test_a_part_stands_in_for_the_push_only_once_a_check_has_passed():
    state = _state(lr=0.1)
    r = _rank(state)
    r._part = (2, 9, state.rank_private())           # taken, not sent (no check passed yet)
    assert r._rank_part_holds() is False and r._part_ok is True
    r._part = (2, 9, state.rank_private())           # sent, and it holds
    assert r._rank_part_holds() is True and r._part is None
    r._part = (1, 9, state.rank_private())           # sent to the previous generation's holder
    assert r._rank_part_holds() is False
    r._part = (2, 8, state.rank_private())           # for another step
    assert r._rank_part_holds() is False and r.notes == []


def test_random_numbers_drawn_after_sync_gradients_turn_the_parts_off():
    state = _state(lr=0.1)
    r = _rank(state, part_ok=True)
    r._part = (2, 9, state.rank_private())
    torch.rand(3)                                     # the loop drew after sync_gradients()
    assert r._rank_part_holds() is False
    assert r._part_ok is False and r.notes == ["rank_part_off"]
    r._part = (2, 9, state.rank_private())
    assert r._rank_part_holds() is False and r.notes == ["rank_part_off"]   # noted once
    assert r._part_ok is False   # and off for good
