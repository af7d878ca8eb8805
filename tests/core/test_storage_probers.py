"""A storage path's failed probes are the path's only when a share of its probers see them.

Several nodes' agents probe one path. One prober whose own NIC or mount fails keeps
failing its probes while the path serves everyone else: that must not make the path
`checkpoint_unsafe`. Failures count when at least 2 probers and more than half of those
reporting see them (a path with fewer probers: all of them); a path that every prober sees
fail is still unsafe, and one that stops answering most probers is `failed` at once
(docs/evidence.md, storage). Decision table through ``assess`` on a small fleet.
"""

from __future__ import annotations

import numpy as np
import pytest

from seamguard.assess.assessment import AssessConfig, assess, initial_states
from seamguard.assess.states import State
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe import History
from seamguard.observe.frame import make_frame

TICK_S = 30.0
FLEET = generate_fleet(FleetShape(gpus=64, rails=2, racks_per_loop=1, nodes_per_storage_path=2), seed=3)
S = FLEET.count(Kind.STORAGE)
PATH = 1
NAN = float("nan")


def _healthy() -> dict[str, np.ndarray]:
    g, nic = FLEET.count(Kind.GPU), FLEET.count(Kind.NIC)
    return {
        "DCGM_FI_DEV_GPU_TEMP": np.full(g, 60.0), "DCGM_FI_DEV_POWER_USAGE": np.full(g, 600.0),
        "DCGM_FI_DEV_GPU_UTIL": np.full(g, 95.0), "DCGM_FI_DEV_SM_CLOCK": np.full(g, 1980.0),
        "DCGM_FI_DEV_XID_ERRORS": np.zeros(g),
        "node_infiniband_state_id": np.full(nic, 4.0), "node_infiniband_physical_state_id": np.full(nic, 5.0),
        "seamguard_coolant_flow_lpm": FLEET.loop_rated_flow_lpm.copy(),
        "seamguard_coolant_supply_temp_c": np.full(FLEET.count(Kind.COOLING_LOOP), 30.0),
        "seamguard_storage_write_latency_ms": np.full(S, 20.0),
    }


def _on_path(v: float, other: float) -> np.ndarray:
    return np.where(np.arange(S) == PATH, v, other)


def _run(probers: float, failing: float, up: float, ticks: int = 10, onset: int = 2) -> int:
    """``failing`` of the path's ``probers`` fail a probe every tick from ``onset`` on (the
    failures counter rises by ``failing``), the share ``up`` answered their last probe."""
    cfg = AssessConfig()
    hist = History(TICK_S, default_depth=2, depth_by_signal=cfg.history_depths(TICK_S))
    prev, base, total, a = initial_states(FLEET), None, 0.0, None
    for i in range(ticks):
        on = i >= onset
        total += failing if on else 0.0
        frame = make_frame(FLEET, 1000.0 + i * TICK_S, {
            **_healthy(),
            "seamguard_storage_probe_up": _on_path(up if on else 1.0, 1.0),
            "seamguard_storage_probe_failures_total": _on_path(total, 0.0),
            "seamguard_storage_probers": _on_path(probers, 2.0),
            "seamguard_storage_probers_failing": _on_path(failing if on else 0.0, 0.0)})
        a = assess(FLEET, frame, hist, prev, cfg, base=base)
        hist.push(frame)
        prev, base = {k: ka.states for k, ka in a.kinds.items()}, a.baselines
    return int(a.kinds[Kind.STORAGE].states.state[PATH])


# (probers reporting, probers failing, share answering their last probe, end state of the path)
ROWS = [
    (4, 0, 1.0, State.HEALTHY),
    (4, 1, 0.75, State.HEALTHY),             # one prober's own mount or NIC: not the path
    (4, 2, 0.5, State.HEALTHY),              # half: no majority
    (4, 3, 1.0, State.CHECKPOINT_UNSAFE),    # most probers see it fail between scrapes
    (2, 1, 0.5, State.HEALTHY),              # one of two
    (2, 2, 1.0, State.CHECKPOINT_UNSAFE),    # both
    (1, 1, 1.0, State.CHECKPOINT_UNSAFE),    # its only prober: all of them
    (4, 4, 1.0, State.CHECKPOINT_UNSAFE),    # every prober sees it fail
    (4, 4, 0.0, State.FAILED),               # and it stopped answering: at once
    (NAN, 1, 1.0, State.CHECKPOINT_UNSAFE),  # prober counts unknown: every failure counts, as before
]


@pytest.mark.parametrize("probers,failing,up,end", ROWS)
def test_a_path_is_unsafe_only_when_a_share_of_its_probers_see_it_fail(probers, failing, up, end):
    assert State(_run(probers, failing, up)) == end


def test_a_path_every_prober_cannot_reach_is_failed_at_once():
    assert State(_run(4, 4, 0.0, ticks=3, onset=2)) == State.FAILED


# ---- the default queries, through a real Prometheus ------------------------------------------
# (path, probers reporting, probers whose failures rise): what the agents' series must map to
PROBERS = {0: (4, 1), 1: (4, 3), 2: (1, 0), 3: (2, 2)}


def _probe_history(path, t0: float, steps: int) -> None:
    up, fails = ["# TYPE seamguard_storage_probe_up gauge"], ["# TYPE seamguard_storage_probe_failures counter"]
    for p, (n, bad) in PROBERS.items():
        storage = FLEET.storage_names[p]
        for k in range(n):
            node = FLEET.node_names[k]
            for i in range(steps):
                t = t0 + i * TICK_S
                up.append(f'seamguard_storage_probe_up{{node="{node}",path="/ckpt",storage="{storage}"}} 1 {t:.3f}')
                count = i if k < bad else 0  # a failing prober fails one probe a scrape
                fails.append(f'seamguard_storage_probe_failures_total{{node="{node}",reason="timeout",'
                             f'storage="{storage}"}} {count} {t:.3f}')
    path.write_text("\n".join(up + fails) + "\n# EOF\n", encoding="utf-8")


def test_the_default_queries_count_probers_and_the_ones_failing(tmp_path):
    import time

    from seamguard.observe.prometheus import PromConfig, PrometheusSource
    from seamguard.scenarios.backfill import backfill_file
    from seamguard.testbed.prom import PrometheusServer

    t0, steps = float(int(time.time() // 3600 * 3600) - 3 * 3600), 12
    _probe_history(tmp_path / "probes.om", t0, steps)
    backfill_file(tmp_path / "probes.om", tmp_path / "tsdb")
    with PrometheusServer(tmp_path / "prom", tsdb_dir=tmp_path / "tsdb", lookback_delta="45s") as prom:
        src = PrometheusSource(FLEET, PromConfig(url=prom.url, timeout_s=10))
        try:
            frame = src.frame_at(t0 + (steps - 1) * TICK_S)
        finally:
            src.close()
    np.testing.assert_array_equal(frame.get("seamguard_storage_probers"), [n for n, _ in PROBERS.values()])
    np.testing.assert_array_equal(frame.get("seamguard_storage_probers_failing"), [b for _, b in PROBERS.values()])
    assert not [f for f in frame.flags if "storage_probers" in f], frame.flags
