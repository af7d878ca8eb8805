"""The zombie detector's response is proportionate to its evidence, and a rare source is evidence too.

Simulated time, the throttle applied as the gateway applies it (a throttled key's minute admits
reservations up to its TPM). A slow statistical departure (spend over history) throttles a key to
its own envelope for the time of day and never suspends it on its own; a fast strong one (volume)
still suspends. A leak from a source the key barely knows is caught sooner than the same leak from
its own client; clients that rotate addresses (a NAT pool, mobile networks) are not a leak.
"""

from __future__ import annotations

import random

import pytest

from seamguard.gateway.zombie import ZombieDetector, ZombieThresholds
from seamguard.gateway.zombie_history import bin_evidence, learn_reference, rare_source_llr, rare_source_share
from tests.gateway.test_zombie import DAY, HOME
from tests.gateway.test_zombie_ramps import random_key_day, random_shape

HOUR = 3600.0
OFFICE = "10.0.0.6|python-openai"
SLOW_RULES = ("spend over its history", "round-the-clock")


class Gateway:
    """The detector with its throttle applied: requests refused while their minute is full or the key suspended."""

    def __init__(self, det: ZombieDetector, key: str = "k") -> None:
        self.det, self.key, self.minute, self.used = det, key, -1, 0
        self.steps: list = []
        self.refused = 0

    def send(self, t: float, tokens: int, source: str = HOME) -> bool:
        self._keep(t, self.det.observe_request(self.key, t, tokens, source))
        state, tpm = self.det.state(self.key)
        if int(t // 60) != self.minute:
            self.minute, self.used = int(t // 60), 0
        if state == "suspended" or (state == "throttled" and tpm is not None and self.used + tokens > tpm):
            self.refused += 1
            return False
        self.det.admitted(self.key, t, tokens)
        self.used += tokens
        self._keep(t, self.det.observe_result(self.key, t + 0.2, True, f"r{t}"))
        return True

    def _keep(self, t: float, step) -> None:
        if step is not None:
            self.steps.append((t, step))


def two_level_day(gw: Gateway, d: int, until_h: float = 18.0, extra=None) -> None:
    """Quiet mornings (1,000 tokens every 30 s, 9-12) and busy afternoons (every 10 s, 12-18), alternating its
    two clients; ``extra(t)`` -> (tokens, source) requests a leak adds at t."""
    t = d * DAY + 9 * HOUR
    while t < d * DAY + until_h * HOUR:
        gw.send(t, 1000, HOME if int(t) % 20 < 10 else OFFICE)
        for n, src in (extra(t) if extra else []):
            gw.send(t + 1.0, n, src)
        t += 30.0 if t < d * DAY + 12 * HOUR else 10.0


def quiet_morning_key() -> Gateway:
    gw = Gateway(ZombieDetector())
    for d in range(4):
        two_level_day(gw, d)
    assert gw.steps == [] and gw.refused == 0
    return gw


def test_a_slow_departure_throttles_to_the_key_s_envelope_and_never_suspends():
    """1.5x the key's morning spend from its own client from 9:30 to 10:45: under its peak minute (set in
    the afternoons), so the old peak-based throttle would not bind; the envelope does, the key is never
    suspended, and the throttle lifts once its spend is back to its usual."""
    gw = quiet_morning_key()
    d = 4
    leak = lambda t: [(1000, OFFICE), (500, OFFICE)] if d * DAY + 9.5 * HOUR <= t < d * DAY + 10.75 * HOUR else []  # noqa: E731
    two_level_day(gw, d, until_h=12.0, extra=leak)
    moves = [(round((t - d * DAY) / HOUR, 2), s.to_state, s.reason, s.throttle_tpm) for t, s in gw.steps]
    assert moves and moves[0][1] == "throttled" and moves[0][2].startswith("spend over its history"), moves
    peak = gw.det.baseline("k")["peak_minute_tokens"]
    morning_tpm = 2000.0  # 1,000 tokens every 30 s
    assert moves[0][3] <= 1.5 * morning_tpm * 1.25 < 1.5 * peak, (moves[0], peak)  # x its day allowance (>= 1.22)
    assert moves[0][3] < (1 + 1.5) * morning_tpm, "the envelope does not cap the leak's excess"
    assert moves[0][0] <= 10.5, "not throttled within the hour"
    assert "suspended" not in [m[1] for m in moves], moves
    assert moves[-1][1] == "ok" and moves[-1][0] < 12.0, moves


def test_a_strong_departure_while_throttled_by_history_still_suspends():
    gw = quiet_morning_key()
    d = 4
    leak = lambda t: [(1000, OFFICE), (500, OFFICE)] if t >= d * DAY + 9.5 * HOUR else []  # noqa: E731
    two_level_day(gw, d, until_h=10.5, extra=leak)
    assert [s.to_state for _, s in gw.steps] == ["throttled"]
    t0 = d * DAY + 10.5 * HOUR
    for i in range(1200):  # 20x its peak minute, refused or not, for two minutes: slamming into the throttle
        gw.send(t0 + 0.1 * i, 1000, OFFICE)
    last = gw.steps[-1][1]
    assert (last.from_state, last.to_state) == ("throttled", "suspended")
    assert last.reason.startswith("volume over its own peak")


def noisy_healthy_weeks(seed: int, weeks: int = 3, rotating: bool = False) -> Gateway:
    """A random healthy key as real ones look: weekends at 30 %, days lognormal(0, 0.2) (about +-20 %),
    growing 20 % a week; ``rotating``: every request from one of 256 addresses drawn afresh each day."""
    rng = random.Random(seed)
    shape, gw = random_shape(rng), Gateway(ZombieDetector())
    for d in range(weeks * 7):
        level = 1.2 ** (d / 7) * rng.lognormvariate(0, 0.2) * (0.3 if d % 7 in (5, 6) else 1.0)
        for t, n in random_key_day(rng, d, 1.0, shape):
            copies = int(level) + (rng.random() < level - int(level))
            for i in range(copies):
                src = f"100.64.{d}.{rng.randrange(256)}|okhttp" if rotating else HOME
                gw.send(t + 0.5 * i, n, src)
    return gw


@pytest.mark.parametrize("seed", range(2))
def test_a_healthy_noisy_key_is_never_suspended_and_at_most_throttled_to_its_envelope(seed):
    gw = noisy_healthy_weeks(500 + seed)
    th = ZombieThresholds()
    for _, s in gw.steps:
        assert s.to_state in ("throttled", "ok"), (s.to_state, s.reason, s.evidence)
        if s.to_state == "throttled":
            assert s.reason.startswith(SLOW_RULES), s.reason
            assert s.throttle_tpm >= th.throttle_floor_tpm and s.evidence["throttle_tpm"] == s.throttle_tpm


@pytest.mark.parametrize("seed", range(2))
def test_clients_that_rotate_addresses_are_not_a_leak(seed):
    gw = noisy_healthy_weeks(600 + seed, weeks=2, rotating=True)
    assert [s.to_state for _, s in gw.steps if s.to_state == "suspended"] == []
    assert all(not s.reason.startswith("volume from a new source") for _, s in gw.steps), \
        [(s.reason, s.evidence) for _, s in gw.steps]


# ---- a rare source's evidence ----------------------------------------------------------------------------
@pytest.mark.parametrize("bin_sources,expect", [
    ({"a": 900.0, "b": 100.0}, 0.0),                                 # its own clients
    ({"a": 400.0, "leak": 600.0}, 0.6),                               # one source it never used carries 60 %
    ({"a": 400.0, "tried-once": 600.0}, 0.6),                         # ... or used once (under 2 % of its spend)
    ({"a": 400.0, **{f"nat{i}": 20.0 for i in range(30)}}, 20 / 1000),  # many new addresses, each small
    ({}, 0.0),
])
def test_rare_source_share(bin_sources, expect):
    known = {"a": 9000.0, "b": 1000.0, "tried-once": 10.0}
    assert rare_source_share(bin_sources, known, sum(known.values()), 0.02) == pytest.approx(expect)
    assert rare_source_share(bin_sources, {}, 0.0, 0.02) == 0.0  # no history: no judgement


def test_a_rare_source_is_weaker_evidence_for_a_key_whose_history_is_full_of_them():
    assert rare_source_llr(0, 600) > rare_source_llr(60, 600) > rare_source_llr(300, 600) == 0.0


def test_a_rare_source_only_adds_to_a_bin_that_already_leans_towards_the_leak():
    from tests.gateway.test_zombie_history import BAR, GATE, PSEUDO, SHIFT, day
    ref = learn_reference({d: day(30000.0) for d in range(3)}, 3, SHIFT, GATE, PSEUDO, 3)
    usual = float(ref.usual[144])
    assert bin_evidence(30000.0, usual, ref, 1.5, PSEUDO, BAR, 5.0) == bin_evidence(30000.0, usual, ref, 1.5,
                                                                                    PSEUDO, BAR)
    leaning = bin_evidence(30000.0 * 1.6, usual, ref, 1.5, PSEUDO, BAR)
    assert 0 < leaning < bin_evidence(30000.0 * 1.6, usual, ref, 1.5, PSEUDO, BAR, 0.5) <= BAR / 4


def first_step_after_leak(source: str, seed: int) -> float | None:
    """A noisy random key (about 4 requests a minute at its peak), then the same key plus 0.8x its own
    requests from ``source`` from mid-day: seconds to its first step (None: never within 3 h)."""
    rng = random.Random(seed)
    shape, gw = random_shape(rng), Gateway(ZombieDetector())
    for d in range(5):
        for t, n in random_key_day(rng, d, 1.0, shape):
            gw.send(t, n, HOME)
    gw.send(4 * DAY + 12 * HOUR, 50, "198.51.100.7|python-requests")  # the leak's client, tried once
    d = 5
    leak_at = d * DAY + (shape[0] + shape[1] / 2 - 1.5) * HOUR
    for t, n in random_key_day(random.Random(seed + 1), d, 1.0, shape):
        gw.send(t, n, HOME)
        if t >= leak_at and rng.random() < 0.8:
            gw.send(t + 1.0, n, source)
    flagged = [t for t, s in gw.steps if s.to_state != "ok"]
    assert all(t >= leak_at for t in flagged), "flagged before the leak"
    return flagged[0] - leak_at if flagged else None


@pytest.mark.parametrize("seed", range(2))
def test_a_leak_from_a_source_the_key_barely_knows_is_caught_sooner(seed):
    rare = first_step_after_leak("198.51.100.7|python-requests", 700 + seed)
    own = first_step_after_leak(HOME, 700 + seed)
    assert rare is not None and rare <= HOUR, rare
    assert own is None or rare <= own, (rare, own)


def test_the_envelope_follows_the_time_of_day():
    """Throttled on its quiet morning, the key's TPM rises with its busy afternoon: a healthy key flagged in the
    morning is not held to its morning's rate all day."""
    gw = quiet_morning_key()
    d = 4
    leak = lambda t: [(1000, OFFICE), (500, OFFICE)] if t >= d * DAY + 9.5 * HOUR else []  # noqa: E731
    two_level_day(gw, d, until_h=10.5, extra=leak)
    state, morning = gw.det.state("k")
    assert state == "throttled"
    t = d * DAY + 10.5 * HOUR
    while t < d * DAY + 13 * HOUR:  # the key's own traffic (its afternoon from 12:00) and the leak
        gw.send(t, 1000, HOME)
        gw.send(t + 1.0, 1500, OFFICE)
        t += 30.0 if t < d * DAY + 12 * HOUR else 10.0
    state, afternoon = gw.det.state("k")
    assert state == "throttled" and afternoon > 1.5 * morning, (morning, afternoon)
