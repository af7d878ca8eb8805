"""Attacks on who may use the gateway's port: a foreign Host (DNS rebinding), admin reads and
/metrics without a token, an audit trail that cannot tell operators apart, an empty "why",
and admin calls while the budget store is down."""

from __future__ import annotations

import hashlib

import httpx
import openai
import pytest

from seamguard.ports import free_port
from tests.gateway.conftest import ADMIN_TOKEN, KEY_A, base_config
from tests.security.gateway_child import GatewayChild, child_config, child_port
from tests.security.test_gateway_surface_body import openai_status

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
READS = ["/admin/keys", "/admin/tenants", "/admin/routing", "/admin/events", "/dashboard"]


def _sqlite(tmp_path):
    return {"type": "sqlite", "path": str(tmp_path / "gw.db")}


def test_a_foreign_host_is_refused(backend, gateway_factory, tmp_path, observed):
    """DNS rebinding: a page at attacker.example, rebound to the loopback gateway, calls it with its key.
    Refused: 421 for a Host the gateway does not answer; localhost and the bound address still work."""
    fb, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path)))
    port = url.rsplit(":", 1)[1]
    rebound = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0,
                            default_headers={"Host": f"attacker.example:{port}"})
    status, _ = openai_status(lambda: rebound.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2))
    admin = httpx.get(url + "/admin/keys", headers={**ADMIN, "Host": f"attacker.example:{port}"})
    local = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key=KEY_A, max_retries=0)
    ok = local.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    observed(f"Host attacker.example: completion HTTP {status}, /admin/keys HTTP {admin.status_code}; "
             f"backend saw {len(fb.seen) - 1} of the foreign request(s); Host localhost: {ok.choices[0].finish_reason}")
    assert status == 421 and admin.status_code == 421
    assert len(fb.seen) == 1   # only the localhost one
    assert ok.choices[0].message.content == "tok0 tok1"


def test_allowed_hosts_extends_the_names_answered(backend, gateway_factory, tmp_path, observed):
    """A gateway published as gw.example.com (allowed_hosts) is called under a look-alike name gw.example.com.evil.
    Refused: 421 for the look-alike; the configured name and its *. suffix are answered."""
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path),
                                         http={"allowed_hosts": ["gw.example.com", "*.inference.internal"]}))
    def status(host: str) -> int:
        return httpx.get(url + "/healthz", headers={"Host": host}).status_code
    got = {h: status(h) for h in ("gw.example.com.evil", "evil-gw.example.com", "gw.example.com:443",
                                  "a.inference.internal", "GW.EXAMPLE.COM.")}
    observed(f"{got}")
    assert got == {"gw.example.com.evil": 421, "evil-gw.example.com": 421, "gw.example.com:443": 200,
                   "a.inference.internal": 200, "GW.EXAMPLE.COM.": 200}


@pytest.mark.parametrize("path", READS)
def test_admin_reads_need_the_admin_token(backend, gateway_factory, tmp_path, observed, path):
    """Reading an admin page (keys, tenants, routing, ledger, dashboard) with no token or with a client's API key.
    Refused: 401 for both; the admin token reads it."""
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path)))
    anon = httpx.get(url + path)
    client_key = httpx.get(url + path, headers={"Authorization": f"Bearer {KEY_A}"})
    admin = httpx.get(url + path, headers=ADMIN)
    observed(f"GET {path}: no token HTTP {anon.status_code}, API key HTTP {client_key.status_code}, "
             f"admin token HTTP {admin.status_code}")
    assert anon.status_code == 401 and client_key.status_code == 401
    assert "sk-test" not in anon.text and "acme" not in anon.text
    assert admin.status_code == 200


def test_metrics_need_a_metrics_or_admin_token(backend, tmp_path, observed):
    """Scraping /metrics (tenant and key names, their spend) with no token, and using the metrics token on /admin.
    Refused: 401 without a token; the metrics token reads /metrics and nothing else."""
    from seamguard.gateway.app import build_gateway, create_app
    from seamguard.gateway.config import parse_gateway_config
    from seamguard.gateway.surface import Bearers
    from seamguard.testbed.openai_backend import ThreadedServer

    _, burl = backend
    gw = build_gateway(parse_gateway_config(base_config(burl, _sqlite(tmp_path)), "t.yaml"))
    with ThreadedServer(create_app(gw, ADMIN_TOKEN, Bearers.of({"prometheus": "scrape-secret-1"}))) as srv:
        anon = httpx.get(srv.url + "/metrics")
        scraper = httpx.get(srv.url + "/metrics", headers={"Authorization": "Bearer scrape-secret-1"})
        admin = httpx.get(srv.url + "/metrics", headers=ADMIN)
        scraper_admin = httpx.get(srv.url + "/admin/keys", headers={"Authorization": "Bearer scrape-secret-1"})
    observed(f"/metrics: no token HTTP {anon.status_code}, metrics token {scraper.status_code}, admin token "
             f"{admin.status_code}; metrics token on /admin/keys HTTP {scraper_admin.status_code}")
    assert anon.status_code == 401 and "seamguard_gateway" not in anon.text
    assert scraper.status_code == 200 and "seamguard_gateway_requests" in scraper.text
    assert admin.status_code == 200
    assert scraper_admin.status_code == 401


def test_audit_names_the_operator_whose_token_acted(backend, tmp_path, observed):
    """Two operators with their own admin tokens (admin_tokens, by environment); alice suspends, bob lifts it.
    Refused: each change records its token's name as `by` (not "operator" for both)."""
    _, burl = backend
    alice, bob = "alice-token-0123456789", "bob-token-9876543210"
    cfg = child_config(burl, tmp_path, child_port(), admin_tokens=[
        {"name": "alice", "token_env": "SG_TEST_ALICE"},
        {"name": "bob", "token_sha256": hashlib.sha256(bob.encode()).hexdigest()}])
    with GatewayChild(tmp_path, cfg, env={"SG_TEST_ALICE": alice}) as g:
        s = httpx.post(g.url + "/admin/keys/a/suspend", headers={"Authorization": f"Bearer {alice}"},
                       json={"note": "key posted in a public gist"})
        u = httpx.post(g.url + "/admin/keys/a/unsuspend", headers={"Authorization": f"Bearer {bob}"},
                       json={"note": "rotated"})
        ev = httpx.get(g.url + "/admin/events?key=a", headers={"Authorization": f"Bearer {bob}"}).json()["events"]
        keys = httpx.get(g.url + "/admin/keys", headers={"Authorization": f"Bearer {alice}"}).json()["keys"]
    by = [(e["to"], e["by"]) for e in ev]
    observed(f"suspend by alice: {s.json().get('by')}; unsuspend by bob: {u.json().get('by')}; ledger {by}")
    assert s.json()["by"] == "alice" and u.json()["by"] == "bob"
    assert ("suspended", "alice") in by and ("ok", "bob") in by
    assert {k["name"]: k["by"] for k in keys}["a"] == "bob"


@pytest.mark.parametrize("body", [None, {}, {"note": ""}, {"note": "   \t\n"}, {"note": 5}])
def test_an_admin_change_without_a_why_is_refused(backend, gateway_factory, tmp_path, observed, body):
    """Suspending, lifting or resetting a key with no reason (no body, no note, an empty or blank note).
    Refused: 400 saying a note is needed; the key's state does not change."""
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path)))
    got = {verb: httpx.post(f"{url}/admin/keys/a/{verb}", headers=ADMIN,
                            **({} if body is None else {"json": body})).status_code
           for verb in ("suspend", "unsuspend", "reset")}
    events = httpx.get(url + "/admin/events?key=a", headers=ADMIN).json()["events"]
    observed(f"body {body!r}: {got}; ledger events for key a: {[(e['to'], e['reason']) for e in events]}")
    assert set(got.values()) == {400}
    assert events == []


def test_admin_calls_while_redis_is_down_are_one_line_503s(backend, gateway_factory, tmp_path, observed):
    """Admin reads and changes while the shared Redis store cannot be reached.
    Refused: 503 with one line (store unavailable, Retry-After), not a 500."""
    _, burl = backend
    store = {"type": "redis", "url": f"redis://127.0.0.1:{free_port()}/0", "ledger": str(tmp_path / "l.db")}
    url, _ = gateway_factory(base_config(burl, store, timeouts={"connect_s": 0.3}))
    got = {p: httpx.get(url + p, headers=ADMIN, timeout=10) for p in ("/admin/keys", "/admin/tenants")}
    got["suspend"] = httpx.post(url + "/admin/keys/a/suspend", headers=ADMIN, json={"note": "test"}, timeout=10)
    observed("; ".join(f"{p}: HTTP {r.status_code} {r.json()['error']['message'][:60]!r}" for p, r in got.items()))
    for r in got.values():
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        assert "\n" not in r.json()["error"]["message"] and r.headers.get("retry-after") == "1"
