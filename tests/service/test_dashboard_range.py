"""The dashboard's time range, zoom and permalinks, and the API docs air-gapped, in Chromium.

A 512-GPU twin is ticked by hand for 21 simulated minutes, so "last 15 min" and "last 1 h"
hold different parts of the ledger. The page is checked against the ledger: a range or a
zoom moves every chart's axis and the timeline's and the entity's tables to that window; a
link copied from the address bar reopens the same entity, window and filters in a new tab
and on reload. `/docs` and `/redoc` render with every request to a host other than the
server refused.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.sources import TwinSource
from seamguard.fleet.model import Kind

from .conftest import TOKEN
from .test_browser import ARTIFACTS, WAIT_MS, _page, browser  # noqa: F401  (browser is a fixture)

TICKS = 250  # x 5 simulated seconds: 20.8 minutes, longer than the shortest range
EVENTS = "#timeline li.transition, #timeline li.action"
CHARTS = ["#gpustates svg.chart", "#nodestates svg.chart", "#loopflow svg.chart", "#tsgfs svg.chart"]


@pytest.fixture(scope="module")
def served():
    runner = Runner(TwinSource(gpus=512, minutes=30.0, seed=0), speed=0)
    runner.advance(TICKS)
    runner.start()
    server = Server(runner, TOKEN).start()
    yield runner, server
    server.stop()
    runner.stop()


def _busiest_gpu(runner) -> str:
    rows = [t for t in runner.ledger.transitions(limit=100_000) if t["kind"] == "gpu"]
    return max({t["entity"] for t in rows}, key=lambda n: (sum(t["entity"] == n for t in rows), n))


def _rendered(page, url_hash: str | None = None) -> dict:
    """Wait until the page has drawn the view its URL names; the view it reports."""
    page.wait_for_function("document.body.dataset.view && document.body.dataset.view === location.hash",
                           timeout=WAIT_MS)
    if url_hash is not None:
        assert page.evaluate("location.hash") == url_hash
    page.wait_for_timeout(200)
    return page.evaluate("window.seamguard.view()")


def _axes(page) -> list[tuple[float, float]]:
    return [(float(page.get_attribute(sel, "data-t0")), float(page.get_attribute(sel, "data-t1"))) for sel in CHARTS]


def _timeline_times(runner, t0: float, t1: float) -> int:
    """Events the timeline lists in [t0, t1]: non-healthy transitions and actions (at most 150 each)."""
    trs = [t for t in runner.ledger.transitions(limit=100_000)
           if t0 <= t["t_s"] <= t1 and (t["to_state"] != "healthy" or t["from_state"] != "healthy")]
    acts = [a for a in runner.ledger.actions(limit=100_000) if t0 <= a["t_s"] <= t1]
    return min(150, len(trs[:150]) + len(acts[:150]))


def test_range_and_zoom_move_every_series_and_table(browser, served):
    runner, server = served
    now = runner.snapshot().t_s
    gpu = _busiest_gpu(runner)
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{server.url}/#range=1h&entity=gpu:{gpu}")
    v = _rendered(page)
    first_t = runner.ledger.first_tick_t_s()
    assert (v["t0"], v["t1"]) == (first_t, now)  # 1 h reaches back past the first tick: it starts there
    assert all(a == (first_t, now) for a in _axes(page)), _axes(page)
    all_events = page.locator(EVENTS).count()
    assert all_events == _timeline_times(runner, first_t, now) > 0

    # Last 15 minutes: every axis, the timeline and the entity's history move to that window.
    page.select_option("#range", "15m")
    v = _rendered(page)
    assert v["hash"].startswith("#range=15m") and (v["t0"], v["t1"]) == (now - 900, now)
    assert all(a == (now - 900, now) for a in _axes(page)), _axes(page)
    in15 = _timeline_times(runner, now - 900, now)
    assert page.locator(EVENTS).count() == in15 < all_events
    hist = [t for t in runner.ledger.transitions(entity=gpu, limit=1000) if now - 900 <= t["t_s"] <= now]
    assert page.locator("#entityhistory tr").count() == min(12, len(hist))
    ts = [float(x) for x in page.eval_on_selector_all("#tsgfs .annot.transition", "es => es.map(e => e.dataset.t)")]
    assert sorted(ts) == sorted(t["t_s"] for t in hist)

    # Drag across the GPU state chart: the window becomes the times under the drag.
    svg = page.locator("#gpustates svg.chart")
    box = svg.bounding_box()
    t0, t1 = float(svg.get_attribute("data-t0")), float(svg.get_attribute("data-t1"))
    x0, x1 = float(svg.get_attribute("data-x0")), float(svg.get_attribute("data-x1"))
    scale = box["width"] / float(svg.get_attribute("width"))
    a, b = box["x"] + (x0 + 0.25 * (x1 - x0)) * scale, box["x"] + (x0 + 0.75 * (x1 - x0)) * scale
    y = box["y"] + box["height"] / 2
    page.mouse.move(a, y)
    page.mouse.down()
    page.mouse.move((a + b) / 2, y, steps=3)
    page.mouse.move(b, y, steps=3)
    page.mouse.up()
    v = _rendered(page)
    want0, want1 = t0 + 0.25 * (t1 - t0), t0 + 0.75 * (t1 - t0)
    assert v["since"] == pytest.approx(want0, abs=2.0) and v["until"] == pytest.approx(want1, abs=2.0)
    assert "since=" in v["hash"] and "until=" in v["hash"] and page.input_value("#range") == "zoom"
    for z0, z1 in _axes(page):
        assert (z0, z1) == pytest.approx((v["since"], v["until"]), abs=1e-3)
    ev_t = [float(x) for x in page.eval_on_selector_all("#timeline li[data-t]", "es => es.map(e => e.dataset.t)")]
    assert all(v["since"] <= t <= v["until"] for t in ev_t)
    assert page.locator(EVENTS).count() == \
        _timeline_times(runner, v["since"], v["until"])
    assert page.locator("#tsgfs svg.chart path.line").count() >= 1
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_zoomed.png"), full_page=False)

    # Zoom out doubles the window (ending no later than now); reset returns to the range.
    page.click("#zoomout")
    w = _rendered(page)
    assert w["until"] - w["since"] == pytest.approx(2 * (v["until"] - v["since"]), abs=1e-2)
    page.click("#zoomreset")
    v = _rendered(page)
    assert v["since"] is None and v["hash"].startswith("#range=15m")
    assert not errors, errors
    page.close()


def test_a_pasted_link_and_a_reload_reopen_the_same_view(browser, served):
    runner, server = served
    now = runner.snapshot().t_s
    gpu = _busiest_gpu(runner)
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(server.url + "/")
    _rendered(page)
    # An operator picks a range, clicks a GPU on the map, filters the timeline, zooms in.
    page.select_option("#range", "6h")
    _rendered(page)
    c = page.evaluate(f"window.seamguard.cellCenter({gpu!r})")
    page.mouse.click(c["x"], c["y"])
    page.wait_for_function(f"document.querySelector('#detail h3') && "
                           f"document.querySelector('#detail h3').textContent.includes({gpu!r})")
    page.check("#actionsonly")
    page.click("#zoomin")
    v = _rendered(page)
    link = page.url
    assert f"entity=gpu%3A{gpu.replace('/', '%2F')}" in link and "actions=1" in link and "since=" in link
    assert v["until"] - v["since"] == pytest.approx((now - runner.ledger.first_tick_t_s()) / 2, abs=1e-2)

    def same_view(p) -> None:
        got = _rendered(p)
        assert (got["since"], got["until"]) == pytest.approx((v["since"], v["until"]), abs=1e-3)
        assert got["selected"] == {"kind": "gpu", "name": gpu}
        assert p.is_checked("#actionsonly") and p.input_value("#range") == "zoom"
        assert gpu in p.inner_text("#detail h3")
        assert p.locator("#timeline li.transition").count() == 0  # the filter holds: actions only
        for z0, z1 in _axes(p):
            assert (z0, z1) == pytest.approx((v["since"], v["until"]), abs=1e-3)

    other = _page(browser, errors)  # a colleague opens the link pasted in the incident channel
    other.goto(link)
    same_view(other)
    other.close()
    page.reload()
    same_view(page)
    assert not errors, errors
    page.close()


@pytest.mark.parametrize("path, ready", [
    ("/docs", "#swagger-ui .opblock-summary-path"),
    ("/redoc", "redoc .api-content h1, .api-content h1"),
])
def test_api_docs_render_air_gapped(browser, served, path, ready):
    """Refused: any request for a host other than the server; the docs render from its own assets."""
    _, server = served
    here = urlsplit(server.url).netloc
    outside: list[str] = []
    ctx = browser.new_context()

    def only_here(route):
        if urlsplit(route.request.url).netloc == here:
            return route.continue_()
        outside.append(route.request.url)
        return route.abort()

    ctx.route("**/*", only_here)
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    broken: list[str] = []
    page.on("pageerror", lambda e: broken.append(str(e)))
    served_here: list[str] = []
    page.on("requestfinished", lambda r: served_here.append(urlsplit(r.url).path))
    page.goto(server.url + path)
    page.wait_for_selector(ready, timeout=WAIT_MS)
    assert "/api/v1/history/states" in page.inner_text("body")  # the spec, rendered: a path it documents
    assert outside == [], f"{path} asked for assets off the server: {outside}"
    assert "/openapi.json" in served_here and any(p.startswith("/static-offline-docs/") for p in served_here)
    assert not broken, broken
    ctx.close()


def test_a_malformed_link_opens_the_default_view_and_a_loop_link_drills_in(browser, served):
    runner, server = served
    now = runner.snapshot().t_s
    fleet = runner.snapshot().fleet
    loop = fleet.loop_names[1]
    in_loop = int((fleet.gpu_loop == 1).sum())
    assert 0 < in_loop < fleet.count(Kind.GPU)
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{server.url}/#range=2y&since=900&until=100&entity=gpu&actions=yes")
    v = _rendered(page)
    assert (v["range"], v["since"], v["selected"]) == ("1h", None, None)
    assert v["hash"] == "#range=1h" and v["t1"] == now and not page.is_checked("#actionsonly")
    page.goto(f"{server.url}/#range=24h&loop={loop}")
    page.reload()
    v = _rendered(page)
    assert v["loop"] == loop and page.input_value("#range") == "24h"
    assert loop in page.inner_text("#crumbs")
    assert page.evaluate("window.seamguard.tiles().length") == 0 and \
        page.get_attribute("#fleetmap", "aria-label") == f"fleet map: {in_loop} GPUs"
    assert not errors, errors
    page.close()
