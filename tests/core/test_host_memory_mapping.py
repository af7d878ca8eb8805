"""Host memory (EDAC) counts reach their node whoever exports them, through a real Prometheus.

The node agent labels its EDAC counters `node`; node_exporter's edac collector labels them
only with the scrape target's `instance` (``host:9100``) and `controller`. Both must land on
the node the mapping names from those labels (observe/prommap.py), summed over memory
controllers, and a controller both export counts once; a host series both export (PSI) is
reported once per node, not as two series for one node. Needs the Debian `prometheus`
package (promtool for the backfill); a missing binary fails loudly.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from seamguard.fleet import FleetShape, generate_fleet
from seamguard.observe.prometheus import PromConfig, PrometheusSource
from seamguard.scenarios.backfill import backfill_file
from seamguard.testbed.prom import PrometheusServer

FLEET = generate_fleet(FleetShape(gpus=8, gpus_per_node=2, rails=1, nodes_per_rack=2, spare_fraction=0.0), seed=2)
CE, UE = "node_edac_correctable_errors", "node_edac_uncorrectable_errors"
PSI = "node_pressure_io_stalled_seconds"


def _series(node: int, exporter: str, controller: str) -> str:
    name = FLEET.node_names[node]
    if exporter == "agent":
        return f'controller="{controller}",instance="{name}:9475",job="seamguard-agent",node="{name}"'
    return f'controller="{controller}",instance="{name}.dc.example:9100",job="node"'


# (node, exporter, controller): (correctable, uncorrectable) before and after the event
ROWS = {
    (0, "agent", "0"): ((3, 0), (5, 1)),            # the agent alone
    (1, "node_exporter", "0"): ((2, 0), (9, 1)),    # node_exporter alone, two controllers
    (1, "node_exporter", "1"): ((1, 0), (1, 1)),
    (2, "agent", "0"): ((4, 0), (4, 0)),            # both export the same controller
    (2, "node_exporter", "0"): ((4, 0), (4, 0)),
}                                                   # node 3: nobody exports host memory


def _history(path: Path, t0: float, t1: float) -> None:
    lines = []
    for fam, k in ((CE, 0), (UE, 1)):
        lines.append(f"# TYPE {fam} counter")
        for (node, exporter, ctl), (before, after) in ROWS.items():
            for t, v in ((t0, before[k]), (t1, after[k])):
                lines.append(f"{fam}_total{{{_series(node, exporter, ctl)}}} {v} {t:.3f}")
    # PSI: the agent on nodes 0 and 2, node_exporter on nodes 1 and 2 (the same kernel counter)
    lines.append(f"# TYPE {PSI} counter")
    for node, exporter in ((0, "agent"), (1, "node_exporter"), (2, "agent"), (2, "node_exporter")):
        labels = _series(node, exporter, "0").split(",", 1)[1]  # no controller on host series
        for t in (t0, t1):
            lines.append(f"{PSI}_total{{{labels}}} {10.0 * (node + 1)} {t:.3f}")
    path.write_text("\n".join(lines) + "\n# EOF\n", encoding="utf-8")


def test_host_series_reach_their_node_from_the_agent_and_node_exporter(tmp_path: Path) -> None:
    t0 = float(int(time.time() // 3600 * 3600) - 3 * 3600)
    t1 = t0 + 60.0
    _history(tmp_path / "edac.om", t0, t1)
    backfill_file(tmp_path / "edac.om", tmp_path / "tsdb")
    with PrometheusServer(tmp_path / "prom", tsdb_dir=tmp_path / "tsdb", lookback_delta="45s") as prom:
        src = PrometheusSource(FLEET, PromConfig(url=prom.url, timeout_s=10))
        try:
            before, after = src.frame_at(t0), src.frame_at(t1)
        finally:
            src.close()
    # per node: correctable and uncorrectable, summed over controllers, one copy per controller
    expect = {"before": ([3, 3, 4, np.nan], [0, 0, 0, np.nan]), "after": ([5, 10, 4, np.nan], [1, 2, 0, np.nan])}
    for when, frame in (("before", before), ("after", after)):
        ce = frame.get(f"{CE}_total")
        ue = frame.get(f"{UE}_total")
        np.testing.assert_array_equal(ce, expect[when][0], err_msg=f"correctable, {when}")
        np.testing.assert_array_equal(ue, expect[when][1], err_msg=f"uncorrectable, {when}")
    np.testing.assert_array_equal(after.get(f"{PSI}_total"), [10, 20, 30, np.nan])
    assert not [f for f in after.flags if "node_edac" in f or PSI in f], after.flags
