"""A leaked key drains a tenant's budget: seamguard's admission vs a static per-key rate limit.

One tenant, five legitimate keys with their own daily shapes and request mixes (interactive
web and mobile chat, a RAG backend with long prompts, CI evaluation bursts, a low-priority
nightly batch), three days of their history, then one key's secret leaks: from 12:00 a
script on a new address sends 4 requests/s of long prompts at max_tokens 1000 and ignores
every refusal. Two systems see the same traffic:

- static: what a competent operator configures without seamguard: per key, TPM and TPD at
  1.5x the key's own peak minute and peak day over the three days of history (50 % headroom;
  nothing legitimate was ever refused by them in that history); the tenant's TPM and TPD at
  1.3x the tenant's peak minute and peak day.
- seamguard: the same caps, plus priority shedding and the zombie-key detector, its
  baselines learned from the same three days.

Figures per system: ``time_to_throttle_s`` (leak start -> the first refusal of a leaked-key
request that is an action against that key: its TPM cap for static, the detector's throttle
for seamguard), ``time_to_suspend_s`` (seamguard; static never stops the key),
``tokens_lost_to_zombie`` (tokens served to the leak), ``legit_requests_rejected`` (on the
other keys) and, apart, ``owner_requests_rejected`` (the leaked key's own legitimate user,
cut off with the leak by any system that stops the key).

Two more scenarios on the same keys and history, in simulated time (``leaks`` in the JSON), each
from 12:00 against what a LiteLLM operator runs: **static+alert** — the static caps above plus a
spend alert per key (a daily soft budget) at 1.25x the key's largest day in the history (no day of
the history would have alerted):

- ramp: the leaked key's own client in a loop that feeds on itself, from the key's usual rate
  growing 3.5x every 2 minutes (capped at 5 requests/s; refused anyway), from one of its own
  sources; 15 minutes (--quick) or 1 h;
- stealth: a second client following the key's own daily shape at 1.5x its rate, from a source
  that tried the key once two days before (not new); 30 minutes (--quick) or to midnight.

Seed s of these leaks the key LEAK_KEYS[s % 3] (three daily shapes); seeds from ``--seed0`` (1000:
held out — seeds 0-5 were used while developing the detector's bin-by-bin history rule, seeds
2000-2023 while developing its envelope throttle and rare-source evidence). A third scenario, healthy
keys (``healthy``), runs the detector alone, its throttle applied, over 9 days (--quick) or 3 weeks of one
key per seed with weekends at 30 %, days +-20 % and 20 % growth a week (odd seeds: clients on 256
addresses drawn afresh each day): its steps are false flags and what its throttle refused is counted,
beside the operator's alert-days and the requests its weekly-reset caps refuse.

Per system: ``time_to_detect_s`` (seamguard: the detector's first step on the key; static+alert:
the alert), ``time_to_first_refusal_s`` (a leak request refused by a cap or a step),
``leak_tokens_before_detect``, ``leak_tokens`` (served to the leak in all),
``healthy_keys_flagged`` (other keys stepped or alerted), ``legit_requests_rejected``.

Two modes, both printed:

- simulated (``sim``): the gateway's own admission code (Gatekeeper, SqliteStore in memory,
  the detector) driven by an injected clock through the whole trace, several seeds, the two
  systems interleaved per seed; medians with [min-max].
- end to end (``http``, seamguard only): the real gateway over HTTP in front of the fake
  OpenAI backend, wall clock, the detector's history seeded with the same three simulated
  days ending now; live legitimate traffic at this hour's rates, then the leak.

    PYTHONPATH=src python benchmarks/token_gateway.py --quick   # 2 seeds, shorter replays (SCOPE)
    PYTHONPATH=src python benchmarks/token_gateway.py

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DAY, HOUR = 86400.0, 3600.0
LEAKED = "chat-mobile"
ZOMBIE_SOURCE = "198.51.100.23|python-requests/2.31"
ZOMBIE_RPS = 4.0


@dataclass(frozen=True)
class Req:
    t: float
    key: str
    prompt: int  # real prompt tokens
    max_tokens: int
    output: int  # tokens the model will produce (<= max_tokens)
    source: str
    zombie: bool = False

    @property
    def duration_s(self) -> float:
        return 0.3 + 0.02 * self.output


# name: active hours (UTC), peak requests/s, prompt (median, sigma), output (median, sigma), max_tokens, priority
PROFILES = {
    "chat-web": (range(7, 23), 0.6, (350, 0.8), (180, 0.6), 1024, "high"),
    "chat-mobile": (range(6, 24), 0.3, (250, 0.8), (150, 0.6), 512, "high"),
    "rag-backend": (range(8, 19), 0.25, (2200, 0.4), (120, 0.5), 400, "normal"),
    "eval-ci": (range(9, 18), 0.0, (600, 0.3), (300, 0.3), 512, "normal"),  # bursts, below
    "batch-nightly": (range(1, 4), 0.8, (900, 0.5), (400, 0.5), 800, "low"),
}


def legit_trace(t0: float, t1: float, rng: random.Random, only: str | None = None, scale: float = 1.0,
                source: str | None = None) -> list[Req]:
    """Every legitimate request in [t0, t1): per 5-minute block, a Poisson count at the key's rate for
    that hour of day (a sine over its active hours) times a lognormal burst factor, at uniform times;
    eval-ci instead sends 40 requests within a minute at :30 of every other hour of its day."""
    out: list[Req] = []
    g = np.random.default_rng(rng.randrange(2**32))
    for ki, (key, (hours, peak, (pm, ps), (om, os_), mt, _)) in enumerate(PROFILES.items()):
        if only is not None and key != only:
            continue
        peak *= scale
        sources = [source] if source else [f"10.1.{ki}.{i}|openai-python/1.{i}" for i in range(3)]
        times: list[float] = []
        if key == "eval-ci":
            for h in range(int(t0 // HOUR), int(math.ceil(t1 / HOUR))):
                start = h * HOUR + 1800.0
                if h % 24 in hours and h % 2 == 0 and t0 <= start < t1:
                    times += list(start + g.uniform(0, 60, 40))
        else:
            for block in range(int(t0 // 300), int(math.ceil(t1 / 300))):
                h = (block * 300.0 % DAY) / HOUR
                if int(h) not in hours:
                    continue
                rate = peak * (0.5 + 0.5 * math.sin(math.pi * (h - hours.start) / len(hours))) * g.lognormal(0, 0.35)
                times += [t for t in block * 300.0 + g.uniform(0, 300, g.poisson(rate * 300)) if t0 <= t < t1]
        n = len(times)
        prompts = np.maximum(1, g.lognormal(math.log(pm), ps, n)).astype(int)
        outs = np.minimum(mt, np.maximum(1, g.lognormal(math.log(om), os_, n))).astype(int)
        srcs = g.integers(0, len(sources), n)
        out += [Req(float(t), key, int(p), mt, int(o), sources[si], zombie=source is not None)
                for t, p, o, si in zip(times, prompts, outs, srcs)]
    out.sort(key=lambda r: r.t)
    return out


def zombie_trace(t0: float, t1: float, rng: random.Random) -> list[Req]:
    out, t = [], t0
    while t < t1:
        out.append(Req(t, LEAKED, max(1, int(rng.lognormvariate(math.log(1500), 0.3))), 1000, 1000, ZOMBIE_SOURCE,
                       zombie=True))
        t += rng.expovariate(ZOMBIE_RPS)
    return out


def peaks(trace: list[Req]) -> tuple[dict[str, int], dict[str, int], int, int]:
    """Per key and for the tenant: the peak minute and peak day of tokens in a trace (what an operator
    reads off a dashboard of the last days)."""
    minute: dict[tuple[str, int], int] = defaultdict(int)
    day: dict[tuple[str, int], int] = defaultdict(int)
    for r in trace:
        n = r.prompt + r.output
        for who in (r.key, "*tenant*"):
            minute[(who, int(r.t // 60))] += n
            day[(who, int(r.t // DAY))] += n
    pm: dict[str, int] = defaultdict(int)
    pd: dict[str, int] = defaultdict(int)
    for (who, _), n in minute.items():
        pm[who] = max(pm[who], n)
    for (who, _), n in day.items():
        pd[who] = max(pd[who], n)
    return pm, pd, pm.pop("*tenant*"), pd.pop("*tenant*")


def config(system: str, history: list[Req], store: dict) -> dict:
    pm, pd, tpm, tpd = peaks(history)
    keys = [{"name": k, "key": f"sk-bench-{k}", "priority": PROFILES[k][5],
             "tpm": math.ceil(1.5 * pm[k]), "tpd": math.ceil(1.5 * pd[k])} for k in PROFILES]
    return {"version": 1, "instances": [{"name": "b0", "url": "http://127.0.0.1:9"}], "store": store,
            "models": ["fake-model"], "zombie": {"enabled": system == "seamguard"},
            "tenants": [{"name": "acme", "tpm": math.ceil(1.3 * tpm), "tpd": math.ceil(1.3 * tpd), "keys": keys}]}


def body(r: Req) -> dict:
    # characters for the gateway's estimate (4 per token, less the 4 it adds per message)
    return {"model": "fake-model", "messages": [{"role": "user", "content": "x" * max(0, 4 * (r.prompt - 4))}],
            "max_tokens": r.max_tokens}


def seed_detector(det, history: list[Req]) -> None:
    """The detector's baselines from the history, in time order (requests and their results)."""
    ev = [(r.t, 0, i, r) for i, r in enumerate(history)] + [(r.t + r.duration_s, 1, i, r) for i, r in enumerate(history)]
    ev.sort(key=lambda e: (e[0], e[1], e[2]))
    for t, kind, i, r in ev:
        if kind == 0:
            det.observe_request(r.key, t, r.prompt + r.max_tokens, r.source)
            det.admitted(r.key, t, r.prompt + r.max_tokens)   # the history was served within its limits
        else:
            det.observe_result(r.key, t, True, f"h{i}")


@dataclass
class Tally:
    time_to_throttle_s: float | None = None
    time_to_suspend_s: float | None = None
    tokens_lost_to_zombie: int = 0
    legit_requests: int = 0
    legit_requests_rejected: int = 0
    owner_requests: int = 0
    owner_requests_rejected: int = 0
    zombie_requests: int = 0
    legit_keys_flagged: int = 0
    rejected_reasons: dict | None = None


def score(results: list[tuple[Req, int, str, int]], leak_t: float, system: str, steps: list) -> Tally:
    """(request, status, error code, tokens served) -> the figures."""
    tl = Tally(rejected_reasons={})
    for r, status, code, tokens in results:
        if r.zombie:
            tl.zombie_requests += 1
            tl.tokens_lost_to_zombie += tokens
            acted = (code in ("key_tpm", "key_tpd") if system == "static"
                     else code == "key_suspended" or "throttled" in code)
            if acted and tl.time_to_throttle_s is None:
                tl.time_to_throttle_s = round(r.t - leak_t, 2)
            continue
        owner = r.key == LEAKED
        tl.owner_requests += owner
        tl.legit_requests += not owner
        if status != 200:
            tl.owner_requests_rejected += owner
            tl.legit_requests_rejected += not owner
            if not owner:
                tl.rejected_reasons[code] = tl.rejected_reasons.get(code, 0) + 1
    for s in steps:
        if s["key"] == LEAKED and s["to"] == "suspended" and tl.time_to_suspend_s is None:
            tl.time_to_suspend_s = round(s["t"] - leak_t, 2)
        if s["key"] == LEAKED and s["to"] == "throttled" and system == "seamguard":
            tl.time_to_throttle_s = min(tl.time_to_throttle_s or 1e18, round(s["t"] - leak_t, 2))
        if s["key"] != LEAKED:
            tl.legit_keys_flagged += 1
    return tl


# ---- simulated time ---------------------------------------------------------------------------------
async def simulate(system: str, history: list[Req], live: list[Req], leak_t: float) -> Tally:
    results, steps = await simulate_leak(system, history, live)
    return score(results, leak_t, system, steps)


# ---- end to end over HTTP -----------------------------------------------------------------------------
async def http_run(history: list[Req], live: list[Req], leak_t: float, t_start_wall: float, workdir: Path) -> Tally:
    import httpx

    from seamguard.gateway.app import build_gateway, create_app
    from seamguard.gateway.config import parse_gateway_config
    from seamguard.testbed.openai_backend import FakeBackend, ThreadedServer

    backend = ThreadedServer(FakeBackend(ttft_s=0.05, per_token_s=0.0).app()).start()
    cfg = config("seamguard", history, {"type": "sqlite", "path": str(workdir / "gw.db")})
    cfg["instances"][0]["url"] = backend.url
    gw = build_gateway(parse_gateway_config(cfg, "bench"))
    seed_detector(gw.gatekeeper.detector, history)
    server = ThreadedServer(create_app(gw, "bench-admin")).start()
    results: list[tuple[Req, int, str, int]] = []
    try:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=30.0, limits=limits) as c:
            async def send(r: Req) -> None:
                await asyncio.sleep(max(0.0, r.t - time.time()))
                # a fake backend answers max_tokens tokens: ask for what the model would produce, reserve
                # as the client would (the gateway only sees max_tokens)
                resp = await c.post("/v1/chat/completions", json={**body(r), "max_tokens": r.output},
                                    headers={"Authorization": f"Bearer sk-bench-{r.key}",
                                             "User-Agent": r.source.split("|")[1]})
                code = "" if resp.status_code == 200 else resp.json()["error"]["code"] or ""
                if "throttled" in (resp.json().get("error") or {}).get("message", ""):
                    code += " throttled"
                used = resp.json()["usage"]["total_tokens"] if resp.status_code == 200 else 0
                results.append((r, resp.status_code, code, used))

            await asyncio.gather(*(send(r) for r in live))
        steps = [{"t": e["wall_s"], "key": e["key"], "to": e["to"]}
                 for e in reversed(gw.ledger.events(limit=10_000))]
    finally:
        server.stop()
        backend.stop()
    return score(results, leak_t, "seamguard", steps)


def summarize(tallies: list[Tally]) -> dict:
    out: dict = {}
    for f in ("time_to_throttle_s", "time_to_suspend_s", "tokens_lost_to_zombie", "legit_requests_rejected",
              "owner_requests_rejected", "legit_requests", "owner_requests", "zombie_requests", "legit_keys_flagged"):
        xs = [getattr(t, f) for t in tallies]
        vals = [x for x in xs if x is not None]
        out[f] = float(np.median(vals)) if len(vals) == len(xs) else None
        out[f + "_spread"] = [min(vals), max(vals)] if vals else None
    return out

# ---- ramps and stealthy leaks: seamguard vs a static cap plus a spend alert -------------------------------
RAMP_FACTOR, RAMP_PERIOD_S, RAMP_MAX_RPS = 3.5, 120.0, 5.0
STEALTH_SCALE = 1.5
STEALTH_SOURCE = "203.0.113.44|openai-python/1.2"
ALERT_MARGIN = 1.25


def ramp_trace(t0: float, t1: float, rng: random.Random, leaked: str = LEAKED) -> list[Req]:
    """The leaked key's own client in a loop that feeds on itself: from the key's usual rate at that hour,
    3.5x every 2 minutes (capped at 5 requests a second: refused anyway), from one of the key's own sources."""
    hours, peak, (pm, ps), (om, os_), mt, _ = PROFILES[leaked]
    own_source = f"10.1.{list(PROFILES).index(leaked)}.0|openai-python/1.0"  # legit_trace's first source of the key
    out, t = [], t0
    while t < t1:
        rps = min(RAMP_MAX_RPS, 0.75 * peak * RAMP_FACTOR ** ((t - t0) / RAMP_PERIOD_S))
        out.append(Req(t, leaked, max(1, int(rng.lognormvariate(math.log(pm), ps))), mt,
                       min(mt, max(1, int(rng.lognormvariate(math.log(om), os_)))), own_source,
                       zombie=True))
        t += rng.expovariate(rps)
    return out


def stealth_trace(t0: float, t1: float, rng: random.Random, leaked: str = LEAKED) -> list[Req]:
    """A second client on the leaked key following the key's own daily shape at 1.5x its rate, from a source
    it tried once two days before (so the new-source rule does not apply: the history rule must see it)."""
    return legit_trace(t0, t1, rng, only=leaked, scale=STEALTH_SCALE, source=STEALTH_SOURCE)


def alert_lines(history: list[Req]) -> dict[str, float]:
    """The spend alert a LiteLLM operator sets per key (a soft budget per day): today's spend over 1.25x
    the key's largest day in the history (no day of the history would have alerted)."""
    _, pd, _, _ = peaks(history)
    return {k: ALERT_MARGIN * pd[k] for k in PROFILES}


def first_alerts(results: list[tuple[Req, int, str, int]], spent_before: dict[str, float],
                 lines: dict[str, float]) -> dict[str, float]:
    """key -> when its spend today (served tokens) first crossed its alert line."""
    spent = dict(spent_before)
    out: dict[str, float] = {}
    for r, _, _, tokens in sorted(results, key=lambda x: x[0].t):
        spent[r.key] = spent.get(r.key, 0.0) + tokens
        if r.key not in out and spent[r.key] > lines[r.key]:
            out[r.key] = r.t
    return out


def score_leak(results, leak_t: float, system: str, steps: list, alerts: dict[str, float],
               leaked: str = LEAKED) -> dict:
    """Detection (seamguard: the detector's first step on the leaked key; static+alert: its alert),
    the first refusal of a leak request by a cap or a step, the leak's tokens before each and in all,
    false flags on the healthy keys."""
    on_leaked = [s for s in steps if s["key"] == leaked and s["to"] != "ok"]
    detect = (on_leaked[0]["t"] if on_leaked else None) if system == "seamguard" else alerts.get(leaked)
    leak = [(r.t, status, tokens) for r, status, _, tokens in results if r.zombie]
    refused = next((t for t, status, _ in leak if status != 200), None)
    flagged = ({s["key"] for s in steps if s["key"] != leaked} if system == "seamguard"
               else {k for k in alerts if k != leaked})
    return {"time_to_detect_s": None if detect is None else round(detect - leak_t, 1),
            "detected_by": (on_leaked[0]["reason"] if on_leaked else None) if system == "seamguard"
            else ("spend alert" if detect is not None else None),
            "time_to_first_refusal_s": None if refused is None else round(refused - leak_t, 1),
            "leak_tokens_before_detect": sum(n for t, _, n in leak if detect is None or t < detect),
            "leak_tokens": sum(n for _, _, n in leak),
            "healthy_keys_flagged": len(flagged),
            "legit_requests_rejected": sum(1 for r, st, _, _ in results if not r.zombie and r.key != leaked
                                           and st != 200),
            "owner_requests_rejected": sum(1 for r, st, _, _ in results if not r.zombie and r.key == leaked
                                           and st != 200),
            "leaked_key_suspended": int(any(s["key"] == leaked and s["to"] == "suspended" for s in steps)),
            "leaked_key": leaked}


async def simulate_leak(system: str, history: list[Req], live: list[Req]) -> tuple[list, list]:
    """The gatekeeper in simulated time: (results, key-state steps); a refusal's code says
    " throttled" when the detector's throttle refused it. The static+alert system is the static
    one (its alert is read off the results)."""
    from seamguard.gateway.config import parse_gateway_config
    from seamguard.gateway.gatekeeper import Gatekeeper, Refusal
    from seamguard.gateway.ledger import GatewayLedger
    from seamguard.gateway.metrics import GatewayMetrics
    from seamguard.gateway.store import SqliteStore

    cfg = parse_gateway_config(config(system, history, {"type": "sqlite", "path": ":memory:"}), "bench")
    now = [live[0].t]
    gk = Gatekeeper(cfg, SqliteStore(":memory:"), GatewayLedger(":memory:"), GatewayMetrics(), clock=lambda: now[0])
    if system == "seamguard":  # the static system's detector is off: nothing to learn
        seed_detector(gk.detector, history)
    heap: list = [(r.t, 1, i, r, None) for i, r in enumerate(live)]
    heapq.heapify(heap)
    results: list[tuple[Req, int, str, int]] = []
    seq = len(live)
    while heap:
        t, kind, _, r, ticket = heapq.heappop(heap)
        now[0] = t
        if kind == 0:
            await gk.finish(ticket, True, r.prompt, r.output)
            continue
        try:
            ticket = await gk.admit(gk.keys[r.key], body(r), str(seq).encode(), r.source)
        except Refusal as e:
            results.append((r, e.status, e.code + (" throttled" if "throttled" in e.message else ""), 0))
            continue
        results.append((r, 200, "", r.prompt + r.output))
        seq += 1
        heapq.heappush(heap, (t + r.duration_s, 0, seq, r, ticket))
    steps = [{"t": e["wall_s"], "key": e["key"], "to": e["to"], "reason": e["reason"]}
             for e in reversed(gk.ledger.events(limit=10_000))]
    return results, steps


LEAK_KEYS = ("chat-mobile", "chat-web", "rag-backend")  # three daily shapes (6-24 h, 7-23 h, 8-19 h)

#: How much of each scenario a run replays. --quick keeps every system, scenario and 2 seeds and
#: cuts lengths so that it ends in about two minutes on the loaded 2-core machine (most of what is
#: left is seeding the detector with three days of history, once per seamguard replay).
SCOPE = {
    "full": {"seeds": 3, "before_h": 2.0, "after_h": 12.0, "http_before_s": 30.0, "http_after_s": 120.0,
             "ramp_h": 1.0, "stealth_h": 12.0, "healthy_days": 21},
    "quick": {"seeds": 2, "before_h": 0.25, "after_h": 0.25, "http_before_s": 5.0, "http_after_s": 25.0,
              "ramp_h": 0.25, "stealth_h": 0.5, "healthy_days": 9},
}


def run_leaks(seeds: int, quick: bool, seed0: int = 0) -> dict:
    """The ramp and the stealthy leak, each from 12:00 on day 3, seamguard and static+alert interleaved per
    seed; seed s leaks key LEAK_KEYS[s % 3] (seeds 0-5 were used while the detector was developed)."""
    leak_t = 3 * DAY + 12 * HOUR
    scope = SCOPE["quick" if quick else "full"]
    after = {"ramp": scope["ramp_h"], "stealth": scope["stealth_h"]}
    out: dict = {}
    for scenario, make in (("ramp", ramp_trace), ("stealth", stealth_trace)):
        runs: dict[str, list[dict]] = {"static+alert": [], "seamguard": []}
        for s in range(seed0, seed0 + seeds):
            rng = random.Random(s)
            leaked = LEAK_KEYS[s % len(LEAK_KEYS)]
            history = legit_trace(0.0, 3 * DAY, rng)
            before = legit_trace(3 * DAY, leak_t - HOUR, rng)   # today's spend before the run, served by both
            spent_before = {k: float(sum(r.prompt + r.output for r in before if r.key == k)) for k in PROFILES}
            live = sorted(legit_trace(leak_t - HOUR, leak_t + after[scenario] * HOUR, rng)
                          + make(leak_t, leak_t + after[scenario] * HOUR, rng, leaked), key=lambda r: r.t)
            if scenario == "stealth":  # the leak's client tried the key once two days ago: its source is not new
                history = sorted(history + [Req(DAY + 12 * HOUR, leaked, 20, 16, 16, STEALTH_SOURCE)], key=lambda r: r.t)
            lines = alert_lines(history)
            order = ("static+alert", "seamguard") if s % 2 == 0 else ("seamguard", "static+alert")
            for system in order:
                results, steps = asyncio.run(simulate_leak("static" if system != "seamguard" else system,
                                                           history, live))
                alerts = first_alerts(results, spent_before, lines)
                runs[system].append(score_leak(results, leak_t, system, steps, alerts, leaked))
            print(f"{scenario} seed {s}: " + ", ".join(f"{k} {v[-1]}" for k, v in runs.items()), file=sys.stderr)
        out[scenario] = {"hours_after": after[scenario], "seeds": [seed0, seed0 + seeds - 1],
                         **{k: summarize_dicts(v) for k, v in runs.items()},
                         "per_seed_time_to_detect_s": {k: [r["time_to_detect_s"] for r in v] for k, v in runs.items()}}
    return out


# ---- healthy keys with real variance: false flags and legitimate refusals, both systems --------------------
HEALTHY_GROWTH_PER_WEEK, HEALTHY_WEEKEND, HEALTHY_DAY_SIGMA = 1.2, 0.3, 0.2
ROTATING_POOL = 256  # a rotating key's clients: this many addresses, a fresh set each day (a NAT pool, mobile)


def healthy_days(key: str, days: int, rng: random.Random, rotating: bool = False) -> list[list[Req]]:
    """Per day, a key's legitimate requests as real keys vary: weekends at 30 % of a weekday, each day's
    level lognormal(0, 0.2), growing 20 % a week. ``rotating``: each request from one of 256 addresses
    drawn afresh every day (clients behind a NAT pool or on mobile networks), not the key's 3 clients."""
    out = []
    for d in range(days):
        level = (HEALTHY_GROWTH_PER_WEEK ** (d / 7) * rng.lognormvariate(0, HEALTHY_DAY_SIGMA)
                 * (HEALTHY_WEEKEND if d % 7 in (5, 6) else 1.0))
        reqs = legit_trace(d * DAY, (d + 1) * DAY, rng, only=key, scale=level)
        if rotating:
            reqs = [Req(r.t, r.key, r.prompt, r.max_tokens, r.output,
                        f"100.{64 + d % 64}.{rng.randrange(ROTATING_POOL)}.{d % 250}|okhttp/4.12") for r in reqs]
        out.append(reqs)
    return out


def static_refusals(days: list[list[Req]], first_judged: int) -> tuple[int, int, set]:
    """The operator's caps and alert, set each week from the week before (TPM and TPD at 1.5x its peak
    minute and day, the alert at 1.25x its largest day): (requests refused by a cap, requests judged,
    days alerted), from day ``first_judged`` on."""
    refused = judged = 0
    alerted: set = set()
    for d in range(first_judged, len(days)):
        week = [r for dd in range(max(0, d - d % 7 - 7), d - d % 7) for r in days[dd]]
        pm, pd, _, _ = peaks(week)
        key = days[d][0].key if days[d] else None
        if key is None:
            continue
        minute: dict[int, int] = defaultdict(int)
        spent = 0
        for r in days[d]:
            n = r.prompt + r.output
            judged += 1
            if minute[int(r.t // 60)] + n > 1.5 * pm[key] or spent + n > 1.5 * pd[key]:
                refused += 1
                continue
            minute[int(r.t // 60)] += n
            spent += n
            if spent > ALERT_MARGIN * pd[key]:
                alerted.add(d)
    return refused, judged, alerted


def detector_replay(key: str, days: list[list[Req]], first_judged: int) -> dict:
    """The detector alone over every request of ``days``, with the throttle it sets applied as the gateway
    applies it (a throttled key's requests admitted while its minute's reservations fit the throttle's TPM;
    a suspended key's refused): its steps from day ``first_judged`` on are false flags."""
    from seamguard.gateway.zombie import ZombieDetector

    det, flags, refused, suspended = ZombieDetector(), [], 0, 0
    minute, used = -1, 0
    for d, reqs in enumerate(days):
        for i, r in enumerate(reqs):
            n = r.prompt + r.max_tokens
            steps = [det.observe_request(key, r.t, n, r.source)]
            state, tpm = det.state(key)
            if int(r.t // 60) != minute:
                minute, used = int(r.t // 60), 0
            ok = state == "ok" or (state == "throttled" and tpm is not None and used + n <= tpm)
            if ok:
                det.admitted(key, r.t, n)
                used += n
                steps.append(det.observe_result(key, r.t + r.duration_s, True, f"{d}.{i}"))
            refused += d >= first_judged and not ok
            for st in steps:
                if st is not None and st.to_state != "ok" and d >= first_judged:
                    suspended += st.to_state == "suspended"
                    flags.append((d, round(r.t % DAY / HOUR, 2), st.to_state, st.reason, st.throttle_tpm))
    return {"flags": flags, "refused": refused, "suspended": suspended}


def run_healthy(seeds: int, quick: bool, seed0: int) -> dict:
    """Healthy keys only (one per seed, the three daily shapes in turn; odd seeds' clients rotate
    addresses): the detector fed every request of the scope's days, its throttle applied; a step on any
    judged day (from day 7) is a false flag, a refusal a legitimate request refused."""
    n_days = SCOPE["quick" if quick else "full"]["healthy_days"]
    rows = []
    for s in range(seed0, seed0 + seeds):
        key = LEAK_KEYS[s % len(LEAK_KEYS)]
        days = healthy_days(key, n_days, random.Random(s), rotating=s % 2 == 1)
        got = detector_replay(key, days, 7)
        refused, judged, alerted = static_refusals(days, 7)
        rows.append({"seed": s, "key": key, "rotating_sources": s % 2 == 1, "days_judged": len(days) - 7,
                     "requests_judged": judged, "seamguard_flags": len(got["flags"]),
                     "seamguard_flagged_at": got["flags"], "seamguard_suspensions": got["suspended"],
                     "seamguard_requests_refused": refused + got["refused"],
                     "seamguard_requests_refused_by_detector": got["refused"],
                     "static_alert_days": len(alerted), "static_requests_refused": refused})
        print(f"healthy seed {s}: {rows[-1]}", file=sys.stderr)
    return {"weeks": round(n_days / 7, 2), "days": n_days, "growth_per_week": HEALTHY_GROWTH_PER_WEEK, "weekend_level": HEALTHY_WEEKEND,
            "day_sigma": HEALTHY_DAY_SIGMA, "per_seed": rows,
            **{f: sum(r[f] for r in rows) for f in ("days_judged", "requests_judged", "seamguard_flags",
                                                     "seamguard_suspensions", "seamguard_requests_refused",
                                                     "seamguard_requests_refused_by_detector",
                                                     "static_alert_days", "static_requests_refused")}}


def stealth_detector_only(seeds: int, seed0: int) -> dict:
    """The stealthy leak's traces (the leaked key's three days, its morning, then 1.5x its own shape from
    12:00 for 2 h from a source it tried once) fed to the detector alone, no caps: per seed, seconds from
    the leak to its first step, the step, and whether it suspended the key."""
    from seamguard.gateway.zombie import ZombieDetector

    leak_t, rows = 3 * DAY + 12 * HOUR, []
    for s in range(seed0, seed0 + seeds):
        rng, leaked = random.Random(s), LEAK_KEYS[s % len(LEAK_KEYS)]
        history = legit_trace(0.0, 3 * DAY, rng) + legit_trace(3 * DAY, leak_t - HOUR, rng)
        history = [r for r in history if r.key == leaked] + [Req(DAY + 12 * HOUR, leaked, 20, 16, 16, STEALTH_SOURCE)]
        live = sorted(legit_trace(leak_t - HOUR, leak_t + 2 * HOUR, rng)
                      + stealth_trace(leak_t, leak_t + 2 * HOUR, rng, leaked), key=lambda r: r.t)
        det = ZombieDetector()
        seed_detector(det, sorted(history, key=lambda r: r.t))
        row: dict = {"seed": s, "key": leaked, "time_to_detect_s": None, "reason": None, "suspended": False}
        for i, r in enumerate(x for x in live if x.key == leaked):
            det_steps = [det.observe_request(r.key, r.t, r.prompt + r.max_tokens, r.source)]
            det.admitted(r.key, r.t, r.prompt + r.max_tokens)
            det_steps.append(det.observe_result(r.key, r.t + r.duration_s, True, f"l{i}"))
            for st in det_steps:
                if st is not None and st.to_state != "ok" and row["time_to_detect_s"] is None:
                    row.update(time_to_detect_s=round(r.t - leak_t, 1), reason=st.reason,
                               throttle_tpm=st.throttle_tpm)
                row["suspended"] |= st is not None and st.to_state == "suspended"
        rows.append(row)
        print(f"detector-only stealth seed {s}: {row}", file=sys.stderr)
    hit = [r["time_to_detect_s"] for r in rows if r["time_to_detect_s"] is not None and r["time_to_detect_s"] <= HOUR]
    return {"seeds": [seed0, seed0 + seeds - 1], "per_seed": rows, "within_the_hour": len(hit),
            "median_time_to_detect_s": float(np.median(hit)) if len(hit) == len(rows) else None,
            "suspended": sum(r["suspended"] for r in rows)}


def print_healthy(h: dict) -> None:
    print(f"\nhealthy keys ({h['weeks']:g} weeks: weekends at {h['weekend_level']:g}, days +-{h['day_sigma']:g}, "
          f"{h['growth_per_week']:g}x a week; judged from day 7): {h['days_judged']} key-days, "
          f"{h['requests_judged']} requests")
    print(f"  static+alert: {h['static_alert_days']} alert-days, {h['static_requests_refused']} requests refused by "
          f"its caps")
    print(f"  seamguard:    {h['seamguard_flags']} flags, {h['seamguard_suspensions']} suspensions, "
          f"{h['seamguard_requests_refused']} requests refused (the same caps, and "
          f"{h['seamguard_requests_refused_by_detector']} by the detector's throttle)")


def summarize_dicts(rows: list[dict]) -> dict:
    """Median [min, max] of each numeric figure over seeds (None where any seed had none), and the
    reasons seen."""
    out: dict = {}
    for f in rows[0]:
        xs = [r[f] for r in rows]
        if f in ("detected_by", "leaked_key"):
            out[f] = sorted({str(x) for x in xs})
            continue
        vals = [x for x in xs if x is not None]
        out[f] = float(np.median(vals)) if len(vals) == len(xs) else None
        out[f + "_spread"] = [min(vals), max(vals)] if vals else None
        out[f + "_missing"] = len(xs) - len(vals)
    return out


def print_leaks(res: dict) -> None:
    for scenario, r in res.items():
        print(f"\n{scenario} (from 12:00 for {r['hours_after']:g} h; median [min-max]; '-' none in some seed)")
        print(f"{'':28} {'static+alert':>28} {'seamguard':>28}")
        for f in ("time_to_detect_s", "time_to_first_refusal_s", "leak_tokens_before_detect", "leak_tokens",
                  "healthy_keys_flagged", "legit_requests_rejected", "owner_requests_rejected",
                  "leaked_key_suspended"):
            cells = []
            for k in ("static+alert", "seamguard"):
                v, sp, miss = r[k][f], r[k][f + "_spread"], r[k][f + "_missing"]
                cells.append(("-" if v is None else f"{v:g}") + ("" if sp is None else f" [{sp[0]:g}-{sp[1]:g}]")
                             + (f" ({miss} none)" if miss else ""))
            print(f"{f:28} {cells[0]:>28} {cells[1]:>28}")
        print(f"{'detected_by':28} {','.join(r['static+alert']['detected_by']):>28} "
              f"{','.join(r['seamguard']['detected_by']):>28}")
        for k in ("static+alert", "seamguard"):
            per = r["per_seed_time_to_detect_s"][k]
            within_s = min(HOUR, r["hours_after"] * HOUR)
            hit = [x for x in per if x is not None and x <= within_s]
            print(f"{k}: detected within {within_s / 60:g} min in {len(hit)} of {len(per)} seeds "
                  f"{r['seeds']} (keys {','.join(r[k]['leaked_key'])}); per seed {per}")



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 2 min: 2 seeds (full: 3); 15 min before and after "
                                                         "the leak (full: 2 h, then to midnight); 5 s + 25 s over "
                                                         "HTTP (full: 30 s + 120 s); ramp 15 min, stealth 30 min "
                                                         "(full: 1 h, to midnight); healthy keys 9 days (full: 21)")
    ap.add_argument("--seeds", type=int)
    ap.add_argument("--seed0", type=int, default=1000, help="first seed of the ramp and stealthy-leak scenarios "
                                                            "(seeds 0-5 were used while developing the detector: "
                                                            "1000 up are held out)")
    ap.add_argument("--no-http", action="store_true", help="simulated time only")
    ap.add_argument("--leaks-only", action="store_true", help="only the ramp and stealthy-leak scenarios")
    ap.add_argument("--detector-only", action="store_true", help="only the stealthy leak, fed to the detector alone")
    args = ap.parse_args()
    if args.detector_only:
        print(json.dumps({"seed0": args.seed0, "detector_only_stealth": stealth_detector_only(args.seeds or 12,
                                                                                              args.seed0)}))
        return
    mode = "quick" if args.quick else "full"
    scope = SCOPE[mode]
    seeds = args.seeds or scope["seeds"]
    if args.leaks_only:
        leaks = run_leaks(seeds, args.quick, args.seed0)
        healthy = run_healthy(seeds, args.quick, args.seed0)
        print_leaks(leaks)
        print_healthy(healthy)
        print(json.dumps({"quick": args.quick, "mode": mode, "scope": scope, "seeds": seeds, "seed0": args.seed0,
                          "leaks": leaks,
                          "healthy": healthy}))
        return
    # the full run lets the leak go on until midnight: long enough for a static limit to run the
    # tenant's day out; --quick stops 15 min after the leak
    before_h, after_h = scope["before_h"], scope["after_h"]
    leak_t = 3 * DAY + 12 * HOUR
    runs: dict[str, list[Tally]] = {"static": [], "seamguard": []}
    t_begin, load_start = time.perf_counter(), os.getloadavg()[0]
    for s in range(seeds):
        rng = random.Random(s)
        history = legit_trace(0.0, 3 * DAY, rng)
        live = sorted(legit_trace(leak_t - before_h * HOUR, leak_t + after_h * HOUR, rng)
                      + zombie_trace(leak_t, leak_t + after_h * HOUR, rng), key=lambda r: r.t)
        order = ("static", "seamguard") if s % 2 == 0 else ("seamguard", "static")
        for system in order:
            runs[system].append(asyncio.run(simulate(system, history, live, leak_t)))
        print(f"seed {s}: " + ", ".join(f"{k} lost {v[-1].tokens_lost_to_zombie} tokens, rejected "
                                          f"{v[-1].legit_requests_rejected} legit" for k, v in runs.items()),
              file=sys.stderr)
    sim = {k: summarize(v) for k, v in runs.items()}
    sim_s = time.perf_counter() - t_begin
    out: dict = {"quick": args.quick, "mode": mode, "scope": scope, "seeds": seeds, "hours_before_leak": before_h,
                 "hours_after_leak": after_h,
                 "zombie_rps": ZOMBIE_RPS, "sim": sim, "sim_wall_s": round(sim_s, 1)}

    print(f"\nsimulated time, {seeds} seeds, leak at 12:00 for {after_h:g} h (median [min-max])")
    print(f"{'':28} {'static':>24} {'seamguard':>24}")
    for f in ("time_to_throttle_s", "time_to_suspend_s", "tokens_lost_to_zombie", "legit_requests_rejected",
              "owner_requests_rejected", "legit_keys_flagged"):
        cells = []
        for k in ("static", "seamguard"):
            v, sp = sim[k][f], sim[k][f + "_spread"]
            cells.append("-" if v is None else f"{v:g} [{sp[0]:g}-{sp[1]:g}]")
        print(f"{f:28} {cells[0]:>24} {cells[1]:>24}")
    lost_s, lost_g = sim["static"]["tokens_lost_to_zombie"], sim["seamguard"]["tokens_lost_to_zombie"]
    out["tokens_lost_ratio_static_over_seamguard"] = round(lost_s / max(1.0, lost_g), 2)

    if not args.no_http:
        rng = random.Random(1000)
        wall0 = time.time()
        pre, post = scope["http_before_s"], scope["http_after_s"]
        leak_wall = wall0 + 5.0 + pre
        history = legit_trace(wall0 - 3 * DAY, wall0, rng)
        live = sorted(legit_trace(wall0 + 5.0, leak_wall + post, rng)
                      + zombie_trace(leak_wall, leak_wall + post, rng), key=lambda r: r.t)
        with tempfile.TemporaryDirectory(prefix="token-gw-") as d:
            tl = asyncio.run(http_run(history, live, leak_wall, wall0, Path(d)))
        out["http"] = {"seconds_before_leak": pre, "seconds_after_leak": post, **vars(tl)}
        print(f"\nend to end over HTTP (seamguard, wall clock, {pre:g} s then the leak for {post:g} s, "
              f"hour {time.gmtime(wall0).tm_hour} UTC): throttled after {tl.time_to_throttle_s} s, suspended after "
              f"{tl.time_to_suspend_s} s, {tl.tokens_lost_to_zombie} tokens to the leak, "
              f"{tl.legit_requests_rejected} of {tl.legit_requests} legit requests rejected "
              f"(owner {tl.owner_requests_rejected} of {tl.owner_requests}), {tl.legit_keys_flagged} legit keys flagged")
    t_leaks = time.perf_counter()
    out["leaks"] = run_leaks(seeds, args.quick, args.seed0)
    out["healthy"] = run_healthy(seeds, args.quick, args.seed0)
    out["leaks_wall_s"] = round(time.perf_counter() - t_leaks, 1)
    print_leaks(out["leaks"])
    print_healthy(out["healthy"])
    g = sim["seamguard"]
    out["goal_throttled_within_30s"] = bool(g["time_to_throttle_s_spread"] and g["time_to_throttle_s_spread"][1] <= 30
                                           and (args.no_http or (out["http"]["time_to_throttle_s"] or 1e9) <= 30))
    out["goal_no_legit_rejected"] = bool(g["legit_requests_rejected_spread"][1] == 0
                                         and (args.no_http or out["http"]["legit_requests_rejected"] == 0))
    out["wall_s"] = round(time.perf_counter() - t_begin, 1)  # the replays, HTTP leg included (not start-up)
    out["loadavg_1m"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    out["cpus"] = os.cpu_count()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
