"""Attacks on the controller's HTTP API (`seamguard serve`): a real server on loopback over a small twin.

The DNS-rebinding attack is what a browser sends once an attacker's domain resolves to
127.0.0.1: the attacker's name in `Host`. The audit attacks check the ledger, the record
a person reads afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from seamguard.app.runner import Runner
from seamguard.fleet.model import Kind
from seamguard.app.service.server import Server
from seamguard.app.sources import TwinSource
from seamguard.ports import free_port
from tests.conftest import subprocess_env

TOKEN = "sec-token-0123456789abcdef"


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    r = Runner(TwinSource(gpus=64, minutes=2.0, seed=0, counterfactual=False), speed=0,
               ledger_path=tmp_path_factory.mktemp("svc") / "ledger.sqlite")
    r.advance(3)
    r.start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def server(runner):
    s = Server(runner, TOKEN).start()
    yield s
    s.stop()


@pytest.mark.parametrize("path", ["/api/v1/summary", "/api/v1/failsafe", "/metrics", "/"])
def test_service_dns_rebinding_read(server, observed, path):
    """A page on a rebinding domain (attacker.example -> 127.0.0.1) reads the controller through the victim's browser.

    Refused: a request whose Host names neither this service nor an address gets 400 and no data.
    """
    r = httpx.get(server.url + path, headers={"Host": f"attacker.example:{server.port}"}, timeout=10)
    observed(f"GET {path} with Host attacker.example: {r.status_code}, {len(r.content)} bytes")
    assert r.status_code == 400 and "Host" in r.json()["detail"]
    assert httpx.get(server.url + path, timeout=10).status_code == 200  # its own address still answers


def test_service_dns_rebinding_write(server, observed):
    """A page on a rebinding domain that has learned a token switches the controller's mode through the browser.

    Refused: 400 before the token is even looked at; the mode is unchanged.
    """
    before = httpx.get(server.url + "/api/v1/summary", timeout=10).json()["mode"]
    want = "dry_run" if before == "enforce" else "enforce"
    r = httpx.put(server.url + "/api/v1/mode", json={"mode": want}, timeout=10,
                  headers={"Host": "attacker.example", "Authorization": f"Bearer {TOKEN}"})
    after = httpx.get(server.url + "/api/v1/summary", timeout=10).json()["mode"]
    observed(f"PUT /api/v1/mode with Host attacker.example: {r.status_code}; mode {before} -> {after}")
    assert r.status_code == 400 and after == before


@pytest.mark.parametrize("why", ["   ", "\t\n ", "\u00a0\u2003"], ids=["spaces", "tabs-newlines", "unicode-spaces"])
def test_service_breaker_reset_blank_why(server, runner, observed, why):
    """An operator resets the safety breaker with a `why` of only whitespace.

    Refused: 422 naming `why`; no reset is recorded in the ledger.
    """
    before = len(runner.ledger.failsafe_events(event="breaker_reset"))
    r = httpx.post(server.url + "/api/v1/breaker/reset", json={"why": why}, timeout=20,
                   headers={"Authorization": f"Bearer {TOKEN}"})
    recorded = len(runner.ledger.failsafe_events(event="breaker_reset")) - before
    observed(f"POST /api/v1/breaker/reset why={why!r}: {r.status_code}; resets recorded: {recorded}")
    assert r.status_code == 422 and "why" in r.text and recorded == 0


def test_service_pin_blank_note(server, runner, observed):
    """An operator pins a GPU healthy with a `note` of only spaces, so the audit trail says nothing.

    Refused: 422 naming `note`; nothing is pinned.
    """
    gpu = runner.snapshot().fleet.names(Kind.GPU)[0]
    r = httpx.put(f"{server.url}/api/v1/pins/gpu/{gpu}", json={"state": "healthy", "note": "    "}, timeout=20,
                  headers={"Authorization": f"Bearer {TOKEN}"})
    pins = httpx.get(server.url + "/api/v1/pins", timeout=10).json()
    observed(f"PUT pin note='    ': {r.status_code}; pins in force: {len(pins)}")
    assert r.status_code == 422 and "note" in r.text and pins == []


def test_service_audit_by_is_always_operator(runner, observed):
    """Two operators with their own tokens reset the breaker; the ledger records both as "operator".

    Refused: each action is recorded under the name of the token that made it.
    """
    tokens = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
    s = Server(runner, tokens).start()
    try:
        for name, tok in tokens.items():
            r = httpx.post(s.url + "/api/v1/breaker/reset", json={"why": f"{name} checked the loop"}, timeout=20,
                           headers={"Authorization": f"Bearer {tok}"})
            assert r.status_code == 200, r.text
        wrong = httpx.post(s.url + "/api/v1/breaker/reset", json={"why": "x"}, timeout=20,
                           headers={"Authorization": "Bearer operator"}).status_code
        events = [e for e in runner.ledger.failsafe_events(event="breaker_reset") if "checked the loop" in e["detail"]]
    finally:
        s.stop()
    actors = sorted(e["by"] for e in events)
    observed(f"resets recorded by {actors}; an unknown token got {wrong}")
    assert actors == ["alice", "bob"] and wrong == 401


@pytest.mark.parametrize("flags", [[], ["--json"]], ids=["banner", "json"])
def test_service_token_from_environment_printed(tmp_path, observed, flags):
    """`seamguard serve` with SEAMGUARD_TOKEN in its environment prints the token in its output (logs).

    Refused: a token someone gave is never printed or logged; serve says only whose tokens it loaded.
    """
    port, token = free_port(), "env-secret-token-0123456789"
    out_path = tmp_path / "out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "seamguard", "serve", "--gpus", "64", "--speed", "0",
                                 "--port", str(port), *flags], stdout=out, stderr=subprocess.STDOUT,
                                env={**subprocess_env(), "SEAMGUARD_TOKEN": token})
        try:
            deadline, up = time.monotonic() + 60, False
            while time.monotonic() < deadline and proc.poll() is None and not up:
                try:
                    up = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    time.sleep(0.3)
            ok = httpx.put(f"http://127.0.0.1:{port}/api/v1/mode", json={"mode": "dry_run"}, timeout=20,
                           headers={"Authorization": f"Bearer {token}"}).status_code if up else None
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    text = out_path.read_text(errors="replace")
    observed(f"serve up: {up}; token works: {ok}; token in output: {token in text}")
    assert up and ok == 200, text[-2000:]
    assert token not in text and os.path.getsize(out_path) > 0
