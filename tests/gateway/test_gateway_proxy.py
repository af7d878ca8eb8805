"""Through the gateway with the official `openai` client: streaming and whole answers, usage, errors."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.conftest import ADMIN, ADMIN_TOKEN, KEY_A, KEY_B, base_config, eventually


def _client(url: str, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10.0)


def test_chat_streaming_and_whole_with_the_openai_client(backend, gateway_factory, tmp_path):
    fb, burl = backend
    url, _ = gateway_factory(base_config(burl, {"type": "sqlite", "path": str(tmp_path / "gw.db")}))
    c = _client(url)
    chunks = list(c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi there"}],
                                            max_tokens=5, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "tok0 tok1 tok2 tok3 tok4"
    assert all(ch.choices for ch in chunks), "the usage chunk the gateway asked for is not passed on unasked"
    assert fb.seen[-1]["stream_options"] == {"include_usage": True}
    with_usage = list(c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].usage.completion_tokens == 3
    whole = c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a b c"}],
                                      max_tokens=4)
    assert whole.choices[0].message.content == "tok0 tok1 tok2 tok3"
    assert whole.usage.prompt_tokens == 6 and whole.usage.completion_tokens == 4
    comp = c.completions.create(model="fake-model", prompt="one two", max_tokens=2)
    assert comp.choices[0].text == "tok0 tok1"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(model="fake-model", prompt="x",
                                                                        max_tokens=3, stream=True) if ch.choices)
    assert streamed == "tok0 tok1 tok2"
    assert [m.id for m in c.models.list()] == ["fake-model"]
    # every request's real completion tokens counted once: 5 + 3 + 4 + 2 + 3
    eventually(lambda: 'seamguard_gateway_tokens_total{key="a",kind="completion",tenant="acme"} 17.0'
               in httpx.get(url + "/metrics", headers=ADMIN).text)
    assert 'seamguard_gateway_ttft_seconds_count{decode="b0"} 3.0' in httpx.get(url + "/metrics", headers=ADMIN).text


def test_stream_without_usage_counts_chunks(backend, gateway_factory, tmp_path):
    fb, burl = backend
    fb.usage_in_stream = False
    url, _ = gateway_factory(base_config(burl, {"type": "sqlite", "path": str(tmp_path / "gw.db")}))
    list(_client(url).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=7, stream=True))
    eventually(lambda: 'kind="completion",tenant="acme"} 7.0' in httpx.get(url + "/metrics", headers=ADMIN).text)


def test_disaggregated_prefill_then_decode(gateway_factory, tmp_path):
    from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer

    pre, dec = FakeBackend(name="p0"), FakeBackend(name="d0")
    with ThreadedServer(pre.app()) as ps, ThreadedServer(dec.app()) as ds:
        cfg = base_config(ps.url, {"type": "sqlite", "path": str(tmp_path / "gw.db")},
                          instances=[{"name": "p0", "url": ps.url, "role": "prefill"},
                                     {"name": "d0", "url": ds.url, "role": "decode"}])
        url, _ = gateway_factory(cfg)
        chunks = list(_client(url).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hello world"}], max_tokens=4, stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "tok0 tok1 tok2 tok3"
        p, d = pre.seen[-1], dec.seen[-1]
        assert p["max_tokens"] == 1 and p["stream"] is False and p["kv_transfer_params"] == {"do_remote_decode": True}
        assert d["kv_transfer_params"]["remote_engine_id"] == "p0" and d["stream"] is True
        eventually(lambda: 'seamguard_gateway_decode_first_token_seconds_count{decode="d0",prefill="p0"} 1.0'
                   in httpx.get(url + "/metrics", headers=ADMIN).text)


@pytest.mark.parametrize("body,status,code,param", [
    (b"not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_json", None),
    (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "missing_required_parameter", "model"),
    (b'{"model": "m", "messages": []}', 400, "invalid_value", "messages"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}', 400, "invalid_value",
     "max_tokens"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "invalid_value",
     "stream"),
])
def test_bad_requests_get_openai_error_bodies(backend, gateway_factory, tmp_path, body, status, code, param):
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, {"type": "sqlite", "path": str(tmp_path / "gw.db")}))
    r = httpx.post(url + "/v1/chat/completions", content=body, headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", code, param)


def test_unknown_paths_and_methods_get_openai_error_bodies(backend, gateway_factory, tmp_path):
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, {"type": "sqlite", "path": str(tmp_path / "gw.db")}))
    r = httpx.post(url + "/v1/embeddings", json={"model": "m", "input": "x"}, headers={"Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url", r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"} and "/v1/embeddings" in r.json()["error"]["message"]
    r = httpx.get(url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_unknown_key_backend_failures_and_openai_exceptions(backend, gateway_factory, tmp_path):
    fb, burl = backend
    url, _ = gateway_factory(base_config(burl, {"type": "sqlite", "path": str(tmp_path / "gw.db")}))
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.AuthenticationError) as e:
        _client(url, "sk-wrong-key-000").chat.completions.create(model="fake-model", messages=msgs)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    fb.fail_next(1, 500)
    with pytest.raises(openai.APIStatusError) as e:
        _client(url).chat.completions.create(model="fake-model", messages=msgs)
    assert e.value.status_code == 502 and e.value.body["code"] == "upstream_http_500"
    fb.fail_next(1, 400)  # the backend's own 4xx is the caller's problem: passed through
    with pytest.raises(openai.BadRequestError):
        _client(url).chat.completions.create(model="fake-model", messages=msgs, stream=True)
    dead = base_config("http://127.0.0.1:9", {"type": "sqlite", "path": str(tmp_path / "dead.db")})
    durl, _ = gateway_factory(dead)
    with pytest.raises(openai.APIStatusError) as e:
        _client(durl, KEY_B).chat.completions.create(model="fake-model", messages=msgs)
    assert e.value.status_code == 502 and e.value.body["code"] == "upstream_unreachable"


def test_backend_timeout_is_504(gateway_factory, tmp_path):
    from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer

    slow = FakeBackend(ttft_s=2.0)
    with ThreadedServer(slow.app()) as s:
        cfg = base_config(s.url, {"type": "sqlite", "path": str(tmp_path / "gw.db")},
                          timeouts={"read_s": 0.3})
        url, _ = gateway_factory(cfg)
        r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_A}"},
                       json={"model": "m", "messages": [{"role": "user", "content": "x"}]}, timeout=10)
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"


def test_mutating_admin_calls_need_the_token(backend, gateway_factory, tmp_path):
    _, burl = backend
    url, _ = gateway_factory(base_config(burl, {"type": "sqlite", "path": str(tmp_path / "gw.db")}))
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {KEY_A}"}):
        r = httpx.post(url + "/admin/keys/a/suspend", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_token"
    assert {k["name"]: k["state"] for k in httpx.get(url + "/admin/keys", headers=ADMIN).json()["keys"]}["a"] == "ok"
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    r = httpx.post(url + "/admin/keys/a/suspend", headers=auth, json={"note": "leaked on a forum"})
    assert r.status_code == 200 and r.json()["state"] == "suspended"
    with pytest.raises(openai.PermissionDeniedError):
        _client(url).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
    assert httpx.post(url + "/admin/keys/a/unsuspend", headers=auth, json={"note": "rotated"}).json()["state"] == "ok"
    _client(url).chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
    ev = httpx.get(url + "/admin/events?key=a", headers=ADMIN).json()["events"]
    assert [(e["to"], e["by"]) for e in ev] == [("ok", "operator"), ("suspended", "operator")]  # the --token's name
    assert ev[1]["reason"] == "leaked on a forum"
    assert httpx.post(url + "/admin/keys/zz/reset", headers=auth, json={"note": "x"}).status_code == 404
    assert 'seamguard_gateway_key_state{key="a",state="ok"} 1.0' in httpx.get(url + "/metrics", headers=ADMIN).text


def test_router_hooks_shed_and_snapshot_in_metrics(gateway_factory, tmp_path):
    """The seamguard router over a disaggregated pool: first_token and finished reach it, its view is
    in /metrics, and a Shed it raises is a 503 with Retry-After that gives the reservation back."""
    from seamguard.gateway.config import register_router
    from seamguard.gateway.routing import ROUTERS, Shed, make_router
    from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer

    seen = {"first": 0, "finished": 0}

    class Spy:
        def __init__(self, instances, clock=None, **options):
            self.inner = make_router("seamguard", instances, **options)

        def route(self, request_class, prompt_tokens):
            if request_class == "batch":
                raise Shed("interactive paths are short", 2.5)
            return self.inner.route(request_class, prompt_tokens)

        def first_token(self, route, dft):
            seen["first"] += 1
            self.inner.first_token(route, dft)

        def finished(self, route, outcome):
            seen["finished"] += 1
            self.inner.finished(route, outcome)

        def snapshot(self):
            return self.inner.snapshot()

    register_router("spy", Spy)
    try:
        with ThreadedServer(FakeBackend(name="p0").app()) as ps, ThreadedServer(FakeBackend(name="d0").app()) as ds:
            cfg = base_config(ps.url, {"type": "sqlite", "path": str(tmp_path / "gw.db")}, router="spy",
                              instances=[{"name": "p0", "url": ps.url, "role": "prefill"},
                                         {"name": "d0", "url": ds.url, "role": "decode"}])
            url, _ = gateway_factory(cfg)
            list(_client(url).chat.completions.create(model="fake-model", max_tokens=3, stream=True,
                                                      messages=[{"role": "user", "content": "hi"}]))
            eventually(lambda: seen == {"first": 1, "finished": 1})
            r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_A}",
                                                                  "X-Request-Class": "batch"},
                           json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100})
            assert r.status_code == 503 and r.headers["Retry-After"] == "3"
            assert r.json()["error"]["code"] == "shed"
            keys = {k["name"]: k for k in httpx.get(url + "/admin/keys", headers=ADMIN).json()["keys"]}
            assert keys["a"]["used"]["inflight"] == 0 and keys["a"]["used"]["tokens_last_minute"] == 7
            m = httpx.get(url + "/metrics", headers=ADMIN).text
            assert 'seamguard_gateway_route_path_samples{decode="d0",prefill="p0",rail=""} 1.0' in m
            assert 'seamguard_gateway_route_path_admissible{decode="d0",prefill="p0",rail="",request_class="interactive"} 1.0' \
                in m
            assert 'seamguard_gateway_router_shed_total{request_class="batch"} 1.0' in m
    finally:
        ROUTERS.pop("spy")
