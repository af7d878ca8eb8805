"""The dashboard charts persisted series after a restart, in Chromium.

Controller A ticks a 512-GPU twin 250 times (20.8 simulated minutes) holding only its last
60 fleet points and 40 signal-ring rows, and stops; controller B opens the same ledger (its
twin advanced past A's ticks) and ticks 10 times. "Last 1 h" is longer than anything B
holds in memory: the coolant lines, useful throughput and a gray GPU's GFS must still start
at the ledger's first tick and hold a point per tick of A's run, not only B's.
"""

from __future__ import annotations

import re

import pytest

from seamguard.app.service.server import Server
from seamguard.fleet.model import Kind

from .conftest import TOKEN
from .test_browser import ARTIFACTS, _page, browser  # noqa: F401  (browser is a fixture)
from .test_dashboard_range import _rendered
from .test_series_history import restart

TICKS_A, TICKS_B = 250, 10


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    before, _, b = restart(tmp_path_factory.mktemp("series_dash") / "ledger.sqlite", TICKS_A, TICKS_B)
    g = before.kinds[Kind.GPU]
    gray = sorted((-float(g.gfs[i]), g.names[i]) for i in range(g.count) if g.state[i] != 0)[0][1]
    b.start()
    server = Server(b, TOKEN).start()
    yield b, server, gray
    server.stop()
    b.stop()


def _line(page, sel: str) -> tuple[float, int, float]:
    """(x of the first point drawn, points drawn, the plot's left edge) of the chart's first line."""
    svg = page.locator(f"{sel} svg.chart").first
    d = svg.locator("path.line").first.get_attribute("d")
    xs = [float(x) for x in re.findall(r"[ML]([-\d.]+) ", d)]
    return xs[0], len(xs), float(svg.get_attribute("data-x0"))


def test_a_range_longer_than_memory_charts_persisted_points_after_restart(browser, restarted):
    b, server, gray = restarted
    s = b.snapshot()
    assert len(s.fleet_history) == TICKS_B and b.ring.pushed == TICKS_B
    first = b.ledger.first_tick_t_s()
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{server.url}/#range=1h&entity=gpu:{gray}")
    v = _rendered(page)
    assert (v["t0"], v["t1"]) == (first, s.t_s)  # the window opens at the ledger's first tick
    page.wait_for_selector("#tsgfs svg.chart path.line", state="attached")
    for sel in ("#loopflow", "#loopsupply", "#tput"):
        x, n, x0 = _line(page, sel)
        assert n >= TICKS_A and x == pytest.approx(x0, abs=2.0), (sel, n, x, x0)  # from A's first tick on
    # The GPU's GFS: persisted while it was gray, so it reaches back before B's ring.
    _, n, _ = _line(page, "#tsgfs")
    t_first = float(page.locator("#tsgfs svg.chart path.line").first.get_attribute("data-first"))
    assert n > TICKS_B and t_first < s.fleet_history[0].t_s, (n, t_first)
    assert "from the ledger" in page.inner_text("#loopnote")
    assert "from the ledger" in page.inner_text("#detail")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_after_restart.png"), full_page=False)
    assert not errors, errors
    page.close()
