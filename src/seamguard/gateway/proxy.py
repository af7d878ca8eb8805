"""Talking to the backends: one pooled httpx client, explicit timeouts, errors sorted for the caller.

`Backends` posts a request to an instance (whole JSON answer, or a stream of SSE ``data:``
lines), and runs the prefill half of disaggregated serving the way vLLM's disaggregated
prefill proxy does (``max_tokens: 1``, not streamed, ``kv_transfer_params:
{"do_remote_decode": true}``; the answer's ``kv_transfer_params`` go to the decode
instance). A backend failure becomes `UpstreamError` with the status the gateway answers:
502 (unreachable, a 5xx, an unreadable answer) or 504 (timed out); a backend's own 4xx is
passed through, since it is the caller's request that was wrong.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from seamguard.gateway.config import TimeoutsConfig
from seamguard.gateway.routing import Instance


class UpstreamError(Exception):
    def __init__(self, status: int, message: str, kind: str, body: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.body = status, message, kind, body


def _error_from(resp_status: int, text: bytes, who: str) -> UpstreamError:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if 400 <= resp_status < 500 and resp_status != 408:
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
            body = {"error": {"message": text[:500].decode("utf-8", "replace") or f"backend answered {resp_status}",
                              "type": "invalid_request_error", "param": None, "code": None}}
        return UpstreamError(resp_status, f"{who} answered {resp_status}", "rejected", body)
    return UpstreamError(502, f"backend {who} answered {resp_status}", f"http_{resp_status}")


class Backends:
    def __init__(self, timeouts: TimeoutsConfig, max_connections: int = 1000) -> None:
        self.t = timeouts
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=timeouts.connect_s, read=timeouts.read_s, write=timeouts.connect_s,
                                  pool=timeouts.connect_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    async def close(self) -> None:
        await self.client.aclose()

    def _wrap(self, e: Exception, who: str) -> UpstreamError:
        if isinstance(e, httpx.TimeoutException):
            return UpstreamError(504, f"backend {who} timed out ({type(e).__name__})", "timeout")
        return UpstreamError(502, f"backend {who} unreachable ({type(e).__name__})", "unreachable")

    async def post_json(self, inst: Instance, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = await self.client.post(inst.url + path, json=body)
        except httpx.HTTPError as e:
            raise self._wrap(e, inst.name) from None
        if r.status_code != 200:
            raise _error_from(r.status_code, r.content, inst.name)
        try:
            out = r.json()
        except ValueError:
            raise UpstreamError(502, f"backend {inst.name} answered something that is not JSON", "bad_body") from None
        if not isinstance(out, dict):
            raise UpstreamError(502, f"backend {inst.name} answered JSON that is not an object", "bad_body")
        return out

    async def prefill(self, inst: Instance, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The prefill half: returns the ``kv_transfer_params`` the decode instance needs."""
        req = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        req.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        if "max_completion_tokens" in req:
            req["max_completion_tokens"] = 1
        out = await self.post_json(inst, path, req)
        kv = out.get("kv_transfer_params")
        if not isinstance(kv, dict):
            raise UpstreamError(502, f"prefill instance {inst.name} returned no kv_transfer_params", "no_kv_params")
        return kv

    async def open_stream(self, inst: Instance, path: str, body: dict[str, Any]) -> httpx.Response:
        """Send a streaming request; returns the response once its headers say 200 (caller closes it)."""
        req = self.client.build_request("POST", inst.url + path, json=body)
        try:
            r = await self.client.send(req, stream=True)
        except httpx.HTTPError as e:
            raise self._wrap(e, inst.name) from None
        if r.status_code != 200:
            try:
                text = await r.aread()
            except httpx.HTTPError:
                text = b""
            await r.aclose()
            raise _error_from(r.status_code, text, inst.name)
        return r

    async def lines(self, r: httpx.Response, who: str) -> AsyncIterator[str]:
        """The ``data:`` payloads of an SSE answer (``[DONE]`` included), a chunk silence bounded."""
        try:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    yield line[5:].strip()
        except httpx.HTTPError as e:
            raise self._wrap(e, who) from None

    async def get_json(self, inst: Instance, path: str) -> dict[str, Any]:
        try:
            r = await self.client.get(inst.url + path, timeout=self.t.connect_s * 2)
        except httpx.HTTPError as e:
            raise self._wrap(e, inst.name) from None
        if r.status_code != 200:
            raise _error_from(r.status_code, r.content, inst.name)
        return r.json()
