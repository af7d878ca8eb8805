"""Attacks on the gateway's token budgets: asking the backend for more than was reserved, prompts the
estimate does not see, backend usage that lies, and waits that hold a key's slot.

Each gateway here is the real HTTP gateway, reached with the ``openai`` client (httpx where a
client must leave mid-request), in front of the vLLM-like stand-in backend; what an attack
really cost is the backend's own record (`FakeBackend.bills`: prompt tokens it counted and
tokens it generated), compared with the key's budget and with what the gateway charged.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from tests.gateway.conftest import ADMIN_TOKEN, KEY_B, base_config, eventually

T0 = 1_800_000_030.0  # a frozen clock: every request in one minute, so budgets are exact
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MSG = [{"role": "user", "content": "x"}]  # estimated 1 + 4 prompt tokens; the stand-in counts 1 + 3


def _cfg(backend_url: str, store: dict, timeouts: dict | None = None, **key_limits: Any) -> dict:
    cfg = base_config(backend_url, store, **({"timeouts": timeouts} if timeouts else {}))
    cfg["tenants"][0]["keys"][1].update(key_limits)
    return cfg


def _sqlite(tmp_path) -> dict:
    return {"type": "sqlite", "path": str(tmp_path / "gw.db")}


def _client(url: str, timeout_s: float = 20.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY_B, max_retries=0, timeout=timeout_s)


def _used(url: str) -> dict:
    keys = httpx.get(url + "/admin/keys", headers=ADMIN, timeout=10).json()["keys"]
    return next(k for k in keys if k["name"] == "b")["used"]


def _status(call) -> int:
    try:
        call()
        return 200
    except openai.APIStatusError as e:
        return e.status_code


def test_concurrent_requests_without_max_tokens_spend_past_the_tpm(redis_url, gateway_factory, tmp_path, observed):
    """19 concurrent chat requests without max_tokens on a 10,000-TPM key (Redis store), each left to generate to the context limit.
    Refused: each reserves the 512-token default and the backend is sent that cap: the backend's real spend (prompt + generated) stays within 10,000, and the key is charged all of it."""
    fb = FakeBackend(ttft_s=0.3, max_model_len=4096)  # requests overlap: each reserves before any ends
    with ThreadedServer(fb.app()) as be:
        store = {"type": "redis", "url": redis_url, "prefix": "budget-conc:", "ledger": str(tmp_path / "l.db")}
        url, _ = gateway_factory(_cfg(be.url, store, tpm=10_000), clock=lambda: T0)
        c = _client(url)
        with ThreadPoolExecutor(19) as ex:
            codes = list(ex.map(lambda _: _status(lambda: c.chat.completions.create(model="fake-model", messages=MSG)),
                                range(19)))
        eventually(lambda: _used(url)["inflight"] == 0)
        charged = _used(url)["tokens_last_minute"]
        observed(f"HTTP {sorted(codes)}; backend spent {fb.spent()} tokens "
                 f"(generated {sum(b.completion for b in fb.bills)}); key charged {charged} of 10,000")
    assert fb.spent() <= 10_000
    assert charged >= fb.spent()
    assert {(b["max_tokens"], b["max_completion_tokens"]) for b in fb.seen} == {(512, 512)}  # the cap it was sent
    assert all(s in (200, 429) for s in codes) and codes.count(200) >= 1


def test_max_completion_tokens_1_with_max_tokens_100000(gateway_factory, tmp_path, observed):
    """A completion asking max_completion_tokens 1 (what the gateway read) and max_tokens 100,000 (what vLLM's /v1/completions reads) on a 2,000-TPM key.
    Refused: the reservation is the larger of the two, which no 2,000-token budget holds: 400 request_too_large, nothing generated."""
    fb = FakeBackend(max_model_len=131_072)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=2000), clock=lambda: T0)
        code = _status(lambda: _client(url, 60).completions.create(
            model="fake-model", prompt="x", max_tokens=100_000, extra_body={"max_completion_tokens": 1}))
        eventually(lambda: _used(url)["inflight"] == 0)
        observed(f"HTTP {code}; backend generated {sum(b.completion for b in fb.bills)} tokens; "
                 f"key charged {_used(url)['tokens_last_minute']} of 2,000")
    assert code == 400
    assert fb.spent() <= 2000


def test_a_450_kb_tools_array_is_not_counted(gateway_factory, tmp_path, observed):
    """A chat request carrying a 450 KB tools array (about 112,000 prompt tokens) on a 20,000-TPM key.
    Refused: tools are counted as prompt text, so the request can never fit: 400 request_too_large and nothing sent to the backend."""
    fb = FakeBackend(max_model_len=200_000)
    tool = {"type": "function", "function": {"name": "f", "description": "d " * 2000,
                                             "parameters": {"type": "object", "properties": {}}}}
    tools = [dict(tool, function={**tool["function"], "name": f"f{i}"}) for i in range(112)]
    size_kb = len(json.dumps(tools)) / 1000
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=20_000), clock=lambda: T0)
        code = _status(lambda: _client(url).chat.completions.create(
            model="fake-model", messages=MSG, max_tokens=10, tools=tools))
        observed(f"tools {size_kb:.0f} KB: HTTP {code}; backend counted {fb.spent()} tokens against a 20,000 TPM")
    assert code == 400
    assert fb.spent() <= 20_000


def test_message_content_given_as_a_dict_is_not_counted(gateway_factory, tmp_path, observed):
    """A chat message whose content is a dict holding 30,000 words, on a 20,000-TPM key.
    Refused: content in any form is counted (a dict as its JSON text): 400 request_too_large, nothing generated."""
    fb = FakeBackend(max_model_len=200_000)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=20_000), clock=lambda: T0)
        body = {"model": "fake-model", "max_tokens": 10,
                "messages": [{"role": "user", "content": {"type": "text", "text": "word " * 30_000}}]}
        r = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY_B}"},
                       timeout=20)
        observed(f"HTTP {r.status_code}; backend counted {fb.spent()} tokens; key charged "
                 f"{_used(url)['tokens_last_minute']} of 20,000")
    assert r.status_code == 400
    assert fb.spent() <= 20_000


def test_a_prompt_list_mixing_token_ids_and_text_is_not_counted(gateway_factory, tmp_path, observed):
    """A completion whose prompt list mixes a 30,000-id token list with a string, on a 20,000-TPM key.
    Refused: every element of every prompt shape is counted (ids one each, strings as text): 400 request_too_large."""
    fb = FakeBackend(max_model_len=200_000)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=20_000), clock=lambda: T0)
        code = _status(lambda: _client(url).completions.create(
            model="fake-model", prompt=[list(range(30_000)), "x"], max_tokens=10))  # type: ignore[arg-type]
        observed(f"HTTP {code}; backend counted {fb.spent()} tokens; key charged "
                 f"{_used(url)['tokens_last_minute']} of 20,000")
    assert code == 400
    assert fb.spent() <= 20_000


def test_negative_usage_from_the_backend_wipes_the_counters(gateway_factory, tmp_path, observed):
    """A backend reporting usage of -100,000 prompt and -5 completion tokens, after the key has spent 504 tokens this minute.
    Refused: the usage is malformed, so the request is charged its whole reservation: 200, and the key's minute and day counters only grow."""
    fb = FakeBackend()
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=10_000), clock=lambda: T0)
        c = _client(url)
        assert _status(lambda: c.chat.completions.create(model="fake-model", messages=MSG, max_tokens=500)) == 200
        before = _used(url)
        fb.usage_override = {"prompt_tokens": -100_000, "completion_tokens": -5, "total_tokens": -100_005}
        code = _status(lambda: c.chat.completions.create(model="fake-model", messages=MSG, max_tokens=100))
        eventually(lambda: _used(url)["inflight"] == 0)
        after = _used(url)
        observed(f"HTTP {code}; minute counter {before['tokens_last_minute']} -> {after['tokens_last_minute']}, "
                 f"day {before['tokens_today']} -> {after['tokens_today']}")
    assert code == 200
    assert after["tokens_last_minute"] == before["tokens_last_minute"] + 5 + 100  # the whole reservation
    assert after["tokens_today"] == before["tokens_today"] + 5 + 100


def test_usage_sent_as_floats_is_charged_as_almost_nothing(gateway_factory, tmp_path, observed):
    """A backend reporting usage as floats (4.0 prompt, 5000.0 completion tokens) for a 5,000-token answer.
    Refused: an integral float is the integer it spells: 5,004 tokens charged, not the 5 the estimate alone gives."""
    fb = FakeBackend(max_model_len=8192,
                     usage_override={"prompt_tokens": 4.0, "completion_tokens": 5000.0, "total_tokens": 5004.0})
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=10_000), clock=lambda: T0)
        code = _status(lambda: _client(url).chat.completions.create(model="fake-model", messages=MSG,
                                                                     max_tokens=5000))
        eventually(lambda: _used(url)["inflight"] == 0)
        charged = _used(url)["tokens_last_minute"]
        observed(f"HTTP {code}; backend generated {sum(b.completion for b in fb.bills)}; key charged {charged}")
    assert code == 200
    assert charged == 5004


def test_a_backend_streaming_past_max_tokens_is_relayed_and_charged(gateway_factory, tmp_path, observed):
    """A backend that ignores the max_tokens it is sent and streams 50 tokens to a request reserved for 10.
    Refused: the gateway relays 10 tokens, ends the stream itself (finish_reason length, [DONE]), closes the backend request and charges no more than the reservation."""
    fb = FakeBackend(per_token_s=0.01, ignore_max_tokens=50)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=10_000), clock=lambda: T0)
        chunks = list(_client(url).chat.completions.create(model="fake-model", messages=MSG, max_tokens=10,
                                                           stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        usage = chunks[-1].usage
        eventually(lambda: _used(url)["inflight"] == 0)
        eventually(lambda: bool(fb.bills) and fb.bills[-1].ended_at is not None)
        charged = _used(url)["tokens_last_minute"]
        observed(f"relayed {len(text.split())} tokens, finish {finish}, usage shown {usage and usage.total_tokens}; "
                 f"backend generated {fb.bills[-1].completion}; key charged {charged} (reserved 15)")
    assert len(text.split()) == 10 and finish == ["length"]
    assert usage is not None and usage.completion_tokens == 10
    assert charged <= 5 + 10
    assert fb.bills[-1].completion < 50   # its stream was closed, so it stopped


def test_a_keep_alive_only_backend_holds_the_client_and_the_slot(gateway_factory, tmp_path, observed):
    """A backend that answers a stream with SSE keep-alive comments only, never a token (first-token deadline 1 s).
    Refused: keep-alives are not tokens: the client gets a 504 upstream_timeout within the first-token deadline, the backend stream is closed and the key's in-flight slot freed."""
    fb = FakeBackend(keepalive_only_s=0.2)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), timeouts={"first_token_s": 1.0,
                                                                           "between_tokens_s": 1.0},
                                      concurrency=1), clock=lambda: T0)
        t0 = time.monotonic()
        try:
            list(_client(url, timeout_s=8).chat.completions.create(model="fake-model", messages=MSG, max_tokens=10,
                                                                   stream=True))
            got = "a stream without error"
        except openai.APIStatusError as e:
            got = f"HTTP {e.status_code} {e.code}"
        except openai.APIError as e:
            got = f"{type(e).__name__}"
        waited_s = time.monotonic() - t0
        time.sleep(0.5)
        ended = fb.bills[-1].ended_at is not None if fb.bills else False
        inflight = _used(url)["inflight"]
        observed(f"client: {got} after {waited_s:.1f} s; backend stream closed: {ended}; key in flight: {inflight}")
    assert got == "HTTP 504 upstream_timeout"
    assert waited_s < 4.0
    assert ended and inflight == 0


def test_keep_alives_after_the_first_tokens_hold_the_stream_open(gateway_factory, tmp_path, observed):
    """A backend that streams 2 tokens, then only SSE keep-alive comments (between-token deadline 1 s).
    Refused: keep-alives do not reset the between-token deadline: the client gets its 2 tokens and an upstream_timeout error event within seconds, the backend stream is closed and the slot freed."""
    fb = FakeBackend(keepalive_only_s=0.2, tokens_before_keepalive=2)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), timeouts={"between_tokens_s": 1.0},
                                      concurrency=1), clock=lambda: T0)
        text, got = [], "a stream that ended without error"
        t0 = time.monotonic()
        try:
            for ch in _client(url, timeout_s=8).chat.completions.create(model="fake-model", messages=MSG,
                                                                         max_tokens=10, stream=True):
                text.extend(c.delta.content or "" for c in ch.choices)
        except openai.APIError as e:
            got = f"{type(e).__name__}: {e.message[:80]}"
        waited_s = time.monotonic() - t0
        time.sleep(0.5)
        ended = fb.bills[-1].ended_at is not None if fb.bills else False
        inflight = _used(url)["inflight"]
        observed(f"client got {''.join(text)!r} then {got} after {waited_s:.1f} s; backend stream closed: {ended}; "
                 f"key in flight: {inflight}")
    assert "".join(text) == "tok0 tok1"
    assert "next token within 1 s" in got and waited_s < 4.0
    assert ended and inflight == 0


def test_a_client_that_leaves_a_keep_alive_stream_keeps_the_backend_and_slot(gateway_factory, tmp_path, observed):
    """A client that opens a stream to a keep-alive-only backend and leaves after 1 s (first-token deadline: the default 120 s).
    Refused: the disconnect is noticed at once: the backend stream is closed and the key's in-flight slot freed within seconds, not at the slot's 15-minute expiry."""
    fb = FakeBackend(keepalive_only_s=0.2)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), concurrency=1), clock=lambda: T0)
        body = {"model": "fake-model", "messages": MSG, "max_tokens": 10, "stream": True}
        try:
            httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY_B}"},
                       timeout=1.0)
        except httpx.TimeoutException:
            pass   # the client gives up and closes its connection
        left = time.monotonic()
        deadline = left + 5.0
        while time.monotonic() < deadline and not (fb.bills and fb.bills[-1].ended_at is not None
                                                   and _used(url)["inflight"] == 0):
            time.sleep(0.05)
        ended = fb.bills[-1].ended_at if fb.bills else None
        inflight = _used(url)["inflight"]
        observed(f"backend stream closed {f'{ended - left:.1f} s after the client left' if ended else 'never (5 s)'}; "
                 f"key in flight: {inflight}")
    assert ended is not None and ended - left < 3.0
    assert inflight == 0


def test_a_non_streamed_request_runs_on_after_its_client_left(gateway_factory, tmp_path, observed):
    """A client that sends a non-streamed request for 200 slow tokens (10 s) and leaves after 1 s.
    Refused: the gateway notices the disconnect and cancels the backend request (the backend aborts it), frees the in-flight slot, and charges the reservation (how far the backend got is unknown)."""
    fb = FakeBackend(per_token_s=0.05)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), concurrency=1), clock=lambda: T0)
        body = {"model": "fake-model", "messages": MSG, "max_tokens": 200}
        try:
            httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY_B}"},
                       timeout=1.0)
        except httpx.TimeoutException:
            pass
        left = time.monotonic()
        deadline = left + 5.0
        while time.monotonic() < deadline and not (fb.bills and fb.bills[-1].ended_at is not None):
            time.sleep(0.05)
        bill = fb.bills[-1]
        eventually(lambda: _used(url)["inflight"] == 0, timeout_s=12)
        charged = _used(url)["tokens_last_minute"]
        observed(f"backend {'aborted' if bill.aborted else 'finished'} after {bill.completion} of 200 tokens, "
                 f"{(bill.ended_at - left) if bill.ended_at else float('nan'):.1f} s after the client left; "
                 f"key charged {charged}")
    assert bill.aborted and bill.ended_at is not None and bill.ended_at - left < 3.0
    assert charged == 5 + 200


@pytest.mark.parametrize("usage", [{"prompt_tokens": "4", "completion_tokens": "3"},
                                   {"prompt_tokens": True, "completion_tokens": 3},
                                   {"prompt_tokens": 4, "completion_tokens": 3.5}])
def test_malformed_usage_from_the_backend(gateway_factory, tmp_path, observed, usage):
    """A backend reporting usage as strings, booleans or fractions.
    Refused: not non-negative integers, so the request is charged its whole reservation (5 + 3), and the client sees that usage."""
    fb = FakeBackend(usage_override=usage)
    with ThreadedServer(fb.app()) as be:
        url, _ = gateway_factory(_cfg(be.url, _sqlite(tmp_path), tpm=10_000), clock=lambda: T0)
        out = _client(url).chat.completions.create(model="fake-model", messages=MSG, max_tokens=3)
        eventually(lambda: _used(url)["inflight"] == 0)
        charged = _used(url)["tokens_last_minute"]
        observed(f"usage {usage}: shown {out.usage and out.usage.total_tokens}, key charged {charged}")
    assert charged == 5 + 3
    assert out.usage is not None and out.usage.total_tokens == 8
