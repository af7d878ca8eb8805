"""Budgets hold under concurrency, across two replicas sharing a real redis-server, and across a restart."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from tests.gateway.conftest import ADMIN, ADMIN_TOKEN, KEY_B, base_config, eventually

T0 = 1_800_000_030.0  # a frozen clock: every request in one minute, so the expected count is exact
MSG = [{"role": "user", "content": "x"}]  # estimated 1 + 4 prompt tokens; the backend counts 1 + 3


def _budget_config(url: str, store: dict, **key_limits) -> dict:
    cfg = base_config(url, store)
    cfg["tenants"][0]["keys"][1].update(key_limits)
    return cfg


def _post(url: str, max_tokens: int = 90, key: str = KEY_B) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "fake-model", "messages": MSG, "max_tokens": max_tokens}, timeout=20)


def _burst(urls: list[str], n: int, max_tokens: int = 90) -> list[httpx.Response]:
    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(lambda i: _post(urls[i % len(urls)], max_tokens), range(n)))


def test_tpm_holds_under_concurrency_and_429_says_when(gateway_factory, tmp_path):
    fb = FakeBackend(ttft_s=0.3)  # requests overlap: each reserves before any ends
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_budget_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")},
                                                 tpm=1000), clock=lambda: T0)
        rs = _burst([url], 30)
        ok = [r for r in rs if r.status_code == 200]
        refused = [r for r in rs if r.status_code == 429]
        assert len(ok) == 10 and len(refused) == 20  # 10 x (5 + 90) = 950 fits 1000, an 11th does not
        assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
        assert {r.json()["error"]["code"] for r in refused} == {"key_tpm"}
        assert refused[0].json()["error"]["type"] == "rate_limit_exceeded"
        spent = sum(r.json()["usage"]["total_tokens"] for r in ok)
        assert spent <= 1000
        eventually(lambda: httpx.get(url + "/admin/keys", headers=ADMIN).json()["keys"][1]["used"]["tokens_last_minute"] == spent)


def test_a_request_larger_than_the_whole_budget_is_invalid_not_rate_limited(gateway_factory, tmp_path):
    """Waiting cannot make it fit: 400 invalid_request_error with no Retry-After (it was 429 with
    'retry after 60 s'), nothing reserved, and the key's learned peak stays untouched."""
    fb = FakeBackend()
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_budget_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")},
                                                tpm=1000), clock=lambda: T0)
        r = _post(url, max_tokens=10**7)
        assert r.status_code == 400 and "Retry-After" not in r.headers, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "request_too_large"
        assert "exceed key" in err["message"] and "1000 per minute" in err["message"]
        key = httpx.get(url + "/admin/keys", headers=ADMIN).json()["keys"][1]
        assert key["used"]["tokens_last_minute"] == 0 and key["state"] == "ok"
        assert key["baseline"].get("peak_minute_tokens", 0.0) == 0.0
        assert _post(url).status_code == 200   # an ordinary request right after it is served


def test_concurrency_limit(gateway_factory, tmp_path):
    fb = FakeBackend(ttft_s=0.5)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_budget_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")},
                                                concurrency=2), clock=lambda: T0)
        rs = _burst([url], 6, max_tokens=2)
        assert sorted(r.status_code for r in rs) == [200, 200, 429, 429, 429, 429]
        assert {r.json()["error"]["code"] for r in rs if r.status_code == 429} == {"key_concurrency"}
        assert _post(url, 2).status_code == 200  # slots are given back


def test_two_replicas_share_budgets_through_redis(gateway_factory, redis_url, tmp_path):
    fb = FakeBackend(ttft_s=0.3)
    with ThreadedServer(fb.app()) as be:
        urls = []
        for i in range(2):
            store = {"type": "redis", "url": redis_url, "prefix": "t1:", "ledger": str(tmp_path / f"l{i}.db")}
            urls.append(gateway_factory(_budget_config(be.url, store, tpm=1000), clock=lambda: T0)[0])
        rs = _burst(urls, 30)
        assert sum(r.status_code == 200 for r in rs) == 10  # not 10 per replica
        assert sum(r.status_code == 429 for r in rs) == 20
        assert {r.status_code for r in rs[0::2]} == {200, 429} or {r.status_code for r in rs[1::2]} == {200, 429}
        # an operator's suspension through one replica holds on the other
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert httpx.post(urls[0] + "/admin/keys/b/suspend", headers=auth, json={"note": "test"}).status_code == 200
        assert _post(urls[1], 1).status_code == 403
        assert httpx.post(urls[1] + "/admin/keys/b/reset", headers=auth, json={"note": "test"}).json()["state"] == "ok"
        assert _post(urls[0], 1).status_code == 200


def test_sqlite_budgets_and_key_state_survive_a_restart(tmp_path, gateway_factory):
    from seamguard.gateway.app import build_gateway, create_app
    from seamguard.gateway.config import parse_gateway_config

    fb = FakeBackend()
    with ThreadedServer(fb.app()) as be:
        cfg = parse_gateway_config(_budget_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")},
                                                  tpd=1000), "t.yaml")
        first = ThreadedServer(create_app(build_gateway(cfg, clock=lambda: T0), ADMIN_TOKEN)).start()
        assert _post(first.url, 600).status_code == 200  # reserves 605, reconciles to 4 + 600
        assert httpx.post(first.url + "/admin/keys/a/suspend",
                          headers=ADMIN, json={"note": "test"}).status_code == 200
        first.stop()
        second = ThreadedServer(create_app(build_gateway(cfg, clock=lambda: T0 + 120), ADMIN_TOKEN)).start()
        try:
            r = _post(second.url, 400)
            assert r.status_code == 429 and r.json()["error"]["code"] == "key_tpd"
            assert _post(second.url, 300).status_code == 200
            keys = {k["name"]: k for k in httpx.get(second.url + "/admin/keys", headers=ADMIN).json()["keys"]}
            assert keys["b"]["used"]["tokens_today"] == 604 + 304
            assert keys["a"]["state"] == "suspended"
        finally:
            second.stop()


def test_low_priority_is_shed_first_near_the_tenant_budget(gateway_factory, tmp_path):
    from tests.gateway.conftest import KEY_A, KEY_LOW

    fb = FakeBackend()
    with ThreadedServer(fb.app()) as be:
        cfg = base_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")})
        cfg["tenants"][0]["tpm"] = 1000
        url, _ = gateway_factory(cfg, clock=lambda: T0)
        assert _post(url, 695, KEY_A).status_code == 200  # tenant at 699 of 1000
        r = _post(url, 150, KEY_LOW)  # 699 + 155 > 800: over the low class's share
        assert r.status_code == 429 and r.json()["error"]["code"] == "tenant_shed"
        assert _post(url, 150, KEY_B).status_code == 200  # normal may go to 950
        assert _post(url, 90, KEY_A).status_code == 200  # high may use it all


def test_a_client_that_leaves_mid_stream_gives_its_slot_and_unused_tokens_back(gateway_factory, tmp_path):
    fb = FakeBackend(per_token_s=0.05)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_budget_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")},
                                                concurrency=1), clock=lambda: T0)
        with httpx.stream("POST", url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_B}"},
                          json={"model": "m", "messages": MSG, "max_tokens": 200, "stream": True}) as r:
            next(r.iter_lines())
        def used() -> dict:
            return httpx.get(url + "/admin/keys", headers=ADMIN).json()["keys"][1]["used"]
        eventually(lambda: used()["inflight"] == 0)
        assert 0 < used()["tokens_last_minute"] < 50  # what was relayed, not the 205 reserved
        assert _post(url, 2).status_code == 200


def test_unreachable_redis_fails_closed_with_503(backend, gateway_factory, tmp_path):
    from seamguard.ports import free_port

    _, burl = backend
    store = {"type": "redis", "url": f"redis://127.0.0.1:{free_port()}/0", "ledger": str(tmp_path / "l.db")}
    url, _ = gateway_factory(base_config(burl, store))
    r = _post(url, 2)
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    assert r.headers["Retry-After"] == "1"
    # and /healthz says so, so a load balancer stops sending this replica traffic (it said ok)
    h = httpx.get(url + "/healthz", timeout=10)
    assert h.status_code == 503 and h.json()["ok"] is False and "redis" in h.json()["store"]
