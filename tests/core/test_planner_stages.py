"""Decision tables for decide's stages, each on its own (inputs -> expected outputs).

The pipeline as a whole is exercised by test_hygiene, test_breaker, test_failsafe and the
demo; here each stage function of decide/planner.py, decide/checkpoints.py,
decide/freeze.py, decide/restrictions.py and the breaker's bounds is fed a small
synthetic assessment of a 16-node fleet and checked against what it should decide.

The fleet (FleetShape(gpus=128, racks_per_loop=2), seed 3): nodes gpu000..gpu015, loop-000
holds gpu000-007 and loop-001 gpu008-015, racks of 4; gpu000 and gpu015 idle; job-00
(high sync, criticality 3) on gpu001-006, job-01 (high sync, 1) on gpu007-009, job-02
(pipeline, 1) on gpu010-011, job-03 (async inference, 0.3) on gpu012-013, job-04
(latency inference, 2) on gpu014.
"""

from dataclasses import replace

import numpy as np
import pytest

from seamguard.assess.admissibility import ADMISSIBILITY_COLUMNS
from seamguard.assess.assessment import ASSESSED_KINDS, Assessment, KindAssessment
from seamguard.assess.evidence import Evidence
from seamguard.assess.quality import FreezeView, FrozenScope
from seamguard.assess.states import State, StateVector
from seamguard.decide import breaker as bk
from seamguard.decide import checkpoints as ck
from seamguard.decide import default_policy
from seamguard.decide import freeze as fz
from seamguard.decide import planner as pl
from seamguard.decide import restrictions as rs
from seamguard.decide.actions import Action, ActionKey
from seamguard.decide.breaker import BreakerState, InEffect, Request
from seamguard.fleet import FleetShape, Kind, generate_fleet

F = generate_fleet(FleetShape(gpus=128, racks_per_loop=2), seed=3)
POL = default_policy(mode="enforce")
H, D, CU, Q, HARM, FAIL = (State.HEALTHY, State.DEGRADED, State.CHECKPOINT_UNSAFE, State.QUARANTINE,
                           State.HARMFUL, State.FAILED)
J0, J1, J2, J3 = F.job_names[:4]
SPINE_LINK = int(np.flatnonzero(F.link_nic < 0)[0])  # leaf-u000-r0~spine-00
NIC_LINK = 0  # gpu000/mlx5_0~leaf-u000-r0: a NIC's own link


def test_fleet_is_as_the_tables_assume():
    assert list(F.node_job) == [-1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, -1]
    assert list(F.node_loop) == [0] * 8 + [1] * 8 and list(F.node_rack) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert F.names(Kind.LINK)[SPINE_LINK] == "leaf-u000-r0~spine-00"


def _kind(kind: Kind, n: int, state=None, gfs=None, dwell=None, score=None, fae=None) -> KindAssessment:
    sv = StateVector.initial(n)
    st = np.full(n, H, dtype=np.int8)
    for i, s in (state or {}).items():
        st[i] = s
    dw = np.zeros(n, dtype=np.int32)
    for i, d in (dwell or {}).items():
        dw[i] = d
    sc = np.zeros((n, 1))
    for i, s in (score or {}).items():
        sc[i, 0] = s
    ev = Evidence(kind, ("probe",), ("x",), sc, sc * 10.0, np.zeros(n, bool), np.zeros(n, bool))
    g = np.zeros(n)
    for i, v in (gfs or {}).items():
        g[i] = v
    fa = np.zeros(n)
    for i, v in (fae or {}).items():
        fa[i] = v
    return KindAssessment(kind, ev, g, np.zeros(n), fa, replace(sv, state=st, dwell=dw), np.zeros(n))


def _a(t_s=1000.0, node=None, domain=None, admissible=None, node_gfs=None, kinds=None) -> Assessment:
    """A synthetic assessment: all healthy and admissible unless told (node: {i: state},
    domain: {i: (compute, fabric, facilities, storage)}, admissible: {i: set of columns},
    kinds: {Kind: dict of _kind's keyword arguments})."""
    n = F.count(Kind.NODE)
    ns = np.full(n, H, dtype=np.int8)
    for i, s in (node or {}).items():
        ns[i] = s
    dom = np.zeros((n, 4), dtype=np.int8)
    dom[:, 0] = ns
    for i, row in (domain or {}).items():
        dom[i] = row
    adm = np.ones((n, len(ADMISSIBILITY_COLUMNS)), dtype=bool)
    for i, cols in (admissible or {}).items():
        adm[i] = [c in cols for c in ADMISSIBILITY_COLUMNS]
    g = np.zeros(n)
    for i, v in (node_gfs or {}).items():
        g[i] = v
    ks = {k: _kind(k, F.count(k), **(kinds or {}).get(k, {})) for k in ASSESSED_KINDS}
    return Assessment(t_s=t_s, kinds=ks, node_gfs=g, node_state=ns, node_domain_state=dom, admissible=adm)


def _pol(section: str, **kw):
    return POL.model_copy(update={section: getattr(POL, section).model_copy(update=kw)})


def _act(key: str, cause: str = "", target_kind: str = "node") -> Action:
    ak = ActionKey.parse(key)
    return Action(key=key, verb=ak.verb, target=ak.entity, target_kind=target_kind, cause=cause or ak.entity)


NODE_INDEX = {n: i for i, n in enumerate(F.node_names)}


# ---- planner: weights, spares ----------------------------------------------------------

@pytest.mark.parametrize("exponent, node, weight", [
    (1.0, 0, 0.5),  # idle: idle_criticality
    (1.0, 1, 3.0),  # job-00
    (1.0, 14, 2.0),  # job-04
    (2.0, 12, 0.09),  # job-03, 0.3 squared
    (2.0, 15, 0.5),  # idle is not raised to the exponent
])
def test_criticality_weights(exponent, node, weight):
    crit, node_w = pl.criticality_weights(F, _pol("objective", criticality_exponent=exponent))
    assert node_w[node] == pytest.approx(weight)
    assert crit == pytest.approx(F.job_criticality ** exponent)


@pytest.mark.parametrize("a, in_effect, free, drained", [
    (_a(), set(), [0, 15], set()),
    (_a(), {"drain:gpu015", "label_degraded:gpu000=none"}, [0], {"gpu015"}),  # a label does not take a spare
    (_a(node={0: D}), set(), [15], set()),  # not healthy
    (_a(admissible={15: {"high_sync_training"}}), set(), [0], set()),  # not admissible for everything
])
def test_spare_nodes(a, in_effect, free, drained):
    f, d = pl.spare_nodes(F, a, in_effect)
    assert np.flatnonzero(f).tolist() == free and d == drained


# ---- planner: drains ----------------------------------------------------------------------

def _drains(a, in_effect=frozenset(), policy=POL):
    _, node_w = pl.criticality_weights(F, policy)
    free, drained_now = pl.spare_nodes(F, a, set(in_effect))
    mask = np.isin(a.node_state, pl._codes(policy.actions.drain_states))
    return pl.plan_drains(F, a, policy, node_w, mask, free, drained_now)


def test_drains_none_when_no_node_is_in_a_drain_state():
    assert _drains(_a(node={3: D, 4: CU})) == []


def test_drains_failed_first_then_most_harmful_and_failed_is_hard():
    out = _drains(_a(node={15: Q, 3: FAIL, 0: HARM}, node_gfs={15: 0.9, 3: 0.1, 0: 0.95}))
    assert [(a.key, r.nodes, r.hard) for a, r in out] == [
        ("drain:gpu003", (3,), True), ("drain:gpu000", (0,), False), ("drain:gpu015", (15,), False)]
    # a failed node or an idle one is drained outright: no economics
    assert all(a.benefit_gpu_h_per_h == 0.0 and a.cost_gpu_h_per_h == 0.0 for a, _ in out)
    assert out[0][0].reason.startswith("seamguard: failed ")


@pytest.mark.parametrize("gfs, drained_now, drained", [
    (0.95, (), True),  # pays
    (0.0, (), False),  # does not pay: not drained
    (0.0, ("drain:gpu003",), True),  # does not pay, but drained already: stays
])
def test_drain_of_a_busy_node_is_priced(gfs, drained_now, drained):
    a = _a(node={3: Q}, node_gfs={3: gfs}, kinds={Kind.GPU: {"gfs": {24: gfs}, "score": {24: gfs}}})
    dec = pl.quarantine_pays(F, a, POL, 3, 3.0, 0.0, 2, False)
    assert (dec.action == "quarantine") == (gfs > 0)
    out = _drains(a, drained_now)
    assert [x.key for x, _ in out] == (["drain:gpu003"] if drained else [])
    if drained and gfs:
        assert out[0][0].benefit_gpu_h_per_h == round(dec.benefit_gpu_h / POL.objective.horizon_h, 3)
        assert out[0][0].evidence and out[0][0].evidence[0][0].startswith("gpu003/")


def test_each_new_drain_of_a_busy_node_uses_a_spare():
    nodes = {1: Q, 2: Q, 3: Q}
    a = _a(node=nodes, node_gfs={1: 0.99, 2: 0.98, 3: 0.97})
    spares = [pl.quarantine_pays(F, a, POL, i, 3.0, 0.0, s, False).action for i, s in ((1, 2), (2, 1), (3, 0))]
    expected = [f"drain:gpu00{i}" for i, act in zip((1, 2, 3), spares) if act == "quarantine"]
    assert [x.key for x, _ in _drains(a)] == expected


# ---- planner: labels -------------------------------------------------------------------------

@pytest.mark.parametrize("domain_row, loop_state, rack_state, expected", [
    ((H, H, D, H), D, H, "cooling_loop:loop-001"),
    ((H, H, D, H), H, D, "rack:rack-0002"),
    ((H, H, D, H), H, H, ""),  # neither is in trouble (the node's facilities column alone)
    ((D, H, D, H), D, H, ""),  # its own trouble: the node's, not the domain's
    ((H, D, D, H), D, H, ""),
])
def test_facility_domain(domain_row, loop_state, rack_state, expected):
    a = _a(domain={8: domain_row}, kinds={Kind.COOLING_LOOP: {"state": {1: loop_state}},
                                          Kind.RACK: {"state": {2: rack_state}}})
    assert pl.facility_domain(F, a, 8) == expected


def _labels(a, drained=()):
    _, node_w = pl.criticality_weights(F, POL)
    mask = np.zeros(F.count(Kind.NODE), bool)
    mask[list(drained)] = True
    return pl.plan_labels(F, a, node_w, mask)


def test_labels_decision_table():
    some = {"async_batch_inference", "latency_inference", "checkpoint_restore"}
    a = _a(node={3: D, 5: D, 6: D}, domain={3: (D, H, H, H), 4: (H, H, H, H), 5: (D, H, H, H), 6: (D, H, H, H)},
           admissible={3: some, 4: {"checkpoint_restore"}, 5: {"checkpoint_restore"}, 6: some})
    out = _labels(a, drained=(6,))
    assert [(x.key, x.reason, x.cause, r.nodes, r.domain) for x, r in out] == [
        ("label_degraded:gpu003=async_batch_inference,latency_inference,checkpoint_restore",
         "seamguard: degraded, admissible for async_batch_inference,latency_inference,checkpoint_restore",
         "gpu003", (3,), ""),
        # gpu004: admissible for no job class but not at risk: not labelled; gpu006: drained
        ("label_degraded:gpu005=none", "seamguard: admissible for no job class (no new work)", "gpu005", (5,), ""),
    ]
    assert out[0][0].params == (("classes", "async_batch_inference,latency_inference,checkpoint_restore"),)


def test_a_label_for_facility_trouble_restricts_the_domain():
    a = _a(domain={8: (H, H, D, H)}, admissible={8: {"checkpoint_restore"}},
           kinds={Kind.COOLING_LOOP: {"state": {1: D}}})
    [(x, r)] = _labels(a)
    assert (x.key, x.cause, r.domain) == ("label_degraded:gpu008=none", "loop-001", "cooling_loop:loop-001")
    assert x.reason == "seamguard: admissible for no job class (no new work) (cooling_loop:loop-001)"


def test_no_labels_where_everything_is_admissible():
    assert _labels(_a(node={3: D}, domain={3: (D, H, D, H)})) == []


# ---- planner: fabric and storage paths ------------------------------------------------------

NIC_RAIL = ("avoid_link:gpu000/mlx5_0~leaf-u000-r0", "link", "link:gpu000/mlx5_0~leaf-u000-r0")


@pytest.mark.parametrize("link_state, storage_state, drained, expected", [
    ({SPINE_LINK: Q}, H, set(), [("avoid_link:leaf-u000-r0~spine-00", "link", "link:leaf-u000-r0~spine-00")]),
    ({SPINE_LINK: D}, H, set(), []),  # degraded is not an avoid state for links
    ({NIC_LINK: FAIL}, H, {"gpu000"}, []),  # a NIC's own link on a node being drained: the drain covers it
    ({NIC_LINK: Q}, H, {"gpu001"}, [NIC_RAIL]),  # its node kept (drain did not pay): a rail to stay off
    ({}, CU, set(), [("avoid_storage:storage-000", "storage", "storage:storage-000")]),
    ({}, D, set(), []),
    ({SPINE_LINK: HARM}, FAIL, set(), [("avoid_link:leaf-u000-r0~spine-00", "link", "link:leaf-u000-r0~spine-00"),
                                       ("avoid_storage:storage-000", "storage", "storage:storage-000")]),
])
def test_path_avoidance(link_state, storage_state, drained, expected):
    a = _a(kinds={Kind.LINK: {"state": link_state, "fae": {SPINE_LINK: 1.23456}},
                  Kind.STORAGE: {"state": {0: storage_state}}})
    out = pl.plan_path_avoidance(F, a, POL.actions, drained)
    assert [(x.key, x.target_kind, r.path) for x, r in out] == expected
    if expected and expected[0][0].startswith("avoid_link:leaf"):
        assert out[0][0].benefit_gpu_h_per_h == 1.235


@pytest.mark.parametrize("gfs, expect_drain", [(0.0, False), (0.99, True)])
def test_a_gray_rail_of_a_node_kept_is_avoided_a_drained_nodes_is_not(gfs, expect_drain):
    """gpu003 (job-00) quarantined by one NIC's link: a drain that does not pay leaves the
    node running and its jobs off that rail; a drain that pays covers the link."""
    link = F.names(Kind.LINK).index("gpu003/mlx5_0~leaf-u000-r0")
    a = _a(node={3: Q}, node_gfs={3: gfs}, kinds={Kind.LINK: {"state": {link: Q}}, Kind.GPU: {"gfs": {24: gfs}}})
    dec, _ = pl.decide(F, a, POL, pl.DecideState(), set())
    keys = set(dec.desired) | {x.key for x in dec.held}
    assert ("drain:gpu003" in keys) == expect_drain
    assert ("avoid_link:gpu003/mlx5_0~leaf-u000-r0" in keys) == (not expect_drain)


# ---- planner: move_job -----------------------------------------------------------------------

def test_move_room_counts_free_and_tolerant_nodes_off_the_troubled_loops():
    off_bad = np.array([False] * 8 + [True] * 8)  # loop-000 in trouble
    a = _a()
    # job-00 (sync 1, criticality 3): job-02, -03, -04 tolerate it (5 nodes); job-01 (criticality 1): job-03 only
    assert pl.move_room(F, a, 0, off_bad, 1) == 6
    assert pl.move_room(F, a, 1, off_bad, 0) == 2
    assert pl.move_room(F, _a(node={12: D}), 1, off_bad, 0) == 1  # only healthy nodes take it


def _moves(a, in_effect=frozenset(), frozen=None, policy=POL):
    crit, _ = pl.criticality_weights(F, policy)
    free, _ = pl.spare_nodes(F, a, set(in_effect))
    return pl.plan_moves(F, a, policy, crit, free, set(in_effect), frozen)


LOOP0_BAD = {Kind.COOLING_LOOP: {"state": {0: D}, "gfs": {0: 0.9}, "score": {0: 0.9}}}
MOVE0, MOVE1 = f"move_job:{J0}@loop-000", f"move_job:{J1}@loop-000"


def test_moves_most_critical_first_where_they_fit_and_pay():
    out = _moves(_a(kinds=LOOP0_BAD))
    assert [(x.key, r.domain) for x, r in out] == [(MOVE0, "cooling_loop:loop-000"), (MOVE1, "cooling_loop:loop-000")]
    assert out[0][0].params == (("domain", "loop-000"), ("domain_kind", "cooling_loop"),
                                ("nodes", ",".join(f"gpu{i:03d}" for i in range(8))))  # what an actuator excludes
    assert out[0][0].reason == "seamguard: loop-000 degraded (probe=9)" and out[0][0].criticality == 3.0
    dec = pl.move_pays(F, POL, 0, 6, 0.9, 3.0)
    assert dec.action == "quarantine" and out[0][0].benefit_gpu_h_per_h == round(dec.benefit_gpu_h / 4.0, 3)


def test_moves_not_for_healthy_loops_low_criticality_or_other_classes():
    assert _moves(_a()) == []
    assert [x.key for x, _ in _moves(_a(kinds=LOOP0_BAD), policy=_pol("actions", move_job_min_criticality=2.0))] \
        == [MOVE0]
    assert _moves(_a(kinds=LOOP0_BAD), policy=_pol("actions", move_job_classes=["latency_inference"])) == []


def test_a_move_that_does_not_fit_is_not_asked_unless_in_effect():
    # job-00 needs 6 nodes; room is 1 idle + 5 tolerant; make 3 of them unhealthy -> no room
    a = _a(node={10: D, 11: D, 14: D}, kinds=LOOP0_BAD)
    assert [x.key for x, _ in _moves(a)] == [MOVE1]
    assert [x.key for x, _ in _moves(a, in_effect={MOVE0})] == [MOVE0, MOVE1]


def test_a_move_that_does_not_pay_is_kept_only_in_effect():
    a = _a(kinds={Kind.COOLING_LOOP: {"state": {0: D}}})  # GFS 0: nothing to gain
    assert _moves(a) == []
    assert [x.key for x, _ in _moves(a, in_effect={MOVE1})] == [MOVE1]


def test_no_new_move_off_a_frozen_loop():
    view = FreezeView((FrozenScope("cooling_loop:loop-000", "no data", 0.0),),
                      {Kind.COOLING_LOOP: np.array([True, False])})
    assert _moves(_a(kinds=LOOP0_BAD), frozen=view) == []
    assert [x.key for x, _ in _moves(_a(kinds=LOOP0_BAD), in_effect={MOVE0}, frozen=view)] == [MOVE0]


# ---- planner: breaker glue ---------------------------------------------------------------------

def test_breaker_in_effect():
    in_effect = {"drain:gpu003", "label_degraded:gpu004=none", "drain:nosuch", "avoid_link:x~y",
                 "avoid_storage:storage-000", f"checkpoint_now:{J0}@t5", f"move_job:{J0}@loop-000"}
    a = _a(kinds={Kind.COOLING_LOOP: {"state": {1: D}}})
    now = pl.breaker_in_effect(F, a, in_effect, ("cooling_loop:loop-001", "rack:rack-0002", "rack:nosuch"),
                               NODE_INDEX)
    assert now.nodes == {3, 4} and now.paths == {"link:x~y", "storage:storage-000"}
    assert now.domains == {"cooling_loop:loop-001"}  # rack-0002 recovered; an unknown domain is dropped


def test_hold_by_breaker_keeps_the_breakers_order_and_says_why():
    desired = {k: _act(k) for k in ("drain:gpu001", "drain:gpu002", "drain:gpu003")}
    out, held = pl.hold_by_breaker(desired, {"drain:gpu003": "too many", "drain:gpu001": "tripped"})
    assert list(out) == ["drain:gpu002"] and list(desired) == ["drain:gpu001", "drain:gpu002", "drain:gpu003"]
    assert [(h.key, h.reason) for h in held] == [("drain:gpu003", "; held: too many"), ("drain:gpu001", "; held: tripped")]


# ---- checkpoints ------------------------------------------------------------------------------

def test_exposure_is_the_worse_of_node_and_facilities_with_a_gfs_floor():
    hg = POL.assess.hysteresis_for(Kind.GPU)
    a = _a(node={3: D}, domain={3: (D, H, H, H), 8: (H, H, CU, H)}, node_gfs={3: 0.2, 12: 0.9})
    ex = ck.exposure(F, a, POL)
    assert ex.node_state[[3, 8, 12]].tolist() == [D, CU, H]
    assert ex.node_gfs[[3, 8, 12]].tolist() == [hg.degrade_enter, hg.quarantine_enter, 0.9]
    h1 = POL.assess.propagation.hazard_per_h_at_gfs1
    # job-00's gpu003 is degraded; gpu012 (job-03) is not exposed: no hazard for all its GFS; the
    # facilities column alone (no loop in trouble) is exposure, not hazard
    assert ex.job_hazard_per_h.tolist() == pytest.approx([h1 * 0.25, 0, 0, 0, 0])


def test_a_failing_loop_is_one_hazard_per_job_not_one_per_node():
    hg = POL.assess.hysteresis_for(Kind.GPU)
    loop1 = {Kind.COOLING_LOOP: {"state": {1: CU}, "gfs": {1: 0.6}}}  # cools gpu008..gpu015
    ex = ck.exposure(F, _a(kinds=loop1), POL)
    h = POL.assess.propagation.hazard_per_h_at_gfs1 * hg.quarantine_enter ** 2  # the state's GFS floor
    # job-01 has gpu008 and gpu009 on the loop (and gpu007 off it): the loop counts once
    assert ex.job_hazard_per_h.tolist() == pytest.approx([0, h, h, h, h])
    assert ex.node_gfs[[7, 8]].tolist() == [0.0, 0.6]


def test_jobs_to_consider():
    a = _a(node={3: D, 12: D}, domain={3: (D, H, H, H), 12: (D, H, H, H)})
    ex = ck.exposure(F, a, POL)
    assert ck.jobs_to_consider(F, ex, POL, {}, {}) == [0]  # job-03 (inference) is not checkpointed
    assert ck.jobs_to_consider(F, ex, POL, {J2: []}, {J1: 5.0, "gone": 1.0}) == [0, 1, 2]


def test_open_episodes():
    a = _a(node={3: D}, domain={3: (D, H, H, H)})
    ex = ck.exposure(F, a, POL)
    node_ht = np.zeros(F.count(Kind.NODE), dtype=np.int64)
    node_ht[1], node_ht[2] = 120, 119
    prior = [ck.Episode(J0, "gpu001", 1), ck.Episode(J0, "gpu002", 1), ck.Episode(J0, "gpu009", 2),
             ck.Episode(J0, "nosuch", 1)]
    eps = ck.open_episodes(F, 0, prior, ex, node_ht, 120, NODE_INDEX)
    # gpu001 recovered for good, gpu009 is not job-00's, nosuch unknown; gpu003 opens
    assert eps == {"gpu002": ck.Episode(J0, "gpu002", 1), "gpu003": ck.Episode(J0, "gpu003", 0)}
    eps = ck.open_episodes(F, 0, [ck.Episode(J0, "gpu003", 2)], ex, node_ht, 120, NODE_INDEX)
    assert eps == {"gpu003": ck.Episode(J0, "gpu003", 2)}  # an open one keeps its level


def test_carried_checkpoint():
    act = ck.carried_checkpoint(J0, 12.7, "gpu003")
    # the job is the target, never the cause: the carried ask is for the node it was asked for (issue 37)
    assert act.key == f"checkpoint_now:{J0}@t12" and act.cause == "gpu003" and act.target_kind == "job"
    assert act.reason == "seamguard: checkpoint asked at t=13s; not repeated while the risk episode lasts"


def _job(a, j, prior=(), last=None, policy=POL):
    crit, _ = pl.criticality_weights(F, policy)
    node_ht = pl.healthy_ticks(F, a, policy)[1]
    return ck.job_checkpoint(F, a, policy, ck.exposure(F, a, policy), j, list(prior), last, node_ht, crit, NODE_INDEX)


EXPOSED = _a(t_s=1000.0, node={3: CU}, domain={3: (CU, H, H, H)},
             kinds={Kind.GPU: {"gfs": {24: 0.9}, "score": {24: 0.9}}})


def test_a_job_exposed_anew_is_asked_for_a_checkpoint_when_it_pays():
    jc = _job(EXPOSED, 0)
    assert jc.action.key == f"checkpoint_now:{J0}@t1000" and not jc.carried
    assert jc.action.cause == "gpu003" and jc.action.reason.startswith(
        "seamguard: job exposed to checkpoint_unsafe gpu003 (gpu003/gpu0:probe=9); rollback avoided ")
    assert jc.issued == (J0, None, [ck.Episode(J0, "gpu003", 0)])
    (ep,) = jc.episodes
    assert (ep.level, ep.hazard_per_h) == (int(CU), pytest.approx(0.32)) and jc.last_s == 1000.0  # 0.5 x 0.8^2


def test_a_checkpoint_that_does_not_pay_is_not_asked():
    jc = _job(EXPOSED, 0, policy=_pol("actions", checkpoint_write_s=1e6))
    assert jc == ck.JobCheckpoint(None, False, None, [ck.Episode(J0, "gpu003", 0)], None)


def _reported(uncommitted_s: float):
    per_job = np.full(F.count(Kind.JOB), np.nan)
    per_job[0] = uncommitted_s
    return replace(EXPOSED, job_uncommitted_s=per_job)


def test_the_runtimes_reported_exposure_prices_the_checkpoint():
    interval_s = POL.assess.propagation.checkpoint_interval_h * 3600.0
    assert ck.uncommitted_and_horizon_s(EXPOSED, 0, None, interval_s) == (interval_s / 2, interval_s / 2)  # assumed
    assert ck.uncommitted_and_horizon_s(EXPOSED, 0, 400.0, interval_s) == (600.0, interval_s - 600.0)
    assert ck.uncommitted_and_horizon_s(_reported(90.0), 0, None, interval_s) == (90.0, interval_s - 90.0)
    assert ck.uncommitted_and_horizon_s(_reported(3 * interval_s), 0, None, interval_s) == (3 * interval_s, interval_s)
    # a job that just persisted has almost nothing at stake: the same risk no longer pays for a write
    assert _job(EXPOSED, 0).action is not None
    assert _job(_reported(1.0), 0).action is None
    overdue = _job(_reported(2 * interval_s), 0).action  # twice the assumed exposure, over a full interval
    assert overdue.benefit_gpu_h_per_h > _job(EXPOSED, 0).action.benefit_gpu_h_per_h


REASK = _pol("actions", reask_on_worse=True)
WORSE = replace(EXPOSED, node_state=np.where(np.arange(16) == 3, Q, H).astype(np.int8))


def test_once_per_episode_by_default_even_when_it_worsens():
    asked = [ck.Episode(J0, "gpu003", int(CU))]
    jc = _job(EXPOSED, 0, prior=asked, last=100.0)
    assert jc.carried and jc.action == ck.carried_checkpoint(J0, 100.0, "gpu003") and jc.issued is None
    assert jc.episodes == asked and jc.last_s == 100.0
    jc = _job(WORSE, 0, prior=asked, last=100.0)  # quarantine now, 900 s at stake: still the one ask
    assert jc.carried and jc.action.key.endswith("@t100") and jc.issued is None
    # another node of the job exposed later is a new risk: asked, once Young's interval has passed
    both = replace(EXPOSED, node_state=np.where(np.isin(np.arange(16), [3, 4]), CU, H).astype(np.int8))
    young = ck.reask_spacing_s(POL.actions.checkpoint_write_s, float(ck.exposure(F, both, POL).job_hazard_per_h[0]))
    jc = _job(both, 0, prior=asked, last=1000.0 - 0.5 * young)
    assert jc.carried and [(e.node, e.level) for e in jc.episodes] == [("gpu003", int(CU)), ("gpu004", 0)]
    jc = _job(both, 0, prior=asked, last=100.0)
    assert not jc.carried and jc.action.key.endswith("@t1000")
    assert [(e.node, e.level) for e in jc.episodes] == [("gpu003", int(CU)), ("gpu004", int(CU))]
    jc = _job(both, 0, prior=jc.episodes, last=1000.0)  # both asked: carried, whatever comes
    assert jc.carried


def test_with_reask_on_worse_asked_again_when_it_worsens_and_pays():
    asked = [ck.Episode(J0, "gpu003", int(CU))]
    jc = _job(WORSE, 0, prior=asked, last=100.0, policy=REASK)  # 900 s of work at stake, as when first asked
    assert not jc.carried and jc.action.key.endswith("@t1000") and jc.episodes[0].level == int(Q)
    jc = _job(WORSE, 0, prior=asked, last=990.0, policy=REASK)  # worse, but 10 s to roll back: not worth a write
    assert jc.carried and jc.action.key.endswith("@t990") and jc.episodes == asked


def test_not_asked_again_sooner_than_youngs_interval():
    asked = [ck.Episode(J0, "gpu003", int(CU))]
    hazard = float(ck.exposure(F, WORSE, POL).job_hazard_per_h[0])
    young = ck.reask_spacing_s(POL.actions.checkpoint_write_s, hazard)
    assert young == pytest.approx((2 * POL.actions.checkpoint_write_s * 3600 / hazard) ** 0.5)
    jc = _job(WORSE, 0, prior=asked, last=1000.0 - 0.9 * young, policy=REASK)  # worse and it would pay: too soon
    assert jc.carried and jc.issued is None
    jc = _job(WORSE, 0, prior=asked, last=1000.0 - 1.1 * young, policy=REASK)
    assert not jc.carried and jc.action.key.endswith("@t1000")


def test_a_failed_node_asks_no_checkpoint():
    failed = replace(EXPOSED, node_state=np.where(np.arange(16) == 3, FAIL, H).astype(np.int8))
    assert _job(failed, 0).action is None  # nothing to avoid: the failure has happened
    assert _job(failed, 0, prior=[ck.Episode(J0, "gpu003", int(CU))], last=100.0).carried


def test_reask_spacing_is_youngs_interval_at_the_jobs_hazard():
    assert ck.reask_spacing_s(20.0, 0.0) == float("inf")
    assert ck.reask_spacing_s(20.0, 2.0) == pytest.approx(268.33, abs=0.01)  # sqrt(2 x 20 s x 1800 s)


def test_asked_again_when_the_jobs_hazard_has_grown_enough():
    """Same state, but the job's failure hazard grew reask_hazard_ratio (2) times since it was asked."""
    asked_at = lambda h: [ck.Episode(J0, "gpu003", int(CU), h)]  # noqa: E731
    jc = _job(EXPOSED, 0, prior=asked_at(0.32), last=100.0, policy=REASK)  # hazard now 0.32/h: unchanged
    assert jc.carried
    jc = _job(EXPOSED, 0, prior=asked_at(0.15), last=100.0, policy=REASK)  # 0.32 >= 2 x 0.15: worse evidence
    assert not jc.carried and jc.action.key.endswith("@t1000") and jc.episodes[0].hazard_per_h == pytest.approx(0.32)
    jc = _job(EXPOSED, 0, prior=asked_at(0.15), last=100.0,
              policy=_pol("actions", reask_on_worse=True, reask_hazard_ratio=3.0))
    assert jc.carried
    assert _job(EXPOSED, 0, prior=asked_at(0.15), last=100.0).carried  # by default: once per episode


def test_worsened_decision_table():
    e = ck.Episode(J0, "n", int(Q), 0.2)
    assert ck.worsened(e, int(Q) + 1, 0.2, 2.0)  # a stricter state
    assert not ck.worsened(e, int(Q), 0.39, 2.0)  # hazard up 1.95x
    assert ck.worsened(e, int(Q), 0.40, 2.0)  # hazard up 2x
    assert not ck.worsened(ck.Episode(J0, "n", 0, 0.0), 0, 9.9, 2.0)  # never asked, not exposed


def test_plan_checkpoints_forgets_old_checkpoints_without_episodes():
    interval_s = POL.assess.propagation.checkpoint_interval_h * 3600.0
    a = _a(t_s=10_000.0)
    node_ht = pl.healthy_ticks(F, a, POL)[1]
    crit, _ = pl.criticality_weights(F, POL)
    plan = ck.plan_checkpoints(F, a, POL, (), ((J0, 10_000.0 - interval_s), (J1, 10_000.0 - interval_s + 1)),
                               node_ht, crit)
    assert plan.actions == {} and plan.episodes == [] and plan.checkpoints == {J1: 10_000.0 - interval_s + 1}


def test_plan_checkpoints_collects_new_and_carried():
    a = _a(t_s=1000.0, node={3: CU, 8: CU}, domain={3: (CU, H, H, H), 8: (CU, H, H, H)},
           kinds={Kind.GPU: {"gfs": {24: 0.9, 64: 0.9}}})
    node_ht = pl.healthy_ticks(F, a, POL)[1]
    crit, _ = pl.criticality_weights(F, POL)
    plan = ck.plan_checkpoints(F, a, POL, (ck.Episode(J1, "gpu008", int(CU)),), ((J1, 900.0),), node_ht, crit)
    assert list(plan.actions) == [f"checkpoint_now:{J0}@t1000", f"checkpoint_now:{J1}@t900"]
    assert plan.carried == {f"checkpoint_now:{J1}@t900"} and list(plan.issued) == [f"checkpoint_now:{J0}@t1000"]
    assert plan.checkpoints == {J0: 1000.0, J1: 900.0}


def test_undo_unasked_restores_the_jobs_state_before():
    before = [ck.Episode(J0, "gpu003", 1)]
    plan = ck.CheckpointPlan(
        actions={}, carried=frozenset(),
        issued={f"checkpoint_now:{J0}@t1000": (J0, 900.0, before), f"checkpoint_now:{J1}@t1000": (J1, None, []),
                f"checkpoint_now:{J2}@t1000": (J2, None, [])},
        episodes=[ck.Episode(J0, "gpu003", 2), ck.Episode(J1, "gpu008", 2), ck.Episode(J2, "gpu010", 2)],
        checkpoints={J0: 1000.0, J1: 1000.0, J2: 1000.0})
    desired = {f"checkpoint_now:{J2}@t1000": _act(f"checkpoint_now:{J2}@t1000", target_kind="job")}  # asked
    out, eps, ckpts = ck.undo_unasked(plan, desired)
    assert list(out) == [f"checkpoint_now:{J2}@t1000", f"checkpoint_now:{J0}@t900"]  # J0's earlier one carried
    assert eps == [ck.Episode(J2, "gpu010", 2), ck.Episode(J0, "gpu003", 1)]
    assert ckpts == {J0: 900.0, J2: 1000.0}
    assert list(desired) == [f"checkpoint_now:{J2}@t1000"]  # the input is not changed


# ---- freeze -------------------------------------------------------------------------------------

@pytest.mark.parametrize("act, scope", [
    (_act("drain:gpu003"), (Kind.NODE, "gpu003")),
    (_act("label_degraded:gpu003=none", cause="loop-000"), (Kind.NODE, "gpu003")),
    (_act("avoid_link:x~y", target_kind="link"), (Kind.LINK, "x~y")),
    (_act("avoid_storage:storage-000", target_kind="storage"), (Kind.STORAGE, "storage-000")),
    (_act(f"move_job:{J0}@loop-000", cause="loop-000", target_kind="job"), (Kind.COOLING_LOOP, "loop-000")),
    (_act(f"checkpoint_now:{J0}@t5", cause="gpu003", target_kind="job"), (Kind.NODE, "gpu003")),
])
def test_action_scope(act, scope):
    assert fz.action_scope(act) == scope


@pytest.mark.parametrize("key, scope", [
    ("drain:gpu003", (Kind.NODE, "gpu003")),
    ("label_degraded:gpu003=none", (Kind.NODE, "gpu003")),
    ("avoid_link:x~y", (Kind.LINK, "x~y")),
    ("avoid_storage:storage-000", (Kind.STORAGE, "storage-000")),
    (f"move_job:{J0}@loop-000", (Kind.COOLING_LOOP, "loop-000")),
    (f"checkpoint_now:{J0}@t5", (None, J0)),
])
def test_key_scope(key, scope):
    assert fz.key_scope(ActionKey.parse(key)) == scope


NODE3_FROZEN = FreezeView((FrozenScope("node:gpu003", "no data", 0.0),),
                          {Kind.NODE: np.arange(16) == 3})


@pytest.mark.parametrize("kind, target, frozen", [
    (Kind.NODE, "gpu003", True), (Kind.NODE, "gpu004", False), (Kind.NODE, "nosuch", False),
    (None, "gpu003", False), (Kind.LINK, "x~y", False)])
def test_is_frozen(kind, target, frozen):
    assert fz.is_frozen(F, NODE3_FROZEN, kind, target) is frozen


def test_drop_frozen_new():
    carried = f"checkpoint_now:{J0}@t5"
    desired = {"drain:gpu003": _act("drain:gpu003"), "drain:gpu004": _act("drain:gpu004"),
               "label_degraded:gpu003=none": _act("label_degraded:gpu003=none"),
               carried: _act(carried, cause="gpu003", target_kind="job")}
    requests = {k: Request(k) for k in desired if not k.startswith("checkpoint")}
    out, req, n = fz.drop_frozen_new(F, NODE3_FROZEN, desired, requests, {"label_degraded:gpu003=none"},
                                     frozenset({carried}))
    assert list(out) == ["drain:gpu004", "label_degraded:gpu003=none", carried] and n == 1
    assert list(req) == ["drain:gpu004", "label_degraded:gpu003=none"] and len(desired) == 4


def test_keep_frozen_in_effect():
    in_effect = {"drain:gpu003", "drain:gpu004", f"checkpoint_now:{J0}@t5", "avoid_link:nosuch"}
    out = fz.keep_frozen_in_effect(F, NODE3_FROZEN, {}, in_effect)
    assert list(out) == ["drain:gpu003"]
    assert out["drain:gpu003"].reason == \
        "seamguard: kept: its input is missing (failsafe freeze); not reverted for want of data"


def test_apply_freeze_without_scopes_changes_nothing():
    desired, requests = {"drain:gpu003": _act("drain:gpu003")}, {"drain:gpu003": Request("drain:gpu003")}
    assert fz.apply_freeze(F, None, desired, requests, set(), frozenset()) == (desired, requests, 0)
    empty = FreezeView((), {Kind.NODE: np.ones(16, bool)})
    assert fz.apply_freeze(F, empty, desired, requests, set(), frozenset()) == (desired, requests, 0)
    out, req, n = fz.apply_freeze(F, NODE3_FROZEN, desired, requests, {"drain:gpu003"}, frozenset())
    assert (list(out), list(req), n) == (["drain:gpu003"], ["drain:gpu003"], 0)  # in effect: not new


# ---- restrictions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("key, strictness", [
    ("drain:n", (3, frozenset())),
    ("label_degraded:n=none", (2, frozenset())),
    ("label_degraded:n=checkpoint_restore", (2, frozenset({"checkpoint_restore"}))),
    ("label_degraded:n=latency_inference,checkpoint_restore", (1, frozenset({"latency_inference",
                                                                            "checkpoint_restore"}))),
])
def test_strictness(key, strictness):
    assert rs.strictness(ActionKey.parse(key)) == strictness


@pytest.mark.parametrize("new, old, stricter", [
    ("drain:n", "label_degraded:n=none", True),
    ("label_degraded:n=none", "drain:n", False),
    ("label_degraded:n=none", "label_degraded:n=a,b", True),
    ("label_degraded:n=a,b", "label_degraded:n=none", False),
    ("label_degraded:n=a", "label_degraded:n=a,b", True),  # admits a subset
    ("label_degraded:n=a,b", "label_degraded:n=a", False),
    ("label_degraded:n=a", "label_degraded:n=b", False),
    ("label_degraded:n=checkpoint_restore", "label_degraded:n=none", True),  # same rank 2
])
def test_at_least_as_strict(new, old, stricter):
    assert rs.at_least_as_strict(ActionKey.parse(new), ActionKey.parse(old)) is stricter


def test_at_risk():
    a = _a(node={1: D}, domain={1: (D, H, H, H), 2: (H, D, H, H), 3: (H, H, D, H), 4: (H, H, H, D)})
    assert np.flatnonzero(rs.at_risk(a)).tolist() == [1, 2, 3]  # storage trouble alone is not a node's risk


LOOSE, NONE = "label_degraded:gpu003=latency_inference,checkpoint_restore", "label_degraded:gpu003=none"


@pytest.mark.parametrize("desired, in_effect, risky, expected", [
    ([LOOSE], {"drain:gpu003"}, True, ["drain:gpu003"]),  # looser replacement: the drain is kept instead
    ([LOOSE], {"drain:gpu003"}, False, [LOOSE]),  # risk gone: lifted
    ([], {NONE}, True, [NONE]),  # no replacement while at risk: kept
    (["drain:gpu003"], {NONE}, True, ["drain:gpu003"]),  # a stricter one replaces it
    ([NONE], {LOOSE}, True, [NONE]),
    ([], {"avoid_link:x~y", "drain:nosuch"}, True, []),  # not a node restriction / unknown node
])
def test_only_tighten(desired, in_effect, risky, expected):
    risk = np.zeros(16, bool)
    risk[3] = risky
    out = rs.only_tighten({k: _act(k) for k in desired}, in_effect, risk, NODE_INDEX)
    assert list(out) == expected
    for k in set(expected) - set(desired):
        assert out[k].reason == "seamguard: kept: gpu003 is still at risk; a restriction only tightens while it is"


def _ht(node=None, link=None, loop=None):
    node_ht = np.zeros(16, dtype=np.int64)
    kind_ht = {k: np.zeros(F.count(k), dtype=np.int64) for k in ASSESSED_KINDS}
    for arr, vals in ((node_ht, node), (kind_ht[Kind.LINK], link), (kind_ht[Kind.COOLING_LOOP], loop)):
        for i, v in (vals or {}).items():
            arr[i] = v
    return kind_ht, node_ht


@pytest.mark.parametrize("key, dwell", [
    ("drain:gpu003", (7, "gpu003")),
    ("label_degraded:gpu003=none", (7, "gpu003")),
    ("avoid_link:leaf-u000-r0~spine-00", (9, "leaf-u000-r0~spine-00")),
    ("avoid_storage:storage-000", (0, "storage-000")),
    (f"move_job:{J0}@loop-001", (11, "loop-001")),
    (f"checkpoint_now:{J0}@t5", None),
    ("avoid_link:nosuch", None),
    ("drain:nosuch", None),
])
def test_healthy_for(key, dwell):
    kind_ht, node_ht = _ht(node={3: 7}, link={SPINE_LINK: 9}, loop={1: 11})
    assert rs.healthy_for(ActionKey.parse(key), F, NODE_INDEX, kind_ht, node_ht) == dwell


@pytest.mark.parametrize("ht, desired, kept", [
    (0, [], False),  # not healthy: not this stage's to keep
    (5, [], True),
    (39, [], True),
    (40, [], False),  # healthy long enough: lifted
    (5, [NONE], False),  # a new restriction of the node replaces it
])
def test_release_dwell(ht, desired, kept):
    kind_ht, node_ht = _ht(node={3: ht})
    out = rs.release_dwell({k: _act(k) for k in desired}, {"drain:gpu003"}, F, NODE_INDEX, kind_ht, node_ht, 40)
    assert ("drain:gpu003" in out) is kept
    if kept:
        assert out["drain:gpu003"].reason == \
            f"seamguard: kept: gpu003 healthy for {ht} of 40 ticks; lifted after sustained recovery"


@pytest.mark.parametrize("ht, kept", [(0, True), (5, True), (40, False)])
def test_release_dwell_keeps_a_move_while_its_loop_is_in_trouble(ht, kept):
    """The job left loop-001 (so no move is asked for now): its exclusion stays while the loop
    is unhealthy and until it has been healthy long enough."""
    key = f"move_job:{J0}@loop-001"
    kind_ht, node_ht = _ht(loop={1: ht})
    out = rs.release_dwell({}, {key}, F, NODE_INDEX, kind_ht, node_ht, 40)
    assert (key in out) is kept
    if ht == 0:
        assert out[key].reason == "seamguard: kept: loop-001 still in trouble; the job stays off it until healthy for 40 ticks"


# ---- breaker bounds -------------------------------------------------------------------------------

CFG = POL.breaker


def _tally(nodes=(), domains=(), paths=(), window=()):
    return bk._tally(F, bk._topology(F), InEffect(set(nodes), set(domains), set(paths)), tuple(window))


def test_topology():
    topo = bk._topology(F)
    assert (topo.n_nodes, topo.n_loops, topo.n_racks, topo.n_links, topo.n_storage) == (16, 2, 4, 64, 1)
    assert topo.loop_size.tolist() == [8, 8] and topo.rack_size.tolist() == [4, 4, 4, 4]
    assert topo.leaf_size.tolist() == [16] * 8 + [0] * 8  # every node on every rail leaf; spines hold none
    assert topo.leaves(3).tolist() == list(range(8))


def test_tally_counts_nodes_one_by_one_not_those_covered_by_their_domain():
    t = _tally(nodes={1, 9}, domains={"cooling_loop:loop-001"}, window=[(0.0, "gpu002"), (0.0, "nosuch")])
    assert t.per_loop.tolist() == [1, 0] and t.covered.sum() == 8 and t.total_now() == 9
    assert t.rate_nodes == {2} and t.rate_loop.tolist() == [1, 0]


@pytest.mark.parametrize("update, nodes, new, why, trips", [
    ({}, {1}, [2], "", True),
    ({}, {1, 2}, [3], "drain:x would put 3 of 8 nodes on loop-000 under restriction (> 30%)", False),
    ({"max_in_effect_loop_fraction": 1.0}, {13, 14}, [12],
     "drain:x would put 3 of 4 nodes in rack-0003 under restriction (> 50%)", False),
    ({"max_in_effect_loop_fraction": 1.0, "max_in_effect_rack_fraction": 1.0, "max_in_effect_fleet_fraction": 1.0},
     {1, 2, 3, 4}, [5], "drain:x would put 5 of 16 nodes on leaf leaf-u000-r0 under restriction (> 30%)", False),
    ({}, {1, 8, 9}, [12], "drain:x would put 4 of 16 nodes under restriction (> 20% of the fleet in effect)", True),
])
def test_node_total_bound(update, nodes, new, why, trips):
    cfg = CFG.model_copy(update=update)
    t = _tally(nodes=nodes)
    assert bk._node_total_bound(F, cfg, bk._topology(F), t, Request("drain:x", nodes=tuple(new)), new) \
        == (why, trips)


def test_node_rate_bound():
    cfg = CFG.model_copy(update={"max_fleet_fraction": 1.0, "max_loop_fraction": 0.125, "min_nodes": 1})  # 1 of 8
    t = _tally(window=[(0.0, "gpu001")])
    assert bk._node_rate_bound(F, cfg, bk._topology(F), t, Request("drain:x"), [9]) == ("", True)
    assert bk._node_rate_bound(F, cfg, bk._topology(F), t, Request("drain:x"), [2]) == (
        "drain:x would restrict 2 of 8 nodes on loop-000 within 3600s (> 12.5% per window)", False)
    assert bk._node_rate_bound(F, cfg, bk._topology(F), t, Request("drain:x"), [1]) == ("", True), \
        "a node already in the window is not counted twice"
    # the default: 5 % of 16 nodes is 0, so the bound is min_nodes (2): the third trips
    assert bk._node_rate_bound(F, CFG, bk._topology(F), _tally(), Request("drain:x"), [2]) == ("", True)
    assert bk._node_rate_bound(F, CFG, bk._topology(F), _tally(window=[(0.0, "gpu001"), (0.0, "gpu009")]),
                               Request("drain:x"), [2]) == (
        "drain:x (gpu002) would restrict 3 of 16 nodes within 3600s (> 2: 5.0% of the fleet per window, "
        "at least 2)", True)


def test_domain_and_path_bounds():
    topo = bk._topology(F)
    assert bk._domain_bound(F, CFG, topo, _tally(), Request("l", domain="cooling_loop:loop-000")) == (
        "restricting cooling_loop:loop-000 would put 8 of 16 nodes under restriction (> 20% of the fleet)")
    assert bk._domain_bound(F, CFG, topo, _tally(domains={"rack:rack-0000"}), Request("l", domain="rack:rack-0001")) \
        == "restricting rack:rack-0001 would restrict 2 of 4 racks as a whole (> 25%)"
    links = {f"link:l{i}" for i in range(6)}
    assert bk._path_bound(CFG, topo, _tally(paths=links), Request("avoid_link:z", path="link:z")) == \
        "avoid_link:z would take 7 of 64 link paths out of use (> 10%)"
    assert bk._path_bound(CFG, topo, _tally(paths=links), Request("avoid_storage:s", path="storage:s")) == ""


def test_exceeds_checks_in_order_and_hard_evidence_skips_the_rate():
    topo, t = bk._topology(F), _tally(window=[(0.0, "gpu001"), (0.0, "gpu009")])  # the rate's 2 taken
    soft, hard = Request("drain:gpu002", nodes=(2,)), Request("drain:gpu002", nodes=(2,), hard=True)
    assert bk._exceeds(F, CFG, topo, t, soft, [2], False, False)[0].startswith("drain:gpu002 (gpu002) would restrict")
    assert bk._exceeds(F, CFG, topo, t, hard, [2], False, False) == ("", True)
    dom = Request("l", domain="cooling_loop:loop-000", path="link:z")
    assert bk._exceeds(F, CFG, topo, t, dom, [], True, True)[0].startswith("restricting cooling_loop:loop-000")


def test_count_adds_soft_nodes_to_the_rate_window_and_hard_ones_not():
    topo, t = bk._topology(F), _tally(domains={"cooling_loop:loop-001"})
    bk._count(F, topo, t, Request("drain:gpu002", nodes=(2,)), [2], 50.0)
    bk._count(F, topo, t, Request("drain:gpu003", nodes=(3,), hard=True), [3], 50.0)
    bk._count(F, topo, t, Request("drain:gpu009", nodes=(9,)), [9], 50.0)  # covered by its loop
    bk._count(F, topo, t, Request("l", nodes=(0,), domain="rack:rack-0000", path="link:z"), [], 50.0)
    assert t.restricted == {0, 2, 3, 9} and t.per_loop.tolist() == [2, 0] and t.rate_nodes == {2}
    assert t.window == ((50.0, "gpu002"),) and t.doms == {"cooling_loop:loop-001", "rack:rack-0000"}
    assert t.paths == {"link:z"}


def test_admit_holds_within_a_loop_and_trips_fleet_wide():
    cfg = CFG.model_copy(update={"max_fleet_fraction": 1.0})
    reqs = [Request(f"drain:gpu{i:03d}", nodes=(i,)) for i in (1, 2, 3, 9, 10, 11)]
    state, admitted, held = bk.admit(BreakerState(), F, cfg, 100.0, reqs, InEffect())
    assert admitted == ["drain:gpu001", "drain:gpu002", "drain:gpu009"]
    loop0 = "drain:gpu003 would put 3 of 8 nodes on loop-000 under restriction (> 30%)"  # held, no trip
    fleet = "drain:gpu010 would put 4 of 16 nodes under restriction (> 20% of the fleet in effect)"  # trips
    assert held == {"drain:gpu003": loop0, "drain:gpu010": fleet, "drain:gpu011": f"breaker tripped: {fleet}"}
    assert state.tripped and state.reason == fleet and state.tripped_at_s == 100.0
    assert state.drained == ((100.0, "gpu001"), (100.0, "gpu002"), (100.0, "gpu009"))
