"""The agent's series land on the right fleet entities under the controller's default mapping
(observe/prommap.py): NICs by `node` + `device`, GPUs' XID gauge by `Hostname` + `gpu`, storage by
`storage`, links by `link` — the names a generated fleet uses, end to end through the exporter."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from seamguard.agent.config import parse_agent_config
from seamguard.agent.exporter import Agent
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe.prommap import Mapping
from seamguard.ports import free_port
from tests.agent.conftest import samples
from tests.agent.test_host_and_nics import _ibport, _netdev

FLEET = generate_fleet(FleetShape(gpus=64, rails=2), seed=1)


def _entity(kind: Kind, labels: dict[str, str]) -> str | None:
    """The fleet entity a series names under the default mapping, as PrometheusSource resolves it."""
    key = Mapping().key_for(kind)
    name = next((labels[lab] for lab in key.labels if lab in labels), None)
    sub = labels.get(key.sub_label) if key.sub_label else None
    if name is None or (key.sub_label and sub is None):
        return None
    return key.entity_name(name, sub)


def where(s: dict, name: str, kind: Kind) -> dict[str, float]:
    """The series ``name`` in samples ``s``, keyed by the fleet entity their labels name."""
    return {_entity(kind, dict(lab)): v for (n_, lab), v in s.items() if n_ == name}


def test_agent_series_map_onto_the_fleet(tmp_path):
    node = FLEET.node_names[0]
    n = FLEET.node_names.index(node)
    nics = [i for i, name in enumerate(FLEET.nic_names) if int(FLEET.nic_node[i]) == n]
    nic0, nic1 = (FLEET.nic_names[i] for i in nics[:2])
    dev0, dev1 = nic0.split("/", 1)[1], nic1.split("/", 1)[1]
    link0 = FLEET.link_names[int(FLEET.nic_link[nics[0]])]
    storage = FLEET.storage_names[int(FLEET.node_storage[n])]
    # sysfs: rail 0 is an InfiniBand port under the fleet's device name; rail 1 a RoCE netdev
    net, ib = tmp_path / "net", tmp_path / "ib"
    _netdev(net, "ens2f0np0", operstate="up", carrier="1", carrier_down_count="1", carrier_changes="2")
    _ibport(ib, dev0, "1", "4: ACTIVE", "5: LinkUp", link_downed="0", symbol_error="3")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    echo = free_port()
    cfg = parse_agent_config(f"""
version: 1
node: {node}
listen: {{host: 127.0.0.1, port: 0}}
kernel_log: {{path: {kmsg}, gpus: {{"0000:18:00.0": 0, "0000:2a:00.0": 1}}}}
nics: {{net_root: {net}, ib_root: {ib}, devices: {{{dev1}: ens2f0np0}}}}
storage: {{paths: [{{name: {storage}, path: {ckpt}}}], interval_s: 0.05}}
fabric:
  port: {echo}
  listen: 127.0.0.1
  interval_s: 0.05
  rails: [{{nic: {nic0}, address: 127.0.0.1, rail: 0, link: "{link0}"}}]
  peers: [{{nic: {FLEET.nic_names[nics[0] + 2]}, address: 127.0.0.1, rail: 0}}]
""", "agent.yaml")
    agent = Agent(cfg)
    agent.start()
    try:
        with kmsg.open("a") as f:
            f.write("NVRM: Xid (PCI:0000:2a:00): 48, pid=1, DBE (double bit error) ECC error\n")
        deadline = time.monotonic() + 10   # a storage probe fsyncs: slow on a loaded disk
        while True:
            s = samples(generate_latest(agent.registry).decode())
            if (where(s, "seamguard_storage_write_latency_ms", Kind.STORAGE)
                    and where(s, "seamguard_fabric_link_latency_us", Kind.LINK)
                    and 48.0 in where(s, "DCGM_FI_DEV_XID_ERRORS", Kind.GPU).values()) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        agent.stop()

    assert where(s, "node_infiniband_state_id", Kind.NIC) == {nic0: 4.0, nic1: 4.0}
    assert where(s, "node_infiniband_symbol_error_total", Kind.NIC) == {nic0: 3.0}
    assert where(s, "node_infiniband_link_downed_total", Kind.NIC) == {nic0: 0.0, nic1: 1.0}
    gpus = where(s, "DCGM_FI_DEV_XID_ERRORS", Kind.GPU)
    assert gpus == {f"{node}/gpu0": 0.0, f"{node}/gpu1": 48.0}
    assert all(FLEET.index_of(Kind.GPU, g) >= 0 for g in gpus)
    assert list(where(s, "seamguard_storage_write_latency_ms", Kind.STORAGE)) == [storage]
    assert list(where(s, "seamguard_fabric_link_latency_us", Kind.LINK)) == [link0]
    for name in (nic0, nic1):
        assert FLEET.index_of(Kind.NIC, name) >= 0
