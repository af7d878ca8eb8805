"""The agent's hard evidence, end to end: agent exposition -> real Prometheus -> the default
mapping's PromQL (observe/prommap.py, Signal.query) -> Frame -> assess -> state.

Two agents (two nodes) are scraped by a throwaway Prometheus; the controller's Prometheus
source reads them with its default queries. Then node 0's kernel log says one GPU fell off
the bus and its checkpoint path stops answering; node 1's host logs an uncorrectable
memory error and a fatal NVSwitch SXid, and nodes 1 and 2 share an NVLink domain. What
dcgm-exporter would add (temperatures, power, ports, coolant) is filled in healthy, so every
state change comes from the agent's series alone.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from seamguard.agent.config import parse_agent_config
from seamguard.agent.exporter import Agent
from seamguard.assess.assessment import AssessConfig, assess, initial_states
from seamguard.assess.states import State
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe import History
from seamguard.observe.frame import make_frame
from seamguard.observe.prometheus import PromConfig, PrometheusSource
from seamguard.testbed.prom import MissingBinary, PrometheusServer, need

BASE = generate_fleet(FleetShape(gpus=8, gpus_per_node=2, rails=1, nodes_per_rack=2, spare_fraction=0.0), seed=2)
FLEET = replace(BASE, node_nvlink_domain=np.array([-1, 7, 7, -1]), _index={})  # nodes 1 and 2: one NVLink domain
BUS = {"0000:18:00.0": 0, "0000:2a:00.0": 1}


def _host(root: Path, ue: int) -> tuple[Path, Path]:
    proc, edac = root / "proc", root / "edac"
    (proc / "pressure").mkdir(parents=True, exist_ok=True)
    for res in ("cpu", "memory", "io"):
        (proc / "pressure" / res).write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n"
                                             "full avg10=0.00 avg60=0.00 avg300=0.00 total=500\n")
    (proc / "vmstat").write_text("nr_free_pages 1000\noom_kill 0\n")
    (edac / "mc0").mkdir(parents=True, exist_ok=True)
    (edac / "mc0" / "ce_count").write_text("3\n")
    (edac / "mc0" / "ue_count").write_text(f"{ue}\n")
    return proc, edac


def _agent(tmp: Path, node: str, storage: tuple[str, Path] | None) -> tuple[Agent, Path, Path]:
    tmp.mkdir()
    kmsg = tmp / "kmsg"
    kmsg.write_text("")
    proc, edac = _host(tmp, 0)
    paths = f"[{{name: {storage[0]}, path: {storage[1]}}}]" if storage else "[]"
    cfg = parse_agent_config(f"""
version: 1
node: {node}
listen: {{host: 127.0.0.1, port: 0}}
gpus: {{enabled: false}}
kernel_log: {{path: {kmsg}, gpus: {{"0000:18:00.0": 0, "0000:2a:00.0": 1}}}}
nics: {{enabled: false}}
fabric: {{enabled: false}}
host: {{proc_root: {proc}, edac_root: {edac}}}
storage: {{paths: {paths}, interval_s: 0.2, timeout_s: 2}}
""", f"{node}.yaml")
    agent = Agent(cfg)
    agent.start()
    return agent, kmsg, edac


def _dcgm_healthy(fleet) -> dict[str, np.ndarray]:
    """What dcgm-exporter, node_exporter and the CDUs would report for a quiet fleet."""
    g, nic = fleet.count(Kind.GPU), fleet.count(Kind.NIC)
    return {"DCGM_FI_DEV_GPU_TEMP": np.full(g, 60.0), "DCGM_FI_DEV_POWER_USAGE": np.full(g, 600.0),
            "DCGM_FI_DEV_GPU_UTIL": np.full(g, 95.0), "DCGM_FI_DEV_SM_CLOCK": np.full(g, 1980.0),
            "node_infiniband_state_id": np.full(nic, 4.0), "node_infiniband_physical_state_id": np.full(nic, 5.0),
            "seamguard_coolant_flow_lpm": fleet.loop_rated_flow_lpm.copy()}


class Controller:
    """The assess loop over frames from the Prometheus source (the controller's tick, without decide)."""

    def __init__(self, url: str) -> None:
        self.source = PrometheusSource(FLEET, PromConfig(url=url, timeout_s=5))
        self.cfg = AssessConfig()
        self.hist = History(1.0, default_depth=2, depth_by_signal=self.cfg.history_depths(1.0))
        self.prev, self.base, self.last = initial_states(FLEET), None, None

    def tick(self):
        f = self.source.frame_at()
        fill = _dcgm_healthy(FLEET)  # where no exporter of the test reports: what dcgm-exporter would
        values = {k: np.where(np.isfinite(v), v, fill[k]) if k in fill else v for k, v in f.values.items()}
        frame = make_frame(FLEET, f.t_s, {**fill, **values})
        a = assess(FLEET, frame, self.hist, self.prev, self.cfg, base=self.base)
        self.hist.push(frame)
        self.prev, self.base, self.last = {k: ka.states for k, ka in a.kinds.items()}, a.baselines, a
        return frame, a


def _gpus(node: int) -> np.ndarray:
    return np.flatnonzero(FLEET.gpu_node == node)


def test_hard_agent_evidence_reaches_the_state_machine_through_prometheus(tmp_path):
    try:
        need("prometheus", "prometheus")
    except MissingBinary as e:
        pytest.skip(str(e))
    storage = FLEET.storage_names[int(FLEET.node_storage[0])]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    a0, kmsg0, _ = _agent(tmp_path / "a0", FLEET.node_names[0], (storage, ckpt))
    a1, kmsg1, edac1 = _agent(tmp_path / "a1", FLEET.node_names[1], None)
    try:
        with PrometheusServer(tmp_path / "prom", targets=[f"127.0.0.1:{a0.port}", f"127.0.0.1:{a1.port}"],
                              scrape_interval="500ms") as prom:
            prom.wait_targets_up()
            ctl = Controller(prom.url)
            deadline = time.monotonic() + 60
            while True:  # quiet: the agent's series are there (0 where nothing happened) and nothing is flagged
                frame, a = ctl.tick()
                seen = frame.get("seamguard_xid_fatal_total")[_gpus(0)]
                probe = frame.get("seamguard_storage_probe_up")[int(FLEET.node_storage[0])]
                if np.isfinite(seen).all() and probe == 1.0 and \
                        np.isfinite(frame.get("node_edac_uncorrectable_errors_total")[1]):
                    break
                assert time.monotonic() < deadline, {k: v for k, v in frame.values.items() if np.isfinite(v).any()}
                time.sleep(0.5)
            for _ in range(2):
                frame, a = ctl.tick()
                time.sleep(0.6)
            assert (a.kinds[Kind.GPU].states.state == State.HEALTHY).all(), [a.kinds[Kind.GPU].reasons(i) for i in range(8)]
            assert (a.kinds[Kind.STORAGE].states.state == State.HEALTHY).all()

            with kmsg0.open("a") as f:  # node 0: GPU 1 falls off the bus (the driver's multi-line message)
                f.write("NVRM: The NVIDIA GPU 0000:2a:00.0\n"
                        "NVRM: (PCI ID: 10de:2330) installed in this system has\n"
                        "NVRM: fallen off the bus and is not responding to commands.\n")
            ckpt.rmdir()  # node 0's checkpoint path stops answering
            (edac1 / "mc0" / "ue_count").write_text("1\n")  # node 1: an uncorrectable host memory error
            with kmsg1.open("a") as f:  # and a fatal SXid on one of its NVSwitches
                f.write("nvidia-nvswitch0: SXid (PCI:0000:c1:00.0): 24007, Fatal, Link 04 sourcetrack timeout\n")

            want = {int(_gpus(0)[1]), *_gpus(1).tolist(), *_gpus(2).tolist()}
            deadline = time.monotonic() + 30
            while True:
                time.sleep(0.6)
                frame, a = ctl.tick()
                failed = set(np.flatnonzero(a.kinds[Kind.GPU].states.state == State.FAILED).tolist())
                path = a.kinds[Kind.STORAGE].states.state[int(FLEET.node_storage[0])]
                if (failed == want and path == State.FAILED) or time.monotonic() > deadline:
                    break
    finally:
        a0.stop()
        a1.stop()
    assert failed == want, (sorted(failed), sorted(want))
    assert path == State.FAILED
    reasons = {r.channel for r in a.kinds[Kind.GPU].reasons(int(_gpus(0)[1]))}
    assert "xid" in reasons
    assert {"host_memory_uncorrectable", "nvswitch_fatal"} <= {r.channel for r in a.kinds[Kind.GPU].reasons(
        int(_gpus(1)[0]))}
    assert {r.channel for r in a.kinds[Kind.GPU].reasons(int(_gpus(2)[0]))} == {"nvswitch_fatal"}
    assert (a.kinds[Kind.GPU].states.state[_gpus(3)] == State.HEALTHY).all()
