"""A small OpenAI-compatible inference server for tests and benchmarks (product test-bed code).

`FakeBackend` answers ``/v1/chat/completions`` and ``/v1/completions`` (streamed as SSE, or
whole), ``/v1/models``, with deterministic tokens (``tok0 tok1 ...``) and a configurable time
to first token and time per token. It bills the way vLLM does, so a gateway in front of it can
be tested against what a real server would spend:

- output: chat takes ``max_completion_tokens``, else ``max_tokens``; completions read only
  ``max_tokens`` (16 when absent); with none (or null) it generates up to its context limit
  (``max_model_len`` minus the prompt), and a request asking for more than fits is a 400;
- prompt tokens: whitespace-separated words of the text (every content form: strings, text
  parts, a dict's JSON), 3 per chat message, 85 per media part, token ids one each, and the
  JSON of ``tools``, ``functions`` and ``documents`` (which the chat template renders) at 4
  characters a token;
- a client that disconnects aborts its request, streamed or not (vLLM's ``with_cancellation``),
  and `bills` records what each request really cost (prompt, tokens generated, aborted).

It speaks the disaggregated-prefill convention (a request with
``kv_transfer_params.do_remote_decode`` answers one token and ``kv_transfer_params`` for the
decode instance), can be told to fail (`fail_next`), and to misbehave as a hostile or broken
backend would: report a given ``usage_override``, generate ``ignore_max_tokens`` tokens whatever
the request asks, or keep a stream open with keep-alive comments only (``keepalive_only_s``,
after ``tokens_before_keepalive`` tokens).
`ThreadedServer` runs any ASGI app with uvicorn on a loopback port in a background thread,
with a bounded start and stop.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from seamguard.ports import free_port

RENDERED_FIELDS = ("tools", "functions", "documents")  # request fields a chat template renders into the prompt
MEDIA_PART_TOKENS = 85


@dataclass
class Bill:
    """What one request cost the backend."""

    prompt: int
    completion: int = 0  # tokens generated (sent, for a stream)
    aborted: bool = False  # its client left before the end (the backend stopped generating)
    ended_at: float | None = None  # time.monotonic() when the backend stopped working on it

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def _words(x: Any) -> int:
    return len(x.split()) if isinstance(x, str) else len(json.dumps(x).split())


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, list):
        return sum(_words(p.get("text", "")) if isinstance(p, dict) and p.get("type") == "text"
                   else MEDIA_PART_TOKENS if isinstance(p, dict) else _words(p) for p in content)
    return _words(content)


def _prompt_list_tokens(p: list) -> int:
    n = 0
    for x in p:
        if isinstance(x, int) and not isinstance(x, bool):
            n += 1
        elif isinstance(x, list):
            n += len(x)
        else:
            n += _words(x)
    return n


@dataclass
class FakeBackend:
    name: str = "fake"
    model: str = "fake-model"
    ttft_s: float = 0.0  # before the first token
    per_token_s: float = 0.0  # between tokens
    max_model_len: int = 4096  # context limit: prompt + output (vLLM's --max-model-len)
    usage_in_stream: bool = True  # False: never send the usage chunk (the gateway must count chunks)
    usage_override: dict[str, Any] | None = None  # report this usage instead of the real one
    ignore_max_tokens: int | None = None  # generate this many tokens whatever the request asks
    keepalive_only_s: float | None = None  # streams: a keep-alive comment this often, never a token ...
    tokens_before_keepalive: int = 0  # ... after this many tokens
    seen: list[dict[str, Any]] = field(default_factory=list)  # request bodies, in order (tests look)
    bills: list[Bill] = field(default_factory=list)  # what each request cost, in order
    kv_hosts: list[str] = field(default_factory=list)  # a prefill's KV addresses, one per rail (remote_hosts)
    _fail: list[int] = field(default_factory=list)

    def fail_next(self, n: int, status: int = 500) -> None:
        """The next ``n`` completion requests answer ``status`` with an OpenAI-style error."""
        self._fail.extend([status] * n)

    def spent(self) -> int:
        """Tokens every request so far cost (prompt + generated)."""
        return sum(b.total for b in self.bills)

    @staticmethod
    def prompt_tokens(body: dict[str, Any]) -> int:
        if isinstance(body.get("messages"), list):
            n = sum(3 + (_content_tokens(m.get("content")) if isinstance(m, dict) else _words(m))
                    for m in body["messages"])
            return n + sum(math.ceil(len(json.dumps(body[f])) / 4) for f in RENDERED_FIELDS if body.get(f))
        p = body.get("prompt")
        return _prompt_list_tokens(p) if isinstance(p, list) else _words(p or "")

    def output_tokens(self, body: dict[str, Any], chat: bool, prompt: int) -> int | str:
        """Tokens to generate, as vLLM reads the request; a str: why it is refused (400)."""
        if self.ignore_max_tokens is not None:
            return self.ignore_max_tokens
        if chat:
            asked = body.get("max_completion_tokens")
            asked = body.get("max_tokens") if asked is None else asked
        else:
            asked = body.get("max_tokens", 16)
        room = self.max_model_len - prompt
        if asked is None:
            return max(0, room) if room > 0 else f"the prompt ({prompt} tokens) fills the context ({self.max_model_len})"
        if asked > room:
            return (f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{asked} output tokens and your prompt contains {prompt} input tokens")
        return asked

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
            return _error(status, f"injected failure {status}", "server_error")
        prompt = self.prompt_tokens(body)
        n = self.output_tokens(body, chat, prompt)
        if isinstance(n, str):
            return _error(400, n, "BadRequestError")
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
        bill = Bill(prompt)
        self.bills.append(bill)
        usage = self.usage_override or {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            if not await self._generate(request, bill, n):
                return Response(status_code=499)
            text = " ".join(f"tok{i}" for i in range(n))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            out = {"id": rid, "object": obj, "created": int(time.time()), "model": body.get("model", self.model),
                   "choices": [choice], "usage": usage}
            if kv_out is not None:
                out["kv_transfer_params"] = kv_out
            return JSONResponse(out)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and self.usage_in_stream
        base = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": int(time.time()),
                "model": body.get("model", self.model)}
        events = (self._keepalive(bill, base, chat) if self.keepalive_only_s is not None
                  else self._events(bill, base, n, chat, usage if include_usage else None))
        return StreamingResponse(events, media_type="text/event-stream")

    async def _generate(self, request: Request, bill: Bill, n: int) -> bool:
        """Generate ``n`` tokens into ``bill`` in time; False if the client left first (aborted)."""
        async def run() -> None:
            await asyncio.sleep(self.ttft_s)
            if self.per_token_s <= 0:
                bill.completion = n
                return
            for i in range(n):
                if i:
                    await asyncio.sleep(self.per_token_s)
                bill.completion += 1

        work = asyncio.ensure_future(run())
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        for t in (work, gone):
            t.cancel()
        await asyncio.gather(work, gone, return_exceptions=True)
        bill.ended_at = time.monotonic()
        bill.aborted = bill.completion < n
        return not bill.aborted

    async def _events(self, bill: Bill, base: dict, n: int, chat: bool, usage: dict | None):
        try:
            await asyncio.sleep(self.ttft_s)
            for i in range(n):
                if i:
                    await asyncio.sleep(self.per_token_s)
                piece = f"tok{i}" if i == 0 else f" tok{i}"
                choice = ({"index": 0, "delta": {"content": piece} if i else {"role": "assistant", "content": piece},
                           "finish_reason": "length" if i == n - 1 else None}
                          if chat else {"index": 0, "text": piece, "finish_reason": "length" if i == n - 1 else None})
                bill.completion += 1
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"
            if usage is not None:
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            bill.aborted = bill.completion < n
            bill.ended_at = time.monotonic()

    async def _keepalive(self, bill: Bill, base: dict, chat: bool):
        try:
            for i in range(self.tokens_before_keepalive):
                piece = f"tok{i}" if i == 0 else f" tok{i}"
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                bill.completion += 1
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"
            while True:
                yield ": keep-alive\n\n"
                await asyncio.sleep(self.keepalive_only_s or 0.0)
        finally:
            bill.aborted = True
            bill.ended_at = time.monotonic()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(status: int, message: str, type_: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": None, "code": None}},
                        status_code=status)


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
