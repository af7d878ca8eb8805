"""GPU evidence from what the node agent sees around the GPU, and from its PCIe link. Pure.

The node agent exports the host's memory errors (Linux EDAC), its NVSwitches' SXids and
the GPUs' XIDs from the kernel log, and the host's pressure (PSI, OOM kills);
dcgm-exporter exports the GPU's PCIe link generation and width and why its clocks are
held (clock-event reasons). gpu_evidence (evidence.py) calls :func:`node_channels` once per
tick; everything here is arrays in, arrays out, per node folded onto its GPUs with
``fleet.gpu_node`` (a node is judged through its GPUs, as the node state is their fold).

How each is judged and why there (docs/evidence.md, "Host, NVSwitch, kernel log, PCIe"):
- host memory: correctable errors per hour over the node's own floor are degraded
  evidence; an uncorrectable one is hard for every GPU of the node;
- NVSwitch SXid: a fatal one is hard for every GPU of the node's NVLink domain; non-fatal
  ones are a counter (a few in five minutes, degraded at most);
- kernel-log XID and "fallen off the bus": the semantics of DCGM's XID gauge, deduplicated
  with it: the same event seen by both sources within one scrape is one event;
- PSI and OOM kills: data that explains a straggler, never a fault of their own;
- PCIe link below the generation or width the GPU holds at load (its own learned maximum;
  links drop to a lower generation at idle by design) is degraded, valued as the share of
  host-link bandwidth lost;
- clock-event reasons: thermal, power, sync boost as the why of a clock deficit (data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seamguard.assess.baselines import floor_step
from seamguard.assess.stats import counter_increase, ramp
from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame
from seamguard.observe.history import History

# Counters read over the rate window (kernel-log XIDs, host pressure) and the flap window
# (rare events: host memory errors, SXids, OOM kills); evidence.py adds them to its lists
# so the history keeps enough rows for them.
RATE = ("seamguard_xid_fatal_total", "seamguard_xid_warning_total", "node_pressure_memory_stalled_seconds_total",
        "node_pressure_io_stalled_seconds_total", "node_pressure_cpu_waiting_seconds_total")
FLAP = ("node_edac_correctable_errors_total", "node_edac_uncorrectable_errors_total", "seamguard_sxid_fatal_total",
        "seamguard_sxid_nonfatal_total", "node_vmstat_oom_kill")

# Usable bandwidth per lane by PCIe generation, GB/s one way: the line rate (2.5, 5, 8, 16,
# 32, 64 GT/s) times its encoding (8b/10b up to Gen2, 128b/130b Gen3-5, 242/256 FLIT Gen6).
PCIE_LANE_GBPS = np.array([0.0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563])

# NVML clocks-event (throttle) reason bits (nvmlClocksEventReasons; DCGM_CLOCKS_THROTTLE_REASON_*).
CLOCK_THERMAL = 0x20 | 0x40  # software thermal slowdown, hardware thermal slowdown
CLOCK_POWER = 0x04 | 0x08 | 0x80  # software power cap, hardware slowdown, hardware power brake
CLOCK_SYNC_BOOST = 0x10  # held to the slowest GPU of its sync-boost group


@dataclass(frozen=True, eq=False)
class NodeChannels:
    """What :func:`node_channels` adds to a GPU's evidence."""

    columns: list[tuple[str, str, np.ndarray, np.ndarray]]  # (channel, unit, score, value)
    xid_warning_new: np.ndarray  # bool: a warning XID appeared in the kernel log (deduplicated)
    xid_fatal_new: np.ndarray  # bool: a fatal XID / fallen off the bus appeared (deduplicated)
    xid_fatal_recent: np.ndarray  # bool: one appeared within the rate window
    hard_event: np.ndarray  # bool per GPU
    hard_level: np.ndarray  # bool per GPU
    host_pressure: np.ndarray  # per GPU, the node's worst PSI share (0..1); NaN: not reported
    baseline: dict[str, np.ndarray]  # GpuBaseline fields learned here


def _seen(hist: History, frame: Frame, *names: str) -> bool:
    """Whether any of the signals is in this frame or its history (most fleets report none of some)."""
    return any(n in frame.values or hist.window(n, 1) is not None for n in names)


def _rows(hist: History, name: str, frame: Frame, k: int) -> list[np.ndarray] | None:
    """The last ``k`` past rows and the current one (oldest first), or None if never seen."""
    w = hist.rows(name, k)
    cur = frame.get(name)
    if not w:
        return None if name not in frame.values else [cur]
    return [*w, cur]


def _increase(rows: list[np.ndarray] | np.ndarray | None, n: int) -> np.ndarray:
    """Sum of counter increases over the rows; a drop is a reset, a step across a gap counts nothing."""
    if rows is None or len(rows) < 2:
        return np.zeros(n)
    return counter_increase(rows)


def _inc_now(hist: History, name: str, frame: Frame, n: int) -> np.ndarray:
    return _increase(_rows(hist, name, frame, 1), n)


def _inc_prev(hist: History, name: str, n: int) -> np.ndarray:
    w = hist.window(name, 2)
    return _increase(w, n) if w is not None and w.shape[0] == 2 else np.zeros(n)


def _count(hist: History, name: str, frame: Frame, window_s: float, n: int) -> np.ndarray:
    return _increase(_rows(hist, name, frame, hist.ticks_for(window_s)), n)


def _per_h(hist: History, name: str, frame: Frame, window_s: float, n: int) -> np.ndarray:
    """Increase per hour over the window (never divided by less than the window)."""
    k = hist.ticks_for(window_s)
    rows = _rows(hist, name, frame, k)
    if rows is None or len(rows) < 2:
        return np.zeros(n)
    span = max(frame.t_s - float(hist.times(len(rows) - 1)[0]), window_s)
    return _increase(rows, n) * 3600.0 / span


def _share(hist: History, name: str, frame: Frame, window_s: float, n: int) -> np.ndarray:
    """A PSI stall counter (seconds) as a share of wall time over the window; NaN where unseen."""
    rows = _rows(hist, name, frame, hist.ticks_for(window_s))
    if rows is None or len(rows) < 2:
        return np.full(n, np.nan)
    span = max(frame.t_s - float(hist.times(len(rows) - 1)[0]), 1e-9)
    seen = np.isfinite(rows[-1]) & np.logical_or.reduce([np.isfinite(r) for r in rows[:-1]])
    return np.where(seen, np.clip(_increase(rows, n) / span, 0.0, 1.0), np.nan)


def _kernel_xid(fleet: Fleet, frame: Frame, hist: History, window_s: float, xid_gauge: np.ndarray,
                fatal: tuple[int, ...], warning: tuple[int, ...]):
    """Kernel-log XIDs deduplicated with DCGM's last-XID gauge.

    The gauge shows an event as a change of its value, the kernel-log counter as an
    increase; the two are scraped at different moments, so one event can show in one
    source this tick and in the other the next. A source's event that follows the other
    source's event of the same class by one scrape is that event, not a second one.
    """
    n = fleet.count(Kind.GPU)
    w = hist.window("DCGM_FI_DEV_XID_ERRORS", 2)
    w = w if w is not None and w.shape[0] == 2 else np.full((2, n), np.nan)
    p2, p1 = w[0], w[1]
    no = np.zeros(n, dtype=bool)
    moved_now, moved_prev = (xid_gauge != p1) & ~np.isnan(xid_gauge), (p1 != p2) & ~np.isnan(p1)
    kernel = _seen(hist, frame, "seamguard_xid_warning_total", "seamguard_xid_fatal_total")

    def changed_to(codes, moved, b):  # the gauge moved onto a code of the class (a change is rare: test first)
        return moved & np.isin(b, codes) if moved.any() else no

    out = []
    for name, codes in (("seamguard_xid_warning_total", warning), ("seamguard_xid_fatal_total", fatal)):
        g_now, g_prev = changed_to(codes, moved_now, xid_gauge), changed_to(codes, moved_prev, p1)
        if not kernel:
            out.append(g_now)
            continue
        k_now, k_prev = _inc_now(hist, name, frame, n) > 0, _inc_prev(hist, name, n) > 0
        out.append((g_now & ~k_prev) | (k_now & ~g_prev))
    recent = _count(hist, "seamguard_xid_fatal_total", frame, window_s, n) > 0 if kernel else no
    return out[0], out[1], recent


def _pcie(frame: Frame, g, at_load: np.ndarray, learn: np.ndarray):
    """Share of the host link's bandwidth lost against the most the GPU has held at load."""
    if "DCGM_FI_DEV_PCIE_LINK_GEN" not in frame.values or "DCGM_FI_DEV_PCIE_LINK_WIDTH" not in frame.values:
        return np.full(len(at_load), np.nan), g.pcie_gen_max, g.pcie_width_max
    gen = frame.get("DCGM_FI_DEV_PCIE_LINK_GEN")
    width = frame.get("DCGM_FI_DEV_PCIE_LINK_WIDTH")
    ok = at_load & np.isfinite(gen) & np.isfinite(width) & (gen >= 1) & (width >= 1)
    gen_max = np.where(ok & learn, np.fmax(g.pcie_gen_max, gen), g.pcie_gen_max).astype(np.float32)
    width_max = np.where(ok & learn, np.fmax(g.pcie_width_max, width), g.pcie_width_max).astype(np.float32)
    top = len(PCIE_LANE_GBPS) - 1

    def bw(gn, wd):
        return np.interp(np.clip(np.nan_to_num(gn), 0, top), np.arange(top + 1), PCIE_LANE_GBPS) * wd

    known = ok & np.isfinite(g.pcie_gen_max) & np.isfinite(g.pcie_width_max)
    best = bw(g.pcie_gen_max, g.pcie_width_max)
    loss = np.where(known & (best > 0), 1.0 - bw(gen, width) / np.where(best > 0, best, 1.0), np.nan)
    return np.clip(loss, 0.0, 1.0), gen_max, width_max


def _host_memory(fleet: Fleet, frame: Frame, hist: History, cfg, g, learn, cnt_warm, alpha_c, margin):
    """Correctable errors per hour over the node's own floor, and uncorrectable ones, per GPU."""
    n_nodes, node = fleet.count(Kind.NODE), fleet.gpu_node
    if not _seen(hist, frame, "node_edac_correctable_errors_total", "node_edac_uncorrectable_errors_total"):
        z = np.zeros(len(node))
        return z, z, z, z > 0, z > 0, g.edac_floor
    ce = _per_h(hist, "node_edac_correctable_errors_total", frame, cfg.flap_window_s, n_nodes)[node]
    s_mem = cfg.host_memory_weight * ramp(ce - np.where(cnt_warm, g.edac_floor, 0.0), *cfg.edac_ce_per_h)
    ue_now = (_inc_now(hist, "node_edac_uncorrectable_errors_total", frame, n_nodes) > 0)[node]
    ue = _count(hist, "node_edac_uncorrectable_errors_total", frame, cfg.flap_window_s, n_nodes)[node]
    floor = floor_step(g.edac_floor, ce, alpha_c, learn & (s_mem < 0.2), margin * cfg.edac_ce_per_h[0])
    return s_mem, ce, ue, ue_now, ue > 0, floor


def _nvswitch(fleet: Fleet, frame: Frame, hist: History, cfg):
    """SXids folded over the NVLink domain (its switches serve every GPU in it), per GPU."""
    n_nodes, node, dom = fleet.count(Kind.NODE), fleet.gpu_node, fleet.node_domain
    if not _seen(hist, frame, "seamguard_sxid_fatal_total", "seamguard_sxid_nonfatal_total"):
        z = np.zeros(len(node))
        return z, z, z > 0, z > 0
    n_dom = int(dom.max()) + 1 if dom.size else 0

    def any_in_domain(per_node: np.ndarray) -> np.ndarray:
        return (np.bincount(dom, weights=per_node, minlength=n_dom) > 0)[dom][node]

    now = any_in_domain(_inc_now(hist, "seamguard_sxid_fatal_total", frame, n_nodes) > 0)
    recent = any_in_domain(_count(hist, "seamguard_sxid_fatal_total", frame, cfg.flap_window_s, n_nodes) > 0)
    nonfatal = np.zeros(n_dom)  # the most any node of the domain logged (each may log the same switch's)
    np.maximum.at(nonfatal, dom, _count(hist, "seamguard_sxid_nonfatal_total", frame, cfg.flap_window_s, n_nodes))
    nonfatal = nonfatal[dom][node]
    return cfg.nvswitch_weight * ramp(nonfatal, *cfg.sxid_nonfatal), nonfatal, now, recent


def _host_pressure(fleet: Fleet, frame: Frame, hist: History, cfg):
    """The node's worst PSI share (full for memory and I/O, some for CPU), 1 after an OOM kill; per GPU."""
    n_nodes, node = fleet.count(Kind.NODE), fleet.gpu_node
    names = ("node_pressure_memory_stalled_seconds_total", "node_pressure_io_stalled_seconds_total",
             "node_pressure_cpu_waiting_seconds_total", "node_vmstat_oom_kill")
    if not _seen(hist, frame, *names):
        return np.full(len(node), np.nan), np.zeros(len(node))
    psi = np.stack([_share(hist, s, frame, cfg.rate_window_s, n_nodes) for s in (
        "node_pressure_memory_stalled_seconds_total", "node_pressure_io_stalled_seconds_total",
        "node_pressure_cpu_waiting_seconds_total")], axis=1)
    worst = np.max(np.nan_to_num(psi, nan=-1.0), axis=1)
    pressure = np.where(worst < 0, np.nan, worst)[node]
    ooms = _count(hist, "node_vmstat_oom_kill", frame, cfg.flap_window_s, n_nodes)[node]
    return np.where(ooms > 0, np.fmax(pressure, 1.0), pressure), ooms


def node_channels(fleet: Fleet, frame: Frame, hist: History, cfg, g, learn: np.ndarray, cnt_warm: np.ndarray,
                  at_load: np.ndarray, deficit: np.ndarray, alpha_c: np.ndarray, margin: float,
                  fatal_xids: tuple[int, ...], warning_xids: tuple[int, ...]) -> NodeChannels:
    """The agent's node-level channels and the PCIe / clock-reason ones, per GPU.

    ``cfg`` is the EvidenceConfig, ``g`` the GpuBaseline before this tick; ``cnt_warm`` the
    GPUs whose counter floors are warm, ``at_load`` the GPUs at load, ``deficit`` their clock
    deficit against peers, ``alpha_c`` / ``margin`` how counter floors learn.
    """
    n = fleet.count(Kind.GPU)
    warn_new, fatal_new, fatal_recent = _kernel_xid(fleet, frame, hist, cfg.rate_window_s,
                                                    frame.get("DCGM_FI_DEV_XID_ERRORS"), fatal_xids, warning_xids)
    s_mem, ce, ue, ue_now, ue_recent, edac_floor = _host_memory(fleet, frame, hist, cfg, g, learn, cnt_warm,
                                                                alpha_c, margin)
    s_sx, nonfatal, sx_now, sx_recent = _nvswitch(fleet, frame, hist, cfg)
    host_pressure, ooms = _host_pressure(fleet, frame, hist, cfg)
    loss, gen_max, width_max = _pcie(frame, g, at_load, learn)
    # Why the clocks are held, where a clock deficit needs a why.
    zero = np.zeros(n)
    reasons = frame.values.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    if reasons is None:
        why = (zero, zero, zero)
    else:
        bits = np.where(np.isfinite(reasons) & (np.nan_to_num(deficit) >= cfg.clock_deficit[0]),
                        np.nan_to_num(reasons), 0).astype(np.int64)
        why = tuple(((bits & b) > 0).astype(float) for b in (CLOCK_THERMAL, CLOCK_POWER, CLOCK_SYNC_BOOST))
    s_pcie = cfg.pcie_link_weight * ramp(loss, *cfg.pcie_bw_loss) if np.isfinite(loss).any() else zero
    cols = [
        ("host_memory", "per_hour", s_mem, ce),
        ("host_memory_uncorrectable", "errors", ue_recent.astype(float), ue),
        ("nvswitch", "events", s_sx, nonfatal),
        ("nvswitch_fatal", "bool", sx_recent.astype(float), sx_recent.astype(float)),
        ("pcie_link", "fraction", s_pcie, loss),
        ("host_pressure", "fraction", zero, host_pressure),
        ("oom_kills", "events", zero, ooms),
        ("clock_thermal", "bool", zero, why[0]),
        ("clock_power", "bool", zero, why[1]),
        ("clock_sync_boost", "bool", zero, why[2]),
    ]
    return NodeChannels(
        columns=cols, xid_warning_new=warn_new, xid_fatal_new=fatal_new, xid_fatal_recent=fatal_recent,
        hard_event=ue_now | sx_now, hard_level=ue_recent | sx_recent, host_pressure=host_pressure,
        baseline={"pcie_gen_max": gen_max, "pcie_width_max": width_max, "edac_floor": edac_floor})
