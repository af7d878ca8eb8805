"""Held-out physics: what the development histories (seeds 0-19) never showed the detector.

A scenario with ``physics="shifted"`` differs from the development physics in ways taken
from the hardware's documentation and field studies, never from the detector's limits
(the sources are in docs/evaluation.md, "Held-out histories"):

- onsets: a fault starts as a step, a ramp (its effect grows linearly over 5-40 min) or
  intermittently (on for 1-5 min, off for 2-10 min, until a hard failure holds it on);
- coolant flow meters read with 1 % standard deviation (±2 % at two sigma);
- every error counter has a healthy background: a few GPUs correct ECC errors now and then,
  NVLink and PCIe links replay occasionally, InfiniBand ports see rare symbol errors and
  recoveries, hosts correct DRAM errors (node_exporter's EDAC counters), NVSwitches correct
  single-bit ECC errors in their SRAM (non-fatal SXids in the node agent's kernel-log counter);
- checkpoints last 1-5 min;
- an exporter on a healthy node can serve stale values for minutes (the last scrape repeated);
- GPUs drop their PCIe link generation at idle (active-state power management);
- every node runs the node agent (``seamguard_agent_info``), whose kernel-log SXid counter
  appears on a node's first SXid, as the agent exports it.

``GENERATOR_VERSION`` names this physics; results record it, and any change to either
physics must bump it (tests/scenarios pin a history's digest to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GENERATOR_VERSION = "2026.12-2"  # 2026.12-2: NVSwitch SXids (class, background, agent)
PHYSICS = ("dev", "shifted")

FLOW_NOISE_SD = {"dev": 0.004, "shifted": 0.01}
CHECKPOINT_S = {"dev": (60.0, 150.0), "shifted": (60.0, 300.0)}
RAMP_S = (300.0, 2400.0)
INTERMITTENT_ON_S = (60.0, 300.0)
INTERMITTENT_OFF_S = (120.0, 600.0)
ONSETS = ("step", "ramp", "intermittent")
STALE_S = (180.0, 600.0)

# Healthy backgrounds (per entity per hour; the share of entities that show any).
# Orders of magnitude from the field studies cited in docs/evaluation.md.
BACKGROUND = {
    # (counter, share of entities prone, events per hour when prone, burst size range)
    "gpu": (("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0.03, 0.5, (1, 3)),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 0.05, 0.3, (1, 20)),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 0.05, 0.1, (1, 2)),
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0.05, 0.2, (1, 4))),
    "nic": (("node_infiniband_symbol_error_total", 0.10, 0.5, (1, 5)),
            ("node_infiniband_link_error_recovery_total", 0.02, 0.05, (1, 1)),
            ("node_infiniband_port_errors_received_total", 0.05, 0.2, (1, 3))),
    "node": (("node_edac_correctable_errors_total", 0.08, 0.3, (1, 2)),
             ("seamguard_sxid_nonfatal_ecc", 0.02, 0.1, (1, 1))),
}
# The node agent's kernel-log SXid counter, one series per (SXid, severity) as the agent labels it
# (``seamguard_sxid_errors_total{sxid, severity}``); codes and severities as the NVSwitch driver logs them
# (sources: docs/evaluation.md, "Held-out histories").
SXID_NONFATAL_ECC = "seamguard_sxid_nonfatal_ecc"  # single-bit ECC the switch corrected
SXID_NONFATAL_LINK = "seamguard_sxid_nonfatal_link"  # a link's receive error rate is high
SXID_FATAL_LINK = "seamguard_sxid_fatal_link"  # "LTSSM Fault Up": a link left the active state
SXID_SERIES = ((SXID_NONFATAL_ECC, "11012", "non-fatal"), (SXID_NONFATAL_LINK, "20009", "non-fatal"),
               (SXID_FATAL_LINK, "20034", "fatal"))  # (series, SXid, severity)
SXID_COUNTERS = tuple(name for name, _, _ in SXID_SERIES)
NODE_COUNTERS = ("node_edac_correctable_errors_total", "node_edac_uncorrectable_errors_total", *SXID_COUNTERS)


@dataclass
class Onset:
    """How a fault's effect reaches full strength: ``weight(t)`` in [0, 1] since its start."""

    shape: str = "step"
    ramp_s: float = 0.0
    on_s: float = 0.0
    off_s: float = 0.0

    def weight(self, t_s: float, hard_failed: bool) -> float:
        if self.shape == "step" or hard_failed:
            return 1.0
        if self.shape == "ramp":
            return min(1.0, max(t_s, 0.0) / self.ramp_s)
        return 1.0 if (t_s % (self.on_s + self.off_s)) < self.on_s else 0.0


def draw_onset(rng: np.random.Generator) -> Onset:
    shape = str(rng.choice(ONSETS))
    if shape == "ramp":
        return Onset(shape, ramp_s=float(rng.uniform(*RAMP_S)))
    if shape == "intermittent":
        return Onset(shape, on_s=float(rng.uniform(*INTERMITTENT_ON_S)), off_s=float(rng.uniform(*INTERMITTENT_OFF_S)))
    return Onset()


def draw_background(rng: np.random.Generator, counts: dict[str, int]) -> dict[str, tuple[str, np.ndarray, tuple]]:
    """Per counter: (entity kind, per-entity rate per hour — zero for most, burst size range)."""
    out = {}
    for kind, rows in BACKGROUND.items():
        n = counts[kind]
        for name, share, per_h, burst in rows:
            prone = rng.random(n) < share
            out[name] = (kind, np.where(prone, per_h * rng.lognormal(0.0, 0.7, n), 0.0), burst)
    return out


def background_increments(rng: np.random.Generator, rate_per_h: np.ndarray, burst: tuple, dt_s: float) -> np.ndarray:
    events = rng.poisson(rate_per_h * dt_s / 3600.0)
    size = rng.integers(burst[0], burst[1] + 1, len(rate_per_h))
    return (events * size).astype(float)


def blend(before: np.ndarray, after: np.ndarray, w: float, rng: np.random.Generator, counter: bool) -> np.ndarray:
    """A fault's change scaled by ``w``: factors linearly, counter increments thinned (binomially)."""
    if w >= 1.0:
        return after
    if counter:
        delta = np.maximum(after - before, 0.0)
        thinned = rng.binomial(np.minimum(delta, 1e9).astype(np.int64), w).astype(float)
        return np.where(after >= before, before + thinned, after)  # a gauge set lower (a reset) stays
    if after.dtype == bool:
        return after if w >= 0.5 else before
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(after) | np.isinf(before), np.where(w >= 0.5, after, before),
                        before + (after - before) * w)
