"""The one wall-clock schedule: a fixed grid; a late loop skips (controller) or catches up (twin)."""

from seamguard.app.schedule import Schedule


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_on_time_ticks_land_on_the_grid():
    c = Clock()
    s = Schedule(5.0, clock=c)
    assert s.due() == 100.0 and s.due() is None
    assert s.wait_s() == 5.0
    c.t = 105.2
    assert s.due() == 105.0 and s.skipped == 0


def test_a_late_controller_skips_to_the_latest_grid_point_and_counts_the_skips():
    c = Clock()
    s = Schedule(5.0, clock=c)
    s.due()
    c.t = 121.0  # 105, 110, 115 are past; 120 is the latest
    assert s.due() == 120.0
    assert s.skipped == 3
    assert s.due() is None and s.next_s == 125.0


def test_a_late_twin_catches_up_every_step_back_to_back():
    c = Clock()
    s = Schedule(5.0, clock=c, first_at_start=False, late="catch_up")
    assert s.due() is None
    c.t = 116.0
    assert [s.due(), s.due(), s.due(), s.due()] == [105.0, 110.0, 115.0, None]
    assert s.skipped == 0 and s.lag_s() == 0.0
