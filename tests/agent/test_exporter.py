"""The agent end to end: started on a free port, scraped over HTTP, parsed with prometheus_client's
text parser; and `seamguard agent` config errors as one line."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from seamguard.agent.config import AgentConfigError, parse_agent_config
from seamguard.agent.exporter import Agent
from seamguard.ports import free_port
from tests.agent.conftest import samples, scrape, value, write_config
from tests.conftest import subprocess_env


def test_agent_end_to_end_over_http(tmp_path):
    kmsg = tmp_path / "kmsg"  # a file standing in for /dev/kmsg: the tail reads it the same way
    kmsg.write_text("4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 48, a line from before the agent started\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    port, echo = free_port(), free_port()
    cfg = parse_agent_config(f"""
version: 1
node: node-0
listen: {{host: 127.0.0.1, port: {port}}}
kernel_log: {{path: {kmsg}, gpus: {{"0000:3b:00.0": 0, "0000:5e:00.0": 1}}}}
storage: {{paths: [{{name: ckpt-a, path: {ckpt}}}], interval_s: 0.05}}
fabric:
  port: {echo}
  listen: 127.0.0.1
  interval_s: 0.05
  rails: [{{nic: node-0/mlx5_0, address: 127.0.0.1, rail: 0, link: node-0/mlx5_0~leaf-0}}]
  peers: [{{nic: node-1/mlx5_0, address: 127.0.0.1, rail: 0}}, {{nic: node-2/mlx5_0, address: 127.0.0.1, rail: 0,
           port: {free_port()}}}]
""", "agent.yaml")
    agent = Agent(cfg)
    assert any("no NVIDIA driver" in n for n in agent.notes)  # no driver here: one note, no GPU series
    assert agent.start() == port
    try:
        with kmsg.open("a") as f:
            f.write("6,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
                    "6,3,3,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
                    "6,4,4,-;nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout\n"
                    "6,5,5,-;NVRM: The NVIDIA GPU 0000:5e:00.0\\x0aNVRM: fallen off the bus and is not "
                    "responding to commands.\n")
        s = _after_rounds(port, 2)
    finally:
        agent.stop()
    # kernel log: only what came after the start, per bus id and code
    assert value(s, "seamguard_xid_errors_total", pci_bus_id="0000:3b:00.0", xid="79", node="node-0") == 2.0
    assert value(s, "seamguard_xid_errors_total", xid="48") is None
    assert value(s, "seamguard_sxid_errors_total", sxid="24007", severity="fatal") == 1.0
    assert value(s, "seamguard_gpu_fallen_off_bus_total", pci_bus_id="0000:5e:00.0") == 1.0
    # the dcgm-exporter gauge the controller maps, for the GPUs the config names
    assert value(s, "DCGM_FI_DEV_XID_ERRORS", Hostname="node-0", gpu="0") == 79.0
    assert value(s, "DCGM_FI_DEV_XID_ERRORS", Hostname="node-0", gpu="1") == 79.0
    assert not [k for k in s if k[0].startswith("DCGM_FI_DEV_GPU_TEMP")]
    assert value(s, "seamguard_agent_info", gpus="none") == 1.0
    # storage: a histogram per path and op, the p99 gauge, up
    assert value(s, "seamguard_storage_probe_seconds_count", storage="ckpt-a", op="write") >= 2
    assert value(s, "seamguard_storage_write_latency_ms", storage="ckpt-a") > 0
    assert value(s, "seamguard_storage_probe_up", storage="ckpt-a") == 1.0
    # fabric: the live peer answers, the one with no responder is all loss
    dead = {**LIVE, "dst_nic": "node-2/mlx5_0"}
    assert value(s, "seamguard_fabric_probes_total", **LIVE) >= 2
    assert value(s, "seamguard_fabric_probe_lost_total", **LIVE) in (None, 0.0)
    assert value(s, "seamguard_fabric_probe_rtt_seconds_count", **LIVE) >= 2
    assert value(s, "seamguard_fabric_probe_lost_total", **dead) == value(s, "seamguard_fabric_probes_total", **dead)
    assert value(s, "seamguard_fabric_link_latency_us", link="node-0/mlx5_0~leaf-0") > 0
    # host pressure and NICs from the real /proc and /sys
    assert value(s, "node_vmstat_oom_kill") is not None
    assert value(s, "node_network_up", device="lo") is None


LIVE = {"src_nic": "node-0/mlx5_0", "dst_nic": "node-1/mlx5_0", "rail": "0"}


def _after_rounds(port: int, rounds: int, timeout_s: float = 10.0) -> dict:
    """The agent's samples once it has done ``rounds`` storage probes (each fsyncs: slow on a
    loaded disk) and fabric rounds and read the kernel log, or whatever it has at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = samples(scrape(port))
        done = ((value(s, "seamguard_storage_probe_seconds_count", storage="ckpt-a", op="write") or 0) >= rounds
                and (value(s, "seamguard_fabric_probe_rtt_seconds_count", **LIVE) or 0) >= rounds
                and value(s, "seamguard_gpu_fallen_off_bus_total", pci_bus_id="0000:5e:00.0") is not None)
        if done or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def _run(cfg_path, *extra):
    return subprocess.run([sys.executable, "-m", "seamguard", "agent", "--config", str(cfg_path), *extra],
                          capture_output=True, text=True, timeout=60, env=subprocess_env())


BAD = [
    ("version: 1\nnode: n\nfabric:\n  rails: [{nic: a, address: 10.0.0.300, rail: 0}]\n",
     "fabric.rails[0].address"),
    ("version: 1\nnode: n\nfabric:\n  rails: [{nic: a, address: 10.0.0.1, rail: 0}]\n"
     "  peers: [{nic: b, address: 10.0.0.2, rail: 3}]\n", "rail 3"),
    ("version: 1\nnode: n\nfabric:\n  port: 0\n  rails: [{nic: a, address: 10.0.0.1, rail: 0}]\n"
     "  peers: [{nic: b, address: 10.0.0.2, rail: 0}]\n", "needs a port"),
    ("version: 1\nnode: n\nstorage: {interval_s: -1}\n", "storage.interval_s"),
    ("version: 1\nnode: n\nlisten: {port: 99999}\n", "listen.port"),
    ("version: 1\nnode: n\nkernel_log: {source: dmesg}\n", "kernel_log.source"),
    ("version: 1\nnode: n\nprobes: {}\n", "probes"),
    ("version: 2\nnode: n\n", "version"),
    ("node: [unclosed\n", "not valid YAML"),
    ("- a list\n", "mapping"),
]


@pytest.mark.parametrize("text,where", BAD, ids=[b[1] for b in BAD])
def test_config_error_is_one_line_naming_file_and_field(text, where):
    with pytest.raises(AgentConfigError) as e:
        parse_agent_config(text, "agent.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("agent.yaml: ") and where in msg


def test_cli_config_error_before_binding(tmp_path):
    """A bad field is reported as one `error:` line, exit 2 — even with the listen port taken,
    because nothing is bound before the whole file validates."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = write_config(tmp_path / "agent.yaml", {"version": 1, "node": "n",
                                                     "listen": {"host": "127.0.0.1", "port": port},
                                                     "storage": {"timeout_s": "soon"}})
        p = _run(cfg)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(f"error: {cfg}: storage.timeout_s:"), p.stderr


def test_cli_errors_for_files_and_sources(tmp_path):
    from typer.testing import CliRunner

    from seamguard.app.cli import app

    def run(path, *extra):
        r = CliRunner().invoke(app, ["agent", "--config", str(path), *extra])
        return r.exit_code, r.stderr

    code, err = run(tmp_path / "missing.yaml")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    cfg = write_config(tmp_path / "a.yaml", {"version": 1, "node": "n", "kernel_log": {"path": str(tmp_path / "no")}})
    code, err = run(cfg, "--check")
    assert code == 2 and "kernel_log: cannot open" in err and err.count("\n") == 1, err
    cfg = write_config(tmp_path / "b.yaml", {"version": 1, "node": "n", "kernel_log": {"enabled": False},
                                             "storage": {"paths": [{"name": "x", "path": str(tmp_path / "no")}]}})
    code, err = run(cfg, "--check")
    assert code == 2 and "storage.paths: x:" in err and err.count("\n") == 1, err


def test_cli_check_says_in_one_line_that_there_is_no_gpu_driver(tmp_path):
    cfg = write_config(tmp_path / "a.yaml", {"version": 1, "node": "n", "kernel_log": {"enabled": False}})
    p = _run(cfg, "--check")
    assert p.returncode == 0, p.stderr
    gpu_lines = [ln for ln in p.stderr.splitlines() if "GPU" in ln]
    assert len(gpu_lines) == 1 and "no NVIDIA driver" in gpu_lines[0]


def test_shipped_configs_validate():
    """deploy/agent.example.yaml and the DaemonSet's per-node config are valid agent configs."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2] / "deploy"
    parse_agent_config((root / "agent.example.yaml").read_text(), "agent.example.yaml")
    docs = list(yaml.safe_load_all((root / "kubernetes" / "seamguard-agent-daemonset.yaml").read_text()))
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    for name, text in cm["data"].items():
        assert parse_agent_config(text, name).version == 1
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["hostNetwork"] is True


def test_cli_check_passes_with_storage_and_fabric_probes_configured(tmp_path):
    """`--check` validates and stops without starting the probes: stopping them must not fail
    (it joined never-started threads: the systemd unit's ExecStartPre failed on every node
    with a storage path or fabric peers)."""
    cfg = write_config(tmp_path / "a.yaml", {
        "version": 1, "node": "n", "kernel_log": {"enabled": False},
        "storage": {"paths": [{"name": "scratch", "path": str(tmp_path)}]},
        "fabric": {"enabled": True, "port": 0,
                   "rails": [{"nic": "n/mlx5_0", "address": "127.0.0.1", "rail": 0}],
                   "peers": [{"nic": "m/mlx5_0", "address": "127.0.0.1", "rail": 0, "port": 9}]}})
    p = _run(cfg, "--check")
    assert p.returncode == 0 and p.stdout.strip().endswith(": ok"), p.stderr
    assert "Traceback" not in p.stderr
