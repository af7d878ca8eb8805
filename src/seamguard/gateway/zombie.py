"""Zombie-key detection: a key whose consumption departs from its own history.

Pure and online: the gateway feeds each request (``observe_request``) and each result
(``observe_result``) with the time it read from its clock; the detector keeps, per key, a
few numbers learned from that key alone and returns a `Step` when the key's state should
change. Nothing here reads a clock, a file or the network. Departures:

- volume: demand (tokens asked for, admitted or not) in the last 60 s over ``volume_ratio``
  x the key's own peak minute (a max of its minute totals that decays with a 7-day half-life;
  a minute is learned only once the minute after it closed without a departure too);
- new source: most of that demand from an address/user agent first seen in the last hour,
  at ``new_source_ratio`` x its peak (a new source alone is normal: laptops move);
- error-retry loop: ``error_loop_count`` failures of one identical request in 60 s while most
  results fail (no history needed: a loop is wrong for any key);
- round-the-clock: active in ``rtc_active_hours`` of the last 24 hours while on no day of
  its history it was active in more than ``rtc_history_max_hours``.

Response is graduated: ok -> throttled (its TPM lowered to its own peak with headroom) ->
suspended when the departure is still there ``suspend_after_s`` later. A throttle lifts
after ``release_after_s`` without a departure; a suspension stays until an operator acts.
Baselines learn only from minutes with no departure, so a drain does not become normal.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

KeyState = Literal["ok", "throttled", "suspended"]
WINDOW_S = 60.0


class ZombieThresholds(BaseModel):
    """Thresholds and why (docs/gateway.md#zombie-keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    warmup_minutes: int = Field(60, ge=1, description="active minutes of history before volume is judged")
    volume_ratio: float = Field(4.0, gt=1, description="last-60-s demand over the key's own peak minute")
    new_source_ratio: float = Field(1.5, gt=1, description="the same, when most of it comes from a new source")
    volume_floor_tokens: int = Field(2000, ge=0, description="demand per minute below which nothing is judged")
    new_source_s: float = Field(3600.0, gt=0, description="a source first seen this recently is new")
    error_loop_count: int = Field(20, ge=2, description="identical failing requests in 60 s")
    error_ratio: float = Field(0.5, gt=0, le=1, description="... while this share of results fails")
    rtc_active_hours: int = Field(20, ge=1, le=24, description="active hours of the last 24 that are round-the-clock")
    rtc_history_max_hours: int = Field(16, ge=0, le=24, description="... for a key never active this long a day")
    rtc_history_days: int = Field(3, ge=1, description="complete days of history before round-the-clock is judged")
    suspend_after_s: float = Field(60.0, gt=0, description="throttled and still departing this long: suspend")
    release_after_s: float = Field(900.0, gt=0, description="throttled and quiet this long: back to ok")
    throttle_headroom: float = Field(1.5, gt=0, description="a throttled key's TPM: its peak minute x this")
    throttle_floor_tpm: int = Field(1000, ge=1, description="... but never below this")
    override_s: float = Field(3600.0, ge=0, description="after an operator's unsuspend, no automatic step this long")
    peak_half_life_s: float = Field(7 * 86400.0, gt=0, description="how fast an old peak minute is forgotten")
    max_sources: int = Field(64, ge=1, description="sources remembered per key (least recently seen dropped)")


@dataclass(frozen=True)
class Step:
    """A change of a key's state, with its evidence (what the ledger records)."""

    key: str
    from_state: KeyState
    to_state: KeyState
    reason: str
    evidence: dict[str, float]
    throttle_tpm: int | None = None  # the TPM cap while throttled
    actor: str = "zombie-detector"


@dataclass
class _Key:
    state: KeyState = "ok"
    since: float = 0.0
    last_departure: float = -math.inf
    throttle_tpm: int | None = None
    override_until: float = -math.inf
    # learned
    peak: float = 0.0  # decayed max of minute demand
    peak_t: float = 0.0
    active_minutes: int = 0
    minute: int | None = None
    minute_total: int = 0
    minute_departed: bool = False
    last_t: float = -math.inf
    pending: float | None = None  # the last closed minute's total, learned if the next one is ordinary too
    first_seen: float | None = None
    sources: dict[str, float] = field(default_factory=dict)  # source -> first seen
    hours: deque = field(default_factory=lambda: deque(maxlen=24))  # active hour indices, last 24 h
    day: int | None = None
    day_hours: set = field(default_factory=set)
    day_history: deque = field(default_factory=lambda: deque(maxlen=14))  # active hours per complete day
    # last 60 s
    # last 60 s, with running sums so that judging a request costs O(1), not O(requests in a minute)
    demand: deque = field(default_factory=deque)  # (t, tokens, from a new source)
    demand_sum: int = 0
    new_sum: int = 0
    results: deque = field(default_factory=deque)  # (t, ok, fingerprint)
    fails: int = 0
    fails_by_body: dict = field(default_factory=dict)  # fingerprint -> failures in the window
    last_fail: str | None = None


class ZombieDetector:
    def __init__(self, thresholds: ZombieThresholds | None = None) -> None:
        self.th = thresholds or ZombieThresholds()
        self._keys: dict[str, _Key] = {}

    def _k(self, key: str) -> _Key:
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = _Key()
        return k

    # ---- views ----------------------------------------------------------------------------
    def state(self, key: str) -> tuple[KeyState, int | None]:
        k = self._keys.get(key)
        return ("ok", None) if k is None else (k.state, k.throttle_tpm)

    def baseline(self, key: str) -> dict[str, float]:
        k = self._keys.get(key)
        if k is None:
            return {}
        return {"peak_minute_tokens": round(k.peak, 1), "active_minutes": k.active_minutes,
                "sources": len(k.sources), "max_active_hours_per_day": max(k.day_history, default=0)}

    # ---- learning ---------------------------------------------------------------------------
    def _roll(self, k: _Key, now: float) -> float:
        """Advance the key's windows to ``now`` (never backwards: two replicas' or threads' clocks may
        interleave out of order by a little); returns the time used."""
        now = max(now, k.last_t)
        k.last_t = now
        m = math.floor(now / WINDOW_S)
        if k.minute is not None and m != k.minute:
            # A minute is learned one minute late, once the next one closed without a departure
            # too: the first minute of a ramp (not yet over the bar) must not raise the bar.
            if k.pending is not None and not k.minute_departed:
                decay = 0.5 ** ((now - k.peak_t) / self.th.peak_half_life_s)
                k.peak = max(k.pending, k.peak * decay)
                k.peak_t = now
                k.active_minutes += 1
            k.pending = None
            if k.minute_total > 0 and not k.minute_departed and k.state == "ok":  # never learn a departure
                k.pending = float(k.minute_total)
        if m != k.minute:
            k.minute, k.minute_total, k.minute_departed = m, 0, False
        h = math.floor(now / 3600.0)
        if not k.hours or k.hours[-1] != h:
            k.hours.append(h)
        d = math.floor(now / 86400.0)
        if k.day is not None and d != k.day:
            k.day_history.append(len(k.day_hours))  # idle days are not counted: weekends stay normal
            k.day_hours = set()
        k.day = d
        k.day_hours.add(h % 24)
        while k.demand and k.demand[0][0] <= now - WINDOW_S:
            _, n, new = k.demand.popleft()
            k.demand_sum -= n
            k.new_sum -= n if new else 0
        while k.results and k.results[0][0] <= now - WINDOW_S:
            _, ok, fp = k.results.popleft()
            if not ok:
                k.fails -= 1
                left = k.fails_by_body[fp] - 1
                if left:
                    k.fails_by_body[fp] = left
                else:
                    del k.fails_by_body[fp]
        return now

    def _new_source(self, k: _Key, source: str, now: float) -> bool:
        first = k.sources.pop(source, None)
        if first is None:
            first = now
            if len(k.sources) >= self.th.max_sources:
                k.sources.pop(next(iter(k.sources)))
        k.sources[source] = first  # re-inserted: most recently seen last
        # new only for a key that was already known before this source appeared
        return k.first_seen is not None and k.first_seen < first - 1.0 and now - first < self.th.new_source_s

    # ---- judging ------------------------------------------------------------------------------
    def _departure(self, k: _Key, now: float) -> tuple[str, dict[str, float]] | None:
        th = self.th
        demand = k.demand_sum
        if k.fails >= th.error_loop_count and k.fails >= th.error_ratio * len(k.results) and k.last_fail:
            same = k.fails_by_body.get(k.last_fail, 0)
            if same >= th.error_loop_count:
                return "error-retry loop", {"identical_failures_60s": same, "failures_60s": k.fails,
                                            "results_60s": len(k.results)}
        warm = k.active_minutes >= th.warmup_minutes and k.peak > 0
        if warm and demand > th.volume_floor_tokens:
            ratio = demand / k.peak
            new = k.new_sum
            ev = {"demand_60s_tokens": demand, "peak_minute_tokens": round(k.peak, 1), "ratio": round(ratio, 2),
                  "new_source_share": round(new / demand, 3)}
            if ratio > th.volume_ratio:
                return "volume over its own peak", ev
            if ratio > th.new_source_ratio and new >= 0.5 * demand:
                return "volume from a new source", ev
        if len(k.day_history) >= th.rtc_history_days:
            active = sum(1 for h in k.hours if h > math.floor(now / 3600.0) - 24)
            usual = max(k.day_history)
            if active >= th.rtc_active_hours and usual <= th.rtc_history_max_hours:
                return "round-the-clock traffic", {"active_hours_24h": active, "max_active_hours_per_day": usual}
        return None

    def _judge(self, key: str, k: _Key, now: float) -> Step | None:
        th = self.th
        if not th.enabled or now < k.override_until:
            return None
        dep = self._departure(k, now)
        if dep is not None:
            k.last_departure = now
            k.minute_departed = True
            k.pending = None
        if k.state == "ok" and dep is not None:
            tpm = max(th.throttle_floor_tpm, math.ceil(th.throttle_headroom * k.peak))
            return self._move(key, k, "throttled", now, dep[0], dep[1], tpm)
        if k.state == "throttled" and dep is not None and now - k.since >= th.suspend_after_s:
            return self._move(key, k, "suspended", now, f"{dep[0]}, still {now - k.since:.0f} s after the throttle",
                              dep[1], None)
        if k.state == "throttled" and dep is None and now - k.last_departure >= th.release_after_s:
            return self._move(key, k, "ok", now, f"no departure for {now - k.last_departure:.0f} s", {}, None)
        return None

    def _move(self, key: str, k: _Key, to: KeyState, now: float, reason: str, evidence: dict[str, float],
              tpm: int | None, actor: str = "zombie-detector") -> Step:
        step = Step(key, k.state, to, reason, evidence, tpm, actor)
        k.state, k.since, k.throttle_tpm = to, now, tpm
        return step

    # ---- inputs -------------------------------------------------------------------------------
    def observe_request(self, key: str, now: float, tokens: int, source: str) -> Step | None:
        """A request arrived (before admission): ``tokens`` is its reservation estimate."""
        k = self._k(key)
        now = self._roll(k, now)
        new = self._new_source(k, source, now)
        if k.first_seen is None:
            k.first_seen = now
        k.demand.append((now, tokens, new))
        k.demand_sum += tokens
        k.new_sum += tokens if new else 0
        return self._judge(key, k, now)

    def admitted(self, key: str, now: float, tokens: int) -> None:
        """The request was admitted with ``tokens`` reserved: only admitted work teaches the key's
        peak minute. A refused one still counts as demand (a zombie hammering at its limit is
        seen), but one impossible request (``max_tokens`` of 10 million) must not lift the bar
        that volume is judged by for the week its half-life lasts."""
        k = self._k(key)
        self._roll(k, now)
        k.minute_total += tokens

    def observe_result(self, key: str, now: float, ok: bool, fingerprint: str) -> Step | None:
        """A request ended (``ok`` False for a backend or client error, not for our own 429)."""
        k = self._k(key)
        now = self._roll(k, now)
        k.results.append((now, ok, fingerprint))
        if not ok:
            k.fails += 1
            k.fails_by_body[fingerprint] = k.fails_by_body.get(fingerprint, 0) + 1
            k.last_fail = fingerprint
        return self._judge(key, k, now)

    def tick(self, now: float) -> list[Step]:
        """Lift throttles whose keys went quiet (a key with no traffic sends no observation)."""
        out = []
        for key, k in self._keys.items():
            if k.state == "throttled" and now - k.last_departure >= self.th.release_after_s:
                out.append(self._move(key, k, "ok", now, f"no departure for {now - k.last_departure:.0f} s", {}, None))
        return out

    def override(self, key: str, now: float, to: KeyState, actor: str, note: str = "") -> Step:
        """An operator's word: unsuspend (``ok``, no automatic step for ``override_s``) or suspend."""
        k = self._k(key)
        if to == "ok":
            k.override_until = now + self.th.override_s
            k.demand.clear()
            k.results.clear()
            k.demand_sum = k.new_sum = k.fails = 0
            k.fails_by_body.clear()
        return self._move(key, k, to, now, note or f"operator override to {to}", {}, None, actor)

    def adopt(self, key: str, state: KeyState, throttle_tpm: int | None, now: float,
              operator_at: float | None = None) -> None:
        """Take a state another replica (or a restart) recorded in the store, without a Step.
        ``operator_at``: an operator set it then; an unsuspend holds automatic steps off here too."""
        k = self._k(key)
        if k.state != state:
            k.state, k.since, k.throttle_tpm = state, now, throttle_tpm
            if state == "ok" and operator_at is not None:
                k.override_until = operator_at + self.th.override_s
                k.demand.clear()
                k.results.clear()
                k.demand_sum = k.new_sum = k.fails = 0
                k.fails_by_body.clear()
