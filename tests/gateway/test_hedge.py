"""Hedging a streamed request whose KV transfer stalls (gateway/hedge.py, app._first_of): the
budget, the stream head, and through the HTTP gateway with the `openai` client."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from seamguard.gateway.app import build_gateway, create_app
from seamguard.gateway.config import parse_gateway_config
from seamguard.gateway.hedge import HedgeBudget, is_token, read_to_first_content, replay
from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from tests.gateway.conftest import KEY_A, base_config


def test_budget_allows_a_burst_then_about_its_share():
    b = HedgeBudget(share=0.1, burst=2)
    assert [b.try_spend() for _ in range(3)] == [True, True, False]
    for _ in range(9):
        b.on_request()
    assert not b.try_spend()   # 0.9 of a token
    b.on_request()
    assert b.try_spend() and not b.try_spend()
    for _ in range(100):
        b.on_request()
    assert b.tokens == 2   # never more than the burst
    with pytest.raises(ValueError, match="share must be in"):
        HedgeBudget(share=1.5, burst=10)


def test_stream_head_ends_at_the_first_token_and_the_rest_follows():
    role = '{"choices":[{"delta":{"role":"assistant","content":""}}]}'
    tok = '{"choices":[{"delta":{"content":"hi"}}]}'

    async def lines():
        for x in (role, tok, tok, "[DONE]"):
            yield x

    async def go():
        it = lines()
        head = await read_to_first_content(it)
        return head, [x async for x in replay(head, it)]

    head, everything = asyncio.run(go())
    assert head == [role, tok] and is_token(tok) and not is_token(role)
    assert everything == [role, tok, tok, "[DONE]"]


def _served(d0_first_token_s: float, hedge_share: float, tmp_path):
    """One prefill and two decode instances behind the gateway with the seamguard router; 12
    streamed requests teach it the paths (a token at once), then d0's first token takes
    ``d0_first_token_s`` (its KV transfer stalls). Streams requests until one was first routed
    to d0; returns (its TTFT seen by the client, its route header, /metrics, /admin/routing, the
    number of requests streamed)."""
    p0 = FakeBackend(name="p0")
    d0, d1 = FakeBackend(name="d0", per_token_s=0.001), FakeBackend(name="d1", per_token_s=0.001)
    with ThreadedServer(p0.app()) as ps, ThreadedServer(d0.app()) as s0, ThreadedServer(d1.app()) as s1:
        cfg = base_config(ps.url, {"type": "sqlite", "path": str(tmp_path / "gw.db")}, router="seamguard",
                          hedge={"share": hedge_share, "burst": 5},
                          instances=[{"name": "p0", "url": ps.url, "role": "prefill"},
                                     {"name": "d0", "url": s0.url, "role": "decode"},
                                     {"name": "d1", "url": s1.url, "role": "decode"}])
        gw = build_gateway(parse_gateway_config(cfg, "test.yaml"))
        with ThreadedServer(create_app(gw, "t" * 24)) as g:
            client = openai.OpenAI(base_url=g.url + "/v1", api_key=KEY_A, max_retries=0)

            def one() -> tuple[float, str]:
                t0 = time.perf_counter()
                raw = client.chat.completions.with_raw_response.create(
                    model="fake-model", max_tokens=4, stream=True, messages=[{"role": "user", "content": "hi"}])
                ttft = None
                for chunk in raw.parse():
                    if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                        ttft = time.perf_counter() - t0
                return ttft, raw.headers["x-seamguard-route"]

            for _ in range(12):
                one()
            d0.ttft_s = d0_first_token_s
            seen = len(d0.seen)
            for n in range(13, 41):   # the router may prefer d1 for a while on a loaded machine
                ttft, route = one()
                if len(d0.seen) > seen:
                    metrics = httpx.get(g.url + "/metrics", headers={"Authorization": "Bearer " + "t" * 24}).text
                    routing = httpx.get(g.url + "/admin/routing", headers={"Authorization": "Bearer " + "t" * 24}).json()
                    return ttft, route, metrics, routing, n
    raise AssertionError("no request was routed to d0")


def test_a_stalled_stream_is_answered_by_a_hedge_on_another_path_and_billed_once(tmp_path):
    ttft, route, metrics, routing, n = _served(3.0, 0.1, tmp_path)
    assert route == "p0->d1"                       # the copy that answered first
    assert ttft < 1.5                              # not the 3 s the stalled transfer would take
    hedge = [r for r in routing["snapshot"]["recent"] if r["kind"] == "hedge"]
    assert hedge and hedge[-1]["reason"].startswith("no first token over p0->d0 after")
    assert hedge[-1]["path"] == "p0->d1"
    assert 'seamguard_gateway_route_decisions_total{kind="hedge"} 1.0' in metrics
    # billed once: n requests of 4 completion tokens each, the hedged one counted once
    assert f'seamguard_gateway_tokens_total{{key="a",kind="completion",tenant="acme"}} {4.0 * n}' in metrics


def test_without_a_hedge_budget_the_stalled_stream_waits_for_its_transfer(tmp_path):
    ttft, route, metrics, routing, _ = _served(1.2, 0.0, tmp_path)
    assert route == "p0->d0" and ttft >= 1.2
    assert not [r for r in routing["snapshot"]["recent"] if r["kind"] == "hedge"]
