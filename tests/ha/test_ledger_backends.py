"""The ledger's contract on both backends: the same tests on SQLite (the embedded default)
and on PostgreSQL (the shared ledger of an HA pair), which the tests start themselves.

What a controller writes reads back the same; a controller started on a ledger resumes
from it; and fenced, the ledger refuses any write of a writer whose token is not the
newest, before the action it precedes reaches an actuator.
"""

from __future__ import annotations

import pytest

from seamguard.act import LogActuator
from seamguard.act.reconcile import reconcile
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.decide.actions import Decisions
from seamguard.fleet import FleetShape, generate_fleet
from seamguard.ledger import Fence, Fenced, LedgerError, open_ledger, open_reader
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=128), seed=2)


def _leading() -> bool:
    return True


def _drive(ctl: Controller, twin: Twin, ticks: int, start: int = 0) -> None:
    for i in range(start, start + ticks):
        f = twin.step()
        if i >= 3:
            twin.gpu_sbe[:16] += 20  # two nodes' GPUs go bad: transitions, decisions, actions
        assert ctl.tick(f).error == ""


def test_writer_and_reader_answer_the_same(ledger_target, tmp_path):
    ledger = open_ledger(ledger_target)
    ctl = Controller(FLEET, default_policy(mode="enforce"), [LogActuator(tmp_path / "a.jsonl")], ledger, tick_s=5.0)
    _drive(ctl, Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4), 25)
    reader = open_reader(ledger_target)
    try:
        trs = reader.transitions()
        assert trs and trs == ledger.transitions()
        assert reader.decisions() == ledger.decisions() != []
        acts = reader.actions()
        assert acts == ledger.actions() != []
        assert {a["status"] for a in acts} == {"done"}
        assert all(a["target"] and a["reason"] for a in acts)  # joined with the decision that asked
        ticks = [t["tick"] for t in trs]
        assert ticks == sorted(ticks, reverse=True)
        mid = ticks[len(ticks) // 2]
        assert all(t["tick"] <= mid for t in reader.transitions(upto_tick=mid))
        assert reader.transitions(limit=2, offset=1) == trs[1:3]
        assert {d["event"] for d in reader.decisions(event="decided")} == {"decided"}
        assert ledger.last_tick() == 24
    finally:
        reader.close()
        ledger.close()


def test_a_controller_started_on_the_ledger_resumes_without_repeating(ledger_target, tmp_path):
    world = LogActuator(tmp_path / "a.jsonl")
    twin = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4)
    first = open_ledger(ledger_target)
    _drive(Controller(FLEET, default_policy(mode="enforce"), [world], first, tick_s=5.0), twin, 12)
    applied = [r["key"] for r in world.records() if r["op"] == "apply"]
    assert applied
    first.close()
    again = open_ledger(ledger_target)
    ctl = Controller(FLEET, default_policy(mode="enforce"), [world], again, tick_s=5.0)
    assert ctl.tick_no == 12
    _drive(ctl, twin, 6, start=12)
    keys = [r["key"] for r in world.records() if r["op"] == "apply"]
    assert len(keys) == len(set(keys)), "an action was applied twice"
    assert set(applied) <= set(keys)
    again.close()


class _Recording:
    """An actuator that records what reached it."""

    name = "recording"

    def __init__(self) -> None:
        from seamguard.decide.actions import Verb

        self.verbs = frozenset(Verb)
        self.calls: list[str] = []

    def observe(self) -> set[str]:
        return set()

    def apply(self, action):
        from seamguard.act.base import ActionResult

        self.calls.append(action.key)
        return ActionResult(True, "ok")

    def revert(self, key):
        from seamguard.act.base import ActionResult

        self.calls.append(key)
        return ActionResult(True, "ok")


def _one_decision(tmp_path) -> Decisions:
    """A real decision: what a controller decides for two bad nodes."""
    ledger = open_ledger(tmp_path / "scratch.sqlite")
    ctl = Controller(FLEET, default_policy(mode="dry_run"), [], ledger, tick_s=5.0)
    twin = Twin(FLEET, [], TwinConfig(tick_s=5.0), seed=4)
    for i in range(12):
        f = twin.step()
        if i >= 3:
            twin.gpu_sbe[:16] += 20
        rep = ctl.tick(f)
    ledger.close()
    assert rep.decisions is not None and rep.decisions.desired
    return rep.decisions


def test_a_deposed_leaders_late_action_is_refused_and_never_reaches_the_actuator(ledger_target, tmp_path):
    decisions = _one_decision(tmp_path)
    old, new = open_ledger(ledger_target), open_ledger(ledger_target)
    old.take_fence(Fence(5, "a", _leading))
    new.take_fence(Fence(9, "b", _leading))  # b won the lease after a's expired
    act = _Recording()
    with pytest.raises(Fenced, match="token 5 is not the newest"):
        reconcile(decisions, [act], old, tick=3, enforce=True, actual=set())
    assert act.calls == []
    assert new.actions() == []  # nothing of the refused write was recorded
    changes = reconcile(decisions, [act], new, tick=3, enforce=True, actual=set())
    assert act.calls and {c.status for c in changes} == {"done"}
    rows = new.db.execute("SELECT DISTINCT fence FROM actions").fetchall()
    assert [tuple(r) for r in rows] == [(9,)]  # every action carries the token it was taken under
    with pytest.raises(Fenced):
        old.set_meta("mode", {"mode": "enforce", "by": "a"})  # no write of any kind
    old.close()
    new.close()


def test_an_older_token_cannot_take_the_ledger_back(ledger_target):
    a, b = open_ledger(ledger_target), open_ledger(ledger_target)
    b.take_fence(Fence(9, "b", _leading))
    with pytest.raises(Fenced, match="older than the newest"):
        a.take_fence(Fence(5, "a", _leading))
    assert a.fence_token() == 9
    assert [(e["token"], e["holder"]) for e in a.leader_events()] == [(9, "b")]
    with pytest.raises(Fenced):  # refused, it is not left an unfenced writer either
        a.set_meta("mode", {"mode": "enforce", "by": "a"})
    a.close()
    b.close()


def test_a_leader_past_its_lease_deadline_writes_nothing(ledger_target):
    ledger = open_ledger(ledger_target)
    alive = [True]
    ledger.take_fence(Fence(3, "a", lambda: alive[0]))
    ledger.begin_action(1, 5.0, "apply", "drain:node:n0", "drain", "log")
    alive[0] = False
    with pytest.raises(Fenced, match="lease deadline"):
        ledger.begin_action(2, 10.0, "apply", "drain:node:n1", "drain", "log")
    assert [a["key"] for a in ledger.actions()] == ["drain:node:n0"]
    ledger.drop_fence()
    alive[0] = True
    with pytest.raises(Fenced):
        ledger.finish_tick(2, 0.1)
    ledger.close()


def test_unfenced_ledger_writes_as_before(ledger_target):
    """One controller, no HA: no fence row, no token on its rows, writes succeed."""
    ledger = open_ledger(ledger_target)
    ledger.begin_tick(0, 0.0, "enforce", ())
    ledger.begin_action(0, 0.0, "apply", "drain:node:n0", "drain", "log")
    ledger.finish_action("drain:node:n0", "apply", "done", "")
    ledger.finish_tick(0, 0.01)
    assert ledger.fence_token() is None
    assert ledger.done_keys() == {"drain:node:n0"}
    assert ledger.last_tick() == 0
    ledger.close()


def test_an_unreachable_postgresql_is_one_line_naming_it_without_the_password():
    from seamguard.ports import free_port

    url = f"postgresql://u:s3cret@127.0.0.1:{free_port()}/x"
    with pytest.raises(LedgerError) as e:
        open_ledger(url)
    msg = str(e.value)
    assert "\n" not in msg and "s3cret" not in msg and "cannot connect to the PostgreSQL ledger" in msg


def test_a_sqlite_ledger_from_before_fencing_opens_and_gains_the_columns(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE actions (id INTEGER PRIMARY KEY, tick INTEGER, t_s REAL, op TEXT, key TEXT, "
                     "verb TEXT, actuator TEXT, status TEXT, detail TEXT, wall_time REAL);"
                     "INSERT INTO actions(tick, op, key, status) VALUES (1, 'apply', 'drain:node:n0', 'done');")
    db.close()
    ledger = open_ledger(path)
    assert ledger.done_keys() == {"drain:node:n0"}
    ledger.begin_action(2, 0.0, "apply", "drain:node:n1", "drain", "log")
    assert ledger.db.execute("SELECT fence FROM actions WHERE tick=2").fetchone() == (None,)
    ledger.close()


def test_a_deadline_that_passes_while_the_action_row_commits_stops_the_actuator_call(ledger_target, tmp_path):
    """A slow commit: the check before the write passed, the deadline is gone when it returns.
    The row stays pending (the next leader settles it); the actuator is not called."""
    decisions = _one_decision(tmp_path)
    ledger = open_ledger(ledger_target)
    calls = iter([True])  # begin_action's check before its write; the one after the commit fails
    ledger.take_fence(Fence(4, "a", lambda: next(calls, False)))
    act = _Recording()
    with pytest.raises(Fenced, match="passed while the write committed"):
        reconcile(decisions, [act], ledger, tick=1, enforce=True, actual=set())
    assert act.calls == []
    assert [r["status"] for r in ledger.actions()] == ["pending"]
    settler = open_ledger(ledger_target)
    assert settler.settle_pending(actual=set()) == 1  # what a new leader does on taking over
    assert [r["status"] for r in settler.actions()] == ["interrupted"]
    settler.close()
    ledger.close()
