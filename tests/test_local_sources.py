"""Node-agent sources: sysfs on a real namespaced host whose link goes down and up; NVML
degrading cleanly on a machine without an NVIDIA driver."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

from conftest import SRC
from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.observe.nvml import NvmlSource

FLEET = generate_fleet(FleetShape(gpus=8), seed=0)


def ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, f"ip {' '.join(args)}: {r.stderr}"


def read_in(ns: str) -> dict:
    code = ("import json,sys; sys.path.insert(0, %r); from seamguard.observe.sysfs import read_netdev, "
            "read_infiniband; print(json.dumps({'net': read_netdev(), 'ib': len(read_infiniband())}))" % SRC)
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.replace("NaN", "null"))


@pytest.fixture
def netns():
    assert shutil.which("ip"), "iproute2 missing: apt-get install -y iproute2"
    ns = f"sgtest-{uuid.uuid4().hex[:8]}"
    ip("netns", "add", ns)
    try:
        ip("-n", ns, "link", "add", "sg0", "type", "veth", "peer", "name", "sg1")
        ip("-n", ns, "link", "set", "sg0", "up")
        ip("-n", ns, "link", "set", "sg1", "up")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=20)


@pytest.mark.slow
def test_sysfs_sees_link_down_and_up(netns):
    import time

    def wait_carrier(want):
        for _ in range(50):
            st = read_in(netns)["net"]["sg0"]
            if st["carrier"] == want:
                return st
            time.sleep(0.1)
        raise AssertionError(f"carrier never became {want}: {st}")

    up = wait_carrier(1)
    assert up["operstate"] == "up"
    ip("-n", netns, "link", "set", "sg1", "down")  # the peer goes away: sg0 loses carrier
    down = wait_carrier(0)
    assert down["operstate"] in ("lowerlayerdown", "down")
    assert down["carrier_changes"] > up["carrier_changes"]
    ip("-n", netns, "link", "set", "sg1", "up")
    back = wait_carrier(1)
    assert back["carrier_changes"] > down["carrier_changes"]
    assert read_in(netns)["ib"] == 0  # no InfiniBand here: empty, not an error


def test_sysfs_source_frame_from_a_fake_tree(tmp_path):
    from seamguard.observe.sysfs import SysfsSource

    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    for c, v in (("link_downed", 3), ("symbol_error", 7), ("port_xmit_wait", 11)):
        (port / "counters" / c).write_text(f"{v}\n")
    eth = tmp_path / "net" / "eth1"
    eth.mkdir(parents=True)
    (eth / "operstate").write_text("down\n")
    (eth / "carrier").write_text("0\n")
    (eth / "carrier_changes").write_text("6\n")
    src = SysfsSource(FLEET, {"gpu000/mlx5_0": "mlx5_0", "gpu000/mlx5_1": "eth1", "gpu000/mlx5_2": "gone0"},
                      net_root=tmp_path / "net", ib_root=tmp_path / "ib")
    f = src.read(1.0)
    st, dn = f.values["node_infiniband_state_id"], f.values["node_infiniband_link_downed_total"]
    assert st[0] == 4 and dn[0] == 3 and f.values["node_infiniband_symbol_error_total"][0] == 7
    assert st[1] == 1 and dn[1] == 3  # carrier_changes 6 = 3 downs + 3 ups
    assert np.isnan(st[2]) and "sysfs: gone0 not present" in f.flags


def test_nvml_without_driver_degrades_cleanly(caplog):
    src = NvmlSource(FLEET, "gpu000")
    f = src.read(5.0)
    src.close()
    if src.error:  # this machine: no NVIDIA driver
        assert np.isnan(f.values["DCGM_FI_DEV_GPU_TEMP"]).all()
        assert f.flags and f.flags[0].startswith("nvml: ")
        assert any("GPU signals will be missing" in r.message for r in caplog.records)
    else:  # a GPU host: real readings for this node's GPUs
        assert np.isfinite(f.values["DCGM_FI_DEV_GPU_TEMP"][:len(src.handles)]).all()
