"""The I/O edge of routing: what the gateway reads to feed a Router's inputs.

The routers in seamguard.gateway.routing are pure; this module fetches their inputs:

- `fetch_fabric_states`: the control plane's NIC and link states, from seamguard's HTTP API
  (``GET /api/v1/entities?kind=nic|link&state=...``, paged; see seamguard.app.service.api),
  as ``{name: state}`` for every entity that is not healthy -> ``router.update_fabric``.
- `fetch_load`: an instance's ``/metrics`` (vLLM names) -> ``router.update_load``.
- `feed_router`: both on an interval until stopped; failures leave the last inputs in place
  (the router ignores load older than its ``load_stale_s``).

Every call takes an explicit timeout; an httpx.AsyncClient is passed in (the gateway's own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import httpx

from seamguard.gateway.routing import FABRIC_SEVERITY, Instance, parse_vllm_metrics

API = "/api/v1"
NOT_HEALTHY = tuple(s for s in FABRIC_SEVERITY if s != "healthy")


async def fetch_fabric_states(client: httpx.AsyncClient, controller_url: str, timeout_s: float = 2.0,
                              kinds: Iterable[str] = ("nic", "link"), page: int = 1000,
                              max_pages: int = 100) -> dict[str, str]:
    """Name -> state of every NIC and link the controller holds not healthy."""
    out: dict[str, str] = {}
    base = controller_url.rstrip("/")
    for kind in kinds:
        offset = 0
        for _ in range(max_pages):
            params = [("kind", kind), *[("state", s) for s in NOT_HEALTHY], ("limit", str(page)),
                      ("offset", str(offset))]
            r = await client.get(f"{base}{API}/entities", params=params, timeout=timeout_s)
            r.raise_for_status()
            doc = r.json()
            items = doc.get("items") or []
            for it in items:
                out[str(it["name"])] = str(it["state"])
            offset += len(items)
            if not items or offset >= int(doc.get("total", 0)):
                break
    return out


async def fetch_load(client: httpx.AsyncClient, instance: Instance, timeout_s: float = 1.0) -> dict[str, float]:
    """``waiting`` / ``kv_usage`` from the instance's /metrics ({} when it exports neither)."""
    r = await client.get(instance.url.rstrip("/") + "/metrics", timeout=timeout_s)
    r.raise_for_status()
    return parse_vllm_metrics(r.text)


async def feed_router(router: object, client: httpx.AsyncClient, instances: list[Instance],
                      controller_url: str | None, every_s: float = 1.0, stop: asyncio.Event | None = None) -> None:
    """Poll load (and fabric states when a controller URL is given) into the router until `stop`."""
    stop = stop or asyncio.Event()
    while not stop.is_set():
        if controller_url and hasattr(router, "update_fabric"):
            try:
                router.update_fabric(await fetch_fabric_states(client, controller_url, timeout_s=every_s))
            except (httpx.HTTPError, ValueError, KeyError):
                pass  # keep the last states; the controller being away is not a fabric fault
        if hasattr(router, "update_load"):
            for inst in instances:
                try:
                    router.update_load(inst.name, **await fetch_load(client, inst, timeout_s=every_s))
                except (httpx.HTTPError, ValueError):
                    pass
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass
