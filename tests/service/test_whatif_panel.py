"""The dashboard's What-if panel in a real browser (Debian's Chromium through Playwright).

A served twin with its fault scenario: the operator picks the breaker bound, types two values and
runs; the panel draws one row per variant and one per job, and each figure it shows is the one
the API answered (the response the page itself received). A value out of range shows the API's
one-line error. Screenshot: artifacts/screenshots/dashboard_whatif.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from seamguard.app.runner import Runner
from seamguard.app.service.server import Server
from seamguard.app.sources import TwinSource

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


@pytest.mark.timeout(180)
def test_whatif_panel_runs_variants_and_shows_what_the_api_answered() -> None:
    src = TwinSource(gpus=256, minutes=6.0, seed=0, counterfactual=False)
    r = Runner(src, speed=0)
    r.advance(70)
    s = Server(r, "test-token-0123456789").start()
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = b.new_page(viewport={"width": 1500, "height": 1400})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(s.url + "/#range=15m")
            page.wait_for_function("document.querySelectorAll('#jobs tr').length > 1", timeout=30_000)
            page.fill("#token", "test-token-0123456789")  # a what-if is an operator's request
            page.select_option("#wiknob", "breaker")
            assert page.input_value("#wivalues") == "0.01,0.05,off"  # the knob's suggested values
            page.fill("#wivalues", "0.001,off")
            with page.expect_response(lambda resp: "/api/v1/twin/whatif" in resp.url, timeout=60_000) as got:
                page.click("#wirun")
            answer = got.value.json()
            page.wait_for_function("document.querySelectorAll('#witable tr[data-variant]').length === 3", timeout=30_000)
            rows = page.eval_on_selector_all("#witable tr[data-variant]", "els => els.map(e => e.dataset.variant)")
            assert rows == ["base", "breaker=0.001", "breaker=off"]
            for v in answer["whatif"]["variants"]:
                cells = page.eval_on_selector_all(f"#witable tr[data-variant='{v['variant']}'] td",
                                                  "els => els.map(e => e.innerText)")
                assert cells[1].startswith(_pct(v["ettr"][1]))
                if v["variant"] != "base":
                    pt = 100 * v["delta_ettr"][1]
                    assert cells[2].startswith(("+" if pt > 0 else "") + f"{pt:.2f} pt"), cells
            jobs = page.eval_on_selector_all("#wijobs tr[data-job]", "els => els.map(e => e.dataset.job)")
            assert jobs == [j["job"] for j in answer["jobs"]] == list(src.fleet.job_names)
            status = page.inner_text("#wistatus")
            assert f"{answer['whatif']['incidents_in_window']['hard']} hard" in status
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.locator("#whatifpanel").screenshot(path=str(ARTIFACTS / "dashboard_whatif.png"))
            page.fill("#wivalues", "7")
            page.click("#wirun")
            page.wait_for_function("document.getElementById('wistatus').innerText.startsWith('error:')", timeout=30_000)
            assert "breaker_max_fleet_fraction must be in (0, 1]" in page.inner_text("#wistatus")
            assert page.locator("#witable tr").count() == 0
            b.close()
    finally:
        s.stop()
        r.stop()
    assert not errors, errors
