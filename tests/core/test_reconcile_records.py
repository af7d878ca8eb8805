"""The log actuator's records do not hide another actuator's unfinished action (act/reconcile.py)."""

from __future__ import annotations

from seamguard.act import LogActuator
from seamguard.act.base import ActionResult
from seamguard.act.reconcile import observe_all, reconcile
from seamguard.decide.actions import Action, ActionKey, Decisions, Verb

KEY = "move_job:job-00@loop-001"


class TwoPhaseMove:
    """A move held only after its second apply (a Slurm move: mark + checkpoint, then requeue)."""

    name, verbs = "slurm", frozenset({Verb.MOVE_JOB})

    def __init__(self) -> None:
        self.applies = 0

    def observe(self) -> set[str]:
        return {KEY} if self.applies >= 2 else set()

    def apply(self, action: Action) -> ActionResult:
        self.applies += 1
        return ActionResult(True, f"phase {self.applies}")

    def revert(self, key: str) -> ActionResult:
        return ActionResult(True)


def _decisions() -> Decisions:
    ak = ActionKey.parse(KEY)
    return Decisions(t_s=0.0, desired={KEY: Action(key=KEY, verb=ak.verb, target=ak.entity, target_kind="job")})


def test_a_move_logged_but_unfinished_elsewhere_is_applied_again_until_held(tmp_path):
    log, slurm = LogActuator(tmp_path / "a.jsonl"), TwoPhaseMove()
    for tick in range(3):
        reconcile(_decisions(), [slurm, log], None, tick, enforce=True)
    assert slurm.applies == 2  # phase 2 reached, then held: not applied a third time
    assert observe_all([slurm, log]) == {KEY}


def test_with_the_log_alone_its_records_are_what_is_in_effect(tmp_path):
    log = LogActuator(tmp_path / "a.jsonl")
    reconcile(_decisions(), [log], None, 0, enforce=True)
    assert observe_all([log]) == {KEY}
    assert reconcile(_decisions(), [log], None, 1, enforce=True) == []
