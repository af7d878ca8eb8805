"""Every series the node agent and dcgm-exporter give is judged (issue 37): decision tables.

One table per channel, each row a short history of frames through ``assess`` on a small
fleet and the state (or evidence column) it must end in. What each channel is and why its
threshold sits where it does: docs/evidence.md ("Host, NVSwitch, kernel log, PCIe" and
"Design envelopes").
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from seamguard.assess.assessment import AssessConfig, assess, initial_states
from seamguard.assess.states import State
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe import History
from seamguard.observe.frame import make_frame

TICK_S = 30.0
BASE = generate_fleet(FleetShape(gpus=64, rails=2, racks_per_loop=1, nodes_per_storage_path=2), seed=3)
# Nodes 0 and 1 share an NVLink domain (one NVL16 rack, say); the others are each their own.
FLEET = replace(BASE, node_nvlink_domain=np.array([0, 0, -1, -1, -1, -1, -1, -1]), _index={})
G = FLEET.count(Kind.GPU)
NODES = FLEET.count(Kind.NODE)
N0 = np.flatnonzero(FLEET.gpu_node == 0)  # GPUs of node 0
N1 = np.flatnonzero(FLEET.gpu_node == 1)
N2 = np.flatnonzero(FLEET.gpu_node == 2)


def healthy(fleet=FLEET) -> dict[str, np.ndarray]:
    """A quiet frame: every GPU at load, every port up, every loop at its rated flow."""
    g, nic = fleet.count(Kind.GPU), fleet.count(Kind.NIC)
    return {
        "DCGM_FI_DEV_GPU_TEMP": np.full(g, 60.0), "DCGM_FI_DEV_POWER_USAGE": np.full(g, 600.0),
        "DCGM_FI_DEV_GPU_UTIL": np.full(g, 95.0), "DCGM_FI_DEV_SM_CLOCK": np.full(g, 1980.0),
        "DCGM_FI_DEV_XID_ERRORS": np.zeros(g),
        "node_infiniband_state_id": np.full(nic, 4.0), "node_infiniband_physical_state_id": np.full(nic, 5.0),
        "seamguard_coolant_flow_lpm": fleet.loop_rated_flow_lpm.copy(),
        "seamguard_coolant_supply_temp_c": np.full(fleet.count(Kind.COOLING_LOOP), 30.0),
        "seamguard_storage_write_latency_ms": np.full(fleet.count(Kind.STORAGE), 20.0),
        "seamguard_storage_probe_up": np.ones(fleet.count(Kind.STORAGE)),
    }


def run(ticks: list[dict[str, np.ndarray]], fleet=FLEET):
    """Assess each frame in turn (``ticks[i]`` overrides the healthy frame); the last Assessment
    and the number of transitions per kind."""
    cfg = AssessConfig()
    hist = History(TICK_S, default_depth=2, depth_by_signal=cfg.history_depths(TICK_S))
    prev, base, a = initial_states(fleet), None, None
    moves: dict[Kind, int] = {}
    for i, over in enumerate(ticks):
        frame = make_frame(fleet, 1000.0 + i * TICK_S, {**healthy(fleet), **over})
        a = assess(fleet, frame, hist, prev, cfg, base=base)
        for t in a.transitions:
            moves[t.kind] = moves.get(t.kind, 0) + 1
        hist.push(frame)
        prev, base = {k: ka.states for k, ka in a.kinds.items()}, a.baselines
    return a, moves


def counter(per_tick: list[float], n: int, rows) -> list[np.ndarray]:
    """A counter's value per tick on ``rows`` (cumulative), 0 elsewhere."""
    out, total = [], 0.0
    for inc in per_tick:
        total += inc
        v = np.zeros(n)
        v[rows] = total
        out.append(v)
    return out


def series(name: str, values: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    return [{name: v} for v in values]


def merge(*runs: list[dict]) -> list[dict]:
    return [{k: v for d in ds for k, v in d.items()} for ds in zip(*runs)]


def gpu_states(a) -> np.ndarray:
    return a.kinds[Kind.GPU].states.state


def col(a, kind: Kind, channel: str) -> tuple[np.ndarray, np.ndarray]:
    e = a.kinds[kind].evidence
    j = e.channels.index(channel)
    return e.score[:, j], e.value[:, j]


# ---- host memory (Linux EDAC) ------------------------------------------------------------------
# (correctable errors per 30-s tick on node 0 over 24 ticks, uncorrectable at tick 20 or None,
#  node 0's GPUs must end: at least this state, at most this state)
EDAC = [
    ([0] * 24, None, State.HEALTHY, State.HEALTHY),
    ([0.1] * 24, None, State.HEALTHY, State.HEALTHY),  # one error every 5 minutes: its own normal
    ([0] * 18 + [8] * 6, None, State.DEGRADED, State.DEGRADED),  # a storm (960/h over a floor of 0): degraded, no more
    ([0] * 24, 20, State.FAILED, State.FAILED),  # an uncorrectable error: hard at once
]


@pytest.mark.parametrize("ce,ue_at,lo,hi", EDAC)
def test_host_memory_errors(ce, ue_at, lo, hi):
    ue = [np.zeros(NODES) for _ in ce]
    if ue_at is not None:
        for v in ue[ue_at:]:
            v[0] = 1.0
    ticks = merge(series("node_edac_correctable_errors_total", counter(ce, NODES, [0])),
                  series("node_edac_uncorrectable_errors_total", ue))
    if ue_at is not None:
        ticks = ticks[:ue_at + 1]
    a, _ = run(ticks)
    s = gpu_states(a)
    assert (s[N0] >= lo).all() and (s[N0] <= hi).all(), s[N0]
    assert (s[np.setdiff1d(np.arange(G), N0)] == State.HEALTHY).all()


# ---- NVSwitch SXid -------------------------------------------------------------------------------
# (fatal SXids per tick on node 1, non-fatal per tick on node 1, end states of nodes 0, 1, 2's GPUs)
SXID = [
    ([0] * 6, [0] * 6, State.HEALTHY, State.HEALTHY, State.HEALTHY),
    ([0] * 6, [0, 0, 1, 0, 0, 0], State.HEALTHY, State.HEALTHY, State.HEALTHY),  # one non-fatal: a counter, not a fault
    ([0] * 6, [0, 2, 2, 1, 1, 1], State.DEGRADED, State.DEGRADED, State.HEALTHY),  # a run of them: degraded domain
    ([0, 0, 0, 0, 1, 0], [0] * 6, State.FAILED, State.FAILED, State.HEALTHY),  # fatal: every GPU of the domain
]


@pytest.mark.parametrize("fatal,nonfatal,s0,s1,s2", SXID)
def test_nvswitch_sxid_judges_the_nvlink_domain(fatal, nonfatal, s0, s1, s2):
    ticks = merge(series("seamguard_sxid_fatal_total", counter(fatal, NODES, [1])),
                  series("seamguard_sxid_nonfatal_total", counter(nonfatal, NODES, [1])))
    s = gpu_states(run(ticks)[0])
    assert (s[N0] == s0).all() and (s[N1] == s1).all() and (s[N2] == s2).all(), (s[N0], s[N1], s[N2])


# ---- kernel-log XIDs, deduplicated with DCGM's gauge ----------------------------------------------
G0 = int(N2[3])


def _xid(gauge: list[float], fatal: list[float], warn: list[float]) -> list[dict]:
    g = []
    for v in gauge:
        a = np.zeros(G)
        a[G0] = v
        g.append(a)
    return merge(series("DCGM_FI_DEV_XID_ERRORS", g), series("seamguard_xid_fatal_total", counter(fatal, G, [G0])),
                 series("seamguard_xid_warning_total", counter(warn, G, [G0])))


# (DCGM last-XID gauge per tick, kernel-log fatal per tick, kernel-log warning per tick,
#  end state of the GPU, its GPU transitions, ticks on which the xid channel scored a warning)
XID = [
    ([0] * 5, [0] * 5, [0] * 5, State.HEALTHY, 0, 0),
    ([0] * 5, [0, 0, 1, 0, 0], [0] * 5, State.FAILED, 1, 0),  # the kernel log alone: a fatal XID is hard
    ([0, 0, 79, 79, 79], [0, 0, 0, 1, 0], [0] * 5, State.FAILED, 1, 0),  # both saw it: one event, one transition
    ([0, 0, 63, 63, 63], [0] * 5, [0, 0, 0, 1, 0], State.HEALTHY, 0, 1),  # one warning seen twice: one 0.7, healthy
    ([0, 0, 63, 63, 63], [0] * 5, [0, 0, 1, 0, 0], State.HEALTHY, 0, 1),  # the same tick: one event
    ([0] * 5, [0] * 5, [0, 1, 1, 0, 0], State.DEGRADED, 1, 2),  # two warnings, one scrape apart: two events
]


@pytest.mark.parametrize("gauge,fatal,warn,end,moves,warned", XID)
def test_kernel_log_xids_are_dcgm_xids_counted_once(gauge, fatal, warn, end, moves, warned):
    ticks = _xid(gauge, fatal, warn)
    scored = 0
    for k in range(1, len(ticks) + 1):
        a, mv = run(ticks[:k])
        scored += int(abs(col(a, Kind.GPU, "xid")[0][G0] - 0.7) < 1e-9)
    assert gpu_states(a)[G0] == end
    assert mv.get(Kind.GPU, 0) == moves
    assert scored == warned


# ---- host pressure (PSI, OOM kills): context for stragglers ----------------------------------------
J = int(FLEET.gpu_job[N2[0]])
JOB = np.flatnonzero(FLEET.gpu_job == J)


def _straggle(psi_share: float, ooms: int, slow: float) -> list[dict]:
    compute = np.full(G, np.nan)
    compute[JOB] = 1.0
    compute[G0] = slow
    stall = [np.zeros(NODES) for _ in range(6)]
    for i, v in enumerate(stall):
        v[2] = psi_share * TICK_S * i
    return [{"seamguard_rank_compute_seconds": compute, "node_pressure_memory_stalled_seconds_total": s,
             "node_vmstat_oom_kill": np.where(np.arange(NODES) == 2, float(ooms * (i >= 1)), 0.0)}
            for i, s in enumerate(stall)]


# (node 2's PSI memory 'full' share, OOM kills, the GPU's compute time over its job's, lowest, highest state)
PRESSURE = [
    (0.6, 3, 1.0, State.HEALTHY, State.HEALTHY),  # pressure alone is never a fault
    (0.0, 0, 1.5, State.QUARANTINE, State.HARMFUL),  # an unexplained straggler
    (0.6, 0, 1.5, State.DEGRADED, State.DEGRADED),  # explained by its host: degraded, not quarantined
    (0.0, 2, 1.5, State.DEGRADED, State.DEGRADED),  # OOM kills on its host explain it too
]


@pytest.mark.parametrize("psi,ooms,slow,lo,hi", PRESSURE)
def test_host_pressure_explains_a_straggler_and_is_never_a_fault(psi, ooms, slow, lo, hi):
    a, _ = run(_straggle(psi, ooms, slow))
    s = gpu_states(a)
    assert lo <= s[G0] <= hi, State(int(s[G0]))
    others = np.setdiff1d(np.arange(G), [G0])
    assert (s[others] == State.HEALTHY).all()
    pressure = col(a, Kind.GPU, "host_pressure")[1][G0]  # carried as data: the why of the straggler
    assert pressure == pytest.approx(1.0 if ooms else psi, abs=0.01)


# ---- storage probe ---------------------------------------------------------------------------------
# (path 1's probe_up share per tick, its failures per tick, end state of path 1)
PROBE = [
    ([1, 1, 1], [0, 0, 0], State.HEALTHY),
    ([1, 1, 0], [0, 0, 1], State.FAILED),  # stopped answering: unsafe for checkpoints at once
    ([1, 1, 0.75], [0, 0, 1], State.HEALTHY),  # one prober of four cannot reach it: its mount, not the path
    ([1] * 8, [0, 0, 1, 1, 1, 1, 1, 1], State.CHECKPOINT_UNSAFE),  # keeps failing between scrapes
]


@pytest.mark.parametrize("up,failures,end", PROBE)
def test_a_storage_path_that_stops_answering_is_unsafe(up, failures, end):
    n = FLEET.count(Kind.STORAGE)
    ups = [np.where(np.arange(n) == 1, float(u), 1.0) for u in up]
    ticks = merge(series("seamguard_storage_probe_up", ups),
                  series("seamguard_storage_probe_failures_total", counter(failures, n, [1])))
    a, _ = run(ticks)
    assert a.kinds[Kind.STORAGE].states.state[1] == end
    assert State(int(a.kinds[Kind.STORAGE].states.state[1])).label in ("healthy", "checkpoint_unsafe", "failed")


# ---- PCIe link width and generation -------------------------------------------------------------------
def _pcie(gen: list[float], width: list[float], util: list[float]) -> list[dict]:
    out = []
    for g_, w_, u_ in zip(gen, width, util):
        gv, wv, uv = np.full(G, 5.0), np.full(G, 16.0), np.full(G, 95.0)
        gv[G0], wv[G0], uv[G0] = g_, w_, u_
        out.append({"DCGM_FI_DEV_PCIE_LINK_GEN": gv, "DCGM_FI_DEV_PCIE_LINK_WIDTH": wv, "DCGM_FI_DEV_GPU_UTIL": uv})
    return out


# (gen, width and utilisation per tick, end state, bandwidth lost on the last tick or None)
PCIE = [
    ([5] * 6, [16] * 6, [95] * 6, State.HEALTHY, 0.0),
    ([5, 5, 5, 1, 1, 1], [16] * 6, [95, 95, 95, 0, 0, 0], State.HEALTHY, None),  # idle: the link parks, by design
    ([5, 5, 5, 5, 5, 5], [16, 16, 16, 8, 8, 8], [95] * 6, State.DEGRADED, 0.5),  # x16 -> x8 at load
    ([5, 5, 5, 4, 4, 4], [16] * 6, [95] * 6, State.DEGRADED, 0.5),  # Gen5 -> Gen4 at load
    ([4] * 6, [16] * 6, [95] * 6, State.HEALTHY, 0.0),  # Gen4 is all this slot ever gave: its own maximum
]


@pytest.mark.parametrize("gen,width,util,end,loss", PCIE)
def test_pcie_link_below_its_own_maximum_at_load(gen, width, util, end, loss):
    a, _ = run(_pcie(gen, width, util))
    assert gpu_states(a)[G0] == end
    got = col(a, Kind.GPU, "pcie_link")[1][G0]
    if loss is None:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(loss, abs=0.01)


# ---- clock-event reasons: the why of a clock deficit ------------------------------------------------
# (the GPU's clock, its reasons bitmask, expected (thermal, power, sync boost) data columns)
REASONS = [
    (1980.0, 0x40, (0, 0, 0)),  # no deficit: nothing to explain
    (1500.0, 0x40, (1, 0, 0)),  # hardware thermal slowdown
    (1500.0, 0x04, (0, 1, 0)),  # software power cap
    (1500.0, 0x10, (0, 0, 1)),  # held to its sync-boost group
    (1500.0, 0x00, (0, 0, 0)),  # a deficit no reason explains
]


@pytest.mark.parametrize("clock,bits,why", REASONS)
def test_clock_event_reasons_explain_a_clock_deficit(clock, bits, why):
    c, r = np.full(G, 1980.0), np.zeros(G)
    c[G0], r[G0] = clock, bits
    a, _ = run([{"DCGM_FI_DEV_SM_CLOCK": c, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": r}])
    got = tuple(int(col(a, Kind.GPU, ch)[1][G0]) for ch in ("clock_thermal", "clock_power", "clock_sync_boost"))
    assert got == why
    assert all(col(a, Kind.GPU, ch)[0].max() == 0.0 for ch in ("clock_thermal", "clock_power", "clock_sync_boost"))


# ---- NVLink recoveries: by persistence, not by one event -------------------------------------------
# (recovery errors per tick on the GPU, end state)
NVLINK = [
    ([0, 0, 1, 0, 0, 0, 0], State.HEALTHY),  # one healthy recovery: the link retrained, as designed
    ([0, 0, 1, 0, 0, 0, 1, 0], State.HEALTHY),  # two, minutes apart
    ([0, 1, 1, 1, 1, 0], State.DEGRADED),  # a link that keeps recovering
]


@pytest.mark.parametrize("rec,end", NVLINK)
def test_a_single_nvlink_recovery_is_not_degradation(rec, end):
    a, _ = run(series("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", counter(rec, G, [G0])))
    assert gpu_states(a)[G0] == end


# ---- design envelopes -------------------------------------------------------------------------------
ENV = replace(FLEET, loop_supply_temp_max_c=np.array([32.0, 45.0]), storage_budget_ms=np.array([100.0, 400.0,
                                                                                               100.0, 100.0]),
              _index={})


# (loop 0 / loop 1 supply °C, loop 0 and loop 1 flagged?)
SUPPLY = [
    (30.0, 30.0, False, False),
    (34.5, 34.5, True, False),  # over loop 0's W32 design, within loop 1's W45
    (44.0, 44.0, True, False),
    (44.0, 48.0, True, True),
]


@pytest.mark.parametrize("t0,t1,flag0,flag1", SUPPLY)
def test_loop_supply_is_judged_against_its_design_envelope(t0, t1, flag0, flag1):
    a, _ = run([{"seamguard_coolant_supply_temp_c": np.array([t0, t1])}] * 3, fleet=ENV)
    s = a.kinds[Kind.COOLING_LOOP].states.state
    assert (s[0] >= State.DEGRADED) == flag0 and (s[1] >= State.DEGRADED) == flag1, s


# (p99 write latency of every path in ms — all alike, so no path is slow against the others —,
#  which paths must be flagged); budgets 100, 400, 100, 100 ms
BUDGET = [
    (40.0, [False, False, False, False]),
    (300.0, [True, False, True, True]),  # over the 100 ms budgets, within path 1's 400 ms
    (1400.0, [True, True, True, True]),
]


@pytest.mark.parametrize("lat,flagged", BUDGET)
def test_storage_latency_is_judged_against_the_path_budget(lat, flagged):
    # outlasts the burst allowance a path has before it has shown a checkpoint burst of its own
    ticks = int(AssessConfig().baselines.burst_prior_s // TICK_S) + 12
    a, _ = run([{"seamguard_storage_write_latency_ms": np.full(4, lat)}] * ticks, fleet=ENV)
    s = a.kinds[Kind.STORAGE].states.state
    assert [bool(x >= State.DEGRADED) for x in s] == flagged, s


# ---- partial rollout: the agent runs on some nodes only ---------------------------------------------
# (share of nodes with an agent, whether the query failed, the scope that must freeze or None)
ROLLOUT = [
    (0.25, False, None),  # an agent on a quarter of the nodes: the rest is not missing input
    (1.0, False, None),
    (0.25, True, "signal:node_edac_uncorrectable_errors_total"),  # a failed query still freezes
]


@pytest.mark.parametrize("share,failed,frozen", ROLLOUT)
def test_an_agent_on_some_nodes_is_not_missing_input(share, failed, frozen):
    from seamguard.assess.quality import FailsafeConfig, bad_scopes

    ue = np.where(np.arange(NODES) < share * NODES, 0.0, np.nan)
    flags = ("prometheus:node_edac_uncorrectable_errors_total:retryable: timeout",) if failed else ()
    frame = make_frame(FLEET, 1000.0, {**healthy(), "node_edac_uncorrectable_errors_total": ue}, flags)
    bad, _ = bad_scopes(FLEET, frame, FailsafeConfig(), ("node_edac_uncorrectable_errors_total",))
    assert set(bad) == ({frozen} if frozen else set()), bad
