"""The outside baseline of benchmarks/detection.py: the health rules operators deploy today.

What a competent operator runs on a GPU fleet without seamguard, read from the same scrapes
the detector's Prometheus holds, and written as a timeline that seamguard.app.eval scores
exactly as it scores `seamguard replay`'s:

- **Fatal XID drain** (the kernel log / DCGM's XID field, as NVSentinel's syslog health
  monitor and most runbooks use it): XIDs 48 (double-bit ECC), 63/64 (row remap
  event / failure), 74 (NVLink), 79 (fallen off the bus), 92-95 (high single-bit ECC
  rate, contained / uncontained ECC) per NVIDIA's XID catalogue -> drain the node.
- **GPU off the bus**: a GPU whose series stop while other GPUs of its node still report
  -> drain (NVSentinel's "GPU fallen off the bus" check).
- **DCGM health watches** (NVSentinel's GPU health monitor polls them; a *failure* is
  fatal, a *warning* only marks the node): memory — a double-bit ECC or a row-remap
  failure is a failure, a pending row remap a warning; PCIe — replays above
  ``PCIE_REPLAYS_PER_MIN`` a warning; NVLink — CRC/replay errors above
  ``NVLINK_ERRORS_PER_MIN`` a warning; thermal — thermal-violation time a warning.
- **Link-down drain**: an InfiniBand port not ACTIVE (``node_infiniband_state_id`` != 4)
  -> drain the node.
- **Host memory**: an uncorrectable EDAC error -> drain the node.

Flags are sticky (an operator repairs, then clears): one episode per entity. The rates
for the warnings are the operator's choice, set before any history was scored.
"""

from __future__ import annotations

import numpy as np

from seamguard.fleet.model import Fleet

FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 93, 94, 95})
PCIE_REPLAYS_PER_MIN = 8.0
NVLINK_ERRORS_PER_MIN = 10.0
ACTIVE = 4.0


class OperatorRules:
    """A scenario sink (``rules(t, values, driver)``); ``events`` is the timeline it wrote."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.events: list[dict] = []
        self._prev: dict[str, np.ndarray] = {}
        self._prev_t: float | None = None
        self._flagged: set[tuple[str, str]] = set()
        self._drained: set[int] = set()
        self._absent = np.zeros(len(fleet.gpu_names), dtype=int)

    def _flag(self, t: float, kind: str, entity: str, to: str, node: int, why: str) -> None:
        if (kind, entity) not in self._flagged:
            self._flagged.add((kind, entity))
            self.events.append({"t": t, "kind": kind, "entity": entity, "from": "healthy", "to": to, "why": why})
        if to == "quarantined" and node not in self._drained:
            self._drained.add(node)
            self.events.append({"t": t, "kind": "node", "entity": self.fleet.node_names[node],
                                "action": {"op": "apply", "verb": "drain", "cause": entity, "why": why}})

    def _increase(self, name: str, values: dict[str, np.ndarray]) -> np.ndarray:
        """Per entity, how much a counter rose since the last scrape (a reset or a gap: 0)."""
        cur, prev = values.get(name), self._prev.get(name)
        if cur is None or prev is None:
            return np.zeros(0 if cur is None else len(cur))
        with np.errstate(invalid="ignore"):
            d = cur - prev
        return np.where(np.isfinite(d) & (d > 0), d, 0.0)

    def __call__(self, t: float, values: dict[str, np.ndarray], driver: list[str]) -> None:
        per_min = 60.0 / (t - self._prev_t) if self._prev_t is not None else 0.0
        self._gpu_rules(t, values, per_min)
        self._host_rules(t, values)
        for k, v in values.items():  # a missed scrape keeps the last value seen
            prev = self._prev.get(k)
            self._prev[k] = v.copy() if prev is None else np.where(np.isfinite(v), v, prev)
        self._prev_t = t

    def _gpu_rules(self, t: float, v: dict[str, np.ndarray], per_min: float) -> None:
        f = self.fleet
        xid = v.get("DCGM_FI_DEV_XID_ERRORS")
        prev_xid = self._prev.get("DCGM_FI_DEV_XID_ERRORS")
        fails: dict[int, str] = {}
        warns: dict[int, str] = {}
        if xid is not None and prev_xid is not None:
            new = np.isfinite(xid) & (xid != prev_xid)
            for g in np.flatnonzero(new).tolist():
                if int(xid[g]) in FATAL_XIDS:
                    fails[g] = f"XID {int(xid[g])}"
        for name, why in (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "double-bit ECC"),
                          ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "row remap failure")):
            for g in np.flatnonzero(self._increase(name, v)).tolist():
                fails.setdefault(g, why)
        for name, why in (("DCGM_FI_DEV_ROW_REMAP_PENDING", "row remap pending"),
                          ("DCGM_FI_DEV_THERMAL_VIOLATION", "thermal violation")):
            for g in np.flatnonzero(self._increase(name, v)).tolist():
                warns.setdefault(g, why)
        rates = (("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", PCIE_REPLAYS_PER_MIN, "PCIe replay rate"),
                 ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", NVLINK_ERRORS_PER_MIN, "NVLink error rate"))
        for name, limit, why in rates:
            for g in np.flatnonzero(self._increase(name, v) * per_min > limit).tolist():
                warns.setdefault(g, why)
        temp = v.get("DCGM_FI_DEV_GPU_TEMP")
        if temp is not None and self._prev:
            gone = ~np.isfinite(temp)
            node_reports = np.bincount(f.gpu_node, weights=(~gone).astype(float), minlength=len(f.node_names)) > 0
            self._absent = np.where(gone & node_reports[f.gpu_node], self._absent + 1, 0)
            for g in np.flatnonzero(self._absent >= 2).tolist():
                fails.setdefault(g, "GPU off the bus")
        for g, why in fails.items():
            self._flag(t, "gpu", f.gpu_names[g], "quarantined", int(f.gpu_node[g]), why)
        for g, why in warns.items():
            self._flag(t, "gpu", f.gpu_names[g], "degraded", int(f.gpu_node[g]), why)

    def _host_rules(self, t: float, v: dict[str, np.ndarray]) -> None:
        f = self.fleet
        state = v.get("node_infiniband_state_id")
        if state is not None:
            for nic in np.flatnonzero(np.isfinite(state) & (state != ACTIVE)).tolist():
                self._flag(t, "nic", f.nic_names[nic], "quarantined", int(f.nic_node[nic]), "link down")
        for n in np.flatnonzero(self._increase("node_edac_uncorrectable_errors_total", v)).tolist():
            self._flag(t, "node", f.node_names[n], "quarantined", n, "uncorrectable memory error")
