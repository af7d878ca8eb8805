"""The gateway's HTTP surface: OpenAI-compatible endpoints, /metrics, /healthz, /dashboard and /admin.

`create_app` wires a `Gateway` (config, store, ledger, router, backends, metrics) into a
FastAPI app. A completion request goes: key -> body check -> admission (the gatekeeper
reserves its estimate) -> route (the router) -> prefill (disaggregated only) -> decode,
streamed back as SSE or as one JSON answer -> usage reconciled, router told the outcome.
Every error body is OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
In front of every route, `SurfaceGuard` (surface.py) checks ``Host`` and caps the body. /admin
and /dashboard need an admin token, /metrics an admin or a metrics token (named tokens,
compared in constant time; the name is the ledger's ``by``); /healthz is open.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import sqlite3
import time
from collections import Counter as Tally
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from seamguard.gateway.admission import Charge, capped_body, charge
from seamguard.gateway.body import parse, wrong_field
from seamguard.gateway.config import GatewayConfig, SqliteStoreConfig, build_router
from seamguard.gateway.dashboard import plain, render_dashboard
from seamguard.gateway.gatekeeper import Gatekeeper, KeyInfo, Refusal, Ticket
from seamguard.gateway.hedge import HedgeBudget, is_token, outputs_in, read_to_first_content, replay
from seamguard.gateway.ledger import GatewayLedger
from seamguard.gateway.metrics import GatewayMetrics
from seamguard.gateway.proxy import Backends, UpstreamError
from seamguard.gateway.relay import ClientGone, OutputCap, bounded, client_gone, cut_events, until_gone
from seamguard.gateway.routing import Outcome, Route, Router, Shed, place_kv, route_label
from seamguard.gateway.routing_feeds import feed_router
from seamguard.gateway.store import RedisStore, SqliteStore, Store, StoreError
from seamguard.gateway.surface import BodyTooLarge, Bearers, InFlight, SurfaceGuard, gateway_hosts

ROUTE_HEADER = "x-seamguard-route"  # the path that served a request (routing.route_label)
CLIENT_GONE = 499  # the status recorded for a request whose client left (nginx's convention; never sent)
log = logging.getLogger("seamguard.gateway")


@dataclass
class Gateway:
    """Everything one replica holds; built by the CLI (or a test) and closed by `close`."""

    cfg: GatewayConfig
    store: Store
    ledger: GatewayLedger
    router: Router
    gatekeeper: Gatekeeper
    backends: Backends
    metrics: GatewayMetrics
    hedges: HedgeBudget
    outstanding: Tally = field(default_factory=Tally)  # instance name -> requests in flight (routers may read it)

    async def close(self) -> None:
        await self.backends.close()
        await self.store.close()
        self.ledger.close()


def error(status: int, message: str, type_: str, code: str | None = None, param: str | None = None,
          retry_after_s: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


def _bearer(request: Request) -> str | None:
    h = request.headers.get("authorization", "")
    return h[7:].strip() if h[:7].lower() == "bearer " else None


def _check_body(raw: bytes, endpoint: str) -> dict[str, Any] | JSONResponse:
    body = parse(raw)
    if isinstance(body, str):
        return error(400, body, "invalid_request_error", "invalid_json")
    if not isinstance(body, dict):
        return error(400, "the request body must be a JSON object", "invalid_request_error", "invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return error(400, "'model' is required (a string)", "invalid_request_error", "missing_required_parameter",
                     "model")
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
            return error(400, "'messages' must be a non-empty list of {role, content} objects",
                         "invalid_request_error", "invalid_value", "messages")
    elif not isinstance(body.get("prompt"), str | list):
        return error(400, "'prompt' is required (a string or a list)", "invalid_request_error",
                     "missing_required_parameter", "prompt")
    for f in ("max_tokens", "max_completion_tokens"):
        v = body.get(f)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            return error(400, f"'{f}' must be a positive integer", "invalid_request_error", "invalid_value", f)
    if not isinstance(body.get("stream", False), bool):
        return error(400, "'stream' must be a boolean", "invalid_request_error", "invalid_value", "stream")
    if body.get("n", 1) not in (1, None):
        return error(400, "only n=1 is supported by this gateway", "invalid_request_error", "invalid_value", "n")
    wrong = wrong_field(body, endpoint)
    if wrong is not None:
        return error(400, wrong[1], "invalid_request_error", "invalid_type", wrong[0])
    return body


@dataclass
class _Flight:
    """One admitted request on its way along one route (a hedge is a second flight of the same
    request): timings and usage as they arrive. The flight that owns the ticket reconciles it."""

    gw: Gateway
    ticket: Ticket
    route: Route
    t_recv: float
    owns_ticket: bool = True
    resp: httpx.Response | None = None  # its decode stream, once open
    sent: asyncio.Event = field(default_factory=asyncio.Event)  # its decode request has gone out
    t_decode_sent: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    chunks: int = 0  # output relayed (one per choice per chunk with output)
    usage: Any = None  # the backend's usage as it sent it (validated by admission.charge); None: none yet
    gone: asyncio.Future | None = None  # completes when the client disconnects
    charged: Charge | None = None  # set when the charge is not the usage's (a client gone before its answer)
    gateway_fault: bool = False  # failed by the gateway or its backend (502, 504): nothing counts against the key
    done: bool = False

    def charge(self) -> Charge:
        return self.charged or charge(self.ticket.reserved, self.usage, self.chunks)

    def first_token(self) -> None:
        """Tell the router as soon as the decode instance's first token is here (a stalled KV
        transfer shows before the request ends)."""
        hook = getattr(self.gw.router, "first_token", None)
        if hook is not None and self.t_first is not None:
            hook(self.route, self.t_first - self.t_decode_sent)

    def start(self) -> None:
        for inst in filter(None, (self.route.prefill, self.route.decode)):
            self.gw.outstanding[inst.name] += 1
            self.gw.metrics.outstanding.labels(inst.name).set(self.gw.outstanding[inst.name])
        started = getattr(self.gw.router, "started", None)
        if started is not None:
            started(self.route)
        departed = "1" if self.route.reason else "0"
        rail = "" if self.route.kv_rail is None else str(self.route.kv_rail)
        self.gw.metrics.routes.labels(self.route.prefill.name if self.route.prefill else "",
                                      self.route.decode.name, rail, departed).inc()

    async def end(self, ok: bool, cancelled: bool = False) -> None:
        """Reconcile once: router and instance counts, metrics, and the ticket if this flight owns
        it; ``cancelled``: dropped for a hedge that answered first (no evidence for the router)."""
        if self.done:
            return
        self.done = True
        gw, r = self.gw, self.route
        for inst in filter(None, (r.prefill, r.decode)):
            gw.outstanding[inst.name] -= 1
            gw.metrics.outstanding.labels(inst.name).set(gw.outstanding[inst.name])
        c = self.charge()
        if c.problem and self.owns_ticket:
            gw.metrics.upstream_errors.labels(r.decode.name, "bad_usage").inc()
            log.warning("backend %s: %s; key %s charged %d prompt + %d completion tokens", r.decode.name,
                        c.problem, self.ticket.key.name, c.prompt, c.completion)
        completion = c.completion
        ttft = tpot = dft = None
        if self.t_first is not None:
            ttft = self.t_first - self.t_recv
            dft = self.t_first - self.t_decode_sent
            gw.metrics.ttft.labels(r.decode.name).observe(ttft)
            gw.metrics.decode_first.labels(r.prefill.name if r.prefill else "", r.decode.name).observe(dft)
            if self.t_last is not None and completion > 1:
                tpot = (self.t_last - self.t_first) / (completion - 1)
                gw.metrics.tpot.labels(r.decode.name).observe(tpot)
        try:
            gw.router.finished(r, Outcome(ok, ttft, tpot, dft, completion, cancelled=cancelled))
        finally:
            if self.owns_ticket:
                await gw.gatekeeper.settle(self.ticket, ok, c, gateway_fault=self.gateway_fault)

    async def drop(self, task: asyncio.Task | None, cancelled: bool) -> None:
        """Stop this flight (the other copy of its request answered first): its read, its stream."""
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with anyio.CancelScope(shield=True):
            if self.resp is not None:
                await self.resp.aclose()
            await self.end(False, cancelled=cancelled)


async def _admitted(gw: Gateway, request: Request, endpoint: str) -> tuple[KeyInfo, dict, Ticket] | Response:
    """Key, body, admission: the request's reservation, or the error response that refuses it."""
    key = gw.gatekeeper.authenticate(_bearer(request))
    if key is None:
        gw.metrics.requests.labels(endpoint, "401").inc()
        return error(401, "Incorrect or missing API key", "invalid_request_error", "invalid_api_key")
    raw = await request.body()
    if len(raw) > gw.cfg.http.max_body_bytes:   # SurfaceGuard stops it reading on: this is a second line
        gw.metrics.requests.labels(endpoint, "413").inc()
        return error(413, f"request body over {gw.cfg.http.max_body_bytes} bytes", "invalid_request_error",
                     "body_too_large")
    body = _check_body(raw, endpoint)
    if isinstance(body, JSONResponse):
        gw.metrics.requests.labels(endpoint, "400").inc()
        return body
    source = f"{request.client.host if request.client else '-'}|{request.headers.get('user-agent', '')[:80]}"
    try:
        return key, body, await gw.gatekeeper.admit(key, body, raw, source)
    except Refusal as r:
        gw.metrics.requests.labels(endpoint, str(r.status)).inc()
        return error(r.status, r.message, r.type, r.code, retry_after_s=r.retry_after_s)
    except (StoreError, sqlite3.Error) as e:  # fail closed: a budget that cannot be checked is not spent
        gw.metrics.store_errors.labels("admit").inc()
        gw.metrics.requests.labels(endpoint, "503").inc()
        return error(503, f"budget store unavailable: {e}", "server_error", "store_unavailable", retry_after_s=1)


async def _complete(gw: Gateway, request: Request, endpoint: str, path: str) -> Response:
    t_recv = time.perf_counter()
    got = await _admitted(gw, request, endpoint)
    if isinstance(got, Response):
        return got
    key, body, ticket = got
    body = capped_body(body, ticket.reserved)  # the backend cannot generate more than was reserved
    gone = asyncio.ensure_future(client_gone(request.receive))
    streamed = False
    try:
        resp = await _answer(gw, request, endpoint, path, key, body, ticket, gone, t_recv)
        streamed = isinstance(resp, StreamingResponse)
        return resp
    finally:
        if not streamed:  # a stream's relay watches for the client until the stream ends
            gone.cancel()


async def _answer(gw: Gateway, request: Request, endpoint: str, path: str, key: KeyInfo, body: dict,
                  ticket: Ticket, gone: asyncio.Future, t_recv: float) -> Response:
    """Route an admitted request, send it and answer: a whole JSON answer or the stream's relay.
    A client that leaves first cancels the backend request (``gone``)."""
    klass = request.headers.get("x-request-class")
    klass = klass if klass in ("interactive", "batch") else ("batch" if key.priority == "low" else "interactive")
    try:
        route = gw.router.route(klass, ticket.prompt_estimate)  # type: ignore[arg-type]
    except Shed as e:  # deferred by the router (batch work while interactive paths are short)
        await gw.gatekeeper.release(ticket)
        gw.metrics.requests.labels(endpoint, "503").inc()
        gw.metrics.shed.labels(klass).inc()
        return error(503, f"deferred by the router: {e.reason}", "server_error", "shed",
                     retry_after_s=max(1, math.ceil(e.retry_after_s)))
    except Exception as e:  # a router bug must not leak the reservation
        await gw.gatekeeper.finish(ticket, False, None, 0, gateway_fault=True)
        gw.metrics.requests.labels(endpoint, "503").inc()
        return error(503, f"no route: {e}", "server_error", "no_route")
    flight = _Flight(gw, ticket, route, t_recv, gone=gone)
    flight.start()
    gw.hedges.on_request()
    stream = bool(body.get("stream"))
    try:
        if stream:
            flight, lines = await _first_of(flight, klass, path, body)
        else:
            out = await _send(flight, path, body, False)
    except ClientGone:
        if not stream:  # how far the backend got before the cancel is unknown: the reservation is charged
            flight.charged = charge(ticket.reserved, None, ticket.reserved.output_tokens)
        await flight.end(False)
        gw.metrics.requests.labels(endpoint, str(CLIENT_GONE)).inc()
        return Response(status_code=CLIENT_GONE)
    except (UpstreamError, TimeoutError) as e:
        up = e if isinstance(e, UpstreamError) else UpstreamError(504, "backend took longer than total_s", "timeout")
        gw.metrics.upstream_errors.labels(route.decode.name, up.kind).inc()
        flight.gateway_fault = up.status >= 500  # a backend's 4xx is the request's own fault
        await flight.end(False)
        gw.metrics.requests.labels(endpoint, str(up.status)).inc()
        if up.body is not None:
            return JSONResponse(up.body, status_code=up.status)
        return error(up.status, up.message, "server_error", "upstream_" + up.kind)
    except BaseException:
        await flight.end(False)
        raise
    if not stream:
        return await _whole(flight, out, endpoint)
    want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    return StreamingResponse(_relay(flight, lines, want_usage, endpoint), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                      ROUTE_HEADER: route_label(flight.route)})


async def _send(flight: _Flight, path: str, body: dict, stream: bool) -> dict | None:
    """Prefill (disaggregated), then the decode request: its stream opened (``flight.resp``) or
    its whole answer returned; `ClientGone` (the backend request cancelled) if the client leaves."""
    gw, route = flight.gw, flight.route
    if route.prefill is not None:
        kv = await until_gone(flight.gone, gw.backends.prefill(route.prefill, path, body))
        body = {**body, "kv_transfer_params": place_kv(kv, route.kv_rail)}
        prefilled = getattr(gw.router, "prefilled", None)
        if prefilled is not None:
            prefilled(route)
    flight.t_decode_sent = time.perf_counter()
    flight.sent.set()
    if stream:
        upstream = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        flight.resp = await until_gone(flight.gone, gw.backends.open_stream(route.decode, path, upstream))
        return None
    async with asyncio.timeout(gw.cfg.timeouts.total_s):
        return await until_gone(flight.gone, gw.backends.post_json(route.decode, path, body))


async def _head(flight: _Flight, path: str, body: dict) -> tuple[list[str], AsyncIterator[str]]:
    """Send the request along the flight's route and read its stream up to the first token:
    (the payloads read, the rest of the stream, read within the first-token and between-token
    deadlines)."""
    t = flight.gw.cfg.timeouts
    start = time.monotonic()
    try:
        async with asyncio.timeout(t.first_token_s):
            await _send(flight, path, body, True)
    except TimeoutError:
        raise UpstreamError(504, f"the backend sent no first token within {t.first_token_s:g} s", "timeout") from None
    raw = flight.gw.backends.lines(flight.resp, flight.route.decode.name)  # type: ignore[arg-type]
    lines = bounded(raw, flight.gone, t.first_token_s - (time.monotonic() - start), t.between_tokens_s)
    head = await read_to_first_content(lines)
    if head and is_token(head[-1]):
        flight.t_first = time.perf_counter()
        flight.first_token()
    return head, lines


async def _first_of(flight: _Flight, klass: str, path: str, body: dict) -> tuple[_Flight, AsyncIterator[str]]:
    """A streamed request up to its first token: the flight to relay and its payloads. When its
    transfer stalls (the router's `stall_after_s` after the decode request went out) and the
    hedge budget allows, a copy goes along the path the router chooses now and the first of
    the two to produce a token is kept (hedge.py); the other is closed."""
    gw = flight.gw
    stall = getattr(gw.router, "stall_after_s", None)
    mine: asyncio.Task | None = None
    second: _Flight | None = None
    theirs: asyncio.Task | None = None
    try:
        if stall is None or gw.cfg.hedge.share == 0:   # nothing to race: no task, no wait
            head, lines = await _head(flight, path, body)
            return flight, replay(head, lines)
        mine = asyncio.ensure_future(_head(flight, path, body))
        if await _stalled(flight, mine, stall):
            second = _second(flight, klass)
        if second is None:
            head, lines = await mine
            return flight, replay(head, lines)
        gw.router.hedged(flight.route, second.route, time.perf_counter() - flight.t_decode_sent)  # type: ignore[attr-defined]
        theirs = asyncio.ensure_future(_head(second, path, body))
        pending: set[asyncio.Task] = {mine, theirs}
        winner = None
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winner = next((t for t in (mine, theirs) if t in done and t.exception() is None), None)
        if winner is theirs:   # the stalled original's wait is evidence against its path: not "cancelled"
            second.owns_ticket, flight.owns_ticket = True, False
            await flight.drop(mine, cancelled=False)
            head, lines = theirs.result()
            return second, replay(head, lines)
        await second.drop(theirs, cancelled=True)
        head, lines = await mine   # the original's token, or (both failed) its error
        return flight, replay(head, lines)
    except BaseException:
        if second is not None and not second.done:
            await second.drop(theirs, cancelled=True)
        if mine is not None and not mine.done():
            mine.cancel()
            await asyncio.gather(mine, return_exceptions=True)
        if flight.resp is not None and not flight.done:
            with anyio.CancelScope(shield=True):
                await flight.resp.aclose()
        raise


async def _stalled(flight: _Flight, mine: asyncio.Task, stall) -> bool:
    """Wait until the request's own read ends (False) or its transfer counts as stalled by the
    router's ``stall`` rule (True); False once its decode request is out if the router cannot
    tell (no peers' history yet)."""
    sent = asyncio.ensure_future(flight.sent.wait())
    await asyncio.wait({mine, sent}, return_when=asyncio.FIRST_COMPLETED)
    sent.cancel()
    wait_s = None if mine.done() else stall(flight.route)
    if wait_s is None:
        return False
    done, _ = await asyncio.wait({mine}, timeout=max(0.0, wait_s - (time.perf_counter() - flight.t_decode_sent)))
    return not done


def _second(flight: _Flight, klass: str) -> _Flight | None:
    """A second flight of the request along the path the router chooses now; None when the hedge
    budget is spent, the router defers it, or it would take the same path."""
    gw = flight.gw
    if not gw.hedges.try_spend():
        return None
    try:
        route = gw.router.route(klass, flight.ticket.prompt_estimate)  # type: ignore[arg-type]
    except Shed:
        return None
    if route_label(route) == route_label(flight.route):
        gw.router.finished(route, Outcome(False, cancelled=True))
        return None
    second = _Flight(gw, flight.ticket, route, flight.t_recv, owns_ticket=False, gone=flight.gone)
    second.start()
    return second


async def _whole(flight: _Flight, out: dict, endpoint: str) -> JSONResponse:
    gw = flight.gw
    flight.usage = out.get("usage")
    if flight.usage is None:  # no usage from the backend: estimate the completion from its text
        text = "".join(str((c.get("message") or {}).get("content") or c.get("text") or "")
                       for c in out.get("choices") or () if isinstance(c, dict))
        flight.chunks = max(1, round(len(text) / gw.cfg.admission.chars_per_token)) if text else 0
    c = flight.charge()
    await flight.end(True)
    gw.metrics.requests.labels(endpoint, "200").inc()
    return JSONResponse({**out, "usage": c.usage()}, headers={ROUTE_HEADER: route_label(flight.route)})


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def _relay(flight: _Flight, lines: AsyncIterator[str], want_usage: bool, endpoint: str) -> AsyncIterator[bytes]:
    """The backend's SSE events to the client as they come, reading usage and token times on the
    way; the usage the client sees is what it is charged. Output past the reservation is not
    relayed: the gateway ends the stream itself (finish_reason ``length``, [DONE])."""
    gw, decode = flight.gw, flight.route.decode.name
    cap = OutputCap(flight.ticket.reserved.output_tokens)
    open_choices: set[int] = set()
    last: dict = {}
    deadline = time.monotonic() + gw.cfg.timeouts.total_s
    ok = False
    try:
        async for data in lines:
            if data == "[DONE]":
                ok = True
                yield b"data: [DONE]\n\n"
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if not isinstance(chunk, dict):
                continue
            if chunk.get("usage") is not None:
                flight.usage = chunk["usage"]
            if cap.over(chunk):  # the backend did not honour the cap it was sent: the stream ends here
                gw.metrics.upstream_errors.labels(decode, "over_reservation").inc()
                for event in cut_events(last or chunk, open_choices, flight.charge().usage() if want_usage else None):
                    yield _sse(event)
                ok = True
                yield b"data: [DONE]\n\n"
                break
            if outputs_in(chunk):
                now = time.perf_counter()
                if flight.t_first is None:
                    flight.t_first = now
                    flight.first_token()
                flight.t_last = now
                flight.chunks = cap.relayed
            _track(open_choices, chunk)
            last = chunk
            if "usage" in chunk:
                if not want_usage:  # the usage we asked for on our own account
                    if not chunk.get("choices"):
                        continue
                    chunk.pop("usage")
                elif chunk["usage"] is not None:
                    chunk["usage"] = flight.charge().usage()
                data = json.dumps(chunk, separators=(",", ":"))
            yield f"data: {data}\n\n".encode()
            if time.monotonic() > deadline:
                raise UpstreamError(504, "backend took longer than total_s", "timeout")
        else:
            ok = True  # a backend that ends its stream without [DONE]
    except UpstreamError as e:
        gw.metrics.upstream_errors.labels(decode, e.kind).inc()
        flight.gateway_fault = e.status >= 500
        yield _sse({"error": {"message": e.message, "type": "server_error", "param": None,
                              "code": "upstream_" + e.kind}})
    except ClientGone:
        pass  # nobody to tell; the backend request is closed below
    finally:
        # A client that goes away cancels this generator (or `bounded` notices it first): the
        # backend request is closed and the reservation reconciled with what was relayed
        # (shielded, or the cancellation would skip it).
        with anyio.CancelScope(shield=True):
            if flight.gone is not None:
                flight.gone.cancel()
            if flight.resp is not None:
                await flight.resp.aclose()
            gw.metrics.requests.labels(endpoint, "200" if ok else "stream_error").inc()
            await flight.end(ok)


def _track(open_choices: set[int], chunk: dict) -> None:
    """The choices a stream has started and not finished (the gateway finishes them if it cuts)."""
    for c in chunk.get("choices") or ():
        if isinstance(c, dict) and isinstance(c.get("index"), int):
            (open_choices.discard if c.get("finish_reason") else open_choices.add)(c["index"])


def _admins(admin_token: str | Bearers | None) -> Bearers:
    """A plain token (tests, the CLI's --token) is named "operator"."""
    if isinstance(admin_token, Bearers):
        return admin_token
    return Bearers.of({"operator": admin_token} if admin_token else {})


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


def create_app(gw: Gateway, admin_token: str | Bearers | None, metrics_tokens: Bearers | None = None) -> FastAPI:
    """The app. ``admin_token``: named admin tokens (a plain string is named "operator"); None
    leaves /admin, /dashboard and /metrics refused (403) unless ``metrics_tokens`` open /metrics.
    The Host rule is the loopback names, ``gw.cfg.host`` (the address bound) and
    ``http.allowed_hosts``. The app closes ``gw`` when the server shuts down (run it with
    lifespan on), after the requests the server cut have reconciled (bounded)."""
    admins = _admins(admin_token)
    scrapers = admins + (metrics_tokens or Bearers())
    in_flight = InFlight()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        # the router's inputs: instances' /metrics (vLLM's waiting requests, KV-cache use) and,
        # with a controller_url, seamguard's NIC/link states; read on an interval, bounded waits
        stop = asyncio.Event()
        feed = asyncio.create_task(feed_router(gw.router, gw.backends.client, gw.cfg.instance_list(),
                                               gw.cfg.controller_url, gw.cfg.feed_every_s, stop))
        yield
        stop.set()
        with anyio.move_on_after(5):
            await feed
        # requests the server cut at its drain deadline reconcile in their own (shielded) cleanup
        await in_flight.drained(SHUTDOWN_RECONCILE_S)
        await gw.close()  # on the server's own event loop, where the clients were used

    app = FastAPI(title="seamguard gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.add_middleware(SurfaceGuard, hosts=gateway_hosts(gw.cfg.host, gw.cfg.http.allowed_hosts),
                       max_body_bytes=gw.cfg.http.max_body_bytes, in_flight=in_flight)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error(500, f"internal error: {type(exc).__name__}", "server_error", "internal_error")

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge) -> JSONResponse:
        gw.metrics.requests.labels(_endpoint(request), "413").inc()
        return error(413, str(exc), "invalid_request_error", "body_too_large")

    @app.exception_handler(StoreError)
    @app.exception_handler(sqlite3.Error)
    async def _store_down(request: Request, exc: Exception) -> JSONResponse:
        # an admin call while Redis (or the SQLite file) is unusable: the client's to retry
        gw.metrics.store_errors.labels("admin").inc()
        return error(503, f"budget store unavailable: {_one_line(exc)}", "server_error", "store_unavailable",
                     retry_after_s=1)

    @app.exception_handler(RequestValidationError)
    async def _bad_query(request: Request, exc: RequestValidationError) -> JSONResponse:
        e = (exc.errors() or [{}])[0]
        where = ".".join(str(x) for x in e.get("loc", ()) if x not in ("query", "path", "body"))
        return error(400, f"{where or 'request'}: {e.get('msg', 'invalid')}", "invalid_request_error",
                     "invalid_value", where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # an unknown path or method (e.g. /v1/embeddings) in OpenAI's error shape, not FastAPI's
        what = "unknown URL" if exc.status_code == 404 else "method not allowed" if exc.status_code == 405 else exc.detail
        return error(exc.status_code, f"{what}: {request.method} {request.url.path[:200]} (this gateway serves "
                     "/v1/chat/completions, /v1/completions and /v1/models)", "invalid_request_error",
                     "unknown_url" if exc.status_code == 404 else None)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(gw, request, "chat", "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(gw, request, "completions", "/v1/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if gw.gatekeeper.authenticate(_bearer(request)) is None:
            return error(401, "Incorrect or missing API key", "invalid_request_error", "invalid_api_key")
        if gw.cfg.models:
            return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                                             "owned_by": "seamguard"} for m in gw.cfg.models]})
        inst = next(i for i in gw.cfg.instance_list() if i.role != "prefill")
        try:
            return JSONResponse(await gw.backends.get_json(inst, "/v1/models"))
        except UpstreamError as e:
            return error(e.status, e.message, "server_error", "upstream_" + e.kind)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        """503 while the budget store cannot be used (Redis unreachable, a SQLite write lock held
        elsewhere): a load balancer in front of several replicas should send the traffic elsewhere.
        Answers within HEALTH_S whatever the store does."""
        try:
            async with asyncio.timeout(HEALTH_S):
                await gw.store.health(gw.gatekeeper.clock())
        except (StoreError, sqlite3.Error) as e:
            return JSONResponse({"ok": False, "store": str(e)}, status_code=503)
        except TimeoutError:
            return JSONResponse({"ok": False, "store": f"no answer from the store in {HEALTH_S} s"}, status_code=503)
        return JSONResponse({"ok": True})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        denied = _who(request, scrapers, "/metrics")
        if isinstance(denied, JSONResponse):
            return denied
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- admin: reads and changes need an admin token; its name is who acted -----------------
    def _admin(request: Request, basic: bool = False) -> str | JSONResponse:
        return _who(request, admins, "the admin API", basic)

    @app.get("/admin/keys")
    async def admin_keys(request: Request) -> Response:
        who = _admin(request)
        return who if isinstance(who, JSONResponse) else JSONResponse({"keys": await gw.gatekeeper.keys_view()})

    @app.get("/admin/tenants")
    async def admin_tenants(request: Request) -> Response:
        who = _admin(request)
        return who if isinstance(who, JSONResponse) else JSONResponse({"tenants": await gw.gatekeeper.tenants_view()})

    def _snapshot() -> dict | None:
        snap = getattr(gw.router, "snapshot", None)
        return snap() if snap is not None else None

    @app.get("/admin/routing")
    async def admin_routing(request: Request) -> Response:
        """The router's view (paths, rails, instances, batch caps, decisions, latest departures)."""
        who = _admin(request)
        if isinstance(who, JSONResponse):
            return who
        return JSONResponse({"router": gw.cfg.router, "snapshot": plain(_snapshot())})

    @app.get("/dashboard")
    async def dashboard(request: Request) -> Response:
        """A browser sends the token as a Basic-auth password (any user name); only this read takes it."""
        who = _admin(request, basic=True)
        if isinstance(who, JSONResponse):
            return who
        return HTMLResponse(render_dashboard(_snapshot(), f"seamguard gateway: {gw.cfg.router}"))

    @app.get("/admin/events")
    async def admin_events(request: Request, key: str | None = None, limit: str = "100") -> Response:
        who = _admin(request)
        if isinstance(who, JSONResponse):
            return who
        if not (limit.isascii() and limit.isdigit() and len(limit) <= 9):
            return error(400, f"limit: {limit[:20]!r} is not a count", "invalid_request_error", "invalid_value",
                         "limit")
        return JSONResponse({"events": gw.ledger.events(key, max(1, min(int(limit), 1000)))})

    @app.post("/admin/keys/{name}/{verb}")
    async def admin_key(name: str, verb: str, request: Request) -> Response:
        who = _admin(request)
        if isinstance(who, JSONResponse):
            return who
        if name not in gw.gatekeeper.keys:
            return error(404, f"no key named {name[:100]!r}", "invalid_request_error", "unknown_key", "name")
        if verb not in ("suspend", "unsuspend", "reset"):
            return error(404, f"unknown admin action {verb[:100]!r} (suspend, unsuspend, reset)",
                         "invalid_request_error", "unknown_action")
        note = _note(await request.body())
        if isinstance(note, JSONResponse):
            return note
        if verb == "reset":
            rec = await gw.gatekeeper.reset(name, who, note)
        else:
            rec = await gw.gatekeeper.override(name, "suspended" if verb == "suspend" else "ok", who, note)
        return JSONResponse({"name": name, "state": rec.state, "reason": rec.reason, "by": rec.actor})

    return app


HEALTH_S = 1.5  # /healthz answers within this, whatever the store does
SHUTDOWN_RECONCILE_S = 5.0  # after the drain deadline: how long cut requests get to reconcile
MAX_NOTE_CHARS = 500


def _endpoint(request: Request) -> str:
    path = request.url.path
    return "chat" if path == "/v1/chat/completions" else "completions" if path == "/v1/completions" else "other"


def _basic_password(request: Request) -> str | None:
    h = request.headers.get("authorization", "")
    if h[:6].lower() != "basic ":
        return None
    try:
        return base64.b64decode(h[6:].strip(), validate=True).decode("latin-1").partition(":")[2] or None
    except (ValueError, binascii.Error):
        return None


def _who(request: Request, tokens: Bearers, what: str, basic: bool = False) -> str | JSONResponse:
    """The name of the token the request carries, or the refusal: 403 when no token can open
    ``what``, 401 when the request's is missing or wrong."""
    if not tokens:
        return error(403, f"{what} is disabled: start the gateway with an admin token (SEAMGUARD_GATEWAY_TOKEN or "
                     "admin_tokens in the config)", "permission_error", "admin_disabled")
    who = tokens.who(_bearer(request) or (_basic_password(request) if basic else None))
    if who is not None:
        return who
    resp = error(401, f"{what} needs 'Authorization: Bearer <token>'", "invalid_request_error",
                 "invalid_admin_token")
    if basic:
        resp.headers["WWW-Authenticate"] = 'Basic realm="seamguard gateway", charset="UTF-8"'
    return resp


def _note(raw: bytes) -> str | JSONResponse:
    """Why the operator acts (the ledger's reason): a JSON object with a non-blank "note"."""
    doc = parse(raw) if raw.strip() else {}
    note = doc.get("note") if isinstance(doc, dict) else None
    if not isinstance(note, str) or not note.strip():
        return error(400, 'say why: send a JSON body {"note": "<why>"} with a non-blank note',
                     "invalid_request_error", "missing_note", "note")
    if len(note) > MAX_NOTE_CHARS:
        return error(400, f"the note is {len(note)} characters; at most {MAX_NOTE_CHARS}", "invalid_request_error",
                     "invalid_value", "note")
    return " ".join(note.split())


def build_gateway(cfg: GatewayConfig, clock=time.time) -> Gateway:
    """A replica from a validated config: its store (SQLite file or shared Redis), ledger, router, backends."""
    if isinstance(cfg.store, SqliteStoreConfig):
        store: Store = SqliteStore(cfg.store.path)
        ledger = GatewayLedger(cfg.store.path)
    else:  # the replica's own file keeps the key states it knew and its charges (a Redis reset loses neither)
        ledger = GatewayLedger(cfg.store.ledger)
        store = RedisStore(cfg.store.url, cfg.store.prefix, cfg.timeouts.connect_s, durable=ledger)
    router = build_router(cfg)
    metrics = GatewayMetrics(router)
    return Gateway(cfg, store, ledger, router, Gatekeeper(cfg, store, ledger, metrics, clock),
                   Backends(cfg.timeouts), metrics, HedgeBudget(cfg.hedge.share, cfg.hedge.burst))
