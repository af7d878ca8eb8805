"""Attacks on what the gateway reads from a request: body size (memory), JSON shape, field types.

The size attacks run `seamguard gateway` as a child and read its peak resident memory
(/proc/<pid>/status VmHWM) before and after: a bound on memory, not on time.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.conftest import KEY_A, base_config
from tests.security.gateway_child import GatewayChild, child_config, child_port, post_raw

BODY_BYTES = 150_000_000
MAX_GROWTH_BYTES = 40_000_000   # the 16 MiB cap read in chunks, and the allocator's slack


def _sqlite(tmp_path):
    return {"type": "sqlite", "path": str(tmp_path / "gw.db")}


def openai_status(call) -> tuple[int, str]:
    """(HTTP status, error message) of an `openai` client call: 200 and "" when it succeeds."""
    try:
        call()
    except openai.APIStatusError as e:
        return e.status_code, e.message
    return 200, ""


def _chat(url: str, body: bytes | str, key: str = KEY_A) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", content=body, timeout=30,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def _peak_growth(tmp_path, backend, chunked: bool) -> tuple[int | None, int]:
    _, burl = backend
    with GatewayChild(tmp_path, child_config(burl, tmp_path, child_port())) as g:
        ok = _chat(g.url, b'{"model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}')
        assert ok.status_code == 200, ok.text   # the request path's own imports and buffers, before the baseline
        before = g.peak_rss_bytes()
        status = post_raw(g.url, "/v1/chat/completions", {"Authorization": f"Bearer {KEY_A}"}, BODY_BYTES, chunked)
        return status, g.peak_rss_bytes() - before


def test_a_150_mb_body_with_a_content_length_does_not_grow_memory(tmp_path, backend, observed):
    """A 150 MB chat body with a valid key and an honest Content-Length, to grow the gateway's memory.
    Refused: 413 on the Content-Length before a byte of the body is read; peak memory grows < 40 MB."""
    status, growth = _peak_growth(tmp_path, backend, chunked=False)
    observed(f"HTTP {status}; gateway peak RSS grew {growth / 1e6:.1f} MB")
    assert status == 413
    assert growth < MAX_GROWTH_BYTES


def test_a_150_mb_chunked_body_without_content_length_does_not_grow_memory(tmp_path, backend, observed):
    """A 150 MB chat body sent chunked (no Content-Length) with a valid key, to grow the gateway's memory.
    Refused: 413 once the body passes the cap while it is read; peak memory grows < 40 MB."""
    status, growth = _peak_growth(tmp_path, backend, chunked=True)
    observed(f"HTTP {status}; gateway peak RSS grew {growth / 1e6:.1f} MB")
    assert status == 413
    assert growth < MAX_GROWTH_BYTES


def test_deeply_nested_json_is_a_one_line_400(backend, gateway_factory, tmp_path, observed):
    """A chat body of 100,000 nested '[' (JSON deeper than Python recurses), to crash the parser.
    Refused: 400 with one line saying the body is nested too deeply."""
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path)))
    r = _chat(url, b"[" * 100_000 + b"]" * 100_000)
    mid = _chat(url, ('{"model": "fake-model", "messages": [{"role": "user", "content": "hi", "x": '
                      + "[" * 500 + "]" * 500 + "}]}").encode())
    observed(f"100k levels: HTTP {r.status_code} {r.text[:120]!r}; 500 levels: HTTP {mid.status_code}")
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"]
    assert "\n" not in r.json()["error"]["message"]
    assert mid.status_code == 400 and "nested deeper" in mid.json()["error"]["message"]


def test_stream_options_as_a_string_is_a_one_line_400(backend, gateway_factory, tmp_path, observed):
    """stream=true with stream_options given as a string (the SDK sends it unchecked), to crash the relay.
    Refused: 400 naming stream_options; no 500."""
    fb, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path)))
    c = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0)
    status, message = openai_status(lambda: list(c.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True,
        stream_options="include_usage")))  # type: ignore[arg-type]
    observed(f"HTTP {status}: {message[:120]!r}; backend saw {len(fb.seen)} request(s)")
    assert status == 400 and "stream_options" in message
    assert fb.seen == []


@pytest.mark.parametrize("field,value", [
    ("stream_options", {"include_usage": "yes"}), ("stream_options", ["include_usage"]),
    ("temperature", "hot"), ("stop", 7), ("tools", {"type": "function"}), ("response_format", "json"),
    ("n", True), ("user", ["x"]), ("logprobs", 1),
])
def test_known_fields_of_the_wrong_type_are_one_line_400s(backend, gateway_factory, tmp_path, observed, field, value):
    """A known OpenAI field sent with the wrong JSON type, to crash whichever part of the gateway reads it.
    Refused: 400 naming the field, before anything is reserved or forwarded."""
    fb, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path)))
    c = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0)
    status, message = openai_status(lambda: list(c.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True,
        extra_body={field: value})))
    observed(f"{field}={value!r}: HTTP {status} {message[:100]!r}; backend saw {len(fb.seen)} request(s)")
    assert status == 400 and field in message
    assert fb.seen == []


@pytest.mark.parametrize("raw", [
    b'{"model": "fake-model", "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "fake-model", "temperature": 1e400, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "fake-model", "messages": [{"role": 7, "content": "hi"}]}',
    b'{"model": "fake-model", "messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]}',
], ids=["nan", "1e400", "lone-surrogate", "role-not-a-string", "part-type-not-a-string"])
def test_json_the_proxy_cannot_forward_is_a_one_line_400(backend, gateway_factory, tmp_path, observed, raw):
    """JSON that parses but the gateway cannot use: NaN, 1e400, a lone surrogate, a non-string role or part type.
    Refused: 400 in one line, nothing forwarded; no 500."""
    fb, burl = backend
    url, _ = gateway_factory(base_config(burl, _sqlite(tmp_path)))
    r = _chat(url, raw)
    observed(f"HTTP {r.status_code} {r.text[:140]!r}")
    assert r.status_code == 400 and "\n" not in r.json()["error"]["message"]
    assert fb.seen == []
