"""Testbed + controller together: a flapping rail link is quarantined, then returned.

The frames are built from the kernel counters of the testbed hosts (carrier, carrier
down count) on a virtual 15 s tick clock, so flap dampening's long recovery runs fast.
"""

from __future__ import annotations

import pytest

from seamguard.assess.states import State
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.fleet import Kind
from seamguard.testbed.net import wait_carrier
from seamguard.testbed.telemetry import exposition, nic_frame, rail_bandwidth, sample_links, fleet_of_testbed

TICK_S = 15.0


@pytest.mark.timeout(120)
def test_controller_dampens_a_flapping_rail_and_returns_it_when_stable(make_testbed):
    tb = make_testbed(hosts=2, rails=2)
    fleet = fleet_of_testbed(tb)
    ctl = Controller(fleet, default_policy(), [], None, tick_s=TICK_S)
    nic = fleet.nic_names.index("h1/rail0")
    states, prev = [], sample_links(tb)
    for tick in range(90):
        if 2 <= tick < 6:  # four flaps inside the 300 s flap window
            tb.set_link(1, 0, False)
            assert wait_carrier(tb, 1, 0, up=False)
            tb.set_link(1, 0, True)
            assert wait_carrier(tb, 1, 0, up=True)
        cur = sample_links(tb)
        rep = ctl.tick(nic_frame(fleet, cur, tick * TICK_S))
        assert not rep.error
        states.append(State(int(rep.assessment.state(Kind.NIC)[nic])))
        others = [State(int(x)) for i, x in enumerate(rep.assessment.state(Kind.NIC)) if i != nic]
        assert all(s == State.HEALTHY for s in others)
        prev = cur
    first_q = states.index(State.QUARANTINE)
    assert first_q <= 8  # quarantined while it flaps
    back = next(i for i in range(first_q, len(states)) if states[i] == State.HEALTHY)
    # dampening: it stays out well past its last flap (tick 5) before coming back
    assert back * TICK_S - 5 * TICK_S >= 300.0
    assert states[-1] == State.HEALTHY
    text = exposition(tb, prev, rail_bandwidth(prev, prev, 1.0))
    assert 'node_network_carrier_changes_total{instance="%s",device="rail0",rail="0"} ' % tb.host_ns(1) in text
    line = next(x for x in text.splitlines()
                if x.startswith("node_network_carrier_down_changes_total") and tb.host_ns(1) in x and "rail0" in x)
    assert float(line.split()[-1]) >= 5  # initial link-up plus four flaps
