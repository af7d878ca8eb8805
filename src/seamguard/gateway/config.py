"""The gateway's config file (`seamguard gateway --config gateway.yaml`), validated whole.

Everything the gateway reads from a file is modelled here: backends (instances and the
router that chooses among them), the budget store, tenants and their keys, admission and
zombie-key thresholds. `load_gateway_config` reads the file (the CLI calls it before any
port is bound); a problem is one line naming the file and the field. Routers are found by
name in seamguard.gateway.routing.ROUTERS (round_robin, least_outstanding, seamguard); another
module adds its own with `register_router`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from seamguard.config import MAX_CONFIG_BYTES, field_path, parse_yaml
from seamguard.gateway.admission import Limits, Priority
from seamguard.gateway.routing import ROUTERS, Instance, Router, make_router
from seamguard.gateway.zombie import ZombieThresholds
from seamguard.http_access import HostRule

RouterFactory = Callable[..., Router]  # (instances, clock=..., **router_options) -> Router


def register_router(name: str, factory: RouterFactory) -> None:
    """Make ``router: <name>`` in a gateway config build ``factory(instances, clock=<monotonic>,
    **router_options)`` (the routing module's ROUTERS, where the built-in routers are)."""
    ROUTERS[name] = factory


class GatewayConfigError(ValueError):
    """A gateway config that cannot be used; the message is one line naming the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InstanceConfig(_Strict):
    name: str = Field(min_length=1)
    url: str = Field(pattern=r"^https?://", description="base URL of its OpenAI-compatible API (no /v1)")
    role: Literal["prefill", "decode", "unified"] = "unified"
    nic: str | None = Field(None, description="the NIC/link id seamguard's control plane knows it by")
    rails: list[str] = Field(default_factory=list,
                             description="the NICs it moves KV over, one per rail, in the order of the prefill's "
                                         "remote_hosts (control-plane names); on every prefill and decode "
                                         "instance, the seamguard router places each KV transfer on a rail")
    home_rail: int = Field(0, ge=0, description="decode: the rail it pulls KV over unless the router moves it")

    def instance(self) -> Instance:
        return Instance(self.name, self.url.rstrip("/"), self.role, self.nic, tuple(self.rails), self.home_rail)


class TimeoutsConfig(_Strict):
    connect_s: float = Field(2.0, gt=0, description="TCP connect to a backend")
    read_s: float = Field(120.0, gt=0, description="longest wait for the next bytes (the first ones include prefill)")
    total_s: float = Field(900.0, gt=0, description="one request end to end")
    first_token_s: float = Field(120.0, gt=0, description="a stream's first token (prefill and queueing included); "
                                                          "keep-alive comments do not count as one")
    between_tokens_s: float = Field(30.0, gt=0, description="longest silence between a stream's tokens; keep-alive "
                                                            "comments and empty chunks do not break it")


class SqliteStoreConfig(_Strict):
    type: Literal["sqlite"]
    path: Path = Field(Path("gateway.db"), description="budgets, key states and the gateway ledger (WAL)")


class RedisStoreConfig(_Strict):
    type: Literal["redis"]
    url: str = Field(pattern=r"^(redis|rediss|unix)://", description="shared by every replica")
    prefix: str = Field("seamguard:gw:", description="key prefix in Redis")
    ledger: Path = Field(Path("gateway-ledger.db"), description="this replica's own ledger file (SQLite)")


StoreConfig = Annotated[SqliteStoreConfig | RedisStoreConfig, Field(discriminator="type")]


class BudgetConfig(_Strict):
    tpm: int | None = Field(None, ge=1, description="tokens per minute (prompt + completion); none: unlimited")
    tpd: int | None = Field(None, ge=1, description="tokens per UTC day; none: unlimited")
    concurrency: int | None = Field(None, ge=1, description="requests in flight; none: unlimited")

    def limits(self) -> Limits:
        return Limits(tpm=self.tpm, tpd=self.tpd, concurrency=self.concurrency)


class KeyConfig(BudgetConfig):
    name: str = Field(min_length=1, description="how the key appears in /admin, /metrics and the ledger")
    key: str | None = Field(None, min_length=8, description="the secret itself (tests, demos)")
    key_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the secret")
    priority: Priority = "normal"

    @model_validator(mode="after")
    def _one_secret(self) -> KeyConfig:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of key or key_sha256")
        return self

    def digest(self) -> str:
        return self.key_sha256 or hashlib.sha256(self.key.encode()).hexdigest()  # type: ignore[union-attr]


class TenantConfig(BudgetConfig):
    name: str = Field(min_length=1)
    keys: list[KeyConfig] = Field(min_length=1)


class HedgeConfig(_Strict):
    share: float = Field(0.1, ge=0, le=1, description="at most about this share of requests is sent twice "
                                                      "(0: never); a hedge needs a router with stall_after_s")
    burst: float = Field(10.0, ge=1, description="hedges allowed at once before the share applies")


class AdmissionConfig(_Strict):
    default_max_tokens: int = Field(512, ge=1, description="output tokens reserved when a request sets none")
    chars_per_token: float = Field(4.0, gt=0, description="prompt estimate: characters per token")
    prompt_template_tokens: int = Field(256, ge=0, description="what a chat template may add to a prompt once "
                                                               "(BOS, default system prompt, tools preamble): part "
                                                               "of the bound a backend's prompt count is believed to")
    shed_low_at: float = Field(0.80, gt=0, le=1, description="low priority refused above this share of tenant TPM")
    shed_normal_at: float = Field(0.95, gt=0, le=1, description="normal priority refused above this share")
    inflight_ttl_s: float = Field(900.0, gt=0, description="a replica's in-flight slot expires after this")


class NamedTokenConfig(_Strict):
    """A bearer token for the admin API or /metrics; its name is who the ledger says acted."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$",
                      description="recorded as `by` in the ledger for what this token does")
    token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                  description="the environment variable holding the token (read by the CLI)")
    token_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the token")

    @model_validator(mode="after")
    def _one_source(self) -> NamedTokenConfig:
        if (self.token_env is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token_env or token_sha256")
        return self


class HttpConfig(_Strict):
    """The gateway's own port: how big a body it reads, which Host names it answers, how it stops."""

    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, le=1024 ** 3,
                                description="a request body over this is refused (413), by Content-Length before "
                                            "it is read, and by counting while it is read")
    allowed_hosts: list[str] = Field(default_factory=list,
                                     description="Host names answered besides localhost, 127.0.0.1, ::1 and the bind "
                                                 "address (DNS rebinding); '*.example.com' a suffix, '*' any")
    drain_s: float = Field(20.0, ge=0, le=3600, description="on SIGTERM, requests in flight get this long to "
                                                            "finish before they are cut")

    @field_validator("allowed_hosts")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for p in v:
            if (why := HostRule.pattern_problem(p)) is not None:
                raise ValueError(why)
        return v


class GatewayConfig(_Strict):
    version: Literal[1]
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    instances: list[InstanceConfig] = Field(min_length=1)
    router: str = Field("round_robin", description="round_robin | least_outstanding | seamguard (routing.ROUTERS)")
    router_options: dict[str, Any] = Field(default_factory=dict, description="the router's own settings")
    controller_url: str | None = Field(None, pattern=r"^https?://",
                                       description="seamguard's HTTP API: NIC/link states for the router")
    feed_every_s: float = Field(1.0, gt=0, description="how often instance /metrics and fabric states are read")
    models: list[str] = Field(default_factory=list, description="served by /v1/models; empty: ask a backend")
    timeouts: TimeoutsConfig = TimeoutsConfig()
    hedge: HedgeConfig = HedgeConfig()
    store: StoreConfig = SqliteStoreConfig(type="sqlite")
    admission: AdmissionConfig = AdmissionConfig()
    zombie: ZombieThresholds = ZombieThresholds()
    tenants: list[TenantConfig] = Field(min_length=1)
    http: HttpConfig = HttpConfig()
    admin_tokens: list[NamedTokenConfig] = Field(default_factory=list,
                                                 description="named admin tokens (besides the CLI's --token, named "
                                                             "'operator')")
    metrics_tokens: list[NamedTokenConfig] = Field(default_factory=list,
                                                   description="tokens that may read /metrics only (an admin token "
                                                               "may too)")

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        if self.router not in ROUTERS:
            raise ValueError(f"router {self.router!r} is not one of {sorted(ROUTERS)}")
        for what, names in (("instance", [i.name for i in self.instances]),
                            ("tenant", [t.name for t in self.tenants]),
                            ("key name", [k.name for t in self.tenants for k in t.keys]),
                            ("key secret", [k.digest() for t in self.tenants for k in t.keys]),
                            ("token name", [t.name for t in (*self.admin_tokens, *self.metrics_tokens)])):
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"duplicate {what}: {sorted(dup)[0] if what != 'key secret' else '(hidden)'}")
        return self

    def instance_list(self) -> list[Instance]:
        return [i.instance() for i in self.instances]


def build_router(cfg: GatewayConfig) -> Router:
    return make_router(cfg.router, cfg.instance_list(), **cfg.router_options)


def _one_line(source: str, err: ValidationError) -> str:
    e = err.errors()[0]
    where = field_path(e["loc"]) or "(top level)"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{source}: {where}: {e['msg']}{more}"


def parse_gateway_config(data: Any, source: str) -> GatewayConfig:
    if not isinstance(data, dict):
        raise GatewayConfigError(f"{source}: expected a mapping at the top level")
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as err:
        raise GatewayConfigError(_one_line(source, err)) from None
    try:
        build_router(cfg)  # a router that refuses these instances is a config error, found before binding
    except (ValueError, TypeError) as e:
        raise GatewayConfigError(f"{source}: router: {e}") from None
    return cfg


def load_gateway_config(path: str | Path) -> GatewayConfig:
    """Read, parse and validate; relative store paths are relative to the file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise GatewayConfigError(f"{p}: cannot read the gateway config: {e.strerror or e}") from None
    cfg = parse_gateway_config(parse_yaml(raw, str(p), "gateway config", GatewayConfigError), str(p))
    st = cfg.store
    if isinstance(st, SqliteStoreConfig) and not st.path.is_absolute():
        st = st.model_copy(update={"path": p.parent / st.path})
    elif isinstance(st, RedisStoreConfig) and not st.ledger.is_absolute():
        st = st.model_copy(update={"ledger": p.parent / st.ledger})
    return cfg.model_copy(update={"store": st})
