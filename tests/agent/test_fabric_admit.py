"""Who the fabric echo responder answers: ``admit`` as a decision table, and the config's allow list."""

from __future__ import annotations

import ipaddress

import pytest

from seamguard.agent.config import AgentConfigError, parse_agent_config
from seamguard.agent.exporter import echo_sources
from seamguard.agent.fabric import FULL, MAX_ECHO_CONNECTIONS, MAX_ECHO_PER_SOURCE, NOT_A_PEER, SOURCE_BUSY, admit

NETS = (ipaddress.ip_network("10.0.0.2/32"), ipaddress.ip_network("10.1.0.0/16"), ipaddress.ip_network("fd00::/64"))

TABLE = [
    # (case, source address, slots held per source, slots in use, refusal or None)
    ("a configured peer", "10.0.0.2", {}, 0, None),
    ("inside an accept_from network", "10.1.7.9", {}, 0, None),
    ("IPv4-mapped on a dual-stack listener", "::ffff:10.0.0.2", {}, 0, None),
    ("IPv6 peer with a zone", "fd00::5%eth0", {}, 0, None),
    ("a stranger", "10.0.0.3", {}, 0, NOT_A_PEER),
    ("a stranger next to a peer's network", "10.2.0.1", {}, 0, NOT_A_PEER),
    ("not an address", "garbage", {}, 0, NOT_A_PEER),
    ("a peer holding its share", "10.0.0.2", {"10.0.0.2": MAX_ECHO_PER_SOURCE}, MAX_ECHO_PER_SOURCE, SOURCE_BUSY),
    ("a peer one below its share", "10.0.0.2", {"10.0.0.2": MAX_ECHO_PER_SOURCE - 1}, 3, None),
    ("every slot held by others", "10.0.0.2", {}, MAX_ECHO_CONNECTIONS, FULL),
]


@pytest.mark.parametrize("case,addr,held,in_use,why", TABLE, ids=[t[0] for t in TABLE])
def test_admit(case, addr, held, in_use, why):
    assert admit(addr, NETS, held, in_use) == why


def test_echo_sources_are_the_peers_and_accept_from():
    cfg = parse_agent_config("""
version: 1
node: a
fabric:
  accept_from: [10.9.0.0/16, 10.8.0.7]
  rails: [{nic: a/mlx5_0, address: 10.0.0.1, rail: 0}]
  peers: [{nic: b/mlx5_0, address: 10.0.0.2, rail: 0}]
""", "a.yaml")
    assert [str(n) for n in echo_sources(cfg)] == ["10.0.0.2/32", "10.8.0.7/32", "10.9.0.0/16"]


def test_accept_from_that_is_not_a_network_is_one_line():
    with pytest.raises(AgentConfigError) as e:
        parse_agent_config("version: 1\nnode: a\nfabric: {accept_from: [10.0.0.0/33]}\n", "a.yaml")
    assert "\n" not in str(e.value) and "a.yaml" in str(e.value) and "fabric.accept_from[0]" in str(e.value)
