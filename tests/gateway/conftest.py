"""Fixtures for the gateway tests: a fake OpenAI backend, gateways built from config dicts, redis-server."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from seamguard.gateway.app import build_gateway, create_app
from seamguard.gateway.config import parse_gateway_config
from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from seamguard.testbed.redis_server import RedisServer

ADMIN_TOKEN = "admin-secret-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}  # /admin, /dashboard and /metrics need it
KEY_A, KEY_B, KEY_LOW = "sk-test-aaaaaaaa", "sk-test-bbbbbbbb", "sk-test-llllllll"


def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """A stream's usage is reconciled just after its last byte: wait (bounded) for what follows it."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def base_config(backend_url: str, store: dict[str, Any], **over: Any) -> dict[str, Any]:
    cfg = {"version": 1, "instances": [{"name": "b0", "url": backend_url}],
           "store": store, "models": ["fake-model"],
           "tenants": [{"name": "acme", "tpm": 1_000_000, "keys": [
               {"name": "a", "key": KEY_A, "priority": "high"},
               {"name": "b", "key": KEY_B},
               {"name": "low", "key": KEY_LOW, "priority": "low"}]}]}
    cfg.update(copy.deepcopy(over))
    return cfg


@pytest.fixture
def backend() -> Iterator[tuple[FakeBackend, str]]:
    fb = FakeBackend()
    with ThreadedServer(fb.app()) as srv:
        yield fb, srv.url


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Any]]]:
    """start(cfg_dict, clock=None) -> (url, Gateway); every gateway started is stopped at the end."""
    servers: list[ThreadedServer] = []

    def start(cfg: dict[str, Any], clock: Callable[[], float] | None = None) -> tuple[str, Any]:
        gw = build_gateway(parse_gateway_config(cfg, "test.yaml"), **({"clock": clock} if clock else {}))
        srv = ThreadedServer(create_app(gw, ADMIN_TOKEN)).start()
        servers.append(srv)
        return srv.url, gw

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as r:
        yield r.url
