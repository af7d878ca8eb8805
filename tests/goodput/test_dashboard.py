"""The dashboard's Goodput panel in a real browser (Debian's Chromium through Playwright).

A served twin whose jobs report their step (the first one idle for 100 s) and which,
like a live cluster, reports no useful-work figure: the Goodput panel draws one stacked
bar per job and the fleet's ETTR over the range, and the throughput panel says it is the
twin's and shows the measured goodput instead of dashes, as does the Jobs table's
"useful" column. Screenshot:
artifacts/screenshots/dashboard_goodput.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from tests.goodput.test_api import SteppingTwin

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


class LiveLikeTwin(SteppingTwin):
    """No useful-work figure, as a live cluster reports none."""

    def progress(self):
        return None


@pytest.mark.timeout(180)
def test_goodput_panel_draws_bars_and_ettr_and_fills_the_throughput_panel() -> None:
    src = LiveLikeTwin(gpus=256, minutes=6.0, seed=0, counterfactual=False)
    r = Runner(src, speed=0)
    r.advance(70)
    s = Server(r, "test-token-0123456789").start()
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = b.new_page(viewport={"width": 1500, "height": 1200})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(s.url + "/#range=15m")
            page.wait_for_function("document.querySelectorAll('#gpbars .gprow').length > 0", timeout=30_000)
            rows = page.eval_on_selector_all("#gpbars .gprow", "els => els.map(e => e.dataset.job)")
            first = src.fleet.job_names[0]
            assert rows[0] == first  # the idle job has the lowest ETTR: drawn first
            titles = page.eval_on_selector_all(f"#gpbars .gprow[data-job='{first}'] .gpbar > div",
                                               "els => els.map(e => e.title)")
            assert any(t.startswith(("unattributed", "straggler", "degraded")) for t in titles), titles
            assert page.locator("#gpettr svg").count() == 1
            assert "twin only" in page.inner_text("#tputsub")
            assert "measured ETTR" in page.inner_text("#tputstats")
            useful = page.inner_text(f"#jobs tr[data-name='{first}'] td:nth-child(5)")
            assert useful.endswith("%") and float(useful[:-1]) < 100  # measured, not the twin's dash
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.locator("#goodputpanel").screenshot(path=str(ARTIFACTS / "dashboard_goodput.png"))
            b.close()
    finally:
        s.stop()
        r.stop()
    assert not errors, errors
