"""seamguard.app.eval: matching, coverage and figures on hand-written labels and timelines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seamguard.app.eval import EvalInputError, Incident, Relations, load_labels, parse_labels, read_timeline, score
from seamguard.fleet import FleetShape, generate_fleet

T0 = 1_800_000_000.0


@pytest.fixture(scope="module")
def rel():
    # 16 nodes, 4 per rack, 2 racks per loop: loop-000 holds gpu000..gpu007, loop-001 gpu008..gpu015
    return Relations(generate_fleet(FleetShape(gpus=128, racks_per_loop=2, nodes_per_storage_path=8), seed=0))


def tr(t, kind, entity, to, frm="healthy"):
    return {"t": T0 + t, "entity": entity, "kind": kind, "from": frm, "to": to, "action": None}


def act(t, verb, kind, target, cause=None):
    a = {"op": "apply", "key": f"{verb}:{target}:{t}", "verb": verb, "target": target}
    if cause:
        a["cause"] = cause
    return {"t": T0 + t, "entity": target, "kind": kind, "from": None, "to": None, "action": a}


def inc(i, kind, entity, fault, start, hard=None, end=None):
    return Incident(i, kind, entity, fault, T0 + start, None if hard is None else T0 + hard,
                    None if end is None else T0 + end)


def test_detection_delay_lead_and_family(rel):
    incs = [inc("a", "gpu", "gpu003/gpu2", "fail_slow_gpu", 100, hard=400),
            inc("b", "cooling_loop", "loop-001", "cooling_loop_flow", 200, hard=500),
            inc("c", "nic", "gpu005/mlx5_1", "ib_symbol_errors", 100)]
    events = [tr(160, "node", "gpu003", "degraded"),          # a GPU's node: detects a, delay 60
              tr(230, "gpu", "gpu012/gpu7", "degraded"),      # a GPU on loop-001: detects b, delay 30
              tr(90, "nic", "gpu005/mlx5_1", "degraded"),     # before c's start (tolerance 0): not a detection
              tr(130, "nic", "gpu005/mlx5_1", "quarantine", "degraded")]  # an escalation inside: detects c
    res = score(incs, events, rel, tolerance_s=0)
    by = {i["id"]: i for i in res["incidents"]}
    assert by["a"]["delay_s"] == 60 and by["a"]["lead_s"] == 240
    assert by["b"]["delay_s"] == 30 and by["b"]["lead_s"] == 270
    assert by["c"]["delay_s"] == 30
    assert res["overall"]["recall"] == 1.0
    assert res["overall"]["median_delay_s"] == 30.0
    # The nic flagged 10 s before its incident's start is outside the window: a false flag.
    assert res["false_flags"] == {"nic:gpu005/mlx5_1": 1}
    # With the default 60 s tolerance it is covered and detects c at -10 s.
    res = score(incs, events, rel)
    assert {i["id"]: i["delay_s"] for i in res["incidents"]}["c"] == -10
    assert res["overall"]["false_flags"] == 0 and res["overall"]["precision"] == 1.0


def test_rack_or_loop_above_a_gpu_does_not_detect_it_and_is_a_false_flag(rel):
    incs = [inc("a", "gpu", "gpu003/gpu2", "thermal_interface", 100)]
    events = [tr(150, "cooling_loop", "loop-000", "degraded"), tr(150, "rack", "rack-0000", "degraded")]
    res = score(incs, events, rel)
    assert res["overall"]["recall"] == 0.0
    assert res["overall"]["false_flags"] == 2 and res["overall"]["precision"] == 0.0
    assert res["incidents"][0]["missed_hard_failure"] is False


def test_false_flags_actions_drains_and_checkpoints(rel):
    incs = [inc("a", "gpu", "gpu003/gpu2", "ecc_sbe", 100, hard=300)]
    job_of_gpu003 = rel.fleet.job_names[rel.fleet.node_job[3]]
    other_node = "gpu010"
    events = [tr(130, "gpu", "gpu003/gpu2", "degraded"),
              act(160, "checkpoint_now", "job", job_of_gpu003),
              act(190, "checkpoint_now", "job", job_of_gpu003),
              act(200, "drain", "node", "gpu003"),
              tr(210, "gpu", "gpu010/gpu1", "degraded"),
              act(220, "drain", "node", other_node),                       # a healthy node drained
              act(230, "label_degraded", "node", "gpu011", cause="gpu003/gpu2"),  # covered through its cause
              tr(1000, "gpu", "gpu003/gpu2", "healthy", "degraded"),
              tr(5000, "gpu", "gpu003/gpu2", "degraded")]       # a new episode long after: open-ended, covered
    res = score(incs, events, rel)
    o = res["overall"]
    assert o["actions"] == 5 and o["false_actions"] == 1 and o["healthy_drains"] == 1
    assert res["false_actions"] == {f"drain node:{other_node}": 1}
    assert o["checkpoint_requests"] == 2 and o["checkpoint_requests_per_fault"] == 2.0
    assert o["max_checkpoint_requests_per_fault"] == 2
    assert res["incidents"][0]["actions"] == 4
    assert res["false_flags"] == {"gpu:gpu010/gpu1": 1}
    assert o["flagged_entities"] == 2 and o["precision"] == 0.5
    # An end closes coverage after the grace period: the late flag becomes false.
    res = score([inc("a", "gpu", "gpu003/gpu2", "ecc_sbe", 100, end=400)], events, rel, grace_s=600)
    assert "gpu:gpu003/gpu2" in res["false_flags"]


def test_a_jobs_checkpoint_belongs_to_the_incident_on_its_cause(rel):
    f = rel.fleet
    j = int(f.node_job[3])
    a_node, b_node = [f.node_names[i] for i in np.flatnonzero(f.node_job == j)[:2]]
    job = f.job_names[j]
    incs = [inc("a", "node", a_node, "power_brake", 100), inc("b", "node", b_node, "power_brake", 200)]
    events = [act(300, "checkpoint_now", "job", job, cause=a_node), act(900, "checkpoint_now", "job", job, cause=a_node),
              act(400, "checkpoint_now", "job", job, cause=b_node)]
    res = score(incs, sorted(events, key=lambda e: e["t"]), rel)
    rows = {r["id"]: r for r in res["incidents"]}
    # b started later and covers the job too, but the first two were asked for a's node
    assert (rows["a"]["checkpoint_requests"], rows["b"]["checkpoint_requests"]) == (2, 1)
    assert rows["a"]["max_checkpoint_requests_per_job"] == 2
    assert res["overall"]["max_checkpoint_requests_per_fault_and_job"] == 2
    # asked for a node of the same job that no incident covers: a false action, not a's or b's
    c_node = next(f.node_names[i] for i in np.flatnonzero(f.node_job == j)[2:])
    res = score(incs, sorted(events + [act(500, "checkpoint_now", "job", job, cause=c_node)], key=lambda e: e["t"]), rel)
    assert [r["checkpoint_requests"] for r in res["incidents"]] == [2, 1]
    assert res["false_actions"] == {f"checkpoint_now job:{job}": 1}


def test_storage_incident_covers_jobs_writing_there_and_maintenance_is_no_incident(rel):
    f = rel.fleet
    path = f.storage_names[0]
    jobs_on = {f.job_names[j] for j in f.node_job[f.node_storage == 0].tolist() if j >= 0}
    jobs_off = set(f.job_names) - {f.job_names[j] for j in f.node_job[f.node_storage == 0].tolist() if j >= 0}
    incs = [inc("s", "storage", path, "storage_slow", 0),
            inc("m", "node", "gpu014", "maintenance", 0, end=600)]
    events = [tr(60, "storage", path, "degraded")]
    events += [act(90, "checkpoint_now", "job", j) for j in sorted(jobs_on)]
    events += [act(90, "checkpoint_now", "job", j) for j in sorted(jobs_off)]
    events += [tr(100, "node", "gpu014", "failed"), act(100, "drain", "node", "gpu014"),
               tr(700, "node", "gpu014", "healthy", "failed"),
               tr(2000, "node", "gpu014", "degraded")]  # after the window and its grace: false
    res = score(incs, events, rel)
    o = res["overall"]
    assert o["incidents"] == 1 and res["maintenance_windows"] == 1
    # jobs writing elsewhere are false, except the one running on the node in maintenance (planned work)
    planned_job = f.job_names[f.node_job[f.node_names.index("gpu014")]]
    assert o["false_actions"] == len(jobs_off - {planned_job}) and o["healthy_drains"] == 0
    assert res["false_flags"] == {"node:gpu014": 1}


def test_without_topology_names_relate_gpus_to_nodes():
    incs = [inc("a", "node", "gpu003", "power_brake", 0)]
    res = score(incs, [tr(30, "gpu", "gpu003/gpu1", "degraded"), tr(30, "gpu", "gpu004/gpu1", "degraded")])
    assert res["overall"]["recall"] == 1.0 and res["false_flags"] == {"gpu:gpu004/gpu1": 1}
    assert res["rules"]["topology"] is False


def test_labels_yaml_json_and_errors(tmp_path):
    y = tmp_path / "l.yaml"
    y.write_text("version: 1\nincidents:\n- {kind: gpu, entity: n1/gpu0, fault: xid, start: 2025-01-31T12:00:00Z,"
                 " hard_failure: '2025-01-31T12:10:00+00:00', id: INC-7}\n- {kind: node, entity: n2, fault: m,"
                 " start: 1738324800}\n")
    a, b = load_labels(y)
    assert a.id == "INC-7" and a.start == 1738324800.0 and a.hard_failure == 1738325400.0
    assert b.id == "#2" and b.start == 1738324800.0
    j = tmp_path / "l.json"
    j.write_text(json.dumps([{"kind": "gpu", "entity": "x", "fault": "f", "start": 5}]))
    assert load_labels(j)[0].start == 5.0
    bad = [({"incidents": [{"kind": "gpu", "entity": "x", "fault": "f"}]}, "start: missing"),
           ({"incidents": [{"kind": "blade", "entity": "x", "fault": "f", "start": 1}]}, "kind: 'blade'"),
           ({"incidents": [{"kind": "gpu", "entity": "x", "fault": "f", "start": "noon"}]}, "cannot read time"),
           ({"incidents": [{"kind": "gpu", "entity": "x", "fault": "f", "start": "2025-01-31T12:00:00"}]}, "time zone"),
           ({"incidents": [{"kind": "gpu", "entity": "x", "fault": "f", "start": 9, "end": 1}]}, "end is before"),
           ({"incidents": [{"kind": "gpu", "entity": "x", "fault": "f", "start": 9, "colour": 1}]}, "unknown field"),
           ({"version": 2, "incidents": []}, "unsupported labels version"),
           ("text", "expected a mapping")]
    for data, msg in bad:
        with pytest.raises(EvalInputError, match=msg):
            parse_labels(data, "l.yaml")
    t = tmp_path / "t.jsonl"
    t.write_text('{"t": 1, "entity": null}\nnot json\n')
    with pytest.raises(EvalInputError, match=r"t.jsonl:2: not a JSON object"):
        read_timeline(t)


def test_check_labels_names_what_would_make_the_score_meaningless(rel):
    from seamguard.app.eval import check_labels

    good = [inc("a", "gpu", "gpu003/gpu2", "fail_slow_gpu", 100), inc("b", "cooling_loop", "loop-001", "flow", 200)]
    events = [tr(50, "gpu", "gpu003/gpu2", "degraded"), tr(400, "node", "gpu009", "degraded")]
    assert check_labels(good, events, rel) == ([], [])
    # A typo in an entity, or a kind that does not match the topology, is an error, not a silent miss.
    typo = [*good, inc("c", "gpu", "nosuch/gpu9", "xid", 100), inc("d", "node", "loop-000", "flow", 100)]
    errors, _ = check_labels(typo, events, rel)
    assert errors == ["incident c: gpu 'nosuch/gpu9' is not in the topology",
                      "incident d: 'loop-000' is a cooling_loop in the topology, labelled node"]
    # Without a topology nothing can be checked against it.
    assert check_labels(typo, events, Relations()) == ([], [])
    # Labels of another window: no incident overlaps the events; one overlap is enough.
    later = [inc("e", "gpu", "gpu003/gpu2", "xid", 10_000), inc("f", "gpu", "gpu003/gpu1", "xid", -5_000, end=-4_000)]
    errors, warnings = check_labels(later, events, rel)
    assert errors == [] and len(warnings) == 1 and "none of the 2 incidents overlaps" in warnings[0]
    assert check_labels([*later, good[0]], events, rel) == ([], [])
    assert check_labels(good, [], rel)[1] == ["the timeline holds no events: every incident counts as missed"]
