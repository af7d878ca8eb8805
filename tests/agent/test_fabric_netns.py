"""The fabric probe between two network namespaces joined by a veth pair: RTT and loss move
when one side is shaped with tbf (netem is not available here).

Two real agents: one in namespace B answers (its echo responder), one in namespace A probes
B over the "rail" and is scraped from inside A. Both namespaces are deleted in a finalizer,
also when the test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tests.agent.conftest import samples, scrape, start_agent, stop, value, write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                                reason="needs root, ip and tc")

ADDR_A, ADDR_B = "10.99.0.1", "10.99.0.2"
ECHO_PORT, METRICS_PORT = 9476, 9475
LABELS = {"src_nic": "a/eth0", "dst_nic": "b/eth0", "rail": "0"}


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=20)


@pytest.fixture
def netns_pair(request):
    tag = f"sgag{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    veth_a, veth_b = f"{tag}va", f"{tag}vb"

    def cleanup() -> None:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)

    request.addfinalizer(cleanup)
    cleanup()  # a leftover of an interrupted run
    _sh("ip", "netns", "add", a)
    _sh("ip", "netns", "add", b)
    _sh("ip", "link", "add", veth_a, "netns", a, "type", "veth", "peer", "name", veth_b, "netns", b)
    for ns, dev, addr in ((a, veth_a, ADDR_A), (b, veth_b, ADDR_B)):
        _sh("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
    return a, b, veth_b


def _window(prefix, seconds: float) -> tuple[float, float, int]:
    """(mean RTT s, loss ratio, probes) over ``seconds`` of probing, from two scrapes' counters."""
    def read():
        s = samples(scrape(METRICS_PORT, prefix))
        return (value(s, "seamguard_fabric_probes_total", **LABELS) or 0.0,
                value(s, "seamguard_fabric_probe_lost_total", **LABELS) or 0.0,
                value(s, "seamguard_fabric_probe_rtt_seconds_sum", **LABELS) or 0.0,
                value(s, "seamguard_fabric_probe_rtt_seconds_count", **LABELS) or 0.0)

    s0, l0, r0, c0 = read()
    time.sleep(seconds)
    s1, l1, r1, c1 = read()
    sent, lost, n = s1 - s0, l1 - l0, c1 - c0
    return ((r1 - r0) / n if n else float("inf")), (lost / sent if sent else float("nan")), int(sent)


def test_fabric_probe_sees_tbf_delay_and_loss(netns_pair, tmp_path):
    a, b, veth_b = netns_pair
    in_a, in_b = ("ip", "netns", "exec", a), ("ip", "netns", "exec", b)
    common = {"gpus": {"enabled": False}, "kernel_log": {"enabled": False}, "host": {"enabled": False},
              "nics": {"enabled": False}}
    cfg_b = write_config(tmp_path / "b.yaml", {"version": 1, "node": "b", **common,
                                               "listen": {"host": "127.0.0.1", "port": METRICS_PORT},
                                               "fabric": {"port": ECHO_PORT, "listen": ADDR_B,
                                                          "accept_from": [ADDR_A]}})
    cfg_a = write_config(tmp_path / "a.yaml", {
        "version": 1, "node": "a", **common, "listen": {"host": "127.0.0.1", "port": METRICS_PORT},
        "fabric": {"port": ECHO_PORT, "listen": ADDR_A, "interval_s": 0.05, "timeout_s": 0.6,
                   "payload_bytes": 16000,
                   "rails": [{"nic": "a/eth0", "address": ADDR_A, "rail": 0, "link": "a/eth0~leaf-0"}],
                   "peers": [{"nic": "b/eth0", "address": ADDR_B, "rail": 0}]}})
    agent_b = start_agent(cfg_b, in_b)
    agent_a = start_agent(cfg_a, in_a)
    try:
        scrape(METRICS_PORT, in_b, proc=agent_b)
        first = samples(scrape(METRICS_PORT, in_a, proc=agent_a))
        assert value(first, "seamguard_agent_info", node="a") == 1.0

        base_rtt, base_loss, n0 = _window(in_a, 1.0)
        # tbf on B's egress: a 16 kB echo drains through a 1.6 kB bucket at 1 Mbit/s (about 115 ms)
        _sh("tc", "-n", b, "qdisc", "add", "dev", veth_b, "root", "tbf", "rate", "1mbit", "burst", "1600",
            "latency", "2s")
        slow_rtt, slow_loss, n1 = _window(in_a, 1.5)
        link = value(samples(scrape(METRICS_PORT, in_a)), "seamguard_fabric_link_latency_us", link="a/eth0~leaf-0")
        # a starved bucket with a 1 ms queue: echoes are dropped, TCP's retransmit comes after the timeout
        _sh("tc", "-n", b, "qdisc", "replace", "dev", veth_b, "root", "tbf", "rate", "16kbit", "burst", "1600",
            "latency", "1ms")
        _, lossy_loss, n2 = _window(in_a, 2.0)
    finally:
        err_a, err_b = stop(agent_a), stop(agent_b)
    print(f"baseline rtt {base_rtt * 1e3:.2f} ms loss {base_loss:.2f} ({n0} probes); "
          f"tbf 1mbit rtt {slow_rtt * 1e3:.2f} ms loss {slow_loss:.2f} ({n1}); tbf 16kbit loss {lossy_loss:.2f} ({n2})")
    assert n0 >= 5 and base_loss == 0.0, err_a
    # tbf adds about 115 ms to every echo (measured here: 0.5-13 ms unshaped on a busy host, ~125 ms shaped)
    assert slow_rtt - base_rtt > 0.07, (base_rtt, slow_rtt)
    assert slow_loss == 0.0
    assert n2 >= 2 and lossy_loss >= 0.3, (lossy_loss, n2, err_a, err_b)
    # the link gauge (what the controller maps) is the last round's fastest RTT over the rail's peers in µs (one peer here)
    assert link is not None and link > 0.5 * slow_rtt * 1e6
