"""`seamguard gateway --config gateway.yaml`: the OpenAI-compatible gateway, started from its config.

The edge: the config file and the admin token (flag or environment) are read here, the
whole config is validated and the store opened before any port is bound, and each problem
is one ``error: ...`` line (exit 2). The gateway itself is seamguard.gateway.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

import typer

from seamguard.app.clikit import (
    JSON_OPTION,
    OUTPUT_OPTION,
    Output,
    emit,
    fail,
    wants_json,
)


def gateway(
    config: Path = typer.Option(..., "--config", help="Gateway config YAML (docs/gateway.md)."),
    host: str | None = typer.Option(None, "--host", help="Address to listen on (default: the config's)."),
    port: int | None = typer.Option(None, "--port", min=0, max=65535, help="Port (default: the config's)."),
    token: str | None = typer.Option(None, "--token", envvar="SEAMGUARD_GATEWAY_TOKEN",
                                     help="Bearer token for mutating /admin calls (default: generated, printed)."),
    check: bool = typer.Option(False, "--check", help="Validate the config and the store, then exit."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Serve the OpenAI-compatible gateway: token budgets, zombie keys, routing to the backends."""
    try:
        import uvicorn

        from seamguard.gateway.app import build_gateway, create_app
        from seamguard.gateway.config import (
            GatewayConfigError,
            RedisStoreConfig,
            load_gateway_config,
        )
        from seamguard.gateway.store import StoreError
    except ImportError as e:
        fail(f"`seamguard gateway` needs the gateway extra ({e.name} is missing): pip install 'seamguard[gateway]'")
    try:
        cfg = load_gateway_config(config)
    except GatewayConfigError as e:
        fail(str(e))
    if isinstance(cfg.store, RedisStoreConfig):
        _ping_redis(config, cfg.store.url, cfg.timeouts.connect_s)
    try:
        gw = build_gateway(cfg)
    except (StoreError, OSError) as e:
        fail(f"{config}: store: {e}")
    bind_host, bind_port = host or cfg.host, cfg.port if port is None else port
    info = {"config": str(config), "listen": f"http://{bind_host}:{bind_port}", "router": cfg.router,
            "instances": len(cfg.instances), "store": cfg.store.type,
            "keys": sum(len(t.keys) for t in cfg.tenants)}
    if check:   # nothing will listen: no admin token to hand out
        emit({**info, "check": "ok"}, wants_json(output, json_flag), _banner)
        return
    _bindable(config, bind_host, bind_port)
    info["token"] = token or secrets.token_urlsafe(24)
    emit(info, wants_json(output, json_flag), _banner)
    sys.stdout.flush()
    token = info["token"]
    uvicorn.run(create_app(gw, token), host=bind_host, port=bind_port, log_level="warning", access_log=False)


def _ping_redis(config: Path, url: str, timeout_s: float) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s).ping()
    except redis.RedisError as e:
        fail(f"{config}: store.url: cannot reach Redis at {url}: {e}")


def _bindable(config: Path, host: str, port: int) -> None:
    """A taken port is one `error:` line before the banner and its token (uvicorn said it after)."""
    import socket

    try:
        with socket.create_server((host, port), reuse_port=False):
            pass
    except OSError as e:
        fail(f"{config}: host/port: cannot listen on {host}:{port}: {e.strerror or e}")


def _banner(d: dict[str, Any]) -> None:
    typer.echo(f"seamguard gateway: {d['listen']}, router {d['router']} over {d['instances']} instance(s), "
               f"{d['keys']} key(s), store {d['store']}" + (": config ok" if d.get("check") else ""))
    if "token" in d:
        typer.echo(f"  admin token  {d['token']}   (Authorization: Bearer <token> for /admin/keys/<name>/...)")
