"""`seamguard gateway --config gateway.yaml`: the OpenAI-compatible gateway, started from its config.

The edge: the config file and the tokens (flags, environment, the variables the config names)
are read here, the whole config is validated and the store opened before any port is bound,
and each problem is one ``error: ...`` line (exit 2). No token, key or store password is ever
printed: the banner names the tokens, never their secrets. SIGTERM (or Ctrl-C) stops it
gracefully: no new connections, requests in flight get ``http.drain_s`` to finish and are
then cut, and the process exits 0. The gateway itself is seamguard.gateway.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import typer

from seamguard.clikit import (
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
    token: str | None = typer.Option(None, "--token", envvar="SEAMGUARD_GATEWAY_TOKEN", show_envvar=True,
                                     help="Admin token, named 'operator' (prefer the environment variable; "
                                          "without any admin token /admin, /dashboard and /metrics are off)."),
    metrics_token: str | None = typer.Option(None, "--metrics-token", envvar="SEAMGUARD_GATEWAY_METRICS_TOKEN",
                                             show_envvar=True,
                                             help="Token that may read /metrics only, named 'metrics'."),
    check: bool = typer.Option(False, "--check", help="Validate the config and the store, then exit."),
    output: Output = OUTPUT_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Serve the OpenAI-compatible gateway: token budgets, zombie keys, routing to the backends."""
    try:
        import uvicorn  # noqa: F401  (the gateway extra)

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
    # the address bound is one of the Host names the gateway answers (surface.HostRule)
    cfg = cfg.model_copy(update={"host": host or cfg.host, "port": cfg.port if port is None else port})
    admins, scrapers = _tokens(config, cfg, token, metrics_token)
    if isinstance(cfg.store, RedisStoreConfig):
        _ping_redis(config, cfg.store.url, cfg.timeouts.connect_s)
    try:
        gw = build_gateway(cfg)
    except (StoreError, OSError) as e:
        fail(f"{config}: store: {_without_secrets(str(e), cfg)}")
    info = {"config": str(config), "listen": f"http://{cfg.host}:{cfg.port}", "router": cfg.router,
            "instances": len(cfg.instances), "store": cfg.store.type,
            "keys": sum(len(t.keys) for t in cfg.tenants),
            "admin_tokens": [n for n, _ in admins.named], "metrics_tokens": [n for n, _ in scrapers.named],
            "drain_s": cfg.http.drain_s}
    if check:
        emit({**info, "check": "ok"}, wants_json(output, json_flag), _banner)
        return
    _bindable(config, cfg.host, cfg.port)
    emit(info, wants_json(output, json_flag), _banner)
    sys.stdout.flush()
    _serve(create_app(gw, admins, scrapers), cfg.host, cfg.port, cfg.http.drain_s)


def _tokens(config: Path, cfg: Any, token: str | None, metrics_token: str | None) -> tuple[Any, Any]:
    """(admin tokens, metrics-only tokens) as `Bearers`: the flags' (named operator and metrics)
    and the config's, whose ``token_env`` variables are read here."""
    from seamguard.gateway.surface import Bearers

    def named(field: str, entries: list, flag_name: str, flag: str | None) -> tuple[dict, dict]:
        plain = {flag_name: flag} if flag else {}
        digests = {}
        for i, t in enumerate(entries):
            if t.name in plain:
                fail(f"{config}: {field}[{i}].name: {t.name!r} is the name of the --token/--metrics-token one")
            if t.token_sha256 is not None:
                digests[t.name] = t.token_sha256
                continue
            value = os.environ.get(t.token_env or "", "")
            if not value.strip():
                fail(f"{config}: {field}[{i}].token_env: the environment variable {t.token_env} is not set")
            plain[t.name] = value
        return plain, digests

    admins = Bearers.of(*named("admin_tokens", cfg.admin_tokens, "operator", token))
    scrapers = Bearers.of(*named("metrics_tokens", cfg.metrics_tokens, "metrics", metrics_token))
    digests = [d for _, d in (*admins.named, *scrapers.named)]
    if len(set(digests)) < len(digests):
        fail(f"{config}: admin_tokens/metrics_tokens: two tokens are the same secret (each must be its own)")
    if {n for n, _ in admins.named} & {n for n, _ in scrapers.named}:
        fail(f"{config}: metrics_tokens: a name is also an admin token's")
    return admins, scrapers


def _serve(app: Any, host: str, port: int, drain_s: float) -> None:
    """uvicorn, with a stop that ends the process with status 0 (uvicorn's own server raises the
    signal again once it has shut down, so the process would die of its SIGTERM)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            before = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=drain_s))
    server.run()
    if not server.started:
        fail(f"the gateway did not start on {host}:{port} (see the lines above)", code=1)


def redacted(url: str) -> str:
    """``url`` without the password in it (redis://user:secret@host -> redis://user:***@host)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an unparseable URL)"
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _without_secrets(text: str, cfg: Any) -> str:
    url = getattr(cfg.store, "url", None)
    return text.replace(url, redacted(url)) if url else text


def _ping_redis(config: Path, url: str, timeout_s: float) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s).ping()
    except (redis.RedisError, ValueError) as e:
        fail(f"{config}: store.url: cannot reach Redis at {redacted(url)}: "
             f"{' '.join(str(e).split()).replace(url, redacted(url))}")


def _bindable(config: Path, host: str, port: int) -> None:
    """A taken port is one `error:` line before the banner (uvicorn said it after)."""
    import socket

    try:
        with socket.create_server((host, port), reuse_port=False):
            pass
    except OSError as e:
        fail(f"{config}: host/port: cannot listen on {host}:{port}: {e.strerror or e}")


def _banner(d: dict[str, Any]) -> None:
    typer.echo(f"seamguard gateway: {d['listen']}, router {d['router']} over {d['instances']} instance(s), "
               f"{d['keys']} key(s), store {d['store']}" + (": config ok" if d.get("check") else ""))
    if d["admin_tokens"]:
        typer.echo(f"  admin tokens    {', '.join(d['admin_tokens'])}   (Authorization: Bearer <token>: /admin, "
                   "/dashboard, /metrics)")
    else:
        typer.echo("  admin API       off: no admin token (SEAMGUARD_GATEWAY_TOKEN or admin_tokens in the config)")
    if d["metrics_tokens"]:
        typer.echo(f"  metrics tokens  {', '.join(d['metrics_tokens'])}   (/metrics only)")
