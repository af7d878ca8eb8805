"""`seamguard demo`: the control plane against the twin, scored against ground truth.

Runs the same seeded scenario twice — with the controller in the loop (enforcing on the
twin) and without — and reports, per injected fault, whether and when it was detected,
the lead time before its hard failure or throttling, the action taken, every action on
an entity no fault touched, and useful throughput with and without control.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from seamguard.assess.assessment import Transition
from seamguard.assess.states import State
from seamguard.control import Controller, TickReport
from seamguard.decide.policy import Policy, default_policy
from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.fleet.model import Fleet, Kind
from seamguard.ledger.sqlite import Ledger
from seamguard.twin.actuator import TwinActuator
from seamguard.twin.faults import FaultKind, FaultSpec, FaultTruth, default_scenario
from seamguard.twin.telemetry import Twin, TwinConfig

_TARGET_KIND = {"node": Kind.NODE, "job": Kind.JOB, "link": Kind.LINK, "storage": Kind.STORAGE,
                "cooling_loop": Kind.COOLING_LOOP}


@dataclass
class RunResult:
    twin: Twin
    transitions: list[Transition] = field(default_factory=list)
    applied: list[dict] = field(default_factory=list)  # {t_s, key, verb, target, target_kind, reason}
    tick_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    breaker_tripped: bool = False
    breaker_reason: str = ""


def build(gpus: int, minutes: float, seed: int, tick_s: float = 5.0,
          faults: list[FaultSpec] | None = None) -> tuple[Fleet, list[FaultSpec], TwinConfig]:
    fleet = generate_fleet(FleetShape(gpus=gpus), seed=seed)
    duration_s = minutes * 60.0
    specs = faults if faults is not None else default_scenario(fleet, duration_s, seed)
    # The demo compresses one diurnal cycle into the run so the swing is exercised.
    cfg = TwinConfig(tick_s=tick_s, diurnal_period_s=duration_s)
    return fleet, specs, cfg


def run(fleet: Fleet, faults: list[FaultSpec], cfg: TwinConfig, minutes: float, seed: int, control: bool,
        policy: Policy | None = None, ledger: Ledger | None = None,
        on_tick: Callable[[Twin, TickReport | None], None] | None = None) -> RunResult:
    twin = Twin(fleet, faults, cfg, seed)
    res = RunResult(twin)
    ctl = None
    if control:
        pol = policy or default_policy(mode="enforce")
        ctl = Controller(fleet, pol, [TwinActuator(twin)], ledger=ledger, tick_s=cfg.tick_s, mode="enforce")
    n_ticks = int(round(minutes * 60.0 / cfg.tick_s))
    for _ in range(n_ticks):
        frame = twin.step()
        rep = None
        if ctl is not None:
            ctl.set_fleet(twin.placement_fleet())
            rep = ctl.tick(frame)
            res.tick_s.append(rep.tick_s)
            if rep.error:
                res.errors.append(rep.error)
            if rep.assessment is not None:
                res.transitions.extend(rep.assessment.transitions)
            for ch in rep.changes:
                if ch.op == "apply" and ch.status == "done" and ch.action is not None:
                    a = ch.action
                    res.applied.append({"t_s": frame.t_s, "key": a.key, "verb": a.verb.value, "target": a.target,
                                        "target_kind": a.target_kind, "reason": a.reason,
                                        "cause": a.cause, "detail": ch.detail})
        if on_tick is not None:
            on_tick(twin, rep)
    res.breaker_tripped = ctl.breaker.tripped if ctl is not None else False
    res.breaker_reason = ctl.breaker.reason if ctl is not None else ""
    return res


def _detection(truth: FaultTruth, transitions: list[Transition]) -> Transition | None:
    s = truth.spec
    for tr in transitions:
        if tr.kind == s.entity_kind and tr.index == s.index and tr.t_s >= s.start_s and tr.to_state != State.HEALTHY:
            return tr
    return None


def _first_action(truth: FaultTruth, fleet: Fleet, applied: list[dict]) -> dict | None:
    for a in applied:
        kind = _TARGET_KIND[a["target_kind"]]
        if a["t_s"] >= truth.spec.start_s and fleet.index_of(kind, a["target"]) in truth.affected[kind]:
            return a
    return None


def _explained(a: dict, truths: list[FaultTruth], fleet: Fleet) -> bool:
    """Is an action on an entity some fault touched, after that fault started?

    Jobs move during a run, so an action on a job counts by its cause (the node or loop
    that drove it), not by where the job sat when the fault began.
    """
    if a["target_kind"] == "job":
        cause = a["cause"]
        kind = Kind.COOLING_LOOP if cause in fleet.loop_names else Kind.NODE
        idx = fleet.index_of(kind, cause)
    else:
        kind = _TARGET_KIND[a["target_kind"]]
        idx = fleet.index_of(kind, a["target"])
    return any(idx in t.affected[kind] and a["t_s"] >= t.spec.start_s for t in truths)


def evaluate(with_ctl: RunResult, without: RunResult) -> dict:
    """Score a controlled run against the ground truth of its faults."""
    tw, fleet = with_ctl.twin, with_ctl.twin.fleet
    rows, delays = [], []
    thermal_leads: list[float] = []
    for truth, base_truth in zip(tw.truth, without.twin.truth):
        s = truth.spec
        det = _detection(truth, with_ctl.transitions)
        act = _first_action(truth, fleet, with_ctl.applied)
        row = {"fault": s.kind.value, "entity": truth.entity, "start_s": s.start_s,
               "detected": det is not None, "detected_s": det.t_s if det else None,
               "delay_s": round(det.t_s - s.start_s, 1) if det else None,
               "state": det.to_state.label if det else None,
               "evidence": [r.channel for r in det.reasons[:3]] if det else [],
               "action": f"{act['verb']} {act['target']}" if act else None,
               "action_s": act["t_s"] if act else None, "lead_time_s": None}
        if det is not None:
            delays.append(det.t_s - s.start_s)
            if s.kind == FaultKind.GPU_ECC_ESCALATION and truth.hard_failure_s is not None:
                row["lead_time_s"] = round(truth.hard_failure_s - det.t_s, 1)
            if s.kind == FaultKind.COOLING_FLOW_LOSS:
                # When clocks dropped without control (with control, work may have moved away).
                throttle = base_truth.throttle_s if base_truth.throttle_s is not None else truth.throttle_s
                if throttle is not None:
                    row["lead_time_s"] = round(throttle - det.t_s, 1)
                    thermal_leads.append(throttle - det.t_s)
        rows.append(row)

    false_actions = [a for a in with_ctl.applied if not _explained(a, tw.truth, fleet)]
    false_transitions = [tr for tr in with_ctl.transitions
                         if tr.to_state != State.HEALTHY and
                         not any(tr.index in t.affected[tr.kind] and tr.t_s >= t.spec.start_s for t in tw.truth)]
    n_detected = sum(r["detected"] for r in rows)
    return {
        "gpus": fleet.count(Kind.GPU),
        "faults": len(rows),
        "detected": n_detected,
        "missed": len(rows) - n_detected,
        "false_actions": len(false_actions),
        "false_transitions": len(false_transitions),
        "actions": len(with_ctl.applied),
        "median_detection_delay_s": round(statistics.median(delays), 1) if delays else None,
        "thermal_lead_time_s": round(min(thermal_leads), 1) if thermal_leads else None,
        "useful_throughput_with_control": round(with_ctl.twin.useful_throughput(), 4),
        "useful_throughput_without_control": round(without.twin.useful_throughput(), 4),
        "job_failures_with_control": int(with_ctl.twin.jobs.failures.sum()),
        "job_failures_without_control": int(without.twin.jobs.failures.sum()),
        "tick_s_p50": round(statistics.median(with_ctl.tick_s), 4) if with_ctl.tick_s else None,
        "controller_errors": len(with_ctl.errors),
        "breaker_tripped": with_ctl.breaker_tripped,
        "fault_table": rows,
        "false_action_list": false_actions[:20],
    }
