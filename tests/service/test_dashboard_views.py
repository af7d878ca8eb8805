"""The dashboard's views an SRE keeps open, in a real browser (Chromium + Playwright).

Each test drives a twin by hand, so it knows what the page must show, and saves a
screenshot under artifacts/screenshots/ for a person to look at:

- the fleet map with a failed node: the node is marked whole (not a sliver), its GPUs
  are not drawn healthy, and it is listed by name;
- an entity's time-series panel: a real time axis, thresholds, a peer band, and a
  state-change annotation at the time the ledger recorded the transition;
- 100,000 GPUs: labelled per-loop tiles, drill-down, no empty sections;
- the banner that says the simulation cannot keep its requested speed.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.sources import TwinSource
from seamguard.fleet.model import Kind
from seamguard.twin.faults import FaultKind

from .conftest import TOKEN, fault_entity
from .test_browser import WAIT_MS, _page, _pixel, _wait_tick, browser  # noqa: F401  (browser is a fixture)

SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


def _shot(page, name: str, *selectors: str) -> Path:
    """The viewport, or the page region covering ``selectors`` (below the sticky header)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    if selectors:
        box = page.evaluate("""sels => {
            const rs = sels.map(s => document.querySelector(s).getBoundingClientRect());
            const x = Math.min(...rs.map(r => r.left)), y = Math.min(...rs.map(r => r.top));
            return { x: x + scrollX, y: y + scrollY, width: Math.max(...rs.map(r => r.right)) - x,
                     height: Math.max(...rs.map(r => r.bottom)) - y };
        }""", list(selectors))
        page.screenshot(path=str(path), full_page=True, clip=box)
    else:
        page.screenshot(path=str(path), full_page=False)
    assert path.stat().st_size > 10_000, f"{path} looks empty"
    return path


@pytest.fixture(scope="module")
def ecc_twin():
    """2,048 GPUs ticked until the ECC fault's GPU is failed (fatal XID), then a few more."""
    src = TwinSource(gpus=2048, minutes=6.0, seed=0)
    runner = Runner(src, speed=0)
    gpu = fault_entity(src, FaultKind.GPU_ECC_ESCALATION)
    gi = src.fleet.index_of(Kind.GPU, gpu)
    for _ in range(120):
        runner.advance(1)
        if runner.snapshot().kinds[Kind.GPU].state[gi] == 5:
            break
    assert runner.snapshot().kinds[Kind.GPU].state[gi] == 5, "the ECC fault never reached failed"
    runner.advance(6)  # the transition sits inside the chart, not on its right edge
    runner.start()
    server = Server(runner, TOKEN).start()
    yield src, runner, server, gpu
    server.stop()
    runner.stop()


def test_fleet_map_marks_a_failed_node_whole(browser, ecc_twin):
    src, runner, server, gpu = ecc_twin
    node = src.fleet.node_names[int(src.fleet.gpu_node[src.fleet.index_of(Kind.GPU, gpu)])]
    assert runner.snapshot().kinds[Kind.NODE].state[src.fleet.index_of(Kind.NODE, node)] == 5
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(server.url + "/")
    _wait_tick(page, runner.snapshot().tick)

    # Listed by name above the map, with the failed style, and on the canvas's attribute.
    chip = page.locator(f'#failednodes .st.failed[data-name="{node}"]')
    assert chip.count() == 1 and node in chip.inner_text()
    assert node in page.get_attribute("#fleetmap", "data-failed-nodes").split()

    # Its rectangle spans all its GPUs: the whole node, not a 2-pixel sliver.
    r = page.evaluate(f"window.seamguard.nodeRect('{node}')")
    cells = page.evaluate(f"window.seamguard.gpuCellsOf('{node}')")
    assert r is not None and r["state"] == "failed"
    assert len(cells) == int((src.fleet.gpu_node == src.fleet.index_of(Kind.NODE, node)).sum()) == 8
    cell = cells[0]["w"]
    assert r["h"] >= cell and r["w"] >= len(cells) * cell, (r, cell)
    for c in cells:  # every GPU cell lies inside the node's rectangle
        assert r["x0"] <= c["cx"] - c["w"] / 2 and c["cx"] + c["w"] / 2 <= r["x0"] + r["w"]
    colors = page.evaluate("window.seamguard.colors")
    healthy, failed = colors["healthy"].lower(), colors["failed"].lower()
    assert failed != colors["harmful"].lower()
    # No GPU of the failed node is painted healthy (its healthy GPUs take the node's hatching).
    own = {c["name"]: c["state"] for c in cells}
    assert "healthy" in own.values(), "expected healthy GPUs on the failed node (only one GPU has the fault)"
    for c in cells:
        px = _pixel(page, c["cx"] - c["w"] / 2 + 1, c["cy"] - c["h"] / 2 + 1)
        assert px != healthy, (c["name"], own[c["name"]], px)
    # The frame between cells carries the failed colour.
    assert _pixel(page, r["x0"] + 1, r["y0"] + r["h"] / 2) == failed
    # A healthy node elsewhere is still healthy-coloured.
    ok_node = next(n for i, n in enumerate(src.fleet.node_names) if runner.snapshot().kinds[Kind.NODE].state[i] == 0)
    ok = page.evaluate(f"window.seamguard.gpuCellsOf('{ok_node}')")[0]
    assert _pixel(page, ok["cx"], ok["cy"]) == healthy

    _shot(page, "fleet_map_failed_node.png", "#mappanel")
    # The legend explains the marks; failed and harmful differ by more than hue.
    assert "failed" in page.inner_text("#legend") and page.locator("#legend .sw.failed").count() == 1
    assert not errors, errors
    page.close()


def test_entity_time_series_has_state_change_annotations(browser, ecc_twin):
    src, runner, server, gpu = ecc_twin
    trs = runner.ledger.transitions(entity=gpu)
    failed_at = next(t["t_s"] for t in trs if t["to_state"] == "failed")
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(server.url + "/")
    _wait_tick(page, runner.snapshot().tick)
    c = page.evaluate(f"window.seamguard.cellCenter('{gpu}')")
    page.mouse.click(c["x"], c["y"])
    page.wait_for_selector("#tsgfs svg.chart .annot")

    svg = page.locator("#tsgfs svg.chart")
    t0, t1 = float(svg.get_attribute("data-t0")), float(svg.get_attribute("data-t1"))
    x0, x1 = float(svg.get_attribute("data-x0")), float(svg.get_attribute("data-x1"))
    assert t0 < failed_at < t1
    ann = page.locator('#tsgfs .annot.transition[data-state="failed"]')
    assert ann.count() == 1
    assert float(ann.get_attribute("data-t")) == failed_at
    # Drawn where the axis puts that time.
    want_x = x0 + (x1 - x0) * (failed_at - t0) / (t1 - t0)
    assert abs(float(ann.locator("line").get_attribute("x1")) - want_x) < 1.0
    # Every recorded transition in the window has its annotation, on every signal chart too.
    in_window = [t for t in trs if t0 <= t["t_s"] <= t1]
    assert page.locator("#tsgfs .annot.transition").count() == len(in_window) >= 2
    n_sig = page.locator("#tssignals svg.chart").count()
    assert n_sig >= 5
    assert page.locator("#tssignals .annot.transition").count() == n_sig * len(in_window)
    # A labelled time axis, thresholds, a peer band and the state strip.
    text = page.eval_on_selector("#tsgfs svg.chart", "e => e.textContent")
    assert "simulated time since start" in text and "degrade" in text and "quarantine" in text
    assert page.locator("#tsgfs .band").count() >= 1 or page.locator("#tssignals .band").count() >= 1
    assert page.locator('#tsgfs .seg[data-state="failed"]').count() == 1

    # Evidence: at the transition and now, with units; the scores explained where they appear.
    at = page.inner_text("#evidence th.at")
    assert "at transition" in at
    assert "now" in page.inner_text("#evidence th.now")
    assert "XID 48" in page.inner_text('#evidence tr[data-channel="xid"] td.at')
    gloss = page.inner_text("#gloss")
    assert "gray-failure score" in gloss and "propagation risk" in gloss
    assert "healthy GPU-hours per hour at risk" in gloss
    assert "at that transition" in page.inner_text("#why")

    # The fleet panels: state counts over time and coolant per loop, with time axes.
    assert page.locator('#gpustates .layer[data-state="failed"]').count() == 1
    assert page.locator("#loopflow svg.chart .threshold").count() == 2
    assert "simulated time since start" in page.eval_on_selector("#loopflow svg", "e => e.textContent")

    _shot(page, "entity_timeseries.png", "#detailpanel")
    _shot(page, "fleet_state_and_cooling.png", "#statepanel", "#looppanel")
    assert not errors, errors
    page.close()


def test_dashboard_at_100k_gpus(browser):
    t = time.monotonic()
    src = TwinSource(gpus=100_000, minutes=30.0, seed=0, counterfactual=False)
    runner = Runner(src, speed=0)
    runner.advance(2)
    runner.start()
    server = Server(runner, TOKEN).start()
    errors: list[str] = []
    try:
        # Fail one GPU by pin: its node fails, its loop tile must say so.
        gpu = "gpu05000/gpu3"
        r = httpx.put(f"{server.url}/api/v1/pins/gpu/{gpu}", json={"state": "failed", "note": "test"},
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert r.status_code == 200, r.text
        runner.advance(1)
        setup_s = time.monotonic() - t
        assert setup_s < 40, f"100k twin: 3 ticks and the server took {setup_s:.1f} s"
        loop = src.fleet.loop_names[int(src.fleet.gpu_loop[src.fleet.index_of(Kind.GPU, gpu)])]

        page = _page(browser, errors)
        t_page = time.monotonic()
        page.goto(server.url + "/")
        _wait_tick(page, runner.snapshot().tick)
        load_s = time.monotonic() - t_page
        assert load_s < 15, f"the page took {load_s:.1f} s to show the 100k fleet"
        assert "aggregated" in page.inner_text("#crumbs")
        assert page.evaluate("document.getElementsByTagName('*').length") < 3000  # no DOM node per GPU

        # Labelled aggregate tiles: one per loop, big enough to read, the label names the loop.
        tiles = page.evaluate("window.seamguard.tiles()")
        n_loops = src.fleet.count(Kind.COOLING_LOOP)
        assert len(tiles) == n_loops == 391
        for tl in tiles:
            assert tl["label"] and tl["label"][1:] == tl["name"].split("-")[1], tl
            assert tl["w"] >= 60 and tl["h"] >= 30
        bad = [tl for tl in tiles if tl["name"] == loop]
        assert bad and bad[0]["worst"] == "failed" and bad[0]["failed_nodes"] == 1
        assert f"{n_loops} cooling loops" in page.inner_text("#maphint")

        # No empty sections: every panel says something; kinds too many to draw give counts.
        for p in page.locator(".panel").all():
            assert len(p.inner_text().strip()) > 30, p.inner_text()
        for cv in page.locator("canvas").all():
            if cv.is_visible():
                assert cv.bounding_box()["height"] >= 10
        nic = page.inner_text("#nicsec")
        assert "100,000 NICs" in nic and ("healthy" in nic)
        assert "125,024 links" in page.inner_text("#linksec")
        assert page.locator("#gpustates svg.chart").count() == 1
        assert "391 loops" in page.inner_text("#loopnote")

        # Drill down: worst loops first, click the failed loop's tile.
        page.check("#worstfirst")
        first = page.evaluate("window.seamguard.tiles()[0]")
        assert first["name"] == loop
        box = page.locator("#fleetmap").bounding_box()
        page.mouse.click(box["x"] + first["x"] + 10, box["y"] + first["y"] + 10)
        page.wait_for_function(f"document.querySelector('#crumbs').textContent.includes('{loop}')")
        page.wait_for_function(f"window.seamguard.nodeRect('{gpu.split('/')[0]}') !== null")
        assert page.evaluate(f"window.seamguard.nodeRect('{gpu.split('/')[0]}').state") == "failed"
        assert "256 GPUs drawn" in page.inner_text("#maphint")
        page.wait_for_function(f"document.querySelector('#detail h3') && document.querySelector('#detail h3').textContent.includes('{loop}')")
        _shot(page, "dashboard_100k.png")
        assert not errors, errors
    finally:
        server.stop()
        runner.stop()


def test_banner_when_the_twin_falls_behind(browser):
    # 5 s ticks asked for every 2.5 ms: no tick is that fast, so the twin runs slower than asked.
    runner = Runner(TwinSource(gpus=256, minutes=6.0, seed=0, counterfactual=False), speed=2000)
    runner.start()
    server = Server(runner, TOKEN).start()
    errors: list[str] = []
    try:
        page = _page(browser, errors)
        page.goto(server.url + "/")
        page.wait_for_selector("#pace:not(.hidden)", timeout=WAIT_MS)
        text = page.inner_text("#pace")
        assert "falling behind" in text and "instead of the requested 2000x" in text
        pace = httpx.get(f"{server.url}/api/v1/summary", timeout=10).json()["pace"]
        assert pace["behind"] and pace["achieved_speed"] < 0.8 * 2000
        assert pace["ticks_skipped"] > 0
        page.wait_for_selector("#gpustates svg.chart")  # the rest of the page keeps up with the ticks
        _shot(page, "pace_banner.png")
        assert not errors, errors
    finally:
        server.stop()
        runner.stop()


def test_no_banner_when_on_pace(browser):
    runner = Runner(TwinSource(gpus=256, minutes=6.0, seed=0, counterfactual=False), speed=5)  # a tick per second
    runner.start()
    server = Server(runner, TOKEN).start()
    errors: list[str] = []
    try:
        deadline = time.monotonic() + 20
        while runner.ticks < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        pace = httpx.get(f"{server.url}/api/v1/summary", timeout=10).json()["pace"]
        assert not pace["behind"], pace
        assert pace["achieved_speed"] == pytest.approx(5, rel=0.2)
        page = _page(browser, errors)
        page.goto(server.url + "/")
        _wait_tick(page, runner.snapshot().tick)
        assert page.locator("#pace.hidden").count() == 1
        assert "speed 5x (achieved" in page.inner_text("#clock")
        assert not errors, errors
    finally:
        server.stop()
        runner.stop()
