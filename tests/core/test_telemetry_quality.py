"""Telemetry that stops being a measurement is not a fault (issue 37, precision).

Decision tables for two causes of false flags on healthy hardware:

- a stale exporter (it serves its last scrape again: every gauge of a node's GPUs repeats
  while their peers' move) is a telemetry fault of that node (a ``stale:`` freeze scope),
  and no verdict, peer's or its own, rests on what it serves;
- a GPU coming back from a telemetry gap (a driver update, a reboot) with a cold die is
  settling, not a sample of its rack's common mode: with half a rack warming back up, the
  other half must not read as drift.
"""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.assess import assess, initial_states
from seamguard.assess.baselines import Baselines
from seamguard.assess.quality import FailsafeConfig, FrozenScope, mask_stale, scope_masks, stale_scopes
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe import History, make_frame
from seamguard.observe.signals import REGISTRY
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=128, nodes_per_storage_path=4), seed=3)
TICK = 30.0
POL = default_policy()
WARM = POL.assess.baselines.warm_samples


def _twin(seed: int = 4) -> Twin:
    return Twin(FLEET, [], TwinConfig(tick_s=TICK, warm_gpu_share=0.0, diurnal_period_s=2 * 3600.0), seed=seed)


def _gpu_gauges(frame) -> list[str]:
    return [n for n in frame.values if REGISTRY[n].kind == Kind.GPU and not REGISTRY[n].counter]


# ---- stale exporters ---------------------------------------------------------------------------
def _frames(n: int, stale_node: int | None, stale_from: int, still_all: bool = False):
    """``n`` twin frames; from ``stale_from`` on, ``stale_node``'s GPU gauges repeat the last
    value served before it (``still_all``: every GPU's do, a quiet fleet)."""
    twin = _twin()
    out, last = [], None
    for k in range(n):
        f = twin.step()
        if k >= stale_from and last is not None:
            sel = np.ones(FLEET.count(Kind.GPU), dtype=bool) if still_all else FLEET.gpu_node == stale_node
            for name in _gpu_gauges(f):
                f.values[name][sel] = last.values[name][sel]
        last = f
        out.append(f)
    return out


def _scopes_at(frames, k: int, cfg: FailsafeConfig = FailsafeConfig()) -> dict[str, str]:
    hist = History(TICK, 4)
    for f in frames[:k]:
        hist.push(f)
    return stale_scopes(FLEET, frames[k], hist, cfg)


@pytest.mark.parametrize("case, node, stale_from, at, still_all, expect", [
    # (what, stale node, first repeated scrape, judged at, every GPU still, stale scopes)
    ("live fleet", None, 99, 8, False, set()),
    ("one repeated scrape (a missed scrape read through the lookback)", 5, 6, 6, False, set()),
    ("two repeated scrapes", 5, 6, 7, False, {"stale:gpu:node005"}),
    ("still stale later", 5, 6, 9, False, {"stale:gpu:node005"}),
    ("data moves again", 5, 6, 20, False, set()),
    ("a quiet fleet: every GPU still", None, 6, 8, True, set()),
])
def test_stale_exporter_decision_table(case, node, stale_from, at, still_all, expect):
    frames = _frames(21, node, stale_from, still_all)
    if node is not None:  # the stale node stops moving only until its data moves again
        for f in frames[12:]:
            f.values["DCGM_FI_DEV_POWER_USAGE"][FLEET.gpu_node == node] += np.arange(8) * 0.01 + f.t_s % 7
    got = set(_scopes_at(frames, at))
    names = {s.replace("node005", FLEET.node_names[5]) for s in expect}
    assert got == names, case


def test_one_still_gpu_among_moving_ones_is_no_stale_exporter():
    """An exporter serves a node: one GPU whose gauges happen to repeat is not a hung exporter."""
    frames = _frames(10, None, 99)
    g = int(np.flatnonzero(FLEET.gpu_node == 5)[0])
    for f in frames[5:]:
        for name in _gpu_gauges(f):
            f.values[name][g] = frames[5].values[name][g]
    assert _scopes_at(frames, 8) == {}


def test_runtime_step_times_are_not_read_for_staleness():
    """A paused job's step time repeats (no step ends): not a stale exporter while DCGM moves."""
    frames = _frames(10, None, 99)
    for f in frames:
        f.values["seamguard_rank_compute_seconds"] = np.full(FLEET.count(Kind.GPU), 0.5)
    assert _scopes_at(frames, 8) == {}


def test_stale_scope_holds_the_nodes_gpus_and_masks_what_they_serve():
    node = FLEET.node_names[5]
    scope = FrozenScope(f"stale:gpu:{node}", "stale", 0.0)
    m = scope_masks(FLEET, [scope])
    assert np.array_equal(np.flatnonzero(m[Kind.GPU]), np.flatnonzero(FLEET.gpu_node == 5))
    assert not m[Kind.NIC].any() and not m[Kind.NODE].any()
    f = _frames(2, None, 99)[1]
    masked = mask_stale(FLEET, f, (scope,))
    util = masked.get("DCGM_FI_DEV_GPU_UTIL")
    assert np.isnan(util[FLEET.gpu_node == 5]).all() and np.isfinite(util[FLEET.gpu_node != 5]).all()
    assert mask_stale(FLEET, f, (FrozenScope(scope.scope, "stale", 0.0, good_ticks=1),)) is f  # rewarming: live data


def test_a_stale_exporter_flags_nothing_on_its_node():
    """A node whose dcgm-exporter serves the scrape from a checkpoint pause (idle utilisation,
    idle power) while its job runs again for ten minutes: none of its GPUs, NICs or the node
    changes state (in the held-out histories its NICs read the job's traffic against the node's
    idle normal, congestion, and its GPUs' unnamed series deviated from their running peers; the
    twin has neither effect, so this guards the end-to-end path, and the table above the rule)."""
    twin = _twin()
    ctl = Controller(FLEET, POL, [], None, tick_s=TICK)
    node, job = 5, int(FLEET.node_job[5])
    on_node = FLEET.gpu_node == node
    idle = None
    for k in range(WARM + 40):
        f = twin.step()
        if WARM + 10 <= k < WARM + 30:  # the exporter hangs during a pause and serves the idle scrape
            if k == WARM + 10:
                f.values["DCGM_FI_DEV_GPU_UTIL"][on_node] = 2.0
                f.values["DCGM_FI_DEV_POWER_USAGE"][on_node] = 90.0
                idle = {n: f.values[n][on_node].copy() for n in _gpu_gauges(f)}
            for n, v in idle.items():
                f.values[n][on_node] = v
        rep = ctl.tick(f)
        assert not rep.error
        bad = [t for t in rep.assessment.transitions
               if (t.kind == Kind.GPU and FLEET.gpu_node[t.index] == node)
               or (t.kind == Kind.NIC and FLEET.nic_node[t.index] == node) or (t.kind == Kind.NODE and t.index == node)]
        assert bad == [], (k, [(t.entity, t.to_state.label, t.reasons[:2]) for t in bad])
    assert job >= 0


# ---- a cold die after a gap --------------------------------------------------------------------
def test_half_a_rack_warming_back_up_is_nobodys_drift():
    """Half of a rack's nodes go dark (a driver update) and come back at full load with cold
    dies that take minutes to warm: the rack's other half must not read as drift (before: the
    rack median sat between the halves and the steady half read +3-7 °C, degraded)."""
    twin = _twin()
    hist = History(TICK, 2, POL.assess.history_depths(TICK))
    states, base = initial_states(FLEET), None
    rack = 1
    nodes = np.flatnonzero(FLEET.node_rack == rack)
    away, steady = nodes[: nodes.size // 2], nodes[nodes.size // 2:]
    gone = np.isin(FLEET.gpu_node, away)
    cold = [14.0, 9.0, 6.0, 4.0, 2.5, 1.5, 0.8]  # °C below settled, per scrape after the return
    back = WARM + 30
    flagged = []
    for k in range(back + 20):
        f = twin.step()
        if WARM + 20 <= k < back:
            for name, arr in f.values.items():
                if REGISTRY[name].kind == Kind.GPU:
                    arr[gone] = np.nan
        elif back <= k < back + len(cold):
            f.values["DCGM_FI_DEV_GPU_TEMP"][gone] -= cold[k - back]
        a = assess(FLEET, f, hist, states, POL.assess, base=base)
        hist.push(f)
        states, base = {kk: a.kinds[kk].states for kk in a.kinds}, a.baselines
        flagged += [(k, t.entity, t.to_state.label) for t in a.transitions
                    if t.kind == Kind.GPU and FLEET.gpu_node[t.index] in steady]
    assert flagged == []
    assert isinstance(base, Baselines)
