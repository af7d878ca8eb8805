"""A stealthy leak through the real HTTP gateway: a second client that follows the key's own pace.

The key's history (three office days, 600 tokens every 10 s from its own client) is fed to the
gateway's detector directly; then the `openai` client talks to the gateway on an injected clock:
an hour of the key's own traffic, then a second client adds 1.5x that, from a user agent the key
saw once two hours before (so not a new source), and stays under every per-minute rule.
"""

from __future__ import annotations

import openai

from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer
from tests.gateway.conftest import KEY_B, base_config
from tests.gateway.test_zombie import office_hours
from tests.security.test_gateway_zombie import PER_REQUEST, SOURCE, UA, _ask, _client, _events

LEAK_UA = "leak-script/2.0"


def _leak_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY_B, max_retries=0, timeout=30.0,
                         default_headers={"User-Agent": LEAK_UA})


def test_a_leak_at_one_and_a_half_times_the_key_s_own_pace(gateway_factory, tmp_path, observed):
    """A second client spends 1.5x the key's usual tokens, at its usual hours, from a source it used once before.
    Refused: throttled (429, to the key's envelope, never suspended: the evidence is statistical) within an hour of
    the leak by spend over its history; nothing refused in the hour before."""
    now = [0.0]
    with ThreadedServer(FakeBackend().app()) as be:
        url, gw = gateway_factory(base_config(be.url, {"type": "sqlite", "path": str(tmp_path / "g.db")}),
                                  clock=lambda: now[0])
        day = office_hours(gw.gatekeeper.detector, key="b", source=SOURCE, tokens=PER_REQUEST) - 10 * 3600.0
        own, leak = _client(url), _leak_client(url)
        now[0] = day + 9 * 3600.0
        _ask(leak)                                   # the leak's client, seen once two hours before
        start, leak_at = day + 10 * 3600.0, day + 11 * 3600.0
        sent = []                                    # (s after the leak, who, status)
        for i in range(int(2 * 3600 / 10)):
            t = start + 10.0 * i
            for j in range(4 if t >= leak_at else 1):
                now[0] = t + 2.5 * j
                who = own if j == 0 else leak        # j = 1..3: 3 leak requests per 2 own (1.5x), alternating
                if j == 3 and i % 2:
                    continue
                sent.append((round(now[0] - leak_at), "own" if j == 0 else "leak", _ask(who)[0]))
            if any(st != 200 for _, w, st in sent[-4:] if w == "leak"):
                break
        events = _events(url)
    refused = [(s, w, st) for s, w, st in sent if st != 200]
    steps = [(e["from"], e["to"], e["reason"]) for e in reversed(events)]
    observed(f"{len(sent)} requests; first refusal {refused[0] if refused else None} (s after the leak, who, "
             f"status); steps {steps}")
    assert refused and refused[0][0] >= 0, "refused before the leak began"
    assert refused[0][0] <= 3600, "not refused within the hour"
    assert steps and steps[0][1] == "throttled" and steps[0][2].startswith("spend over its history")
    assert refused[0][2] == 429 and "suspended" not in [to for _, to, _ in steps]
