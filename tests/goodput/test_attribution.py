"""The pure attribution core as decision tables: every second of wall time to one cause.

Each case builds a job's step series (a job stepping at 1 s per step, sampled every 5 s),
the scheduler's runs and the ledger's episodes, and checks where the time went, which
entity and seam were named, and that the causes add up to wall time exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from seamguard.goodput import CAUSES, Cause, Episode, JobSeries, Run, attribute, ettr_over_time, fleet

P, S, RB, RS, ST, DG, UN = (c.value for c in (Cause.PRODUCTIVE, Cause.CHECKPOINT_STALL, Cause.ROLLBACK,
                                                Cause.RESTART, Cause.STRAGGLER, Cause.DEGRADED,
                                                Cause.UNATTRIBUTED))


def stepping(t_end: float, rate=lambda t: 1.0, dt: float = 5.0, t0: float = 0.0, down=(), back=None):
    """Samples every ``dt`` of a job doing ``rate(t)`` steps per second; NaN inside ``down``
    intervals; ``back=(t, step)`` sets the counter back to ``step`` at ``t`` (a restore)."""
    t = np.arange(t0, t_end + 1e-9, dt)
    step = np.zeros_like(t)
    s = 0.0
    for i in range(1, t.size):
        if back is not None and t[i - 1] < back[0] <= t[i]:
            s = back[1]
        elif not any(a <= t[i - 1] < b for a, b in down):
            s += rate(t[i - 1]) * dt
        step[i] = s
    for a, b in down:
        step[(t > a) & (t < b)] = np.nan
    return t, step


def check_tiles(g) -> None:
    assert sum(g.by_cause_s.values()) == pytest.approx(g.wall_s, abs=1e-6)
    assert sum(s.seconds for s in g.spans) == pytest.approx(g.wall_s, abs=1e-6)
    for a, b in zip(g.spans, g.spans[1:]):
        assert a.end_s == pytest.approx(b.start_s, abs=1e-9)


def test_steady_job_is_all_productive() -> None:
    t, step = stepping(600)
    g = attribute("j", 0, 600, JobSeries.of(t, step))
    check_tiles(g)
    assert g.wall_s == 600 and g.by_cause_s[P] == pytest.approx(600) and g.ettr == pytest.approx(1.0)
    assert g.steps_new == 600 and g.steps_redone == 0 and g.step_clean_s == pytest.approx(1.0)


def test_checkpoint_stall_is_the_stalled_share_of_step_time() -> None:
    t, step = stepping(600)
    stall = np.where(t > 300, 0.25, 0.0)  # from 300 s on, a quarter of each step waits on its snapshot
    g = attribute("j", 0, 600, JobSeries.of(t, step, np.ones_like(t), stall))
    check_tiles(g)
    assert g.by_cause_s[S] == pytest.approx(0.25 * 300, abs=0.3)
    assert {s.seam for s in g.spans if s.cause == S} == {"checkpoint"}


def test_requeue_gap_is_restart_and_recomputation_is_rollback_named_after_the_move() -> None:
    # runs 0-300 and 360-600; checkpoint at step 240, so steps 241..300 are done twice
    t, step = stepping(600, down=[(300, 360)], back=(360, 240))
    step[(t >= 360)] = 240 + (t[t >= 360] - 360)
    runs = [Run(0, 300, "REQUEUED", "n1"), Run(360, math.inf, "RUNNING", "n2")]
    eps = [Episode(290, 290, Cause.RESTART, "loop-a", "coolant_flow", "move_job j (loop-a flow low)")]
    g = attribute("j", 0, 600, JobSeries.of(t, step), runs, eps)
    check_tiles(g)
    assert g.by_cause_s[RS] == pytest.approx(60)
    assert g.by_cause_s[RB] == pytest.approx(60, abs=0.5)
    assert g.by_cause_s[P] == pytest.approx(480, abs=0.5)
    lost = {(s.cause, s.entity, s.seam) for s in g.spans if s.cause in (RS, RB)}
    assert lost == {(RS, "loop-a", "coolant_flow"), (RB, "loop-a", "coolant_flow")}
    assert g.steps_redone == 60


def test_requeue_without_a_ledger_action_names_the_scheduler() -> None:
    t, step = stepping(400, down=[(200, 260)])
    runs = [Run(0, 200, "NODE_FAIL", "n7"), Run(260, math.inf, "RUNNING", "n8")]
    g = attribute("j", 0, 400, JobSeries.of(t, step), runs)
    check_tiles(g)
    gap = [s for s in g.spans if s.cause == RS]
    assert [(s.entity, s.seam) for s in gap] == [("n7", "scheduler")] and "NODE_FAIL" in gap[0].why


def test_in_job_recovery_without_the_scheduler_is_restart_then_rollback() -> None:
    t, step = stepping(600, back=(302, 250))  # the runtime restored step 250 between 300 and 305
    g = attribute("j", 0, 600, JobSeries.of(t, step))
    check_tiles(g)
    assert g.by_cause_s[RS] == pytest.approx(5)
    assert g.by_cause_s[RB] == pytest.approx(50, abs=1)
    assert any("went back from 300 to 250" in s.why for s in g.spans if s.cause == RS)


@pytest.mark.parametrize("episodes, cause, entity, seam", [
    ([Episode(200, 400, Cause.STRAGGLER, "h1/mlx5_0-leaf1", "link_latency", "link degraded", 1)],
     ST, "h1/mlx5_0-leaf1", "link_latency"),
    ([Episode(200, 400, Cause.DEGRADED, "h1/mlx5_0-leaf1", "avoid_link", "avoid_link in effect")],
     DG, "h1/mlx5_0-leaf1", "avoid_link"),
    # both: the unhealthy entity wins over the action taken about it
    ([Episode(200, 400, Cause.DEGRADED, "rail1", "avoid_link", "avoid_link in effect"),
      Episode(250, 400, Cause.STRAGGLER, "gpu3", "compute", "gpu degraded", 1)], ST, "gpu3", "compute"),
    ([], P, "j", "none"),  # slower steps that nothing explains stay productive: the job progressed
])
def test_slow_steps_go_to_what_explains_them(episodes, cause, entity, seam) -> None:
    t, step = stepping(600, rate=lambda x: 0.5 if 250 <= x < 350 else 1.0)  # half speed for 100 s
    g = attribute("j", 0, 600, JobSeries.of(t, step), (), episodes)
    check_tiles(g)
    slow = [s for s in g.spans if 250 <= s.start_s < 350 and s.cause != P]
    if cause == P:
        assert not slow and g.by_cause_s[P] == pytest.approx(600)
    else:
        assert g.by_cause_s[cause] == pytest.approx(50, abs=0.5)  # 100 s at half speed: 50 s lost
        assert {(s.cause, s.entity, s.seam) for s in slow} == {(cause, entity, seam)}


@pytest.mark.parametrize("episodes, cause", [
    ((), UN),
    ((Episode(0, math.inf, Cause.STRAGGLER, "gpu1", "xid", "gpu failed", 5),), ST),
])
def test_no_progress_is_straggler_when_explained_else_unattributed(episodes, cause) -> None:
    t, step = stepping(300, rate=lambda x: 0.0 if 100 <= x < 200 else 1.0)
    g = attribute("j", 0, 300, JobSeries.of(t, step), (), episodes)
    check_tiles(g)
    assert g.by_cause_s[cause] == pytest.approx(100)


def test_scheduler_down_wins_over_an_unhealthy_entity() -> None:
    t, step = stepping(300, down=[(100, 160)])
    eps = [Episode(50, 250, Cause.STRAGGLER, "link9", "latency", "link degraded", 1)]
    g = attribute("j", 0, 300, JobSeries.of(t, step), [Run(0, 100, "REQUEUED"), Run(160, 400, "RUNNING")], eps)
    check_tiles(g)
    assert g.by_cause_s[RS] == pytest.approx(60) and g.by_cause_s[ST] == pytest.approx(0)
    assert {s.entity for s in g.spans if s.cause == RS} == {"link9"}  # open when the job stopped


def test_wall_time_starts_at_the_first_start_and_ends_at_the_last_end() -> None:
    t, step = stepping(500, t0=100)
    g = attribute("j", 0, 1000, JobSeries.of(t, step), [Run(100, 500, "COMPLETED")])
    check_tiles(g)
    assert g.wall_s == 400


def test_no_series_leaves_running_time_unattributed() -> None:
    t = np.arange(0, 101, 5.0)
    g = attribute("j", 0, 100, JobSeries.of(t, np.full(t.shape, np.nan)), [Run(0, 100, "COMPLETED")])
    check_tiles(g)
    assert g.by_cause_s[UN] == pytest.approx(100) and g.notes


def test_fleet_sums_jobs_and_ettr_over_time_per_bucket() -> None:
    t, step = stepping(600)
    a = attribute("a", 0, 600, JobSeries.of(t, step))
    t2, step2 = stepping(600, rate=lambda x: 0.0 if x >= 300 else 1.0)
    b = attribute("b", 0, 600, JobSeries.of(t2, step2))
    f = fleet([a, b], 0, 600)
    assert f.wall_s == 1200 and f.by_cause_s[UN] == pytest.approx(300) and f.ettr == pytest.approx(0.75)
    pts = ettr_over_time([a, b], [0, 300, 600])
    assert [p["ettr"] for p in pts] == [pytest.approx(1.0), pytest.approx(0.5)]
    assert set(pts[0]["by_cause_s"]) == set(CAUSES)


@pytest.mark.parametrize("build, msg", [
    (lambda: JobSeries.of([0, 1], [0, 1, 2]), "different lengths"),
    (lambda: JobSeries.of([0, 2, 1], [0, 1, 2]), "increase strictly"),
    (lambda: attribute("j", 5, 5, JobSeries.of([0, 1], [0, 1])), "must be after"),
])
def test_bad_input_is_one_line_error(build, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        build()


@pytest.mark.parametrize("episodes, entity, seam", [
    ([Episode(280, 280, Cause.RESTART, "cdu-a", "coolant_flow", "move_job train (cdu-a flow low)")],
     "cdu-a", "coolant_flow"),
    ([Episode(-400, -400, Cause.RESTART, "cdu-a", "coolant_flow", "long before: explains nothing")], "j", "runtime"),
])
def test_a_gap_in_the_series_is_restart_named_after_an_action_just_before(episodes, entity, seam) -> None:
    t, step = stepping(600, down=[(300, 360)])
    step[t >= 360] = 250 + (t[t >= 360] - 360)  # back at step 250 after the gap: 50 steps redone
    g = attribute("j", 0, 600, JobSeries.of(t, step), (), episodes)
    check_tiles(g)
    assert g.by_cause_s[RS] == pytest.approx(60)  # from the last sample before the gap (300) to the first after
    assert g.by_cause_s[RB] == pytest.approx(50, abs=1)
    assert {(s.entity, s.seam) for s in g.spans if s.cause in (RS, RB)} == {(entity, seam)}


@pytest.mark.parametrize("bump, cause", [(True, RS), (False, UN)])
def test_stepless_time_around_a_generation_bump_is_restart(bump, cause) -> None:
    # 20 s without a step (a worker lost, noticed, replaced); the generation advances mid-way
    t, step = stepping(300, rate=lambda x: 0.0 if 100 <= x < 120 else 1.0)
    gen = np.where(t >= 110, 1.0, 0.0) if bump else np.zeros_like(t)
    g = attribute("j", 0, 300, JobSeries.of(t, step, generation=gen))
    check_tiles(g)
    assert g.by_cause_s[cause] == pytest.approx(20)
    if bump:
        assert {(s.entity, s.seam) for s in g.spans if s.cause == RS} == {("j", "runtime")}
        assert any("generation advanced" in s.why for s in g.spans if s.cause == RS)


def test_stepless_time_before_a_bump_that_steps_back_is_the_same_recovery() -> None:
    # a worker lost at 100 s: no step until 120 s, when the job resumes 2 steps back in the
    # sample where the generation advances (a scrape that missed the recovering phase)
    t = np.arange(0.0, 300.0 + 1e-9, 5.0)
    step = np.where(t < 100, t, np.where(t < 120, 100.0, t - 22.0))
    gen = np.where(t >= 120, 1.0, 0.0)
    g = attribute("j", 0, 300, JobSeries.of(t, step, generation=gen))
    check_tiles(g)
    assert g.by_cause_s[UN] == 0
    assert g.by_cause_s[RS] >= 20


def test_ledger_rows_become_episodes_of_the_jobs_entities_only() -> None:
    from seamguard.goodput.evidence import episodes_from_ledger

    trs = [{"t_s": 10, "entity": "link1", "kind": "link", "from_state": "healthy", "to_state": "degraded",
            "reasons": [{"channel": "link_errors", "score": 0.2, "value": 3.0, "unit": "/s"},
                        {"channel": "link_latency", "score": 0.9, "value": 80.0, "unit": "us"}]},
           {"t_s": 40, "entity": "link1", "kind": "link", "from_state": "degraded", "to_state": "healthy", "reasons": []},
           {"t_s": 20, "entity": "gpu9", "kind": "gpu", "from_state": "healthy", "to_state": "failed", "reasons": []}]
    acts = [{"t_s": 50, "op": "apply", "key": "avoid_link:link1", "status": "done", "target": "link1", "cause": "link1",
             "reason": "errors"},
            {"t_s": 90, "op": "revert", "key": "avoid_link:link1", "status": "done", "target": "link1", "cause": ""},
            {"t_s": 60, "op": "apply", "key": "move_job:j@loop", "status": "failed", "target": "j", "cause": "loop"},
            {"t_s": 70, "op": "apply", "key": "not a key", "status": "done", "target": "x", "cause": ""}]
    eps = episodes_from_ledger(trs, acts, "j", {"link1"})
    assert [(e.cause, e.entity, e.seam, e.start_s, e.end_s) for e in eps] == [
        (Cause.STRAGGLER, "link1", "link_latency", 10, 40), (Cause.DEGRADED, "link1", "link_latency", 50, 90)]


MOVE = Episode(290, 290, Cause.RESTART, "loop-a", "coolant_flow", "move_job j (loop-a flow low)")


def _requeued(steps_again_s: float, later: Episode):
    """A move requeues the job at 300 (checkpoint at step 240); its next allocation starts at 340
    and steps again from ``steps_again_s``; ``later`` is another restarting action after the move."""
    t, step = stepping(600, down=[(300, steps_again_s)], back=(steps_again_s, 240))
    step[(t >= steps_again_s)] = 240 + (t[t >= steps_again_s] - steps_again_s)
    runs = [Run(0, 300, "REQUEUED", "n1"), Run(340, math.inf, "RUNNING", "n2")]
    g = attribute("j", 0, 600, JobSeries.of(t, step), runs, [MOVE, later])
    check_tiles(g)
    return g


def test_start_up_after_a_requeue_is_charged_to_what_requeued_the_job_not_a_later_action() -> None:
    # another node is drained (320) while the job is pending: 300-360 is still the move's
    g = _requeued(360, Episode(320, 320, Cause.RESTART, "h1/gpu0", "xid", "drain_node h1 (XID 79)"))
    assert g.by_cause_s[RS] == pytest.approx(60)
    lost = {(s.cause, s.entity) for s in g.spans if s.cause in (RS, RB)}
    assert lost == {(RS, "loop-a"), (RB, "loop-a")}


def test_an_action_on_the_new_allocation_during_its_start_up_is_charged_to_it() -> None:
    g = _requeued(380, Episode(350, 350, Cause.RESTART, "n2/gpu3", "xid", "restart_job j (n2 XID 79)"))
    by = {}
    for s in g.spans:
        if s.cause == RS:
            by[s.entity] = by.get(s.entity, 0.0) + s.seconds
    assert by["loop-a"] == pytest.approx(50, abs=5.1) and by["n2/gpu3"] == pytest.approx(30, abs=5.1)


def _flagged(flag_s: float, evidence_since_s: float | None) -> list[dict]:
    """link1 flagged degraded at ``flag_s`` (its evidence from ``evidence_since_s``), healthy at 400."""
    flag = {"t_s": flag_s, "entity": "link1", "kind": "link", "from_state": "healthy", "to_state": "degraded",
            "reasons": [{"channel": "latency", "score": 0.9, "value": 40.0, "unit": "ratio"}]}
    if evidence_since_s is not None:
        flag["evidence_since_s"] = evidence_since_s
    return [flag, {"t_s": 400, "entity": "link1", "kind": "link", "from_state": "degraded", "to_state": "healthy"}]


def _gray_link(flag_s: float, evidence_since_s: float | None):
    """The job at half speed 200-400 s on link1 (`_flagged`)."""
    from seamguard.goodput.evidence import episodes_from_ledger

    trs = _flagged(flag_s, evidence_since_s)
    t, step = stepping(600, rate=lambda x: 0.5 if 200 <= x < 400 else 1.0)
    g = attribute("j", 0, 600, JobSeries.of(t, step), (), episodes_from_ledger(trs, [], "j", {"link1"}))
    check_tiles(g)
    return g


@pytest.mark.parametrize("flag_s, evidence_s, straggler_s", [
    (250, 200, 100),  # evidence from the slowdown's start: all 100 s lost are the link's
    (250, None, 75),  # nothing says when it began: from the flag on (75 s of the 100)
    (250, 230, 85),  # evidence began 30 s into the slowdown: the 15 s before it stay productive
])
def test_a_gray_entity_is_charged_from_when_its_evidence_began_not_from_its_flag(
        flag_s, evidence_s, straggler_s) -> None:
    g = _gray_link(flag_s, evidence_s)
    assert g.by_cause_s[ST] == pytest.approx(straggler_s, abs=0.5)
    assert g.by_cause_s[P] == pytest.approx(600 - straggler_s, abs=0.5)
    early = [s for s in g.spans if s.cause == ST and s.start_s < flag_s]
    assert bool(early) == (evidence_s is not None)
    assert all("evidence began" in s.why for s in early)


def test_back_dating_stops_at_the_entitys_previous_state_change() -> None:
    from seamguard.goodput.evidence import episodes_from_ledger

    before = [{"t_s": 100, "entity": "link1", "kind": "link", "from_state": "healthy", "to_state": "degraded"},
              {"t_s": 220, "entity": "link1", "kind": "link", "from_state": "degraded", "to_state": "healthy"}]
    eps = episodes_from_ledger(before + _flagged(250, 150), [], "j", {"link1"})
    assert sorted((e.start_s, e.end_s) for e in eps) == [(100, 220), (220, 400)]


def test_evidence_onset_is_the_unbroken_run_of_watched_ticks_before_the_flag() -> None:
    from seamguard.goodput.evidence import evidence_onset

    ticks = np.arange(0.0, 101.0)  # the controller ticked every second
    watched = np.r_[10.0, 11.0, np.arange(60.0, 101.0)]  # gray at 10-11, then from 60 on (flagged at 100)
    assert evidence_onset(100.0, ticks, watched) == 60.0
    assert evidence_onset(100.0, ticks, watched, floor_s=75.0) == 75.0  # its previous state change
    assert evidence_onset(100.0, ticks, watched, lookback_s=30.0) == 70.0
    assert evidence_onset(100.0, ticks, np.array([100.0])) == 100.0  # watched only at the flag
    assert evidence_onset(100.0, ticks, watched[:-1]) == 100.0  # not watched at the last tick: unbroken from nothing
    assert evidence_onset(100.0, np.array([]), watched) == 100.0  # no series persisted: the flag


def test_read_ledger_finds_each_flags_evidence_onset_in_the_ledgers_series(tmp_path) -> None:
    """Through a real ledger: ticks and the link's watched rows as the runner persists them."""
    from seamguard.assess.assessment import Reason, Transition
    from seamguard.assess.states import State
    from seamguard.fleet.model import Kind
    from seamguard.goodput.sources import read_ledger
    from seamguard.ledger import Ledger, open_reader
    from seamguard.ledger.series import SeriesTick, encode_fleet

    T = 1_000_000.0
    led = Ledger(tmp_path / "l.db")
    try:
        fleet_vec = encode_fleet([1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], None, None, np.zeros(0), np.zeros((0, 3)))
        for k in range(120):
            t = T + k
            gray = 40 <= k <= 119 or k == 5  # a lone gray tick at 5, then from 40 on; flagged at 70
            ents = (("link", "link1", 0.6, np.zeros(3, dtype=np.float32)),) if gray else ()
            led.record_series(SeriesTick(k, t, t, fleet_vec, ents))
        led.record_transitions(70, [Transition(T + 70, Kind.LINK, 0, "link1", State.HEALTHY, State.DEGRADED, 0.6,
                                               0.1, 0.5, (Reason("latency", 0.9, 40.0, "ratio"),))])
        led.record_transitions(71, [Transition(T + 71, Kind.NODE, 0, "n9", State.HEALTHY, State.DEGRADED, 0.6,
                                               0.1, 0.5, ())])  # no rows of its own: its flag
    finally:
        led.close()
    reader = open_reader(tmp_path / "l.db")
    try:
        trs, _ = read_ledger(reader, T, T + 200, onsets_from_s=T)
        plain, _ = read_ledger(reader, T, T + 200)
    finally:
        reader.close()
    since = {r["entity"]: r.get("evidence_since_s") for r in trs}
    assert since == {"link1": T + 40, "n9": T + 71}
    assert all("evidence_since_s" not in r for r in plain)


def test_a_jobs_entities_include_the_switches_its_traffic_crosses() -> None:
    """A gray leaf (the assessment may blame a slow link on the leaf its peers share) costs the job."""
    from seamguard.fleet.topology import parse_topology
    from seamguard.goodput.evidence import job_entities

    topo = {"version": 1, "cooling_loops": [{"name": "cdu", "rated_flow_lpm": 480}],
            "racks": [{"name": "r1", "cooling_loop": "cdu"}], "storage_paths": ["nfs"],
            "switches": [{"name": n, "tier": t} for n, t in (("leaf-a", "leaf"), ("leaf-b", "leaf"),
                                                              ("leaf-c", "leaf"), ("spine", "spine"))],
            "uplinks": [{"leaf": x, "spine": "spine"} for x in ("leaf-a", "leaf-b", "leaf-c")],
            "nodes": [{"name": n, "rack": "r1", "storage": "nfs", "gpus": 1, "nics": [{"rail": 0, "leaf": lf}]}
                      for n, lf in (("n1", "leaf-a"), ("n2", "leaf-a"), ("n3", "leaf-b"), ("n4", "leaf-c"))],
            "jobs": [{"name": "one_leaf", "class": "high_sync_training", "nodes": ["n1", "n2"]},
                     {"name": "two_leaves", "class": "high_sync_training", "nodes": ["n3", "n4"]}]}
    fleet = parse_topology(topo)
    one, two = job_entities(fleet, "one_leaf"), job_entities(fleet, "two_leaves")
    assert "leaf-a" in one and not one & {"leaf-b", "leaf-c", "spine", "leaf-a~spine"}
    assert {"leaf-b", "leaf-c", "leaf-b~spine", "leaf-c~spine", "spine"} <= two
    assert not two & {"leaf-a", "leaf-a~spine", "n1", "n2"}
