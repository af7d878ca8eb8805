"""The gateway config: a problem is one line naming the file and the field; the CLI checks before binding."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from seamguard.gateway.config import GatewayConfigError, load_gateway_config, register_router
from seamguard.gateway.routing import ROUTERS, RoundRobin
from tests.conftest import subprocess_env

GOOD = {"version": 1, "instances": [{"name": "v0", "url": "http://10.0.0.2:8000"}],
        "tenants": [{"name": "acme", "tpm": 100000, "keys": [{"name": "app", "key": "sk-aaaaaaaaaaaa"}]}]}


def _write(tmp_path, data, name="gw.yaml"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("patch,where", [
    (lambda c: c["tenants"][0]["keys"][0].update(tpm=0), "tenants[0].keys[0].tpm"),
    (lambda c: c["tenants"][0]["keys"][0].update(key_sha256="ab" * 32), "tenants[0].keys[0]"),
    (lambda c: c["instances"][0].update(url="10.0.0.2:8000"), "instances[0].url"),
    (lambda c: c.update(router="fastest"), "(top level)"),
    (lambda c: c.update(store={"type": "etcd"}), "store"),
    (lambda c: c["tenants"].append(dict(c["tenants"][0])), "(top level)"),
    (lambda c: c.update(zombie={"volume_ratio": 0.5}), "zombie.volume_ratio"),
    (lambda c: c.update(admission={"shed_low_at": 2}), "admission.shed_low_at"),
    (lambda c: c.update(colour="blue"), "colour"),
])
def test_config_errors_are_one_line_naming_file_and_field(tmp_path, patch, where):
    import copy

    cfg = copy.deepcopy(GOOD)
    patch(cfg)
    p = _write(tmp_path, cfg)
    with pytest.raises(GatewayConfigError) as e:
        load_gateway_config(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: {where}")


def test_relative_store_path_is_beside_the_config(tmp_path):
    cfg = load_gateway_config(_write(tmp_path, {**GOOD, "store": {"type": "sqlite", "path": "state/gw.db"}}))
    assert cfg.store.path == tmp_path / "state/gw.db"


def test_registered_routers_are_found_by_name(tmp_path):
    made = []

    def factory(instances, weight=1, clock=None):
        made.append(weight)
        return RoundRobin(instances)

    register_router("test_only", factory)
    try:
        load_gateway_config(_write(tmp_path, {**GOOD, "router": "test_only", "router_options": {"weight": 3}}))
        assert made == [3]
        with pytest.raises(GatewayConfigError, match=r"gw.yaml: router: .*unexpected keyword"):
            load_gateway_config(_write(tmp_path, {**GOOD, "router": "test_only", "router_options": {"w": 3}}))
    finally:
        ROUTERS.pop("test_only")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "seamguard", "gateway", *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=60)


def test_cli_reports_a_bad_config_in_one_line_before_binding(tmp_path):
    bad = _write(tmp_path, {**GOOD, "port": 99999})
    r = _cli("--config", str(bad))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith(f"error: {bad}: port: ")
    r = _cli("--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "missing.yaml: cannot read the gateway config" in r.stderr
    r = _cli("--config", str(_write(tmp_path, "version: [1", "syntax.yaml")))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "syntax.yaml" in r.stderr
    ok = _cli("--config", str(_write(tmp_path, {**GOOD, "store": {"type": "sqlite", "path": "gw.db"}}, "ok.yaml")),
              "--check", "-o", "json", "--token", "t0k3n")
    assert ok.returncode == 0, ok.stderr
    assert '"router": "round_robin"' in ok.stdout and (tmp_path / "gw.db").exists()
    assert "t0k3n" not in ok.stdout and '"check": "ok"' in ok.stdout   # nothing listens: no token shown
    # a port that is taken: one error line before the banner (and its admin token)
    import socket
    with socket.create_server(("127.0.0.1", 0)) as taken:
        r = _cli("--config", str(tmp_path / "ok.yaml"), "--port", str(taken.getsockname()[1]))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "cannot listen on" in r.stderr, r.stderr
    assert "admin token" not in r.stdout


def test_cli_serves_the_openai_api(tmp_path, backend):
    import time

    import httpx
    import openai

    from seamguard.ports import free_port

    _, burl = backend
    port = free_port()
    cfg = {**GOOD, "instances": [{"name": "b0", "url": burl}], "store": {"type": "sqlite", "path": "gw.db"}}
    p = subprocess.Popen([sys.executable, "-m", "seamguard", "gateway", "--config", str(_write(tmp_path, cfg)),
                          "--port", str(port), "--token", "adm1n"], env=subprocess_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.1)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-aaaaaaaaaaaa", max_retries=0)
        r = c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.choices[0].message.content == "tok0 tok1"
    finally:
        p.terminate()
        out, _ = p.communicate(timeout=20)
    assert "admin tokens    operator" in out and "adm1n" not in out   # named, never shown
