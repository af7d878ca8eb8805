"""PhaseClock (runtime/profile.py): per-phase totals behind SEAMGUARD_PROFILE."""

from __future__ import annotations

import threading
import time

from seamguard.runtime.profile import PhaseClock


def test_disabled_clock_records_nothing():
    clock = PhaseClock(False)
    clock.add("x", 1.0, 0.5)
    with clock.phase("y"):
        pass
    assert clock.report(10) == {}


def test_report_sums_per_phase_and_divides_by_steps():
    clock = PhaseClock(True)
    clock.add("push", 0.010, 0.002)
    clock.add("push", 0.030, 0.004)
    clock.add("hash", 0.001)
    rep = clock.report(4)
    assert rep["push"]["count"] == 2
    assert rep["push"]["wall_ms_per_step"] == 10.0      # 40 ms over 4 steps
    assert rep["push"]["cpu_ms_per_step"] == 1.5        # 6 ms over 4 steps
    assert rep["hash"] == {"wall_s": 0.001, "cpu_s": 0.0, "count": 1,
                           "wall_ms_per_step": 0.25, "cpu_ms_per_step": 0.0}
    assert clock.report(0)["hash"]["wall_ms_per_step"] == 1.0   # no step yet: per 1


def test_phase_times_wall_and_this_threads_cpu():
    clock = PhaseClock(True)
    with clock.phase("sleep"):
        time.sleep(0.05)
    with clock.phase("spin"):
        t_end = time.thread_time() + 0.03
        while time.thread_time() < t_end:
            pass
    rep = clock.report(1)
    assert rep["sleep"]["wall_s"] >= 0.05 and rep["sleep"]["cpu_s"] < 0.02
    assert rep["spin"]["cpu_s"] >= 0.03


def test_threads_add_to_one_clock():
    clock = PhaseClock(True)

    def beat() -> None:
        for _ in range(1000):
            clock.add("beat", 0.001)

    threads = [threading.Thread(target=beat) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.report(1)["beat"]["count"] == 4000
