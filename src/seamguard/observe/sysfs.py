"""Local link state from sysfs for a node agent: /sys/class/net and /sys/class/infiniband.

Reads what node_exporter's netclass and infiniband collectors read, without needing
node_exporter: operstate/carrier/carrier_changes per interface and state/phys_state and
error counters per InfiniBand port (docs/sources.md §1). Hosts without InfiniBand
simply have no `/sys/class/infiniband`; that is an empty result, not an error.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame, make_frame

log = logging.getLogger("seamguard.observe.sysfs")

IB_ACTIVE = 4  # node_infiniband_state_id: 4 = ACTIVE
IB_DOWN = 1
_IB_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "port_xmit_wait",
                "local_link_integrity_errors", "port_xmit_discards")


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:  # the interface vanished between listdir and read, or the file is not readable
        return None


def _int(s: str | None) -> float:
    try:
        return float(int(s)) if s is not None else np.nan
    except ValueError:
        return np.nan


def read_netdev(root: str | Path = "/sys/class/net") -> dict[str, dict[str, object]]:
    """{ifname: {operstate, carrier, carrier_changes, carrier_up_count, carrier_down_count}}."""
    out: dict[str, dict[str, object]] = {}
    base = Path(root)
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        out[d.name] = {
            "operstate": _read(d / "operstate"),
            # Reading carrier of an administratively-down interface fails with EINVAL: NaN.
            "carrier": _int(_read(d / "carrier")),
            "carrier_changes": _int(_read(d / "carrier_changes")),
            "carrier_up_count": _int(_read(d / "carrier_up_count")),
            "carrier_down_count": _int(_read(d / "carrier_down_count")),
        }
    return out


def read_infiniband(root: str | Path = "/sys/class/infiniband") -> dict[tuple[str, str], dict[str, float]]:
    """{(device, port): {state_id, phys_state_id, <counters>}}; empty without InfiniBand."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    base = Path(root)
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir()):
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir()):
            rec: dict[str, float] = {}
            for field, key in (("state", "state_id"), ("phys_state", "phys_state_id")):
                raw = _read(port / field)  # e.g. "4: ACTIVE", "5: LinkUp"
                rec[key] = _int(raw.split(":", 1)[0]) if raw else np.nan
            for c in _IB_COUNTERS:
                rec[c] = _int(_read(port / "counters" / c))
            out[(dev.name, port.name)] = rec
    return out


def netdev_state_id(rec: dict[str, object]) -> float:
    """An Ethernet/RoCE interface in the IB state code: 4 when up with carrier, else 1."""
    return float(IB_ACTIVE) if rec.get("operstate") == "up" and rec.get("carrier") == 1 else float(IB_DOWN)


def nic_record(iface: str, ib: dict[tuple[str, str], dict[str, float]],
               net: dict[str, dict[str, object]]) -> dict[str, float] | None:
    """One NIC in node_exporter's infiniband terms: port 1 of an IB device, else a netdev.

    An Ethernet/RoCE interface gets the IB state code (4 up, 1 down) and its carrier down
    transitions as ``link_downed``; its IB-only counters are NaN. None when neither exists.
    Shared by ``SysfsSource`` and the node agent (seamguard.agent), so both read a NIC alike.
    """
    rec = ib.get((iface, "1"))
    if rec is not None:
        return dict(rec)
    r = net.get(iface)
    if r is None:
        return None
    # Down transitions; older kernels only have carrier_changes (ups + downs).
    dc = r["carrier_down_count"]
    downed = dc if not np.isnan(dc) else np.floor(r["carrier_changes"] / 2.0)
    out = {c: np.nan for c in _IB_COUNTERS}
    out.update(state_id=netdev_state_id(r), phys_state_id=np.nan, link_downed=downed)
    return out


class SysfsSource:
    """NIC signals of one node from sysfs, as a Frame aligned to the fleet.

    ``nic_ifaces`` maps fleet NIC names to an InfiniBand device ('mlx5_0', port 1) or a
    network interface ('eth0'); IB devices are preferred when present.
    """

    def __init__(self, fleet: Fleet, nic_ifaces: dict[str, str], net_root: str | Path = "/sys/class/net",
                 ib_root: str | Path = "/sys/class/infiniband") -> None:
        self.fleet = fleet
        self.net_root, self.ib_root = Path(net_root), Path(ib_root)
        self.targets = [(fleet.index_of(Kind.NIC, nic), iface) for nic, iface in nic_ifaces.items()]

    def read(self, t_s: float) -> Frame:
        n = self.fleet.count(Kind.NIC)
        state, downed, symbol, wait = (np.full(n, np.nan) for _ in range(4))
        ib = read_infiniband(self.ib_root)
        net = read_netdev(self.net_root)
        flags = []
        for i, iface in self.targets:
            rec = nic_record(iface, ib, net)
            if rec is None:
                flags.append(f"sysfs: {iface} not present")
                continue
            state[i], downed[i] = rec["state_id"], rec["link_downed"]
            symbol[i], wait[i] = rec["symbol_error"], rec["port_xmit_wait"]
        return make_frame(self.fleet, t_s, {"node_infiniband_state_id": state,
                                            "node_infiniband_link_downed_total": downed,
                                            "node_infiniband_symbol_error_total": symbol,
                                            "node_infiniband_port_transmit_wait_total": wait}, tuple(flags))
