"""The dashboard in a real browser: Debian's Chromium driven by Playwright's Python API.

The twin is ticked by hand so the test knows what has happened: the page loads clean,
the fleet map paints the injected faults, clicking the faulty GPU shows its evidence,
and an action taken after the page loaded appears in the timeline. Screenshots go to
artifacts/screenshots/ for a person to look at. The views an SRE keeps open (a failed
node, time series with annotations, 100k GPUs, the pace banner) are in
test_dashboard_views.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from seamguard.fleet.model import Kind
from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.sources import TwinSource
from seamguard.twin.faults import FaultKind

from .conftest import TOKEN, fault_entity

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
WAIT_MS = 20_000


@pytest.fixture(scope="module")
def browser():
    # CI installs the Debian package; a missing browser must fail loudly, not skip.
    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists(), \
        "Chromium not found at /usr/bin/chromium: apt-get install -y chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _page(browser, errors: list[str]):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.set_default_timeout(WAIT_MS)
    return page


def _wait_tick(page, tick: int) -> None:
    page.wait_for_function(f"Number(document.body.dataset.tick) >= {tick}", timeout=WAIT_MS)
    page.wait_for_timeout(300)  # let the redraw that follows the tick finish


def _pixel(page, x: float, y: float) -> str:
    return page.evaluate("""([x, y]) => {
        const cv = document.getElementById('fleetmap'), d = window.devicePixelRatio || 1;
        const p = cv.getContext('2d').getImageData(Math.round(x * d), Math.round(y * d), 1, 1).data;
        return '#' + [p[0], p[1], p[2]].map(v => v.toString(16).padStart(2, '0')).join('');
    }""", [x, y])


def test_dashboard_on_the_twin(browser):
    src = TwinSource(gpus=2048, minutes=6.0, seed=0)
    runner = Runner(src, speed=0)
    runner.advance(3)
    runner.start()
    server = Server(runner, TOKEN).start()
    errors: list[str] = []
    try:
        assert runner.ledger.actions() == []  # nothing has happened yet
        page = _page(browser, errors)
        page.goto(server.url + "/")
        _wait_tick(page, runner.snapshot().tick)
        assert page.locator("#timeline li.action").count() == 0
        assert "2,048 GPUs" in page.inner_text("#source")

        # Tick until the controller acts; the page must show the action without a reload.
        for _ in range(200):
            runner.advance(1)
            acts = [a for a in runner.ledger.actions() if a["op"] == "apply" and a["status"] == "done"]
            if acts:
                break
        assert acts, "the controller took no action within 200 ticks of the default scenario"
        target = acts[0]["key"].split(":", 1)[1].split("@")[0].split("=")[0]
        _wait_tick(page, runner.snapshot().tick)
        page.wait_for_selector("#timeline li.action", timeout=WAIT_MS)
        assert target in page.inner_text("#timeline")

        # Tick until the ECC fault has made its GPU non-healthy; the map paints it.
        gpu = fault_entity(src, FaultKind.GPU_ECC_ESCALATION)
        gi = src.fleet.index_of(Kind.GPU, gpu)
        for _ in range(200):
            if runner.snapshot().kinds[Kind.GPU].state[gi] != 0:
                break
            runner.advance(1)
        state = runner.snapshot().view(Kind.GPU).state[gi]
        assert state != 0
        _wait_tick(page, runner.snapshot().tick)
        label = page.evaluate("window.seamguard.states")[int(state)]
        color = page.evaluate(f"window.seamguard.colors['{label}']")
        c = page.evaluate(f"window.seamguard.cellCenter('{gpu}')")
        assert c is not None, "the faulty GPU is not drawn on the map"
        # Sample inside the cell's corner: failed and harmful cells carry a mark in the middle.
        corner = (c["cx"] - c["w"] / 2 + 1, c["cy"] - c["h"] / 2 + 1)
        assert _pixel(page, *corner) == color.lower()
        healthy = page.evaluate("window.seamguard.colors.healthy").lower()
        loop = src.fleet.loop_names[int(src.fleet.gpu_loop[gi])]
        assert loop and _pixel(page, *corner) != healthy

        # Click it: the detail panel shows its state, evidence and the reason.
        page.mouse.click(c["x"], c["y"])
        page.wait_for_function(f"document.querySelector('#detail h3') && "
                               f"document.querySelector('#detail h3').textContent.includes('{gpu}')")
        detail = page.inner_text("#detail")
        assert label.replace("_", " ") in detail
        assert any(ch in detail for ch in ("remapped_rows", "sbe_rate", "xid"))
        why = page.inner_text("#why")
        assert why.startswith(label) and "score" in why
        assert page.locator("#tssignals svg.chart").count() >= 5  # its signals over time

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard_2048.png"), full_page=True)
        assert not errors, errors
    finally:
        server.stop()
        runner.stop()
