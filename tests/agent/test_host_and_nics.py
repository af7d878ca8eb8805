"""Host-pressure parsers (PSI, vmstat, EDAC) and the NIC collector over sysfs trees built in tmp_path."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from seamguard.agent.config import HostConfig, NicConfig
from seamguard.agent.exporter import HostCollector, NicCollector
from seamguard.agent.host import parse_psi, parse_vmstat, read_edac, read_host
from tests.agent.conftest import samples, value


@pytest.mark.parametrize("text,expected", [
    ("some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
     {"some": 0.001234, "full": 0.0}),
    ("some avg10=95.10 avg60=79.46 avg300=52.31 total=1700124795\n", {"some": 1700.124795}),  # older cpu file
    ("", {}),
    ("garbage\nsome avg10=1 total=notanumber\n", {}),
    ("full avg10=1.00 avg60=0.50 avg300=0.10 total=2000000\n", {"full": 2.0}),
])
def test_parse_psi(text, expected):
    assert parse_psi(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("nr_free_pages 123\noom_kill 3\npgfault 99\n", {"oom_kill": 3.0}),
    ("nr_free_pages 123\n", {}),  # kernels before 4.13 have no oom_kill
    ("oom_kill x\n", {}),
])
def test_parse_vmstat(text, expected):
    assert parse_vmstat(text) == expected


def _edac(root: Path, mcs: dict[str, tuple[str | None, str | None]]) -> Path:
    for name, (ce, ue) in mcs.items():
        d = root / name
        d.mkdir(parents=True)
        if ce is not None:
            (d / "ce_count").write_text(ce + "\n")
        if ue is not None:
            (d / "ue_count").write_text(ue + "\n")
    return root


@pytest.mark.parametrize("mcs,expected", [
    ({"mc0": ("5", "0"), "mc1": ("0", "2")}, {"0": (5.0, 0.0), "1": (0.0, 2.0)}),
    ({"mc0": ("7", None)}, {"0": (7.0, math.nan)}),  # unreadable counter: NaN, not exported
    ({"power": ("1", "1")}, {}),  # not a memory controller directory
    ({}, {}),
])
def test_read_edac(tmp_path, mcs, expected):
    got = read_edac(_edac(tmp_path / "mc", mcs))
    assert got.keys() == expected.keys()
    for k, (c, u) in expected.items():
        assert got[k][0] == c and (got[k][1] == u or (math.isnan(u) and math.isnan(got[k][1])))


def test_read_edac_without_edac(tmp_path):
    assert read_edac(tmp_path / "absent") == {}


def test_host_collector_exports_node_exporter_names(tmp_path):
    proc = tmp_path / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "pressure" / "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\n"
                                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (proc / "pressure" / "memory").write_text("some avg10=0 avg60=0 avg300=0 total=1000\n"
                                              "full avg10=0 avg60=0 avg300=0 total=500\n")
    # no io file: that resource is simply absent
    (proc / "vmstat").write_text("oom_kill 4\n")
    edac = _edac(tmp_path / "mc", {"mc0": ("11", "1")})
    assert read_host(proc, edac).psi.keys() == {"cpu", "memory"}
    reg = CollectorRegistry()
    reg.register(HostCollector("n0", HostConfig(proc_root=proc, edac_root=edac)))
    s = samples(generate_latest(reg).decode())
    assert value(s, "node_pressure_cpu_waiting_seconds_total", node="n0") == 2.5
    assert value(s, "node_pressure_cpu_stalled_seconds_total") is None  # cpu "full" 0: not tracked
    assert value(s, "node_pressure_memory_stalled_seconds_total") == pytest.approx(0.0005)
    assert value(s, "node_pressure_io_waiting_seconds_total") is None
    assert value(s, "node_vmstat_oom_kill", node="n0") == 4.0
    assert value(s, "node_edac_correctable_errors_total", controller="0") == 11.0
    assert value(s, "node_edac_uncorrectable_errors_total", controller="0") == 1.0


def _netdev(root: Path, name: str, **files: str) -> None:
    d = root / name
    d.mkdir(parents=True)
    for k, v in files.items():
        (d / k).write_text(v + "\n")


def _ibport(root: Path, dev: str, port: str, state: str, phys: str, **counters: str) -> None:
    p = root / dev / "ports" / port
    (p / "counters").mkdir(parents=True)
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text(phys + "\n")
    for k, v in counters.items():
        (p / "counters" / k).write_text(v + "\n")


def test_nic_collector_over_a_sysfs_tree(tmp_path):
    net, ib = tmp_path / "net", tmp_path / "ib"
    _netdev(net, "lo", operstate="unknown", carrier="1")
    _netdev(net, "eth0", operstate="up", carrier="1", carrier_changes="4", carrier_up_count="2",
            carrier_down_count="2")
    _netdev(net, "eth1", operstate="down", carrier_changes="7")  # admin-down: carrier unreadable
    _netdev(net, "rail0", operstate="up", carrier="1", carrier_changes="6")  # no up/down counts (old kernel)
    _ibport(ib, "mlx5_0", "1", "4: ACTIVE", "5: LinkUp", link_downed="3", symbol_error="17", port_rcv_errors="2",
            port_xmit_wait="900", link_error_recovery="1")
    _ibport(ib, "mlx5_1", "1", "1: DOWN", "3: Disabled", link_downed="9")
    cfg = NicConfig(net_root=net, ib_root=ib, devices={"mlx5_4": "rail0", "mlx5_9": "missing0"})
    reg = CollectorRegistry()
    reg.register(NicCollector("n0", cfg))
    s = samples(generate_latest(reg).decode())
    # node_network_*: every netdev but lo
    assert value(s, "node_network_up", device="eth0") == 1.0
    assert value(s, "node_network_up", device="eth1") == 0.0
    assert value(s, "node_network_up", device="lo") is None
    assert value(s, "node_network_carrier", device="eth1") is None
    assert value(s, "node_network_carrier_changes_total", device="eth1") == 7.0
    assert value(s, "node_network_carrier_down_changes_total", device="eth0") == 2.0
    assert value(s, "node_network_info", device="eth1", operstate="down") == 1.0
    # node_infiniband_*: real ports under node_exporter's names
    assert value(s, "node_infiniband_state_id", device="mlx5_0", port="1", node="n0") == 4.0
    assert value(s, "node_infiniband_physical_state_id", device="mlx5_0") == 5.0
    assert value(s, "node_infiniband_state_id", device="mlx5_1") == 1.0
    assert value(s, "node_infiniband_link_downed_total", device="mlx5_0") == 3.0
    assert value(s, "node_infiniband_symbol_error_total", device="mlx5_0") == 17.0
    assert value(s, "node_infiniband_port_errors_received_total", device="mlx5_0") == 2.0
    assert value(s, "node_infiniband_port_transmit_wait_total", device="mlx5_0") == 900.0
    assert value(s, "node_infiniband_link_error_recovery_total", device="mlx5_0") == 1.0
    assert value(s, "node_infiniband_symbol_error_total", device="mlx5_1") is None  # file absent
    # a RoCE/Ethernet rail mapped to a fleet device name: IB state code and carrier downs (changes / 2)
    assert value(s, "node_infiniband_state_id", device="mlx5_4", port="1") == 4.0
    assert value(s, "node_infiniband_link_downed_total", device="mlx5_4") == 3.0
    assert value(s, "node_infiniband_symbol_error_total", device="mlx5_4") is None
    assert value(s, "node_infiniband_state_id", device="mlx5_9") is None  # maps to nothing present


def test_nic_collector_without_sysfs(tmp_path):
    reg = CollectorRegistry()
    reg.register(NicCollector("n0", NicConfig(net_root=tmp_path / "no", ib_root=tmp_path / "no")))
    s = samples(generate_latest(reg).decode())
    assert not [k for k in s if k[0].startswith(("node_network", "node_infiniband"))]
