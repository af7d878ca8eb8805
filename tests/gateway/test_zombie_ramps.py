"""Ramps, stealthy leaks and the gateway's own failures, for the zombie-key detector (simulated time).

The false-positive cases use keys the thresholds were not tuned on: seeded random daily
shapes with noise per 5 minutes and per day, idle days, organic growth and one-off bursts.
"""

from __future__ import annotations

import math
import random

import pytest

from seamguard.gateway.zombie import ZombieDetector
from tests.gateway.test_zombie import DAY, HOME, office_hours

HOUR = 3600.0
TOKENS = 300  # per request


def feed(det: ZombieDetector, key: str, t: float, tokens: int, source: str = HOME) -> list:
    """One served request: its steps (none expected from ordinary traffic)."""
    steps = [det.observe_request(key, t, tokens, source)]
    det.admitted(key, t, tokens)
    steps.append(det.observe_result(key, t + 0.2, True, f"r{t}"))
    return [s for s in steps if s is not None]


def at_rate(t0: float, t1: float, tokens_per_min):
    """Request times in [t0, t1) for a rate (tokens a minute, a function of time) of TOKENS-token requests."""
    t = t0
    while t < t1:
        yield t
        t += 60.0 * TOKENS / max(tokens_per_min(t), 1e-6)


@pytest.mark.parametrize("factor,period_s", [
    (3.5, 120.0),    # the ramp: 3.5x every 2 minutes
    (2.0, 300.0),
    (2.0, 1200.0),   # 8x an hour
    (3.0, HOUR),     # under the volume bar within any hour
    (1.5, HOUR),
])
def test_a_geometric_ramp_is_throttled_before_ten_times_its_peak(factor, period_s):
    det = ZombieDetector()
    t0 = office_hours(det)                   # three days of 1,800 tokens a minute, 9:00-18:00
    peak = det.baseline("k")["peak_minute_tokens"]
    rate = lambda t: 1800.0 * factor ** ((t - t0) / period_s)  # noqa: E731
    for t in at_rate(t0, t0 + 7 * HOUR, rate):
        steps = [s for s in feed(det, "k", t, TOKENS) if s.to_state != "ok"]
        if steps:
            assert steps[0].to_state == "throttled"
            assert rate(t) < 10 * peak, f"throttled only at {rate(t) / peak:.1f}x its peak ({steps[0].reason})"
            return
        assert rate(t) < 10 * peak, "reached 10x its learned peak with no throttle"
    pytest.fail("never throttled")


def random_key_day(rng: random.Random, day: int, growth_per_day: float, shape: tuple,
                   per_minute: float = 4.0) -> list[tuple[float, int]]:
    """One day of a seeded random healthy key: (time, tokens) requests. The shape (start hour, hours,
    peak tokens a minute) is the key's own; a day's level varies by ~12 %, every 5 minutes by ~30 %."""
    start_h, hours, peak_tpm = shape
    day_level = rng.lognormvariate(0, 0.12) * growth_per_day ** day
    out = []
    for b in range(int(hours * 12)):
        h = b / 12
        shape_now = 0.35 + 0.65 * math.sin(math.pi * (h + 1 / 24) / hours)
        tpm = peak_tpm * day_level * shape_now * rng.lognormvariate(0, 0.3)
        t0 = day * DAY + start_h * HOUR + b * 300.0
        size = peak_tpm / per_minute  # requests a minute at its peak
        n = max(0, round(tpm * 5 / size + rng.gauss(0, 1)))
        out += [(t0 + rng.uniform(0, 300), int(size * rng.uniform(0.5, 1.5))) for _ in range(n)]
    return sorted(out)


def random_shape(rng: random.Random) -> tuple:
    return (rng.uniform(5, 11), rng.uniform(7, 15), rng.uniform(2000, 12000))


def healthy_days(det: ZombieDetector, rng: random.Random, days: int, growth_per_day: float = 1.0,
                 shape: tuple | None = None, per_minute: float = 4.0) -> tuple:
    """``days`` of a random healthy key (weekends idle); every step on the way fails the test."""
    shape = shape or random_shape(rng)
    for d in range(days):
        if d % 7 in (5, 6):
            continue
        for t, n in random_key_day(rng, d, growth_per_day, shape, per_minute):
            assert feed(det, "k", t, n) == [], f"a healthy key was flagged on day {d} (shape {shape})"
    return shape


@pytest.mark.parametrize("seed", range(4))
def test_healthy_random_daily_shapes_with_growth_are_never_flagged(seed):
    rng = random.Random(seed)
    healthy_days(ZombieDetector(), rng, 12, growth_per_day=1.0 + 0.02 * seed)  # up to 6 % a day


@pytest.mark.parametrize("seed", range(3))
def test_a_one_off_burst_under_the_jump_rules_is_not_flagged(seed):
    rng = random.Random(100 + seed)
    det = ZombieDetector()
    shape = healthy_days(det, rng, 8)
    day = 8
    burst_at = day * DAY + (shape[0] + rng.uniform(1, shape[1] - 2)) * HOUR
    peak = det.baseline("k")["peak_minute_tokens"]
    reqs = random_key_day(rng, day, 1.0, shape)
    burst = [(burst_at + i * 6.0, int(2.5 * peak / 10)) for i in range(30)]  # 3 minutes at 2.5x its peak minute
    for t, n in sorted(reqs + burst):
        assert feed(det, "k", t, n) == []


@pytest.mark.parametrize("seed,share", [(0, 1.5), (1, 1.5), (2, 1.5), (3, 1.5)])
def test_a_stealthy_leak_following_the_daily_shape_is_caught_within_an_hour(seed, share):
    """A second client adds ``share`` x the key's own spend at every time of day, from a source
    first seen two hours earlier (so it is not new), never 1.5x its peak minute on its own."""
    rng = random.Random(200 + seed)
    det = ZombieDetector()
    shape = healthy_days(det, rng, 8, per_minute=20.0)  # a busy key: its day-to-day spread is under the leak
    day = 8
    leak_at = day * DAY + (shape[0] + rng.uniform(2, shape[1] - 2)) * HOUR
    own = random_key_day(rng, day, 1.0, shape, per_minute=20.0)
    leak = []  # a copy of the key's own requests, scaled by share
    for t, n in own:
        copies = int(share) + (rng.random() < share - int(share))
        leak += [(t + 1.0 + i, n, "198.51.100.7|python-requests") for i in range(copies) if t + 1.0 + i >= leak_at]
    leak.append((leak_at - 2 * HOUR, 50, "198.51.100.7|python-requests"))  # first seen earlier: not a new source
    events = sorted([(t, n, HOME) for t, n in own] + leak)
    for t, n, src in events:
        steps = [s for s in feed(det, "k", t, n, src) if s.to_state != "ok"]
        if steps:
            assert t >= leak_at, f"flagged {leak_at - t:.0f} s before the leak ({steps[0].reason})"
            assert t - leak_at <= 60 * 60.0, f"caught {t - leak_at:.0f} s after the leak"
            assert steps[0].reason.startswith("spend over its history")
            assert steps[0].evidence["ratio"] > 1.5
            return
    pytest.fail("the leak was never caught")


def test_the_history_rule_needs_three_active_days():
    det = ZombieDetector()
    t0 = office_hours(det, days=2)
    # twice its usual spend for three hours, from its usual source: no history to compare with yet
    assert [s for t in at_rate(t0, t0 + 3 * HOUR, lambda t: 3600.0) for s in feed(det, "k", t, TOKENS)] == []


# ---- the gateway's own failures -------------------------------------------------------------------
def test_a_client_retrying_through_a_backend_outage_is_never_flagged():
    """One identical request a second for five minutes, every one failed by the gateway (502)."""
    det = ZombieDetector()
    t0 = office_hours(det)
    for i in range(300):
        t = t0 + i
        assert det.observe_request("k", t, TOKENS, HOME, request=i) is None
        det.admitted("k", t, TOKENS, request=i)
        assert det.observe_result("k", t + 0.01, False, "same-body", gateway_fault=True, request=i) is None
    # the same requests failed by the backend as bad requests (4xx) are a loop
    steps = []
    for i in range(300, 360):
        t = t0 + i
        det.observe_request("k", t, TOKENS, HOME, request=i)
        det.admitted("k", t, TOKENS, request=i)
        steps.append(det.observe_result("k", t + 0.01, False, "same-body", request=i))
    assert any(s is not None and s.reason == "error-retry loop" for s in steps)


def test_a_suspension_whose_evidence_timed_out_in_the_gateway_is_lifted():
    """Retries pile up while the backend hangs: the key is throttled, then suspended on demand that
    the gateway then fails with 504s; once those are withdrawn, the evidence is under its bar."""
    det = ZombieDetector()
    t0 = office_hours(det)
    steps, rid = [], 0
    for i in range(400):  # 10 requests of 300 a second, all hanging: 60x its peak minute
        t = t0 + i * 0.1
        rid += 1
        s = det.observe_request("k", t, TOKENS, HOME, request=rid)
        steps += [s] if s else []
    steps += [det.observe_request("k", t0 + 63.0, TOKENS, HOME, request=rid + 1)]
    assert [s.to_state for s in steps if s] == ["throttled", "suspended"]
    lifted = [det.observe_result("k", t0 + 62.0, False, "x", gateway_fault=True, request=r) for r in range(1, rid + 2)]
    (up,) = [s for s in lifted if s is not None]
    assert (up.from_state, up.to_state, up.reason) == ("suspended", "ok", "its evidence was the gateway's own failures")
    assert det.state("k") == ("ok", None)


def test_a_suspension_on_the_key_s_own_demand_is_not_lifted_by_a_few_gateway_failures():
    det = ZombieDetector()
    t0 = office_hours(det)
    rid = 0
    for i in range(700):
        rid += 1
        det.observe_request("k", t0 + i * 0.1, TOKENS, HOME, request=rid)
    assert det.state("k")[0] == "suspended"
    for r in range(rid - 5, rid + 1):  # five of them failed by the gateway: the rest is still 30x its peak
        assert det.observe_result("k", t0 + 70.0, False, "x", gateway_fault=True, request=r) is None
    assert det.state("k")[0] == "suspended"


def noisy_weeks(det: ZombieDetector, rng: random.Random, weeks: int, growth_per_week: float,
                weekend_level: float, day_sigma: float) -> list:
    """Weeks of a random healthy key as real ones look: weekends at ``weekend_level`` of a weekday,
    each day's level lognormal(0, ``day_sigma``), organic growth; its steps (none expected)."""
    shape, steps = random_shape(rng), []
    for d in range(weeks * 7):
        level = growth_per_week ** (d / 7) * rng.lognormvariate(0, day_sigma) * (weekend_level if d % 7 in (5, 6)
                                                                                 else 1.0)
        for t, n in random_key_day(rng, d, 1.0, shape):
            copies = int(level) + (rng.random() < level - int(level))  # the day's level, request by request
            for i in range(copies):
                steps += [s for s in feed(det, "k", t + 0.5 * i, n) if s.to_state != "ok"]
    return steps


@pytest.mark.parametrize("seed", range(2))
def test_healthy_keys_with_weekends_noisy_days_and_growth_are_never_flagged(seed):
    """Three weeks: weekends at 30 % of a weekday, days varying ~10 %, growing 20 % a week."""
    steps = noisy_weeks(ZombieDetector(), random.Random(300 + seed), 3, 1.2, 0.3, 0.1)
    assert steps == [], [(s.reason, s.evidence) for s in steps]
