"""The fabric probe's per-link gauge blames the NIC whose own link is gray, not its peers.

A three-host, one-rail round like the seam drill's: h0's link is gray (every pair from or to
h0 is slow). Each agent only sees the pairs it sources; its gauge must stay low when only
one of its peers is slow.
"""

from __future__ import annotations

from seamguard.agent.fabric import Pair, link_latency_us

FAST_S, SLOW_S = 0.0008, 0.120  # an unshaped echo; one through a tbf-starved link


def _pair(src: int, dst: int) -> Pair:
    return Pair(f"h{src}/mlx5_0", f"10.0.0.{src}", f"h{dst}/mlx5_0", f"10.0.0.{dst}", 9476, 0,
                link=f"h{src}/mlx5_0~leaf-r0")


def _round(gray: int, hosts: int = 3) -> dict[int, float]:
    """Each host's link gauge (µs) from its own agent's round, with ``gray``'s link slow."""
    out = {}
    for src in range(hosts):
        rtts = {_pair(src, dst): SLOW_S if gray in (src, dst) else FAST_S for dst in range(hosts) if dst != src}
        (value,) = link_latency_us(rtts).values()
        out[src] = value
    return out


def test_a_gray_link_is_blamed_on_its_own_nic_only():
    for gray in range(3):
        gauge = _round(gray)
        assert gauge[gray] == SLOW_S * 1e6
        assert all(v == FAST_S * 1e6 for h, v in gauge.items() if h != gray), (gray, gauge)


def test_lost_probes_give_no_value_and_do_not_hide_a_slow_link():
    slow, lost = _pair(0, 1), _pair(0, 2)
    assert link_latency_us({slow: SLOW_S, lost: None}) == {slow.link: SLOW_S * 1e6}
    assert link_latency_us({slow: None, lost: None}) == {}
    no_link = Pair("h0/mlx5_1", "10.0.1.0", "h1/mlx5_1", "10.0.1.1", 9476, 1)
    assert link_latency_us({no_link: SLOW_S}) == {}
