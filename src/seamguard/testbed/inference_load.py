"""A load generator that drives a Router through vLLM's disaggregated flow, per request.

Why this exists: the routers (seamguard.gateway.routing) must be judged on real requests
against real instances (seamguard.testbed.inference_pool) with realistic mixes. Used by
benchmarks/inference_routing.py and tests/gateway/test_routing_pool.py, which run it inside a
testbed host with ``python -m seamguard.testbed.inference_load --spec SPEC.json --out OUT.json``.

Two ways to send: through a running gateway (``gateway`` in the spec: the `seamguard gateway`
server routes and runs the flow; the client sees what a user sees), or directly — the
gateway's routing loop without the HTTP front: for every arrival it asks the router
for a Route, POSTs the prompt to the prefill instance (``max_tokens: 1``, ``stream: false``,
``kv_transfer_params: {"do_remote_decode": true}``), POSTs the request plus the returned
``kv_transfer_params`` to the decode instance, streams the SSE tokens, and tells the router
``first_token`` and ``finished`` — the same calls and the same order as the gateway server.
Batch requests the router sheds (`Shed`) are retried after Retry-After until their TTFT budget
is spent (deferred), then counted as shed. Instance ``/metrics`` are polled into
``update_load`` (seamguard.gateway.routing_feeds), and timed shell commands (``events``, e.g.
a ``tc`` that degrades a link) run at their offsets, so a degradation lands at the same point
of the same arrival sequence for every router; each event's record carries the router's decision
counts just after it ran (the difference of two is what the router did in between).

The arrival sequence is a pure function of the spec and seed (`arrivals`): Poisson arrivals
plus periodic bursts; per class a share, log-normal prompt and output lengths (median and
sigma, clipped), a tenant and SLO targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass

from seamguard.gateway.routing import Instance, Outcome, Shed, make_router, place_kv
from seamguard.gateway.routing_feeds import feed_router


@dataclass(frozen=True)
class ClassMix:
    """One request class (and tenant) of the mix."""

    name: str  # "interactive" or "batch": the router's request class
    share: float
    prompt_median: int
    prompt_sigma: float
    prompt_max: int
    output_median: int
    output_sigma: float
    output_max: int
    ttft_slo_s: float
    tpot_slo_s: float
    tenant: str = ""


INTERACTIVE = ClassMix("interactive", 0.7, 192, 0.6, 1024, 48, 0.5, 160, ttft_slo_s=1.0, tpot_slo_s=0.1,
                       tenant="chat")
BATCH = ClassMix("batch", 0.3, 512, 0.5, 2048, 96, 0.4, 256, ttft_slo_s=10.0, tpot_slo_s=0.25, tenant="offline")


@dataclass(frozen=True)
class LoadSpec:
    rate_rps: float = 6.0
    duration_s: float = 60.0
    burst_every_s: float = 15.0  # 0: no bursts
    burst_size: int = 12
    burst_span_s: float = 1.0
    classes: tuple[ClassMix, ...] = (INTERACTIVE, BATCH)
    seed: int = 0


@dataclass(frozen=True)
class Arrival:
    t_s: float
    cls: str
    tenant: str
    prompt_tokens: int
    output_tokens: int


def arrivals(spec: LoadSpec) -> list[Arrival]:
    """The seeded arrival sequence: Poisson at rate_rps plus a burst every burst_every_s."""
    rng = random.Random(spec.seed)
    times: list[float] = []
    t = rng.expovariate(spec.rate_rps)
    while t < spec.duration_s:
        times.append(t)
        t += rng.expovariate(spec.rate_rps)
    if spec.burst_every_s > 0:
        b = spec.burst_every_s
        while b < spec.duration_s:
            times += [b + rng.uniform(0, spec.burst_span_s) for _ in range(spec.burst_size)]
            b += spec.burst_every_s
    total = sum(c.share for c in spec.classes)
    out = []
    for t in sorted(times):
        x, acc, cls = rng.uniform(0, total), 0.0, spec.classes[-1]
        for c in spec.classes:
            acc += c.share
            if x <= acc:
                cls = c
                break
        draw = lambda med, sig, hi: max(1, min(hi, int(round(med * math.exp(rng.gauss(0, sig))))))  # noqa: E731
        out.append(Arrival(round(t, 4), cls.name, cls.tenant, draw(cls.prompt_median, cls.prompt_sigma, cls.prompt_max),
                           draw(cls.output_median, cls.output_sigma, cls.output_max)))
    return out


@dataclass
class Record:
    t_s: float  # arrival, seconds after the run's start
    cls: str
    tenant: str
    prompt_tokens: int
    output_tokens: int
    ok: bool = False
    error: str = ""
    shed: bool = False
    deferred: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    dft_s: float | None = None
    prefill: str = ""
    decode: str = ""
    rail: int | None = None  # the rail the router placed the KV transfer on (None: the decode's own choice)
    reason: str = ""


async def _via_gateway(client, gw: dict, a: Arrival, budget_s: float, timeout_s: float) -> Record:
    """One request through the gateway (it routes and runs the disaggregated flow); a 503 with
    Retry-After is a deferral, retried while the TTFT budget lasts."""
    import httpx

    rec = Record(a.t_s, a.cls, a.tenant, a.prompt_tokens, a.output_tokens)
    t_arr = time.monotonic()
    body = {"model": "emulated", "messages": [{"role": "user", "content": "w " * a.prompt_tokens}],
            "max_tokens": a.output_tokens, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {gw['keys'][a.cls]}", "x-request-class": a.cls}
    first = last = None
    n = 0
    try:
        while True:
            async with client.stream("POST", gw["url"] + "/v1/chat/completions", json=body, headers=headers,
                                     timeout=timeout_s) as resp:
                if resp.status_code == 503 and "retry-after" in resp.headers:
                    wait = float(resp.headers["retry-after"])
                    text = (await resp.aread()).decode(errors="replace")
                    if time.monotonic() - t_arr + wait > budget_s:
                        rec.shed, rec.error, rec.reason = True, "shed", text[:200]
                        return rec
                    rec.deferred += 1
                    await asyncio.sleep(wait)
                    continue
                resp.raise_for_status()
                _route_from_header(rec, resp.headers.get("x-seamguard-route", ""))
                async for now in _content_times(resp):
                    first = first or now
                    last, n = now, n + 1
                break
        rec.ok = n > 0
        rec.error = "" if rec.ok else "no tokens"
    except (httpx.HTTPError, KeyError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:200]
    _token_timing(rec, t_arr, first, last, n)
    return rec


def _route_from_header(rec: Record, label: str) -> None:
    """prefill, decode and rail from the gateway's ``x-seamguard-route`` (``p0->d1/r0``, ``p0->d1``, ``d1``)."""
    m = re.fullmatch(r"(?:([^>]+)->)?([^/]+)(?:/r(\d+))?", label)
    if m:
        rec.prefill, rec.decode = m.group(1) or "", m.group(2)
        rec.rail = int(m.group(3)) if m.group(3) else None


async def _content_times(resp):
    """The arrival time (monotonic) of each content chunk of an OpenAI SSE stream; an error chunk raises."""
    async for line in resp.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise ValueError(str(chunk["error"].get("message"))[:150])
        if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", [])):
            yield time.monotonic()


def _token_timing(rec: Record, t_arr: float, first: float | None, last: float | None, n: int) -> None:
    """TTFT from the request's arrival, TPOT over the tokens after the first."""
    if first is not None:
        rec.ttft_s = first - t_arr
        rec.tpot_s = (last - first) / (n - 1) if n > 1 else 0.0


async def _wait_up(client, url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if (await client.get(url + "/healthz", timeout=1.0)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"gateway at {url} not up after {timeout_s}s")
        await asyncio.sleep(0.1)


async def _gateway_decisions(client, url: str, admin_token: str | None = None) -> dict:
    """The gateway router's decision counts by kind, and routes per path, from its /metrics
    (which needs the gateway's admin or metrics token)."""
    out: dict = {}
    auth = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    try:
        text = (await client.get(url + "/metrics", headers=auth, timeout=5.0)).text
    except Exception:  # noqa: BLE001 - figures without them still stand
        return out
    for line in text.splitlines():
        m = re.match(r'^seamguard_gateway_route_decisions(?:_total)?\{kind="([^"]+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = int(float(m.group(2)))
        m = re.match(r'^seamguard_gateway_routes_total\{(.*)\} (\S+)', line)
        if m:
            lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            k = f"routes {lab.get('prefill')}->{lab.get('decode')}" + (f"/r{lab['rail']}" if lab.get("rail") else "")
            out[k] = out.get(k, 0) + int(float(m.group(2)))
    return out


async def _one(client, router, a: Arrival, t_start: float, budget_s: float, timeout_s: float) -> Record:
    import httpx

    rec = Record(a.t_s, a.cls, a.tenant, a.prompt_tokens, a.output_tokens)
    t_arr = time.monotonic()
    while True:
        try:
            route = router.route(a.cls, a.prompt_tokens)  # type: ignore[arg-type]
            break
        except Shed as s:
            if time.monotonic() - t_arr + s.retry_after_s > budget_s:
                rec.shed, rec.error, rec.reason = True, "shed", s.reason
                return rec
            rec.deferred += 1
            await asyncio.sleep(s.retry_after_s)
    rec.prefill, rec.decode, rec.reason = route.prefill.name if route.prefill else "", route.decode.name, route.reason
    rec.rail = route.kv_rail
    body = {"model": "emulated", "messages": [{"role": "user", "content": "w " * a.prompt_tokens}],
            "max_tokens": a.output_tokens, "stream": True, "stream_options": {"include_usage": True}}
    dft = first = last = None
    n = 0
    try:
        if route.prefill is not None:
            r = await client.post(route.prefill.url + "/v1/chat/completions", timeout=timeout_s,
                                  json={**body, "max_tokens": 1, "stream": False, "stream_options": None,
                                        "kv_transfer_params": {"do_remote_decode": True}})
            r.raise_for_status()
            body["kv_transfer_params"] = place_kv(r.json()["kv_transfer_params"], route.kv_rail)
            prefilled = getattr(router, "prefilled", None)
            if prefilled is not None:
                prefilled(route)
        t_dec = time.monotonic()
        async with client.stream("POST", route.decode.url + "/v1/chat/completions", json=body,
                                 timeout=timeout_s) as resp:
            resp.raise_for_status()
            async for now in _content_times(resp):
                if first is None:
                    first, dft = now, now - t_dec
                    router.first_token(route, dft)
                last, n = now, n + 1
        rec.ok = n > 0
        rec.error = "" if rec.ok else "no tokens"
    except (httpx.HTTPError, KeyError, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:200]
    _token_timing(rec, t_arr, first, last, n)
    rec.dft_s = dft
    router.finished(route, Outcome(ok=rec.ok, ttft_s=rec.ttft_s, tpot_s=rec.tpot_s, decode_first_token_s=dft,
                                   output_tokens=n))
    return rec


async def _event(at_s: float, argv: list[str], t_start: float, applied: list, decisions) -> None:
    """Run one timed command; its record carries the router's decision counts (the gateway's,
    or the local router's) just after it ran, so a caller can count decisions between events."""
    await asyncio.sleep(max(0.0, t_start + at_s - time.monotonic()))
    p = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                             stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(p.communicate(), 10.0)
    applied.append({"at_s": round(time.monotonic() - t_start, 3), "planned_s": at_s, "argv": argv,
                    "rc": p.returncode, "stderr": err.decode(errors="replace")[-300:],
                    "decisions": await decisions()})


async def run_load(instances: list[Instance], router_name: str, router_options: dict, load: LoadSpec,
                   events: list[dict], timeout_s: float = 30.0, metrics_poll_s: float = 0.5,
                   gateway: dict | None = None) -> dict:
    """Drive one router through the arrival sequence; records and the router's decision counts.
    With ``gateway`` ({"url", "keys": {class: api key}}) the requests go through that gateway,
    which runs its own router (configured with the same name); the local router is then unused."""
    import httpx

    budgets = {c.name: c.ttft_slo_s for c in load.classes}
    tpot = {c.name: c.tpot_slo_s for c in load.classes}
    router = make_router(router_name, instances, **{"ttft_budget_s": budgets, "tpot_budget_s": tpot,
                                                    **router_options})
    seq = arrivals(load)
    applied: list[dict] = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200)) as client:
        if gateway:
            await _wait_up(client, gateway["url"], 30.0)
        t_start = time.monotonic()
        stop = asyncio.Event()
        poller = asyncio.ensure_future(feed_router(router, client, [] if gateway else instances, None,
                                                   metrics_poll_s, stop))

        async def decisions_now() -> dict:
            if gateway:
                return await _gateway_decisions(client, gateway["url"], gateway.get("admin_token"))
            return dict(getattr(router, "decisions", {}))

        evs = [asyncio.ensure_future(_event(e["at_s"], e["argv"], t_start, applied, decisions_now))
               for e in events]

        async def at(a: Arrival) -> Record:
            await asyncio.sleep(max(0.0, t_start + a.t_s - time.monotonic()))
            if gateway:
                return await _via_gateway(client, gateway, a, budgets.get(a.cls, 10.0), timeout_s)
            return await _one(client, router, a, t_start, budgets.get(a.cls, 10.0), timeout_s)

        records = await asyncio.gather(*(at(a) for a in seq))
        for e in evs:
            await e
        stop.set()
        await poller
        decisions = dict(getattr(router, "decisions", {}))
        if gateway:
            decisions = await _gateway_decisions(client, gateway["url"], gateway.get("admin_token"))
        wall = time.monotonic() - t_start
    return {"router": router_name, "wall_s": round(wall, 3), "events": applied,
            "decisions": decisions, "records": [asdict(r) for r in records]}


def load_spec(d: dict) -> LoadSpec:
    classes = tuple(ClassMix(**c) for c in d.get("classes", [])) or LoadSpec().classes
    return LoadSpec(**{**{k: v for k, v in d.items() if k != "classes"}, "classes": classes})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m seamguard.testbed.inference_load",
                                description="Drive one router through a request mix; write records as JSON.")
    p.add_argument("--spec", required=True, help="JSON: instances, router, router_options, load, events")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    with open(a.spec) as f:
        spec = json.load(f)
    instances = [Instance(**i) for i in spec["instances"]]
    res = asyncio.run(run_load(instances, spec["router"], spec.get("router_options", {}),
                               load_spec(spec.get("load", {})), spec.get("events", []),
                               spec.get("timeout_s", 30.0), gateway=spec.get("gateway")))
    with open(a.out, "w") as f:
        json.dump(res, f)


def spec_dict(instances: list[Instance], router: str, load: LoadSpec, events: list[dict] | None = None,
              router_options: dict | None = None, timeout_s: float = 30.0, gateway: dict | None = None) -> dict:
    """The --spec document for main()."""
    return {"instances": [asdict(i) for i in instances], "router": router, "router_options": router_options or {},
            "load": asdict(load), "events": events or [], "timeout_s": timeout_s, "gateway": gateway}


if __name__ == "__main__":
    main()

