"""Attacks on the gateway process: a stream that never ends holding SIGTERM off, and secrets
(admin and metrics tokens, API keys, the store's password) in what the process prints."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import openai

from seamguard.ports import free_port
from tests.conftest import subprocess_env
from tests.gateway.conftest import KEY_A, KEY_B
from tests.security.gateway_child import GatewayChild, child_config, child_port


def _stream_in_thread(url: str, max_tokens: int) -> tuple[threading.Thread, dict]:
    """A streamed chat request read on a thread: got["tokens"] as they come, got["end"] how it ended."""
    got: dict = {"tokens": 0, "end": None, "first": threading.Event()}

    def read() -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0, timeout=120)
        try:
            for chunk in c.chat.completions.create(model="fake-model", max_tokens=max_tokens, stream=True,
                                                   messages=[{"role": "user", "content": "count"}]):
                if chunk.choices and chunk.choices[0].delta.content:
                    got["tokens"] += 1
                    got["first"].set()
            got["end"] = "complete"
        except Exception as e:  # noqa: BLE001 (how it was cut is what the test reports)
            got["end"] = type(e).__name__
        got["first"].set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


def test_sigterm_lets_a_stream_in_flight_finish(backend, tmp_path, observed):
    """SIGTERM while a 30-token stream is being relayed (3 s), with a 20 s drain deadline.
    Refused: the stream finishes whole (drain), then the process exits 0 (not killed by its own signal)."""
    fb, burl = backend
    fb.per_token_s = 0.1
    with GatewayChild(tmp_path, child_config(burl, tmp_path, child_port())) as g:   # drain_s: 20 by default
        t, got = _stream_in_thread(g.url, 30)
        assert got["first"].wait(30)
        g.terminate()
        rc = g.wait(40)
        t.join(10)
    observed(f"exit status {rc}; stream {got['end']} after {got['tokens']} of 30 tokens")
    assert got["end"] == "complete" and got["tokens"] == 30
    assert rc == 0


def test_sigterm_cuts_a_stream_that_outlasts_the_drain_deadline(backend, tmp_path, observed):
    """SIGTERM while a backend stream runs for minutes (200 tokens, 0.5 s apart), with a 1 s drain deadline.
    Refused: the stream is cut at the drain deadline and the process exits 0 (it did not wait for the stream)."""
    fb, burl = backend
    fb.per_token_s = 0.5
    with GatewayChild(tmp_path, child_config(burl, tmp_path, child_port(), http={"drain_s": 1})) as g:
        t, got = _stream_in_thread(g.url, 200)
        assert got["first"].wait(30)
        t0 = time.monotonic()
        g.terminate()
        rc = g.wait(30)   # the deadline, the cut requests' reconcile (≤ 5 s), and a loaded machine
        waited_s = time.monotonic() - t0
        t.join(10)
    observed(f"exit status {rc} {waited_s:.1f} s after SIGTERM; stream {got['end']} after {got['tokens']} of 200")
    assert rc == 0
    assert got["end"] != "complete" and got["tokens"] < 200


def test_no_secret_is_printed(backend, tmp_path, observed):
    """Reading the gateway's output for the secrets it was given (admin and metrics tokens, API keys, a Redis password).
    Exercised: the startup banner (table and JSON), wrong tokens, a backend failure, SIGTERM, two failed starts.
    Refused: none of these secrets appears in stdout or stderr."""
    fb, burl = backend
    admin, alice, scrape = "adm-0f3b9c2e7d1a", "alice-7c1d9e2b0a4f", "scrape-5e8a2c6b1d3f"
    env = {"SEAMGUARD_GATEWAY_TOKEN": admin, "SG_TEST_ALICE": alice, "SEAMGUARD_GATEWAY_METRICS_TOKEN": scrape}
    plain = child_config(burl, tmp_path, child_port())
    cfg = {**plain, "admin_tokens": [{"name": "alice", "token_env": "SG_TEST_ALICE"}]}
    outputs = []
    for conf, args in ((plain, ()), (cfg, ("-o", "json"))):
        g = GatewayChild(tmp_path, {**conf, "port": child_port()}, env=env, args=args)
        try:
            g.start()
        except RuntimeError:   # its output is what is judged
            outputs.append(g.output())
            continue
        try:
            c = openai.OpenAI(base_url=g.url + "/v1", api_key=KEY_A, max_retries=0)
            c.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            fb.fail_next(1)
            try:
                openai.OpenAI(base_url=g.url + "/v1", api_key=KEY_B, max_retries=0).chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            except openai.APIStatusError:
                pass
            for tok in (admin + "x", alice[:-1], scrape, KEY_A):
                httpx.post(g.url + "/admin/keys/a/suspend", headers={"Authorization": f"Bearer {tok}"},
                           json={"note": "probe"})
            httpx.get(g.url + "/metrics", headers={"Authorization": f"Bearer {scrape}"})
            g.terminate()
            g.wait(30)
        finally:
            g.stop()
        outputs.append(g.output())
    # failed starts: a Redis store behind a password that is not there, a variable that is not set
    redis_pw = "hunter2-redis-pw"
    bad_redis = {**cfg, "store": {"type": "redis", "url": f"redis://:{redis_pw}@127.0.0.1:{free_port()}/0",
                                  "ledger": str(tmp_path / "l.db")}, "timeouts": {"connect_s": 0.5}}
    for bad, extra_env in ((bad_redis, env), (cfg, {k: v for k, v in env.items() if k != "SG_TEST_ALICE"})):
        (tmp_path / "bad.json").write_text(__import__("json").dumps(bad))
        r = subprocess.run([sys.executable, "-m", "seamguard", "gateway", "--config", str(tmp_path / "bad.json")],
                           capture_output=True, text=True, timeout=60, env={**subprocess_env(), **extra_env})
        outputs.append(f"[exit {r.returncode}] " + r.stdout + r.stderr)
    text = "\n".join(outputs)
    leaked = [name for name, s in (("admin token", admin), ("alice's token", alice), ("metrics token", scrape),
                                   ("API key", KEY_A), ("API key", KEY_B), ("Redis password", redis_pw)) if s in text]
    observed(f"leaked: {leaked or 'nothing'}; failed starts: {[o.splitlines()[0][:90] for o in outputs[2:]]}")
    assert leaked == []
    assert all(o.startswith("[exit 2] ") for o in outputs[2:])
