"""An inference-pool emulator: prefill and decode instances that speak the OpenAI API and move
real KV-cache bytes between them over TCP.

Why this exists: fabric-aware routing must be shown on transfers that cross real (namespaced,
`tc`-shaped) links, not on sleeps. The gateway's routers, tests/gateway/test_routing_pool.py
and benchmarks/inference_routing.py run these instances inside the testbed's hosts
(seamguard.testbed.net); `python -m seamguard.testbed.inference_pool --help` starts one.

What it emulates (vLLM's disaggregated-prefill convention):

- **prefill** (``--role prefill``): a request with ``kv_transfer_params.do_remote_decode`` is
  queued FIFO for the one emulated GPU, which spends ``prefill_base_s + prefill_per_token_s x
  prompt tokens``; the prompt's KV (``ModelShape.kv_bytes``) is then *held* in its KV cache
  until a decode instance pulls it over TCP (``--kv-port``) or ``kv_hold_s`` passes. A full
  KV cache makes new prefills wait, as in vLLM. The answer is a completion with one token and
  ``kv_transfer_params`` naming the addresses, port and id to pull from.
- **decode** (``--role decode``): the request plus those ``kv_transfer_params``; it reserves
  KV space, pulls the bytes from the prefill instance (from its own address ``--kv-bind``,
  picking the first of its addresses that shares a subnet with one the prefill advertised: one
  rail, its home rail unless the gateway narrowed ``remote_hosts`` to another), then joins a continuous batch
  whose step takes ``decode_base_s + decode_per_seq_s x batch size`` and yields one token to
  every running sequence (``--kv-blocking``: no step while a pull is in flight, as a
  connector that receives the KV inside the model step); streams SSE chunks (OpenAI format, final usage chunk when
  ``stream_options.include_usage``) or answers one JSON.
- **unified** (``--role unified``): prefill locally, then decode.

Tokens: one per whitespace-separated word of the prompt (chat: of every message's content);
output is ``max_tokens`` tokens (finish_reason "length"). ``/metrics`` exports vLLM's names:
``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``
(and the V0 name ``vllm:gpu_cache_usage_perc``).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import struct
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field

_ZEROS = memoryview(bytes(1 << 18))


@dataclass(frozen=True)
class ModelShape:
    """The attention shape that sizes the KV cache: bytes = tokens x layers x 2 (K and V) x
    kv_heads x head_dim x dtype bytes."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # bf16

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes


# Shapes from the models' published config.json (num_hidden_layers, num_key_value_heads,
# hidden_size / num_attention_heads); see docs/gateway-routing.md.
SHAPES = {
    "llama-3-8b": ModelShape("llama-3-8b", layers=32, kv_heads=8, head_dim=128),  # 128 KiB per token
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", layers=24, kv_heads=2, head_dim=64),  # 12 KiB per token
}


@dataclass(frozen=True)
class PoolTiming:
    """Emulated GPU speed and memory of one instance."""

    prefill_base_s: float = 0.010
    prefill_per_token_s: float = 0.00010  # 10k prompt tokens/s
    decode_base_s: float = 0.015  # one batch step with one sequence
    decode_per_seq_s: float = 0.0004  # each more sequence in the batch adds this to a step
    max_batch: int = 64  # running sequences; more wait
    kv_capacity_tokens: int = 65536
    kv_hold_s: float = 30.0  # prefill frees KV nobody is pulling after this (vLLM's initial NIXL lease)
    kv_timeout_s: float = 60.0  # decode gives up a KV pull after this
    kv_blocking: bool = False  # decode steps wait while a KV pull is in flight (a connector that
    # receives the KV inside the model step, as vLLM V0's PyNccl connector did); False: pulls run
    # beside the batch (vLLM V1's NIXL connector)


@dataclass
class _Seq:
    remaining: int
    out: asyncio.Queue = field(default_factory=asyncio.Queue)


class Engine:
    """One instance's emulated GPU: a FIFO prefill, a KV cache, a continuous decode batch."""

    def __init__(self, name: str, role: str, shape: ModelShape, timing: PoolTiming, kv_addrs: list[str],
                 kv_port: int, kv_binds: list[str]) -> None:
        self.name, self.role, self.shape, self.timing = name, role, shape, timing
        self.kv_addrs, self.kv_port, self.kv_binds = kv_addrs, kv_port, kv_binds
        self.kv_used = 0
        self.waiting = 0
        self._prefill_lock = asyncio.Lock()  # FIFO: one prompt on the GPU at a time
        self._kv_free = asyncio.Condition()
        self._held: dict[str, tuple[int, asyncio.TimerHandle]] = {}
        self._running: list[_Seq] = []
        self._queued: deque[_Seq] = deque()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._pulls = 0
        self._no_pulls = asyncio.Event()
        self._no_pulls.set()

    # ---- KV cache ---------------------------------------------------------------------------
    async def reserve(self, tokens: int) -> None:
        tokens = min(tokens, self.timing.kv_capacity_tokens)
        async with self._kv_free:
            await self._kv_free.wait_for(lambda: self.kv_used + tokens <= self.timing.kv_capacity_tokens)
            self.kv_used += tokens

    async def release(self, tokens: int) -> None:
        async with self._kv_free:
            self.kv_used -= min(tokens, self.timing.kv_capacity_tokens)
            self._kv_free.notify_all()

    def _expire(self, tid: str) -> None:
        got = self._held.pop(tid, None)
        if got is not None:
            asyncio.ensure_future(self.release(got[0]))

    # ---- prefill ----------------------------------------------------------------------------
    async def compute_prefill(self, tokens: int) -> None:
        """The prompt on the GPU, after every prompt queued before it (counted as waiting)."""
        self.waiting += 1
        queued = True
        try:
            async with self._prefill_lock:
                self.waiting -= 1
                queued = False
                await asyncio.sleep(self.timing.prefill_base_s + self.timing.prefill_per_token_s * tokens)
        finally:
            if queued:
                self.waiting -= 1

    async def prefill_for_remote(self, tokens: int) -> dict:
        self.waiting += 1  # a prompt waiting for KV space is waiting too
        try:
            await self.reserve(tokens)
        finally:
            self.waiting -= 1
        try:
            await self.compute_prefill(tokens)
        except BaseException:
            await self.release(tokens)
            raise
        tid = uuid.uuid4().hex
        handle = asyncio.get_running_loop().call_later(self.timing.kv_hold_s, self._expire, tid)
        self._held[tid] = (tokens, handle)
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.name,
                "remote_block_ids": [tid], "transfer_id": tid, "remote_host": self.kv_addrs[0],
                "remote_hosts": self.kv_addrs, "remote_port": self.kv_port,
                "kv_bytes": self.shape.kv_bytes(tokens), "prompt_tokens": tokens}

    async def serve_kv(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One pull: ``GET <id>\\n`` -> 8-byte big-endian length, then that many bytes. While the
        pull runs the KV is held whatever its age (vLLM's NIXL lease is renewed while the decode
        instance works on the request); a pull that fails leaves it held for another kv_hold_s."""
        tid = ""
        try:
            line = await asyncio.wait_for(reader.readline(), self.timing.kv_timeout_s)
            tid = line.decode(errors="replace").strip().removeprefix("GET ")
            got = self._held.get(tid)
            if got is None:
                writer.write(struct.pack(">Q", 2**64 - 1))
                await writer.drain()
                return
            got[1].cancel()
            n = self.shape.kv_bytes(got[0])
            writer.write(struct.pack(">Q", n))
            sent = 0
            while sent < n:
                chunk = _ZEROS[:min(len(_ZEROS), n - sent)]
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
            got = self._held.pop(tid, None)
            if got is not None:
                got[1].cancel()
                await self.release(got[0])
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()
            got = self._held.get(tid)
            if got is not None:  # not pulled to the end: the lease runs again
                self._held[tid] = (got[0], asyncio.get_running_loop().call_later(self.timing.kv_hold_s,
                                                                                  self._expire, tid))

    def kv_route(self, params: dict) -> tuple[str, str | None]:
        """(prefill address, own address) of a pull: the first of this instance's KV addresses
        (its home rail first) that shares a subnet with an address the prefill advertised, so a
        gateway that narrows ``remote_hosts`` to one rail moves the pull onto that rail."""
        hosts = params.get("remote_hosts") or [params["remote_host"]]
        for bind in self.kv_binds:
            mine = ipaddress.ip_interface(f"{bind}/24").network
            for h in hosts:
                if ipaddress.ip_address(h) in mine:
                    return h, bind
        return hosts[0], None

    async def pull_kv(self, params: dict) -> int:
        """Fetch the prompt's KV from the prefill instance named in params; bytes received."""
        host, bind = self.kv_route(params)
        self._pulls += 1
        self._no_pulls.clear()
        try:
            return await self._pull(host, bind, params)
        finally:
            self._pulls -= 1
            if self._pulls == 0:
                self._no_pulls.set()

    async def _pull(self, host: str, bind: str | None, params: dict) -> int:
        reader, writer = await asyncio.open_connection(host, int(params["remote_port"]),
                                                       local_addr=(bind, 0) if bind else None)
        try:
            writer.write(f"GET {params['transfer_id']}\n".encode())
            await writer.drain()
            (n,) = struct.unpack(">Q", await reader.readexactly(8))
            if n == 2**64 - 1:
                raise LookupError(f"KV {params['transfer_id']} not held by {params.get('remote_engine_id')}")
            got = 0
            while got < n:
                chunk = await reader.read(min(1 << 20, n - got))
                if not chunk:
                    raise ConnectionError(f"KV transfer closed after {got} of {n} bytes")
                got += len(chunk)
            return got
        finally:
            writer.close()

    # ---- decode -----------------------------------------------------------------------------
    def join(self, max_tokens: int) -> _Seq:
        seq = _Seq(remaining=max(1, max_tokens))
        if len(self._running) < self.timing.max_batch:
            self._running.append(seq)
        else:
            self._queued.append(seq)
        self._wake.set()
        if self._loop_task is None:
            self._loop_task = asyncio.ensure_future(self._decode_loop())
        return seq

    async def _decode_loop(self) -> None:
        t = self.timing
        while True:
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            if t.kv_blocking:
                await self._no_pulls.wait()
            await asyncio.sleep(t.decode_base_s + t.decode_per_seq_s * (len(self._running) - 1))
            for seq in self._running:
                seq.remaining -= 1
                seq.out.put_nowait(seq.remaining == 0)
            self._running = [s for s in self._running if s.remaining > 0]
            while self._queued and len(self._running) < t.max_batch:
                self._running.append(self._queued.popleft())

    def leave(self, seq: _Seq) -> None:
        seq.remaining = 0
        if seq in self._running:
            self._running.remove(seq)
        if seq in self._queued:
            self._queued.remove(seq)

    def metrics(self) -> str:
        usage = self.kv_used / self.timing.kv_capacity_tokens
        lab = f'{{model_name="{self.shape.name}",engine="{self.name}"}}'
        rows = [("vllm:num_requests_waiting", "Requests waiting to be processed.", self.waiting + len(self._queued)),
                ("vllm:num_requests_running", "Requests in the model execution batch.", len(self._running)),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
                ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (vLLM V0 name).", usage)]
        return "".join(f"# HELP {n} {h}\n# TYPE {n} gauge\n{n}{lab} {v}\n" for n, h, v in rows)


# ---- HTTP ---------------------------------------------------------------------------------------

def count_tokens(body: dict) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content") or "") for m in body["messages"] if isinstance(m, dict))
    else:
        p = body.get("prompt", "")
        text = " ".join(p) if isinstance(p, list) else str(p)
    return max(1, len(text.split()))


def _error(status: int, message: str, kind: str = "invalid_request_error"):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status)


def build_app(engine: Engine):
    """The instance's Starlette app: /v1/completions, /v1/chat/completions, /v1/models, /metrics."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def completions(request: Request):
        chat = request.url.path.endswith("/chat/completions")
        try:
            body = await request.json()
            assert isinstance(body, dict)
        except Exception:
            return _error(400, "request body is not a JSON object")
        n_in = count_tokens(body)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        params = body.get("kv_transfer_params") or {}
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        model = body.get("model") or engine.shape.name
        if params.get("do_remote_decode"):
            if engine.role == "decode":
                return _error(400, f"{engine.name} is a decode instance")
            out = await engine.prefill_for_remote(n_in)
            usage = {"prompt_tokens": n_in, "completion_tokens": 1, "total_tokens": n_in + 1}
            choice = ({"index": 0, "message": {"role": "assistant", "content": "tok"}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": "tok", "finish_reason": "length", "logprobs": None})
            return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                 "created": int(time.time()), "model": model, "choices": [choice],
                                 "usage": usage, "kv_transfer_params": out})
        if engine.role == "prefill":
            return _error(400, f"{engine.name} is a prefill instance; send kv_transfer_params.do_remote_decode")
        reserved = n_in + max_tokens
        engine.waiting += 1
        try:
            await engine.reserve(reserved)
            if params.get("transfer_id"):
                try:
                    await asyncio.wait_for(engine.pull_kv(params), engine.timing.kv_timeout_s)
                except (OSError, LookupError, asyncio.TimeoutError, asyncio.IncompleteReadError, KeyError) as e:
                    await engine.release(reserved)
                    return _error(503, f"KV transfer failed: {type(e).__name__}: {e}", "server_error")
            else:
                await engine.compute_prefill(n_in)
        except BaseException:
            engine.waiting -= 1
            raise
        engine.waiting -= 1
        seq = engine.join(max_tokens)
        usage = {"prompt_tokens": n_in, "completion_tokens": max_tokens, "total_tokens": n_in + max_tokens}

        def chunk(last: bool) -> dict:
            c = {"index": 0, "finish_reason": "length" if last else None}
            c.update({"delta": {"content": "tok "}} if chat else {"text": "tok ", "logprobs": None})
            return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": int(time.time()), "model": model, "choices": [c]}

        if not body.get("stream"):
            try:
                while not await seq.out.get():
                    pass
            finally:
                engine.leave(seq)
                await engine.release(reserved)
            text = "tok " * max_tokens
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length", "logprobs": None})
            return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                 "created": int(time.time()), "model": model, "choices": [choice], "usage": usage})
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def stream():
            try:
                if chat:
                    first = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                             "model": model,
                             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]}
                    yield f"data: {json.dumps(first)}\n\n"
                last = False
                while not last:
                    last = await seq.out.get()
                    yield f"data: {json.dumps(chunk(last))}\n\n"
                if with_usage:
                    yield f"data: {json.dumps({'id': rid, 'object': chunk(True)['object'], 'created': int(time.time()), 'model': model, 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                engine.leave(seq)
                await engine.release(reserved)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": engine.shape.name, "object": "model",
                                                         "owned_by": "seamguard-testbed"}]})

    async def metrics(request: Request):
        return PlainTextResponse(engine.metrics(), media_type="text/plain; version=0.0.4")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/chat/completions", completions, methods=["POST"]),
                             Route("/v1/models", models), Route("/metrics", metrics)])


async def serve(args: argparse.Namespace) -> None:
    import uvicorn

    timing = PoolTiming(**{k: getattr(args, k) for k in PoolTiming.__dataclass_fields__})
    kv_addrs = [a for a in (args.kv_addrs or args.host).split(",") if a]
    kv_binds = [a for a in (args.kv_bind or "").split(",") if a]
    engine = Engine(args.name, args.role, SHAPES[args.model_shape], timing, kv_addrs, args.kv_port, kv_binds)
    kv_server = None
    if args.role in ("prefill",):
        kv_server = await asyncio.start_server(engine.serve_kv, "0.0.0.0", args.kv_port)
    server = uvicorn.Server(uvicorn.Config(build_app(engine), host=args.host, port=args.port, log_level="warning",
                                           access_log=False, lifespan="off"))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise SystemExit(f"{args.name}: server stopped before it started")
        await asyncio.sleep(0.02)
    print("READY " + json.dumps({"name": args.name, "role": args.role, "port": args.port,
                                 "kv_port": args.kv_port, "shape": asdict(engine.shape)}), flush=True)
    await task
    if kv_server is not None:
        kv_server.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m seamguard.testbed.inference_pool",
                                description="One emulated prefill/decode/unified inference instance.")
    p.add_argument("--role", choices=("prefill", "decode", "unified"), required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--host", default="127.0.0.1", help="address of the OpenAI API")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--kv-port", type=int, default=8200, help="prefill: TCP port the KV is pulled from")
    p.add_argument("--kv-addrs", default="", help="prefill: comma list of addresses it advertises for KV pulls")
    p.add_argument("--kv-bind", default=None,
                   help="decode: comma list of its own addresses to pull KV from, one per NIC, the home rail "
                        "first; a pull leaves from the first one in a subnet the prefill advertised")
    p.add_argument("--model-shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    for k, f in PoolTiming.__dataclass_fields__.items():
        if isinstance(f.default, bool):
            p.add_argument("--" + k.replace("_", "-"), action="store_true")
        else:
            p.add_argument("--" + k.replace("_", "-"), type=type(f.default), default=f.default)
    return p


@dataclass
class PoolProcess:
    """A running instance (see launch)."""

    name: str
    proc: subprocess.Popen

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)


def launch(exec_prefix: list[str], args: list[str], timeout_s: float = 20.0, env: dict | None = None) -> PoolProcess:
    """Start one instance (e.g. inside a testbed host: exec_prefix = tb.exec_prefix(h)) and wait,
    bounded, for its READY line."""
    import select

    cmd = [*exec_prefix, sys.executable, "-m", "seamguard.testbed.inference_pool", *args]
    import tempfile

    err = tempfile.TemporaryFile(mode="w+")  # never a pipe nobody reads
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    name = args[args.index("--name") + 1] if "--name" in args else "?"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if line.startswith("READY "):
                return PoolProcess(name, proc)
            if not line and proc.poll() is not None:
                break
    PoolProcess(name, proc).stop()
    err.seek(0)
    raise RuntimeError(f"inference_pool {name} did not start: {err.read()[-2000:]}")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
