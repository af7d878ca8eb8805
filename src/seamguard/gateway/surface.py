"""The gateway port's guards, applied before any route runs: which Host, how many body bytes,
whose token, and how many requests are still in flight when the server stops.

Why this exists: anyone the network lets through reaches the gateway's port, and a browser on
the operator's machine can be made to reach a loopback one (DNS rebinding). `SurfaceGuard`
(an ASGI middleware that seamguard.gateway.app puts in front of every route) refuses a
``Host`` name it does not answer (421; an IP address is answered, since no rebound browser
sends one) and a ``Content-Length`` over the cap (413) without reading a byte of the body,
and hands the routes a ``receive`` that counts, so a chunked body is cut at the cap as well
(`BodyTooLarge`, answered 413 by the app). It also counts the requests in flight, so the
app's shutdown can wait (bounded) for the ones the server cut to reconcile.

The Host rule (`HostRule`) and the named tokens (`Bearers`: admin, metrics; the name is who
the ledger says acted) are seamguard.http_access's, shared with the controller's API; this
port answers a request without ``Host`` (HTTP/1.0 carries none, and no browser omits it), so
the gateway builds its rule with `gateway_hosts`. Pure apart from the ASGI calls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from seamguard.http_access import Bearers, HostRule

__all__ = ["Bearers", "BodyTooLarge", "HostRule", "InFlight", "SurfaceGuard", "capped", "gateway_hosts"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyTooLarge(Exception):
    """The request body grew past the cap while it was read (a chunked body, or a lying length)."""

    def __init__(self, cap_bytes: int) -> None:
        super().__init__(f"request body over {cap_bytes} bytes")
        self.cap_bytes = cap_bytes


def gateway_hosts(bind_host: str, allowed: Iterable[str]) -> HostRule:
    """The Host rule of a gateway bound to ``bind_host`` with ``http.allowed_hosts``: a request
    without Host is answered, since rebinding needs a browser and a browser always sends one."""
    return HostRule.of(bind_host, allowed, answer_missing=True)


# ---- the middleware ----------------------------------------------------------------------------
def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def _refuse(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def capped(receive: Receive, cap_bytes: int) -> Receive:
    """``receive`` that raises `BodyTooLarge` once more than ``cap_bytes`` of body have come."""
    seen = 0

    async def counted() -> Message:
        nonlocal seen
        msg = await receive()
        if msg["type"] == "http.request":
            seen += len(msg.get("body", b""))
            if seen > cap_bytes:
                raise BodyTooLarge(cap_bytes)
        return msg

    return counted


class InFlight:
    """Requests inside the app right now; `drained` waits (bounded) until there are none."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if not self.count:
                self._idle.set()
        return self._idle

    def enter(self) -> None:
        self.count += 1
        self._event().clear()

    def leave(self) -> None:
        self.count -= 1
        if not self.count:
            self._event().set()

    async def drained(self, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                await self._event().wait()
        except TimeoutError:
            return False
        return True


def _content_length(value: str | None) -> int | None | str:
    """The header's value, None when absent, or the reason it cannot be read."""
    if value is None:
        return None
    v = value.strip()
    if not v or len(v) > 19 or any(c not in "0123456789" for c in v):
        return f"Content-Length {v[:20]!r} is not a byte count"
    return int(v)


class SurfaceGuard:
    """Host check, body cap and in-flight count in front of an ASGI app (see the module docstring)."""

    def __init__(self, app: Callable, hosts: HostRule, max_body_bytes: int, in_flight: InFlight) -> None:
        self.app, self.hosts, self.max_body_bytes, self.in_flight = app, hosts, max_body_bytes, in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if not self.hosts.allows(host):
            await _refuse(send, 421, f"Host {(host or '')[:100]!r} is not a name this gateway answers "
                                     "(http.allowed_hosts)", "misdirected_request")
            return
        length = _content_length(_header(scope, b"content-length"))
        if isinstance(length, str):
            await _refuse(send, 400, length, "invalid_content_length")
            return
        if length is not None and length > self.max_body_bytes:
            await _refuse(send, 413, f"request body over {self.max_body_bytes} bytes (Content-Length {length})",
                          "body_too_large")
            return
        self.in_flight.enter()
        try:
            await self.app(scope, capped(receive, self.max_body_bytes), send)
        finally:
            self.in_flight.leave()
