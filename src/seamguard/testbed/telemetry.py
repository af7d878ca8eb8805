"""The testbed's hosts as telemetry: node_exporter netclass names, and Frames for the controller.

Why this exists: the control plane must see the same flaps the runtime fails over from.
Per host and rail we read the kernel's own counters (``/sys/class/net/<if>/{operstate,
carrier,carrier_changes,carrier_down_count}``, inside the host's namespace) and expose
them under node_exporter's netclass names, plus seamguard's per-rail bandwidth gauge. For
the controller, the Ethernet link maps onto the NIC channels that assessment already
scores: carrier up = ``node_infiniband_state_id`` 4 (ACTIVE), else 1 (DOWN); carrier
down transitions = ``node_infiniband_link_downed_total``. Flap dampening (quarantine after
repeated downs in a window, return after a long stable stretch) is then the existing
NIC hysteresis, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seamguard.fleet.model import Fleet, Kind
from seamguard.fleet.topology import parse_topology
from seamguard.observe.frame import Frame, make_frame
from seamguard.testbed.net import Testbed

RAIL_BANDWIDTH = "seamguard_rail_bandwidth_bytes_per_second"
IB_ACTIVE, IB_DOWN = 4.0, 1.0


@dataclass(frozen=True)
class LinkSample:
    host: int
    rail: int
    device: str
    up: float  # operstate == up
    carrier: float
    carrier_changes_total: float
    carrier_down_changes_total: float
    receive_bytes_total: float
    transmit_bytes_total: float


def sample_links(tb: Testbed) -> list[LinkSample]:
    out = []
    for h in range(tb.spec.hosts):
        stats = tb.host_link_stats(h)
        for r in range(tb.spec.rails):
            s = stats[tb.rail_if(r)]
            out.append(LinkSample(h, r, tb.rail_if(r), s["up"], s["carrier"], s["carrier_changes"],
                                  s["carrier_down_changes"], s["rx_bytes"], s["tx_bytes"]))
    return out


def rail_bandwidth(prev: list[LinkSample], cur: list[LinkSample], dt_s: float) -> dict[tuple[int, int], float]:
    """Received bytes per second per (host, rail) between two samples."""
    p = {(s.host, s.rail): s.receive_bytes_total for s in prev}
    return {(s.host, s.rail): max(0.0, s.receive_bytes_total - p.get((s.host, s.rail), s.receive_bytes_total))
            / max(dt_s, 1e-9) for s in cur}


def exposition(tb: Testbed, samples: list[LinkSample], bw: dict[tuple[int, int], float]) -> str:
    """Prometheus text format, node_exporter names, one instance label per testbed host."""
    fams = [("node_network_up", "gauge", "operstate up", lambda s: s.up),
            ("node_network_carrier", "gauge", "carrier state", lambda s: s.carrier),
            ("node_network_carrier_changes_total", "counter", "carrier changes", lambda s: s.carrier_changes_total),
            ("node_network_carrier_down_changes_total", "counter", "carrier down changes",
             lambda s: s.carrier_down_changes_total),
            ("node_network_receive_bytes_total", "counter", "received bytes", lambda s: s.receive_bytes_total),
            (RAIL_BANDWIDTH, "gauge", "received bytes per second on the rail",
             lambda s: bw.get((s.host, s.rail), float("nan")))]
    lines = []
    for name, typ, help_, get in fams:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {typ}"]
        for s in samples:
            lines.append(f'{name}{{instance="{tb.host_ns(s.host)}",device="{s.device}",rail="{s.rail}"}} '
                         f"{get(s):g}")
    return "\n".join(lines) + "\n"


def fleet_of_testbed(tb: Testbed) -> Fleet:
    """A Fleet of the testbed: one node per host, one NIC per rail on leaf switch br<r>."""
    rails = range(tb.spec.rails)
    topo = {
        "version": 1, "name": tb.prefix,
        "cooling_loops": [{"name": "loop0", "rated_flow_lpm": 100.0}],
        "racks": [{"name": "rack0", "cooling_loop": "loop0"}],
        "switches": [{"name": f"br{r}", "tier": "leaf"} for r in rails],
        "storage_paths": ["nfs0"],
        "nodes": [{"name": f"h{h}", "rack": "rack0", "storage": "nfs0", "gpus": 0,
                   "nics": [{"name": f"h{h}/rail{r}", "rail": r, "leaf": f"br{r}"} for r in rails]}
                  for h in range(tb.spec.hosts)],
    }
    return parse_topology(topo, f"testbed {tb.prefix}")


def nic_frame(fleet: Fleet, samples: list[LinkSample], t_s: float) -> Frame:
    """The links' state as the NIC signals assessment scores (see the module docstring)."""
    n = fleet.count(Kind.NIC)
    state = np.full(n, np.nan)
    downs = np.full(n, np.nan)
    index = {name: i for i, name in enumerate(fleet.nic_names)}
    for s in samples:
        i = index[f"h{s.host}/{s.device}"]
        state[i] = IB_ACTIVE if s.carrier == 1.0 and s.up == 1.0 else IB_DOWN
        downs[i] = s.carrier_down_changes_total
    return make_frame(fleet, t_s, {"node_infiniband_state_id": state,
                                   "node_infiniband_link_downed_total": downs})
