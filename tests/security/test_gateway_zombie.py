"""Zombie keys through the real HTTP gateway: a ramp the jump rules missed, and a key punished for the gateway's own timeouts.

The key's history (three office days, 1,800 tokens a minute at most) is fed to the gateway's
detector directly; then the `openai` client talks to the gateway on an injected clock.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from tests.gateway.conftest import ADMIN_TOKEN, KEY_B, base_config
from tests.gateway.test_zombie import office_hours

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
UA = "ramp-client/1.0"
SOURCE = f"127.0.0.1|{UA}"
PER_REQUEST = 600  # tokens each request reserves (about 100 of prompt + max_tokens 496)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY_B, max_retries=0, timeout=30.0,
                         default_headers={"User-Agent": UA})


def _ask(c: openai.OpenAI) -> tuple[int, str]:
    try:
        c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x" * 400}],
                                  max_tokens=496)
        return 200, ""
    except openai.APIStatusError as e:
        err = (e.body or {}) if isinstance(e.body, dict) else {}
        return e.status_code, str(err.get("message", ""))


def _events(url: str) -> list[dict]:
    return httpx.get(url + "/admin/events?key=b", headers=ADMIN, timeout=10).json()["events"]


def test_a_key_ramping_3_5x_every_2_minutes(gateway_factory, tmp_path, observed):
    """A leaked key's spend grows 3.5x every 2 minutes from its own peak minute, never jumping 4x at once.
    Refused: throttled (429, key throttled) before it asks for 10x its learned peak minute, then suspended (403)."""
    now = [0.0]
    with ThreadedServer(FakeBackend().app()) as be:
        url, gw = gateway_factory(base_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")}),
                                  clock=lambda: now[0])
        t0 = now[0] = office_hours(gw.gatekeeper.detector, key="b", source=SOURCE)
        peak = gw.gatekeeper.detector.baseline("b")["peak_minute_tokens"]
        c = _client(url)
        seen, t = [], t0
        while t < t0 + 15 * 60.0:
            rate = 1800.0 * 3.5 ** ((t - t0) / 120.0)  # tokens a minute it asks for now
            now[0] = t
            status, msg = _ask(c)
            seen.append((round(t - t0, 1), round(rate / peak, 1), status, "throttled" in msg))
            if status == 403:
                break
            t += 60.0 * PER_REQUEST / rate
        events = _events(url)
    first = next(((s, x) for s, x, st, _ in seen if st in (403, 429)), None)
    observed(f"{len(seen)} requests over {seen[-1][0]} s; first refusal at {first} (s, x its peak); "
             f"last {seen[-1]}; steps {[(e['from'], e['to'], e['reason']) for e in reversed(events)]}")
    assert first is not None and first[1] < 10.0
    assert [e["to"] for e in reversed(events)][:2] == ["throttled", "suspended"]
    assert any(st == 429 and thr for _, _, st, thr in seen)


def test_requests_timing_out_in_the_gateway_get_the_key_throttled(gateway_factory, tmp_path, observed):
    """While the backend hangs, a client's 20 requests pile up in flight and every one ends in the gateway's own 504.
    Refused: their demand is the gateway's failure, not the key's: a throttle taken on it is lifted as they time out, and the key is served (200) once the backend answers."""
    now = [0.0]
    fb = FakeBackend(ttft_s=3.0)   # hangs past the gateway's 1 s total
    with ThreadedServer(fb.app()) as be:
        cfg = base_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")}, timeouts={"total_s": 1.0})
        url, gw = gateway_factory(cfg, clock=lambda: now[0])
        now[0] = office_hours(gw.gatekeeper.detector, key="b", source=SOURCE)
        c = _client(url)
        with ThreadPoolExecutor(20) as pool:
            statuses = [s for s, _ in pool.map(lambda _: _ask(c), range(20))]
        state = gw.gatekeeper.detector.state("b")[0]
        fb.ttft_s = 0.0                 # the backend is back
        now[0] += 5.0
        back, _ = _ask(c)
        events = _events(url)
    tally = {s: statuses.count(s) for s in sorted(set(statuses))}
    steps = [(e["from"], e["to"], e["reason"]) for e in reversed(events)]
    observed(f"statuses {tally}; key state after the timeouts {state}; then {back}; steps {steps}")
    assert 504 in tally and state == "ok" and back == 200
    assert all(to != "suspended" for _, to, _ in steps)
    assert steps == [] or steps[-1] == ("throttled", "ok", "its evidence was the gateway's own failures")
