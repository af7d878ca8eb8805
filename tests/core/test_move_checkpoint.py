"""A job move asks the job for a checkpoint first, once per move (decide/checkpoints.plan_move_checkpoints).

Found by the seam drill under Slurm: the planner moved the job off a loop losing flow before
its risk pricing asked for a checkpoint (that came 4 s later, after the requeue), so the
requeued job restarted from a checkpoint 65 steps old. A requeue loses everything since the
last persisted checkpoint for certain: the move's checkpoint is asked with the move.
The fleet is test_planner_stages' (loop-000 degraded: job-00 and job-01 are moved off it),
and test_shed's for a shed inference job (loop-001 harmful: job-03 is shed, no checkpoint).
"""

from seamguard.decide import planner as pl
from seamguard.decide.actions import Verb

from .test_planner_stages import J0, J1, LOOP0_BAD, F, _a, _pol
from .test_shed import HARM, loop1, name


def _policy(**actions):
    pol = _pol("actions", **actions)
    return pol.model_copy(update={"breaker": pol.breaker.model_copy(update={"enabled": False})})


def _ckpts(desired) -> dict[str, str]:
    return {a.target: k for k, a in desired.items() if a.verb == Verb.CHECKPOINT_NOW}


def _moves(desired) -> dict[str, str]:
    return {a.target: k for k, a in desired.items() if a.verb == Verb.MOVE_JOB}


def test_a_new_move_asks_its_training_job_for_a_checkpoint_once():
    pol, a = _policy(), _a(kinds=LOOP0_BAD)
    dec, st = pl.decide(F, a, pol, pl.DecideState(), set())
    moves, ckpts = _moves(dec.desired), _ckpts(dec.desired)
    assert {J0, J1} <= set(moves)
    for job in (J0, J1):
        assert ckpts.get(job) == f"checkpoint_now:{job}@t{int(a.t_s)}", sorted(dec.desired)
    assert dict(st.move_checkpoints) == {moves[J0]: a.t_s, moves[J1]: a.t_s}
    assert dict(st.checkpoints)[J0] == a.t_s  # the work since the last checkpoint counts from it

    # next tick, the move still on its way (Slurm's grace before the requeue): the same key, not a new one
    dec2, st2 = pl.decide(F, _a(t_s=a.t_s + 1.0, kinds=LOOP0_BAD), pol, st, set())
    assert {j: _ckpts(dec2.desired).get(j) for j in (J0, J1)} == {j: ckpts[j] for j in (J0, J1)}

    # once a move is in effect (requeued) nothing is carried for it; the other still carries its own
    dec3, st3 = pl.decide(F, _a(t_s=a.t_s + 2.0, kinds=LOOP0_BAD), pol, st2, {moves[J0]})
    assert _ckpts(dec3.desired).get(J0) != ckpts[J0] and _ckpts(dec3.desired).get(J1) == ckpts[J1]
    assert dict(st3.move_checkpoints) == {moves[J1]: a.t_s}

    # a move no longer desired forgets its checkpoint: a later move asks again
    _, st4 = pl.decide(F, _a(t_s=a.t_s + 3.0), pol, st3, set())
    assert st4.move_checkpoints == ()


def test_a_shed_inference_job_gets_no_checkpoint():
    dec, st = pl.decide(F, loop1(HARM), _policy(move_job_domain_states=["harmful"]), pl.DecideState(), set())
    assert name("job-03") in _moves(dec.desired) and name("job-03") not in _ckpts(dec.desired)
    assert st.move_checkpoints == ()


def test_the_move_checkpoints_survive_a_controller_restart():
    pol, a = _policy(), _a(kinds=LOOP0_BAD)
    _, st = pl.decide(F, a, pol, pl.DecideState(), set())
    assert st.move_checkpoints
    back = pl.DecideState.from_json(st.to_json())
    assert back.move_checkpoints == st.move_checkpoints
    assert pl.DecideState.from_json({"breaker": st.breaker.to_json()}).move_checkpoints == ()


def test_a_recent_request_serves_the_move_and_an_old_one_does_not():
    """Young's spacing, as for episodes: a job asked 30 s ago is not asked again for its move (the
    detection benchmark's loop faults asked twice per job before); one asked a day ago is."""
    pol, a = _policy(), _a(kinds=LOOP0_BAD)
    recent = a.t_s - 30.0
    dec, st = pl.decide(F, a, pol, pl.DecideState(checkpoints=((J0, recent),)), set())
    assert J0 in _moves(dec.desired)
    assert _ckpts(dec.desired)[J0] == f"checkpoint_now:{J0}@t{int(recent)}", sorted(dec.desired)
    assert dict(st.move_checkpoints)[_moves(dec.desired)[J0]] == recent

    dec2, _ = pl.decide(F, a, pol, pl.DecideState(checkpoints=((J0, a.t_s - 86400.0),)), set())
    assert _ckpts(dec2.desired)[J0] == f"checkpoint_now:{J0}@t{int(a.t_s)}"
