"""Policy what-ifs on the fleet's own window: its faults replayed through the twin under each variant. Pure.

Why this file exists: `twin simulate --calibrated FILE --whatif ...` (app/twin_calibrate.py) and
`GET /api/v1/twin/whatif` (app/service/whatif.py) answer "what would enforcing instead of a dry
run, another breaker bound or a drain floor have bought over the last window?". Each answer
replays the window's own incidents — the calibrated document lists every one as [entity, left
healthy, back] (twin/calibrate.py) — through the event twin's seamguard policy once per
variant, with the same streams and the same policy seed for every variant (common random
numbers), so a difference is the variant's, not the dice's:

- **replayed** from the window: when each hard incident began and in which domain (a cause of
  that component, drawn by the causes' rates), when each gray node/GPU/link episode and each
  cooling-loop degradation began and how long it lasted;
- **drawn** (the ledger does not hold them): which twin node an entity is, a fail-slow's
  severity, whether a hard failure showed evidence ahead and how far, repairs, planned
  maintenance and link flaps — from the calibrated FailureModel (twin/calibrated.py), whose
  rates and durations are themselves drawn from their posteriors once per parameter draw.

Per variant the output gives ETTR and goodput, and the paired difference from the base
(what the variant would have bought, also in GPU-hours), each as [2.5 %, median, 97.5 %] over
draws x seeds, with the nodes the controller drained and the breaker held. A run budget is
the caller's (``stop``): the samples done when it says stop are reported, and how many.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from seamguard.decide.policy import BreakerConfig
from seamguard.twin.calibrate import GRAY, HARD
from seamguard.twin.calibrated import failure_model
from seamguard.twin.events.calibration import COMPONENTS_PER_NODE, FailureModel
from seamguard.twin.events.config import MODES, ClusterConfig, ControllerSettings, PolicyParams
from seamguard.twin.events.processes import Streams, generate_streams
from seamguard.twin.events.simulator import RunResult, simulate_streams

__all__ = ["KNOBS", "Variant", "base_settings", "parse_setting", "variants", "replay_streams", "whatif"]

#: What a what-if may vary: the name users type -> the ControllerSettings field.
KNOBS = {"mode": "mode", "breaker": "breaker_max_fleet_fraction",
         "breaker_in_effect": "breaker_max_in_effect_fleet_fraction", "breaker_window_s": "breaker_window_s",
         "breaker_min_nodes": "breaker_min_nodes", "drain_min_slowdown": "drain_min_slowdown"}
_COMM_DOMAINS = ("nic", "link", "switch")  # a gray episode there slows communication
MAX_VALUES = 12  # values of one knob in one request


@dataclass(frozen=True)
class Variant:
    """One controller setting the window is replayed under."""

    name: str
    controller: ControllerSettings


def _value(knob: str, text: str) -> object:
    field = KNOBS[knob]
    if field == "mode":
        if text not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {text!r}")
        return text
    if knob in ("breaker", "breaker_in_effect") and text == "off":
        return 1.0
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{knob} takes a number, got {text!r}") from None
    if field == "breaker_min_nodes":
        if not v.is_integer():
            raise ValueError(f"{knob} takes a whole number of nodes, got {text!r}")
        return int(v)
    return v


def parse_setting(text: str) -> tuple[str, list[tuple[str, object]]]:
    """``KNOB=V[,V...]`` -> (knob, [(as typed, value)]); a one-line ValueError naming what was wrong."""
    knob, eq, vals = str(text).partition("=")
    knob = knob.strip()
    if not eq or knob not in KNOBS:
        raise ValueError(f"{text!r}: expected KNOB=VALUE[,VALUE...] with KNOB one of {', '.join(KNOBS)}")
    items = [v.strip() for v in vals.split(",") if v.strip()]
    if not items or len(items) > MAX_VALUES:
        raise ValueError(f"{text!r}: give 1 to {MAX_VALUES} values")
    return knob, [(v, _value(knob, v)) for v in items]


def _with(base: ControllerSettings, knob: str, v: object, where: str) -> ControllerSettings:
    try:
        return replace(base, **{KNOBS[knob]: v})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def variants(base_settings: Sequence[str], whatifs: Sequence[str]) -> list[Variant]:
    """The base (what runs today: the defaults changed by ``base_settings``) first, then one variant per
    value of each ``whatifs`` item, each changing one knob of the base."""
    base = ControllerSettings()
    for text in base_settings:
        knob, vals = parse_setting(text)
        if len(vals) != 1:
            raise ValueError(f"base {text!r}: one value per knob")
        base = _with(base, knob, vals[0][1], f"base {text!r}")
    out = [Variant("base", base)]
    for text in whatifs:
        knob, vals = parse_setting(text)
        for raw, v in vals:
            name = f"{knob}={raw}"
            if name not in {x.name for x in out}:
                out.append(Variant(name, _with(base, knob, v, repr(text))))
    return out


def base_settings(mode: str, breaker: BreakerConfig) -> list[str]:
    """The settings of a controller running in ``mode`` with ``breaker`` (a policy's), as ``variants`` reads them."""
    if not breaker.enabled:
        return [f"mode={mode}", "breaker=off", "breaker_in_effect=off"]
    return [f"mode={mode}", f"breaker={breaker.max_fleet_fraction!r}",
            f"breaker_in_effect={breaker.max_in_effect_fleet_fraction!r}", f"breaker_window_s={breaker.window_s!r}",
            f"breaker_min_nodes={breaker.min_nodes}"]


# ---------------------------------------------------------------------------------------------- replay

def _rows(doc: Mapping, cls: str) -> list[tuple[str, list, int]]:
    """(domain, listed incidents, total incidents) of the document's ``cls`` hazards."""
    out = []
    for h in doc["hazards"]:
        if h.get("class") == cls:
            rec = h.get("records") or {}
            listed = [r for r in rec.get("incidents") or [] if isinstance(r, (list, tuple)) and len(r) == 3]
            out.append((h["domain"], listed, max(int(rec.get("total") or 0), len(listed))))
    return out


def _times(listed: list, total: int, t0: float, horizon_s: float, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray]:
    """(onset s, duration s) of a domain's incidents, relative to the window's start; the ones past the
    document's listing cap get onsets drawn over the window and no duration (nan)."""
    start = np.array([float(r[1]) - t0 for r in listed], dtype=float)
    end = np.array([horizon_s if r[2] is None or not math.isfinite(float(r[2])) else float(r[2]) - t0
                    for r in listed], dtype=float)
    extra = total - len(listed)
    start = np.concatenate([start, rng.random(extra) * horizon_s])
    dur = np.concatenate([np.minimum(end, horizon_s) - start[:len(listed)], np.full(extra, np.nan)])
    keep = (start >= 0) & (start < horizon_s)
    return start[keep], dur[keep]


def _hard(fm: FailureModel, nodes: int, doms: list, t0: float, horizon: float, rng: np.random.Generator):
    """The fail stream's fields: each hard incident at its onset, as a cause of its domain's component (drawn
    by the causes' rates) on a drawn node; and the incidents of domains without a cause (left out)."""
    ts, cs, ns, ks, skipped = [], [], [], [], {}
    for dom, listed, total in doms:
        idx = [i for i, c in enumerate(fm.causes) if c.component == dom]
        if not idx:
            if total and dom != "cooling_loop":
                skipped[f"{dom}/{HARD}"] = total
            continue
        t, _ = _times(listed, total, t0, horizon, rng)
        w = np.array([fm.causes[i].rate_per_component_day for i in idx], dtype=float)
        cause = rng.choice(idx, size=t.size, p=w / w.sum() if w.sum() > 0 else None)
        span = int(round(1.0 / COMPONENTS_PER_NODE[dom])) if COMPONENTS_PER_NODE[dom] < 1 else 1
        node = (rng.integers(0, max(nodes // span, 1), t.size) * span).clip(0, nodes - 1)
        ts.append(t)
        cs.append(cause)
        ns.append(node)
        ks.append(np.minimum(span, nodes - node))
    t = np.concatenate(ts) if ts else np.zeros(0)
    order = np.argsort(t, kind="stable")
    cause = (np.concatenate(cs) if cs else np.zeros(0)).astype(np.int64)[order]
    pre = np.array([c.precursor_fraction for c in fm.causes])[cause] if cause.size else np.zeros(0)
    return dict(fail_t=t[order], fail_cause=cause,
                fail_node=(np.concatenate(ns) if ns else np.zeros(0)).astype(np.int64)[order],
                fail_nnodes=(np.concatenate(ks) if ks else np.zeros(0)).astype(np.int64)[order],
                fail_has_precursor=rng.random(order.size) < pre,
                fail_lead_s=rng.exponential(fm.precursor_lead_mean_min * 60.0, order.size)), skipped


def _slow(fm: FailureModel, nodes: int, doms: list, t0: float, horizon: float, rng: np.random.Generator):
    """The fail-slow stream's fields: each gray GPU, node or fabric incident at its onset for its duration, on a
    drawn node with a drawn slowdown."""
    ts, ds, comm = [], [], []
    for dom, listed, total in doms:
        if dom not in ("gpu", "node", *_COMM_DOMAINS) or not total:
            continue
        t, d = _times(listed, total, t0, horizon, rng)
        c = (rng.random(t.size) < fm.fail_slow_comm_share) if dom == "node" else np.full(t.size, dom != "gpu")
        mean_s = np.where(c, fm.fail_slow_comm_mean_min, fm.fail_slow_compute_mean_min) * 60.0
        ts.append(t)
        ds.append(np.where(np.isnan(d), rng.exponential(1.0, t.size) * mean_s, d))
        comm.append(c)
    t = np.concatenate(ts) if ts else np.zeros(0)
    order = np.argsort(t, kind="stable")
    lo, hi = fm.fail_slow_severity_range
    return dict(slow_t=t[order], slow_node=rng.integers(0, nodes, t.size),
                slow_comm=(np.concatenate(comm) if comm else np.zeros(0, dtype=bool))[order],
                slow_dur_s=(np.concatenate(ds) if ds else np.zeros(0))[order],
                slow_sev=rng.uniform(lo, hi, t.size))


def _cool(fm: FailureModel, loops: int, gray: list, hard: list, t0: float, horizon: float,
          rng: np.random.Generator):
    """A loop's degradation replays as one; one that reached failed ends in a trip (drawn length)."""
    ts, ds, trip = [], [], []
    for rows, tripped in ((gray, False), (hard, True)):
        for dom, listed, total in rows:
            if dom != "cooling_loop" or not total:
                continue
            t, d = _times(listed, total, t0, horizon, rng)
            drawn = rng.exponential(fm.cooling_event_mean_h * 3600.0, t.size)
            ts.append(t)
            ds.append(drawn if tripped else np.where(np.isnan(d), drawn, d))
            trip.append(np.full(t.size, tripped))
    t = np.concatenate(ts) if ts else np.zeros(0)
    order = np.argsort(t, kind="stable")
    return dict(cool_t=t[order], cool_loop=rng.integers(0, loops, t.size),
                cool_dur_s=(np.concatenate(ds) if ds else np.zeros(0))[order],
                cool_trip=(np.concatenate(trip) if trip else np.zeros(0, dtype=bool))[order])


def replay_streams(doc: Mapping, cfg: ClusterConfig, rng: np.random.Generator) -> tuple[Streams, dict[str, int]]:
    """The twin's streams for the document's window (module docstring) and the incidents of domains the
    twin has no process for (left out, by domain/class)."""
    t0, horizon = float(doc["window"]["since_s"]), cfg.horizon_s
    drawn = generate_streams(cfg, rng)  # planned maintenance and link flaps: not in the ledger
    hard, gray = _rows(doc, HARD), _rows(doc, GRAY)
    fail, skipped = _hard(cfg.failures, cfg.nodes, hard, t0, horizon, rng)
    loops = max(1, -(-cfg.nodes // cfg.nodes_per_loop))
    known = {"gpu", "node", "cooling_loop", *_COMM_DOMAINS}
    skipped.update({f"{d}/{GRAY}": n for d, _, n in gray if n and d not in known})
    return replace(drawn, **fail, **_slow(cfg.failures, cfg.nodes, gray, t0, horizon, rng),
                   **_cool(cfg.failures, loops, gray, hard, t0, horizon, rng)), skipped


# ---------------------------------------------------------------------------------------------- runs

def _q(x: Sequence[float]) -> list[float] | None:
    a = np.asarray(x, dtype=float)
    return np.quantile(a, [0.025, 0.5, 0.975]).tolist() if a.size else None


def _settings(c: ControllerSettings) -> dict:
    return {f.name: getattr(c, f.name) for f in fields(c)}


def _summary(v: Variant, runs: list[RunResult], base: list[RunResult], gpu_h: float) -> dict:
    d_ettr = [r.ettr - b.ettr for r, b in zip(runs, base)]
    d_good = [r.goodput - b.goodput for r, b in zip(runs, base)]
    return {"variant": v.name, "settings": _settings(v.controller),
            "ettr": _q([r.ettr for r in runs]), "goodput": _q([r.goodput for r in runs]),
            "delta_ettr": _q(d_ettr), "delta_goodput": _q(d_good),
            "delta_gpu_hours": _q([d * gpu_h for d in d_good]),
            "better_share": float(np.mean([d > 0 for d in d_good])) if d_good else None,
            "drained_nodes": _q([r.quarantines for r in runs]),
            "held_by_breaker": _q([r.held_by_breaker for r in runs]),
            "breaker_tripped_share": float(np.mean([r.breaker_tripped_at_s is not None for r in runs]))
            if runs else None}


def whatif(doc: Mapping, cfg: ClusterConfig, variants_: Sequence[Variant], policy: PolicyParams, draws: int,
           seeds: int, seed: int, stop: Callable[[], bool] | None = None) -> dict:
    """Every variant on the window's replayed faults, ``draws`` parameter draws x ``seeds`` seeds (module
    docstring). ``cfg``: the fleet (GPUs, the window's days; its failures are the base the document's rates
    scale); ``policy``: the seamguard policy the variants change the controller of. With a measured detector
    (``policy.detection``), every other draw runs it at its recall's 95 % lower bound, so the intervals span
    the detector's measured range too, not the seeds and rates alone."""
    if not variants_ or variants_[0].name != "base":
        raise ValueError("the first variant must be the base")
    det = policy.detection
    corners = [policy] + ([replace(policy, detection=det.at_recall_bound())] if det is not None else [])
    rng = np.random.default_rng(seed)
    runs: dict[str, list[RunResult]] = {v.name: [] for v in variants_}
    skipped: dict[str, int] = {}
    done = 0
    for d in range(draws):
        if stop is not None and stop():
            break
        run_cfg = replace(cfg, failures=failure_model(doc, cfg.failures, rng))
        corner = corners[d % len(corners)]
        for k in range(seeds):
            if stop is not None and stop():
                break
            streams, skipped = replay_streams(doc, run_cfg, np.random.default_rng([seed, d, k]))
            for v in variants_:
                pp = replace(corner, controller=v.controller)
                runs[v.name].append(simulate_streams(run_cfg, pp, streams, seed=seed * 1_000_003 + d * 1009 + k))
            done += 1
    gpu_h = cfg.gpus * cfg.horizon_s / 3600.0
    base = runs["base"]
    return {"window": dict(doc["window"]), "gpus": cfg.gpus, "days": cfg.days,
            "samples": {"draws": draws, "seeds": seeds, "done": done, "asked": draws * seeds,
                        "cut_short": done < draws * seeds,
                        "detection": [c.detection.source if c.detection is not None
                                      else f"every event after {c.detection_delay_s:g} s" for c in corners]},
            "incidents_in_window": {c: sum(t for _, _, t in _rows(doc, c)) for c in (HARD, GRAY)},
            "not_replayed": skipped,
            "variants": [_summary(v, runs[v.name], base, gpu_h) for v in variants_]}
