"""Hedging a streamed request whose KV transfer stalls.

A path that turns slow is avoided for new requests as soon as the router sees it (routing.py),
but the requests already on it when it degraded are stuck with it: their KV crawls over the
slow link and their first token misses the TTFT target whatever the router does next. A hedged
request (Dean and Barroso, "The Tail at Scale", CACM 2013,
https://research.google/pubs/the-tail-at-scale/) gets a second chance: when a streamed,
disaggregated request has produced no token by the time its transfer counts as stalled (the
router's own rule, `stall_after_s`), the gateway sends it again along the path the router
chooses now and relays whichever copy produces its first token first; the other is closed
(vLLM aborts a request whose client went away). Nothing has reached the client before its
first token, so the switch is invisible to it; the client is billed once, for the copy it got.

Hedges are throttled like gRPC's retry throttling (https://github.com/grpc/proposal/blob/master/A6-client-retries.md):
every request adds ``share`` of a token up to ``burst`` tokens and a hedge spends one, so at
most about ``share`` of the requests are sent twice, and a fabric-wide slowdown, which makes
every transfer look stalled at once, cannot double the load. Pure bookkeeping here; the race
itself is in app.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass
class HedgeBudget:
    """Token bucket of hedges: ``share`` of a token per request, ``burst`` tokens at most."""

    share: float
    burst: float
    tokens: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.share <= 1.0 and self.burst >= 1.0):
            raise ValueError(f"hedge budget: share must be in [0, 1] and burst >= 1, got {self.share}, {self.burst}")
        self.tokens = self.burst

    def on_request(self) -> None:
        self.tokens = min(self.burst, self.tokens + self.share)

    def try_spend(self) -> bool:
        if self.tokens < 1.0 - 1e-9:   # ten shares of 0.1 make a token
            return False
        self.tokens -= 1.0
        return True


def outputs_in(chunk: dict) -> int:
    """How many choices of a streamed chunk carry output: a token, reasoning or a tool call."""
    choices = chunk.get("choices")
    n = 0
    for c in choices if isinstance(choices, list) else ():
        if not isinstance(c, dict):
            continue
        d = c.get("delta") if isinstance(c.get("delta"), dict) else {}
        if d.get("content") or d.get("reasoning_content") or d.get("tool_calls") or c.get("text"):
            n += 1
    return n


def content_in(chunk: dict) -> bool:
    """Whether a streamed chunk carries output."""
    return outputs_in(chunk) > 0


def _chunk(data: str) -> dict | None:
    try:
        chunk = json.loads(data)
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


def is_token(data: str) -> bool:
    """Whether one SSE ``data:`` payload carries output."""
    chunk = _chunk(data)
    return chunk is not None and content_in(chunk)


def _ends_head(data: str) -> bool:
    chunk = _chunk(data)
    return data == "[DONE]" or (chunk is not None and ("error" in chunk or content_in(chunk)))


async def read_to_first_content(lines: AsyncIterator[str]) -> list[str]:
    """The payloads up to and including the first one with content, ``[DONE]`` or an error (or
    all of them, when the stream ends before any)."""
    head: list[str] = []
    async for data in lines:
        head.append(data)
        if _ends_head(data):
            break
    return head


async def replay(head: list[str], lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The payloads already read, then the rest of the stream."""
    for data in head:
        yield data
    if head and head[-1] == "[DONE]":
        return
    async for data in lines:
        yield data
