"""A small OpenAI-compatible inference server for tests and benchmarks (product test-bed code).

`FakeBackend` answers ``/v1/chat/completions`` and ``/v1/completions`` (streamed as SSE, or
whole), ``/v1/models``, with deterministic tokens (``tok0 tok1 ...``), a real ``usage``
(prompt tokens are whitespace-separated words plus 3 per chat message; completion tokens
are what it sent) and a configurable time to first token and time per token. It speaks the
disaggregated-prefill convention (a request with ``kv_transfer_params.do_remote_decode``
answers one token and ``kv_transfer_params`` for the decode instance) and can be told to
fail (`fail_next`). `ThreadedServer` runs any ASGI app with uvicorn on a loopback port in a
background thread, with a bounded start and stop.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from seamguard.ports import free_port


@dataclass
class FakeBackend:
    name: str = "fake"
    model: str = "fake-model"
    ttft_s: float = 0.0  # before the first token
    per_token_s: float = 0.0  # between tokens
    default_max_tokens: int = 16
    usage_in_stream: bool = True  # False: never send the usage chunk (the gateway must count chunks)
    seen: list[dict[str, Any]] = field(default_factory=list)  # request bodies, in order (tests look)
    kv_hosts: list[str] = field(default_factory=list)  # a prefill's KV addresses, one per rail (remote_hosts)
    _fail: list[int] = field(default_factory=list)

    def fail_next(self, n: int, status: int = 500) -> None:
        """The next ``n`` completion requests answer ``status`` with an OpenAI-style error."""
        self._fail.extend([status] * n)

    @staticmethod
    def prompt_tokens(body: dict[str, Any]) -> int:
        if isinstance(body.get("messages"), list):
            return sum(3 + len(str(m.get("content") or "").split()) for m in body["messages"])
        p = body.get("prompt")
        return sum(len(str(x).split()) for x in p) if isinstance(p, list) else len(str(p or "").split())

    def app(self) -> FastAPI:
        app = FastAPI()
        app.add_api_route("/v1/chat/completions", self._chat, methods=["POST"])
        app.add_api_route("/v1/completions", self._completions, methods=["POST"])
        app.add_api_route("/v1/models", self._models, methods=["GET"])
        return app

    async def _models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}]}

    async def _chat(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def _serve(self, request: Request, chat: bool) -> Response:
        body = await request.json()
        self.seen.append(body)
        if self._fail:
            status = self._fail.pop(0)
            return JSONResponse({"error": {"message": f"injected failure {status}", "type": "server_error",
                                           "param": None, "code": None}}, status_code=status)
        n = body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens
        prompt = self.prompt_tokens(body)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:12]}"
        kv_in = body.get("kv_transfer_params") or {}
        kv_out = None
        if kv_in.get("do_remote_decode"):  # prefill half of disaggregated serving
            n = 1
            kv_out = {"do_remote_prefill": True, "remote_engine_id": self.name, "remote_request_id": rid,
                      "remote_block_ids": list(range(max(1, prompt // 16))),
                      "remote_host": self.kv_hosts[0] if self.kv_hosts else "127.0.0.1"}
            if self.kv_hosts:
                kv_out["remote_hosts"] = list(self.kv_hosts)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            await asyncio.sleep(self.ttft_s + self.per_token_s * max(0, n - 1))
            text = " ".join(f"tok{i}" for i in range(n))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            out = {"id": rid, "object": obj, "created": int(time.time()), "model": body.get("model", self.model),
                   "choices": [choice], "usage": usage}
            if kv_out is not None:
                out["kv_transfer_params"] = kv_out
            return JSONResponse(out)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and self.usage_in_stream

        async def events():
            base = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": int(time.time()),
                    "model": body.get("model", self.model)}
            await asyncio.sleep(self.ttft_s)
            for i in range(n):
                if i:
                    await asyncio.sleep(self.per_token_s)
                piece = f"tok{i}" if i == 0 else f" tok{i}"
                choice = ({"index": 0, "delta": {"content": piece} if i else {"role": "assistant", "content": piece},
                           "finish_reason": "length" if i == n - 1 else None}
                          if chat else {"index": 0, "text": piece, "finish_reason": "length" if i == n - 1 else None})
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"
            if include_usage:
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


class ThreadedServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a daemon thread; `start` waits until it listens."""

    def __init__(self, app: Any, port: int = 0, host: str = "127.0.0.1") -> None:
        self.host, self.port = host, port or free_port(host)
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                     access_log=False, lifespan="auto"))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> ThreadedServer:
        self._thread = threading.Thread(target=self._server.run, name=f"asgi-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"server did not start on {self.url} within {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
