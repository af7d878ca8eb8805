"""The fault player: a fault stays fully on for its duration, and its record brackets it.

Applying a gray fault is four `tc` calls, which took up to 2 s on the loaded 2-core testbed.
A revert timed from the scheduled start then left a 2 s fault fully on for 0.06 s; and
"applied" (fully on) can come long after the fault began to act. A stand-in testbed notes
when each change reached it.
"""

from __future__ import annotations

import time

import pytest

from seamguard.testbed.job import Fault, FaultPlayer


class _SlowTestbed:
    """Each change is noted when it starts acting, then takes a while to finish (as tc under load)."""

    def __init__(self, apply_s: float) -> None:
        self.apply_s = apply_s
        self.changes: list[tuple[str, float]] = []

    def set_gray(self, host: int, rail: int, rate_mbit: float | None) -> None:
        self.changes.append(("on" if rate_mbit is not None else "off", time.time()))
        time.sleep(self.apply_s)


def _play_until_reverted(tb, fault):
    """Play one fault on ``tb`` and return its record once it is reverted (10 s at most)."""
    player = FaultPlayer(tb, [fault])
    player.start(time.time())
    deadline = time.time() + 10.0
    while not player.records[0].reverted_t and time.time() < deadline:
        time.sleep(0.01)
    player.stop()
    return player.records[0]


@pytest.mark.timeout(30)
def test_the_record_brackets_the_time_the_fault_began_to_act():
    tb = _SlowTestbed(apply_s=0.2)
    rec = _play_until_reverted(tb, Fault(0.0, "gray", host=1, rail=0, duration_s=0.3))
    on, off = tb.changes
    assert on[0] == "on" and off[0] == "off"
    assert rec.begun_t <= on[1] < rec.applied_t  # acting before it was fully applied
    assert rec.applied_t <= off[1] < rec.reverted_t


@pytest.mark.timeout(30)
def test_a_fault_slow_to_apply_stays_fully_on_for_its_duration():
    # applying takes longer than the fault lasts: timed from its scheduled start, the revert
    # would be due before the fault was fully on
    tb = _SlowTestbed(apply_s=0.4)
    fault = Fault(0.0, "gray", host=1, rail=0, duration_s=0.3)
    rec = _play_until_reverted(tb, fault)
    _, off = tb.changes
    assert off[1] - rec.applied_t >= fault.duration_s
