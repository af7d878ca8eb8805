"""benchmarks/detection.py's outside baseline (the operator rules) and its per-alarm precision."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from seamguard.app.eval import Relations, parse_labels, score
from seamguard.scenarios import Scenario, ScenarioSpec

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rules_on(spec: ScenarioSpec):
    rules = _load("_operator_rules").OperatorRules(Scenario(spec).fleet)
    sc = Scenario(spec)
    sc.run(rules)
    return sc, rules


def test_fatal_xid_and_link_down_drain_the_node_the_fault_is_on():
    spec = ScenarioSpec(gpus=64, minutes=30, seed=11, faults=("row_remap", "nic_link_flap"))
    sc, rules = _rules_on(spec)
    by = {f.cls: f for f in sc.faults}
    drains = {e["entity"]: e for e in rules.events if e.get("action")}
    g = by["row_remap"].index
    assert sc.fleet.node_names[sc.fleet.gpu_node[g]] in drains  # XID 63
    nic = by["nic_link_flap"].index
    assert sc.fleet.node_names[sc.fleet.nic_node[nic]] in drains  # port not ACTIVE
    t0 = spec.start_unix
    first = min(e["t"] for e in rules.events if e.get("entity") == sc.fleet.gpu_names[g] and not e.get("action"))
    assert first - t0 >= by["row_remap"].start_s  # nothing before the fault


def test_rules_never_drain_a_healthy_fleet_through_its_everyday_events():
    sc, rules = _rules_on(ScenarioSpec(gpus=128, minutes=30, seed=12))
    labels = parse_labels({"incidents": sc.labels()})
    card = score(labels, rules.events, Relations(sc.fleet), tolerance_s=0.0)
    assert card["overall"]["healthy_drains"] == 0


def test_alarms_count_a_detected_incident_once_and_merge_false_flags_by_parent():
    det = _load("detection")
    sc = Scenario(ScenarioSpec(gpus=256, minutes=20, seed=13))
    f = sc.fleet
    loop_nodes = np.flatnonzero(f.node_loop == 0)
    n0, n1 = int(loop_nodes[0]), int(loop_nodes[1])
    other = int(np.flatnonzero(f.node_loop != 0)[0])
    g = lambda n, i: f.gpu_names[int(np.flatnonzero(f.gpu_node == n)[i])]  # noqa: E731
    false = [("gpu", g(n0, 0), 100.0), ("gpu", g(n0, 1), 900.0),  # one node: one alarm
             ("gpu", g(n1, 0), 200.0),  # same loop, within 5 min of the first: the same alarm
             ("gpu", g(other, 0), 3000.0),  # another loop: another alarm
             ("job", f.job_names[0], 50.0)]  # no node: an alarm of its own
    events = [{"t": t, "kind": k, "entity": e, "from": "healthy", "to": "degraded"} for k, e, t in false]
    result = {"incidents": [{"detected": True}, {"detected": True}, {"detected": False}],
              "false_flags": {f"{k}:{e}": 1 for k, e, _ in false}}
    a = det.alarms(result, events, f)
    assert a == {"alarms": 5, "correct_alarms": 2, "false_alarms": 3}
