"""A zombie key through the HTTP gateway: throttled, then suspended, with evidence in the ledger and /metrics."""

from __future__ import annotations

import httpx

from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from tests.gateway.conftest import ADMIN, ADMIN_TOKEN, KEY_B, base_config
from tests.gateway.test_zombie import office_hours


def test_leaked_key_is_throttled_then_suspended_and_an_operator_lifts_it(gateway_factory, tmp_path):
    now = [0.0]
    with ThreadedServer(FakeBackend().app()) as be:
        url, gw = gateway_factory(base_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")}),
                                  clock=lambda: now[0])
        # three office days of its own history (1,800 tokens a minute at most), fed to the detector directly
        now[0] = office_hours(gw.gatekeeper.detector, key="b", source="127.0.0.1|python-httpx/0.28.1")
        t0 = now[0]
        statuses = []
        for i in range(200):  # 100 s of 2 requests a second of ~600 tokens: about 40x its peak minute
            now[0] = t0 + i * 0.5
            r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_B}"},
                           json={"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 496})
            statuses.append((now[0] - t0, r.status_code, r.json().get("error", {}).get("code")))
            if r.status_code == 403:
                break
        first_429 = next(t for t, s, _ in statuses if s == 429)
        first_403 = next(t for t, s, _ in statuses if s == 403)
        assert first_429 <= 30.0 and 60.0 <= first_403 <= 90.0
        ev = httpx.get(url + "/admin/events?key=b", headers=ADMIN).json()["events"]
        assert [(e["from"], e["to"]) for e in reversed(ev)] == [("ok", "throttled"), ("throttled", "suspended")]
        assert ev[-1]["evidence"]["ratio"] > 4 and ev[-1]["by"] == "zombie-detector"
        m = httpx.get(url + "/metrics", headers=ADMIN).text
        assert 'seamguard_gateway_key_state{key="b",state="suspended"} 1.0' in m
        assert 'seamguard_gateway_key_state_changes_total{actor="zombie-detector",key="b",to="throttled"} 1.0' in m
        r = httpx.post(url + "/admin/keys/b/unsuspend", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                       json={"note": "rotated the leaked secret's twin; job is legitimate"})
        assert r.json()["state"] == "ok"
        now[0] += 1.0
        assert httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_B}"},
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}]}).status_code == 200
