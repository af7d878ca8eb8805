"""Bounds on relaying a backend's answer: how long it may stay silent, how much it may generate,
and noticing the client leave.

The gateway (app.py) reads a streamed answer through `bounded`, which ends it with a 504 when
the first token, or the next one, does not come in time: only a chunk with output counts as a
token, so a backend that sends SSE keep-alive comments or empty chunks cannot hold a client
(and its key's in-flight slot) for ever. `client_gone` completes when the client disconnects;
`bounded` and `until_gone` then stop waiting on the backend, and the caller closes the backend
request (vLLM aborts a request whose connection closes). `OutputCap` stops a stream at the
reservation: the forwarded body already caps the backend (admission.capped_body), this is the
second wall for a backend that does not honour it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from seamguard.gateway.hedge import is_token, outputs_in
from seamguard.gateway.proxy import UpstreamError

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was complete."""


async def client_gone(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Return when the ASGI server reports the client's connection closed (call it once the body
    has been read: every later message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _left(gone: asyncio.Future | None) -> bool:
    """Whether the client has left (a watch cancelled because the request ended is not a departure)."""
    return gone is not None and gone.done() and not gone.cancelled()


async def until_gone(gone: asyncio.Future | None, work: Awaitable[T]) -> T:
    """``work``'s result, or `ClientGone` (``work`` cancelled) if the client leaves first."""
    if gone is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not _left(gone):  # the watch itself was cancelled: just the work
            await asyncio.wait({task})
    except BaseException:  # our own wait cancelled (a deadline): the work goes with it
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    return task.result()


async def bounded(lines: AsyncIterator[str], gone: asyncio.Future | None, first_token_s: float,
                  between_tokens_s: float) -> AsyncIterator[str]:
    """``lines`` (SSE payloads) as they come, until a token is late: `UpstreamError` 504 when the
    first token takes longer than ``first_token_s`` or the next one than ``between_tokens_s``
    (payloads without output do not reset the clock), `ClientGone` when the client leaves.

    Each read waits under its own deadline (no task per line, and whichever task iterates);
    a departure moves the deadline of the read in progress to now."""
    it = aiter(lines)
    loop = asyncio.get_running_loop()
    got_token, since = False, loop.time()
    reading: list[asyncio.Timeout] = []

    def on_gone(_: asyncio.Future) -> None:
        if _left(gone):
            for cm in reading:
                cm.reschedule(loop.time())

    if gone is not None:
        gone.add_done_callback(on_gone)
    try:
        while True:
            if _left(gone):
                raise ClientGone()
            limit_s = between_tokens_s if got_token else first_token_s
            try:
                async with asyncio.timeout_at(since + limit_s) as cm:
                    reading.append(cm)
                    try:
                        data = await anext(it)
                    finally:
                        reading.remove(cm)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if _left(gone):
                    raise ClientGone() from None
                raise UpstreamError(504, f"the backend sent no {'next' if got_token else 'first'} token within "
                                         f"{limit_s:g} s", "timeout") from None
            if is_token(data):
                got_token, since = True, loop.time()
            yield data
    finally:
        if gone is not None:
            gone.remove_done_callback(on_gone)


@dataclass
class OutputCap:
    """Counts the output a stream relays (one per choice per chunk with output) against the
    reservation's ``limit``: `over` says a chunk would pass it."""

    limit: int
    relayed: int = 0

    def over(self, chunk: dict) -> bool:
        n = outputs_in(chunk)
        if self.relayed + n > self.limit:
            return True
        self.relayed += n
        return False


def cut_events(last: dict, open_choices: set[int], usage: dict | None) -> list[dict]:
    """The chunks that end a stream the gateway cut at its reservation: ``finish_reason: length``
    for each choice still open, then the usage (when the client asked for it)."""
    base = {k: last[k] for k in ("id", "object", "created", "model") if k in last}
    chat = str(last.get("object", "")).startswith("chat")
    out = [{**base, "choices": [{"index": i, "delta": {}, "finish_reason": "length"} if chat else
                                {"index": i, "text": "", "finish_reason": "length"} for i in sorted(open_choices)]}]
    if usage is not None:
        out.append({**base, "choices": [], "usage": usage})
    return out
