"""Active-standby rails (``RailSettings(chunks=1)``, `seamguard launch --rail-mode standby`):
one rail carries every all-reduce, the other idles until the carrier fails, and a flap of
the carrying rail costs a re-run on the other with bit-identical weights.

A real gloo job on the namespaced testbed (3 hosts x 2 rails); the flap is host 1's switch
port on rail 0, so only host 1 sees its carrier drop: the other hosts give the rail up on
host 1's announcement.
"""

from __future__ import annotations

import pytest

from seamguard.testbed.job import Fault, JobSpec, run_rail_job

HOSTS, STEPS = 3, 900
STANDBY = {"chunks": 1}
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def standby_reference(tmp_path_factory) -> str:
    """A flap-free standby run's final checksum; every step ran on rail 0 alone."""
    from seamguard.testbed.net import Testbed, TestbedSpec

    with Testbed(TestbedSpec(hosts=HOSTS, rails=2)) as tb:
        res = run_rail_job(tb, JobSpec(steps=STEPS, timeout_s=120, settings=STANDBY), [],
                           tmp_path_factory.mktemp("standby_ref"))
    assert res.ok, res.stderr_tail
    rails = {tuple(s["rails"]) for s in res.steps}
    assert rails == {(0,)}, f"a flap-free standby run used {rails}"
    assert all(set(s["bytes_per_rail"]) == {"0"} for s in res.steps), "the standby rail carried data"
    return res.checksums[0]


def test_a_flap_of_the_carrying_rail_moves_the_all_reduce_to_the_standby(make_testbed, tmp_path,
                                                                         standby_reference):
    tb = make_testbed(hosts=HOSTS, rails=2)
    res = run_rail_job(tb, JobSpec(steps=STEPS, timeout_s=150, settings=STANDBY),
                       [Fault(1.0, "flap", host=1, rail=0, duration_s=1.5)], tmp_path / "job")
    assert res.ok, f"rc={res.returncodes} checksums={res.checksums}\n{res.stderr_tail}"
    assert res.checksums[0] == standby_reference
    during = [s for s in res.steps if s["rails"] == [1]]
    assert during, "no step ran on the standby rail"
    assert all(len(s["rails"]) == 1 for s in res.steps), "a standby step used both rails"
    # host 1 saw its carrier drop; hosts 0 and 2 learned it from host 1's announcement (an
    # in-flight chunk abandoned as "flagged", or the rail skipped at the next issue), not by
    # waiting out the deadline: with one chunk there is no other rail's time, so that wait
    # would be the ceiling, a whole second
    assert any(c["cause"] == "carrier" and c["rail"] == 0 for c in res.causes[1]), res.causes[1]
    waited = [(h, c) for h in (0, 2) for c in res.causes[h] if c["rail"] == 0 and c["cause"] == "timeout"]
    assert not waited, f"a peer waited for the deadline instead of the announcement: {waited}"
    back = [e for e in res.rail_events if e["rail"] == 0 and e["event"] == "in" and e["gen"] > 0]
    assert back, f"rail 0 never came back: {res.rail_events}"
    assert any(s["rails"] == [0] for s in res.steps if s["t_wall"] > back[-1]["t_wall"]), \
        "the all-reduce did not return to rail 0 once it was back"
