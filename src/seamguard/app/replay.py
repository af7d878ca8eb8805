"""`seamguard replay`: what the controller would have done over a stretch of history.

Steps Frames (from any source, in time order) through a dry-run Controller and turns
each tick's report into event records — one per state change and one per decision
that appears, is withdrawn or is held by the breaker — as JSON lines with the fields
`t, entity, kind, from, to, gfs, prs, fae, reasons, action`. The live controller
(`seamguard run`) writes the same records, so a backtest and a live run compare line
by line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import IO

from seamguard.control import Controller, TickReport
from seamguard.decide.actions import Action
from seamguard.observe.frame import Frame


def _reasons(reasons) -> list[dict]:
    return [{"channel": r.channel, "score": r.score, "value": None if r.value != r.value else r.value,
             "unit": r.unit} for r in reasons]


def _action(op: str, a: Action | None, key: str) -> dict:
    if a is None:
        return {"op": op, "key": key}
    return {"op": op, "key": a.key, "verb": a.verb.value, "target": a.target, "cause": a.cause, "reason": a.reason,
            "benefit_gpu_h_per_h": a.benefit_gpu_h_per_h, "cost_gpu_h_per_h": a.cost_gpu_h_per_h}


class EventStream:
    """Turns consecutive TickReports into event records (remembers the last desired set)."""

    def __init__(self) -> None:
        self.desired: dict[str, Action] = {}
        self.held: set[str] = set()

    def events(self, rep: TickReport, extra: dict | None = None) -> list[dict]:
        out: list[dict] = []
        base = dict(extra or {})
        if rep.error:
            out.append({"t": rep.t_s, "entity": None, "kind": "controller", "from": None, "to": None,
                        "gfs": None, "prs": None, "fae": None, "reasons": [], "action": None,
                        "error": rep.error, **base})
            return out
        if rep.assessment is not None:
            for tr in rep.assessment.transitions:
                out.append({"t": tr.t_s, "entity": tr.entity, "kind": tr.kind.label,
                            "from": tr.from_state.label, "to": tr.to_state.label, "gfs": tr.gfs,
                            "prs": tr.prs, "fae": tr.fae, "reasons": _reasons(tr.reasons), "action": None,
                            **base})
        d = rep.decisions
        if d is not None:
            for key, a in d.desired.items():
                if key not in self.desired:
                    out.append(self._decision(rep.t_s, "apply", a, key, base))
            for key, a in self.desired.items():
                if key not in d.desired and not a.verb.one_shot:
                    out.append(self._decision(rep.t_s, "revert", a, key, base))
            held = {a.key: a for a in d.held}
            for key, a in held.items():
                if key not in self.held:
                    ev = self._decision(rep.t_s, "held", a, key, base)
                    ev["action"]["breaker"] = d.breaker_reason
                    out.append(ev)
            self.desired = dict(d.desired)
            self.held = set(held)
        return out

    @staticmethod
    def _decision(t: float, op: str, a: Action, key: str, base: dict) -> dict:
        return {"t": t, "entity": a.target, "kind": a.target_kind, "from": None, "to": None, "gfs": None,
                "prs": None, "fae": None, "reasons": [{"channel": c, "score": s, "value": v, "unit": u}
                                                      for c, s, v, u in a.evidence],
                "action": _action(op, a, key), **base}


def replay(ctl: Controller, frames: Iterable[Frame], out: IO[str]) -> Iterator[tuple[Frame, TickReport]]:
    """Tick ``ctl`` over ``frames`` in order, writing events to ``out``; yields each frame with its report."""
    stream = EventStream()
    last_t = None
    for frame in frames:
        if last_t is not None and frame.t_s <= last_t:
            raise ValueError(f"frames out of order: {frame.t_s} after {last_t}")
        last_t = frame.t_s
        rep = ctl.tick(frame)
        extra = {"flags": list(frame.flags)} if frame.flags else None
        for ev in stream.events(rep, extra):
            out.write(dumps(ev) + "\n")
        yield frame, rep


def _clean(o: object) -> object:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    return o


def dumps(ev: dict) -> str:
    """Strict JSON of one event (NaN/Inf become null)."""
    return json.dumps(_clean(ev), allow_nan=False)


def detected_faults(events: Iterable[dict], faults: list[dict], to_fault_time=lambda ev: ev["t"]) -> dict[str, dict]:
    """Which ground-truth faults the events detect: a non-healthy transition of the faulted
    entity at or after the fault's start (the demo's rule). ``faults`` as written by
    `twin serve --truth-out`; ``to_fault_time`` maps an event to the fault clock.

    Returns {entity: {"kind", "start_s", "detected_s" or None}}.
    """
    first: dict[tuple[str, str], float] = {}
    for ev in events:
        if ev.get("to") in (None, "healthy") or ev.get("entity") is None:
            continue
        t = to_fault_time(ev)
        k = (ev["kind"], ev["entity"])
        for f in faults:
            if (f["entity_kind"], f["entity"]) == k and t >= f["start_s"] and k not in first:
                first[k] = t
    return {f["entity"]: {"kind": f["kind"], "start_s": f["start_s"],
                          "detected_s": first.get((f["entity_kind"], f["entity"]))} for f in faults}
