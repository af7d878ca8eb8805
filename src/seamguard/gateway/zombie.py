"""Zombie-key detection: a key whose consumption departs from its own history.

Pure and online: the gateway feeds each request (``observe_request``) and each result
(``observe_result``) with the time it read from its clock; the detector keeps, per key, a
few numbers learned from that key alone and returns a `Step` when the key's state should
change. Nothing here reads a clock, a file or the network. Departures:

- volume: demand (tokens asked for, admitted or not) in the last 60 s over ``volume_ratio``
  x the key's own peak minute (a max of its minute totals that decays with a 7-day half-life;
  a minute teaches the peak only ``peak_settle_s`` after it closed with no departure since,
  so a ramp cannot raise its own bar: growing more than ``volume_ratio`` x within that time is
  a departure whether it comes as a jump or as a ramp);
- new source: most of that demand from one address/user agent first seen in the last hour,
  at ``new_source_ratio`` x its peak (a new source alone is normal: laptops move);
- spend over history: the key's level in the last hour (the median of its 12 bins of 5 minutes)
  over ``history_ratio`` x what it usually spent at that time of day (give or take
  ``history_shift_s``) over its last ``history_days`` active days (the median day, but no
  less than 3/4 of the busiest): a leak that follows the key's daily shape, or a ramp slower
  than the volume rule sees, stays above its history;
- spend over history, bin by bin (``zombie_history.py``): each closed 5-minute bin's demand
  against the key's usual at that time of day adds to a CUSUM of the evidence for "spend
  ``history_seq_ratio`` x usual", with the spread learned from the key's own days; over
  ln(``history_false_alarm_bins``) is a departure (a shape-following leak is seen in ~20-40
  minutes, sooner than the hour's median moves); a bin carried by a source the key's previous days
  barely know adds the evidence of that, as rare as such bins were in the key's own history;
- error-retry loop: ``error_loop_count`` failures of one identical request in 60 s while most
  results fail (no history needed: a loop is wrong for any key);
- round-the-clock: active in ``rtc_active_hours`` of the last 24 hours while on no day of
  its history it was active in more than ``rtc_history_max_hours``.

Response is proportionate to the evidence. A fast, strong departure (volume, new source, error
loop) throttles the key to its own peak with headroom and suspends it when a strong departure is
still there ``suspend_after_s`` later. A slow statistical one (spend over history, either form;
round-the-clock) throttles the key to its own envelope (what it usually spends at this time of day
x ``history_headroom``), which caps a shape-following leak's excess, and never suspends on its
own: a key throttled that way is suspended only if a strong rule fires too (its demand, refused
requests included, over its peak: a key that keeps slamming into the throttle). A throttle lifts
after ``release_after_s`` without a departure; a suspension stays until an operator acts.
Baselines learn only from minutes with no departure, so a drain does not become normal.

The gateway's own failures (a backend 5xx, unreachable or timed out: ``gateway_fault``) are
not the key's activity: such a request's demand is withdrawn from every window it went
into, it is not a failure for the loop rule, and an automatic step whose volume evidence
falls back under its bar once those requests are withdrawn is lifted at once.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from seamguard.gateway.zombie_history import (
    Reference,
    bin_evidence,
    cusum,
    envelope_tokens,
    learn_reference,
    rare_source_llr,
    rare_source_share,
)

KeyState = Literal["ok", "throttled", "suspended"]
WINDOW_S = 60.0
BIN_S = 300.0  # the history rule's bins: 5 minutes
BINS_PER_DAY = 288
HISTORY_BINS = 12  # its window: the last hour of complete bins
MAX_LIVE = 4096  # requests per key awaiting their result (a withdrawal needs them); the oldest dropped


class ZombieThresholds(BaseModel):
    """Thresholds and why (docs/gateway.md#zombie-keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    warmup_minutes: int = Field(60, ge=1, description="active minutes of history before volume is judged")
    volume_ratio: float = Field(4.0, gt=1, description="last-60-s demand over the key's own peak minute")
    new_source_ratio: float = Field(1.5, gt=1, description="the same, when most of it comes from a new source")
    volume_floor_tokens: int = Field(2000, ge=0, description="demand per minute below which nothing is judged")
    new_source_s: float = Field(3600.0, gt=0, description="a source first seen this recently is new")
    peak_settle_s: float = Field(3600.0, ge=60, description="a closed minute teaches the peak minute only this "
                                                           "long later, with no departure since")
    history_ratio: float = Field(2.0, gt=1, description="the last hour's typical 5 minutes over what the key "
                                                         "usually spent at that time of day on its previous active "
                                                         "days (history_usual)")
    history_days: int = Field(14, ge=1, le=60, description="active days of 5-minute demand remembered per key")
    history_min_days: int = Field(3, ge=1, description="previous active days before spend is judged by history")
    history_shift_s: float = Field(1800.0, ge=0, le=6 * 3600.0,
                                   description="a previous day's time of day may differ by this much (its most "
                                               "spent within it is used)")
    history_floor_tpm: int = Field(500, ge=0, description="typical demand per minute in the last hour below which "
                                                          "history is not judged")
    history_peak_share: float = Field(0.25, ge=0, description="... nor below this share of the key's peak minute "
                                                              "(off-hours work well under its peak is not a leak)")
    history_seq_ratio: float = Field(1.5, gt=1, description="spend over history, bin by bin: the departure it "
                                                            "is designed to catch (this x the usual: a leak adding "
                                                            "half the key's own spend)")
    history_false_alarm_bins: float = Field(1e5, gt=1, description="spend over history, bin by bin: the "
                                           "CUSUM's bar is ln of this, so a key that spends as its history says "
                                           "crosses it no more than once in this many 5-minute bins on average")
    history_headroom: float = Field(1.5, gt=0, description="a key throttled by a slow rule (spend over history, "
                                                           "round-the-clock): its TPM is its usual at this time of "
                                                           "day (the next hour's most) x this")
    rare_source_share: float = Field(0.02, ge=0, le=1, description="a source that carried less than this share of "
                                                                   "the key's previous days' spend is rare")
    rare_source_bin_share: float = Field(0.25, gt=0, le=1, description="a bin one rare source carries this share "
                                                                       "of is evidence of a leak (as rare as such "
                                                                       "bins were in the key's history)")
    history_override_s: float = Field(86400.0, ge=0, description="after an operator's unsuspend, spend is not "
                                                                 "judged by history this long (that day is learned)")
    error_loop_count: int = Field(20, ge=2, description="identical failing requests in 60 s")
    error_ratio: float = Field(0.5, gt=0, le=1, description="... while this share of results fails")
    rtc_active_hours: int = Field(20, ge=1, le=24, description="active hours of the last 24 that are round-the-clock")
    rtc_history_max_hours: int = Field(16, ge=0, le=24, description="... for a key never active this long a day")
    rtc_history_days: int = Field(3, ge=1, description="complete days of history before round-the-clock is judged")
    suspend_after_s: float = Field(60.0, gt=0, description="throttled and a strong rule (volume, new source, "
                                                          "error loop) still departing this long: suspend")
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


@dataclass(slots=True)
class _Req:
    """One request's demand, where it went (window, minute, 5-minute bin), until its result."""

    t: float
    tokens: int
    new: bool
    minute: int
    bin: int
    admitted: int = 0
    in_window: bool = True
    source: str = ""


@dataclass
class _Key:
    state: KeyState = "ok"
    since: float = 0.0
    last_departure: float = -math.inf
    throttle_tpm: int | None = None
    override_until: float = -math.inf
    history_off_until: float = -math.inf
    # learned
    peak: float = 0.0  # decayed max of minute demand
    peak_t: float = 0.0
    active_minutes: int = 0
    minute: int | None = None
    minute_total: int = 0
    minute_departed: bool = False
    last_t: float = -math.inf
    settling: deque = field(default_factory=deque)  # [learn at, total, minute]: closed minutes not yet learned
    first_seen: float | None = None
    sources: dict[str, float] = field(default_factory=dict)  # source -> first seen
    hours: deque = field(default_factory=lambda: deque(maxlen=24))  # active hour indices, last 24 h
    day: int | None = None
    day_hours: set = field(default_factory=set)
    day_history: deque = field(default_factory=lambda: deque(maxlen=14))  # active hours per complete day
    # 5-minute demand per active day (day -> (tokens per bin, bin tainted by a departure)), and the
    # history rule's verdict for the current bin (judged once per bin)
    days: dict = field(default_factory=dict)
    bin: int | None = None
    history_departure: tuple[str, dict[str, float]] | None = None
    # spend over history bin by bin (zombie_history.py): the day's reference, the CUSUM and its run
    reference: Reference | None = None
    reference_day: int | None = None
    cusum: float = 0.0
    cusum_bins: int = 0
    cusum_log_ratio: float = 0.0
    # sources bin by bin: the current bin's demand per source, clean bins' demand per source so far, its
    # snapshot when the day's reference was learned (the previous days), and how often a rare source carried
    # a judged bin
    bin_sources: dict = field(default_factory=dict)
    source_spend: dict = field(default_factory=dict)
    source_known: dict = field(default_factory=dict)
    source_known_total: float = 0.0
    rare_bins: int = 0
    judged_bins: int = 0
    throttle_slow: bool = False  # throttled by a slow rule: its TPM follows its envelope bin by bin
    strong_since: float | None = None  # the current run of strong departures began
    last_strong: float = -math.inf
    # last 60 s, with running sums so that judging a request costs O(1), not O(requests in a minute)
    demand: deque = field(default_factory=deque)  # _Req
    demand_sum: int = 0
    new_sum: int = 0
    new_by_source: dict = field(default_factory=dict)  # new source -> its demand in the window
    results: deque = field(default_factory=deque)  # (t, ok, fingerprint)
    fails: int = 0
    fails_by_body: dict = field(default_factory=dict)  # fingerprint -> failures in the window
    last_fail: str | None = None
    live: OrderedDict = field(default_factory=OrderedDict)  # request id -> _Req, awaiting its result
    # the requests behind the current automatic step (id -> (request, tokens)) and the bar they were over
    evidence: dict | None = None
    evidence_sum: int = 0
    evidence_bar: float = 0.0


def _bin_of(days: dict, n: int) -> tuple[float, bool]:
    """Demand of absolute 5-minute bin ``n`` and whether it is tainted (an idle day: 0, clean)."""
    d, s = divmod(n, BINS_PER_DAY)
    got = days.get(d)
    return (0.0, False) if got is None else (got[0][s], bool(got[1][s]))


def _window_level(days: dict, end: int, clean: bool) -> float | None:
    """The level of the bins [end - HISTORY_BINS, end): their median (a burst of up to half an hour
    is ignored; a level held for more than half of the hour shows); with ``clean``, None if any
    is tainted."""
    vals = []
    for n in range(end - HISTORY_BINS, end):
        v, bad = _bin_of(days, n)
        if bad and clean:
            return None
        vals.append(v)
    return statistics.median(vals)


def history_reference(days: dict, end: int, shift_bins: int) -> list[float]:
    """For each previous active day: the most its window at this time of day (shifted by up to
    ``shift_bins`` either way) held, over windows with no tainted bin. Pure."""
    today = (end - 1) // BINS_PER_DAY
    out = []
    for d in days:
        j = today - d
        if j < 1:
            continue
        meds = [_window_level(days, end - j * BINS_PER_DAY + s, clean=True) for s in range(-shift_bins, shift_bins + 1)]
        meds = [m for m in meds if m is not None]
        if meds:
            out.append(max(meds))
    return out


def history_usual(refs: list[float]) -> float:
    """What the key usually spends at this time of day: the median over its days, but no less than
    3/4 of its busiest such day (a weekly peak, a Monday twice the others, stays normal). Pure."""
    return max(statistics.median(refs), 0.75 * max(refs))


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
                "sources": len(k.sources), "max_active_hours_per_day": max(k.day_history, default=0),
                "history_days": len(k.days)}

    # ---- learning ---------------------------------------------------------------------------
    def _learn(self, k: _Key, total: float, now: float) -> None:
        decay = 0.5 ** ((now - k.peak_t) / self.th.peak_half_life_s)
        k.peak = max(total, k.peak * decay)
        k.peak_t = now
        k.active_minutes += 1

    def _close_minute(self, k: _Key, now: float) -> None:
        """The key's minute closed: it waits ``peak_settle_s`` (none while an operator's word
        holds: what it allowed is normal) and is learned if no departure came in between."""
        if k.minute_total > 0 and not k.minute_departed and k.state == "ok":
            settle = 0.0 if now < k.override_until else self.th.peak_settle_s
            k.settling.append([(k.minute + 1) * WINDOW_S + settle, float(k.minute_total), k.minute])
        while k.settling and k.settling[0][0] <= now:
            self._learn(k, k.settling.popleft()[1], now)

    def _roll(self, k: _Key, now: float) -> float:
        """Advance the key's windows to ``now`` (never backwards: two replicas' or threads' clocks may
        interleave out of order by a little); returns the time used."""
        now = max(now, k.last_t)
        k.last_t = now
        m = math.floor(now / WINDOW_S)
        if k.minute is not None and m != k.minute:
            self._close_minute(k, now)
        if m != k.minute:
            k.minute, k.minute_total, k.minute_departed = m, 0, False
        self._roll_bins(k, now)
        h = math.floor(now / 3600.0)
        if not k.hours or k.hours[-1] != h:
            k.hours.append(h)
        d = math.floor(now / 86400.0)
        if k.day is not None and d != k.day:
            k.day_history.append(len(k.day_hours))  # idle days are not counted: weekends stay normal
            k.day_hours = set()
        k.day = d
        k.day_hours.add(h % 24)
        while k.demand and k.demand[0].t <= now - WINDOW_S:
            r = k.demand.popleft()
            r.in_window = False
            k.demand_sum -= r.tokens
            self._drop_new(k, r)
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

    def _roll_bins(self, k: _Key, now: float) -> None:
        """Open today's bins (forgetting the oldest active day) and, on a new 5-minute bin, judge
        the last hour against the key's history once."""
        n = math.floor(now / BIN_S)
        d = n // BINS_PER_DAY
        if d not in k.days:
            k.days[d] = (array("f", bytes(4 * BINS_PER_DAY)), bytearray(BINS_PER_DAY))
            while len(k.days) > self.th.history_days + 1:
                k.days.pop(next(iter(k.days)))
        if n != k.bin:
            if k.bin is not None:
                self._close_bins(k, k.bin, n)
            k.bin = n
            k.history_departure = self._history(k, n)
            if k.state == "throttled" and k.throttle_slow:  # the envelope follows the time of day
                k.throttle_tpm = self._throttle_tpm(k, False, now)

    def _history(self, k: _Key, n: int) -> tuple[str, dict[str, float]] | None:
        """Spend over history for the hour of complete bins before bin ``n``."""
        th = self.th
        cur = _window_level(k.days, n, clean=False) or 0.0
        per_minute = cur / (BIN_S / 60.0)
        if per_minute < max(th.history_floor_tpm, th.history_peak_share * k.peak, 1e-9):
            return self._sequential(k)
        refs = history_reference(k.days, n, int(th.history_shift_s // BIN_S))
        if len(refs) < th.history_min_days:
            return None
        usual = history_usual(refs)
        if cur <= th.history_ratio * usual:
            return self._sequential(k)
        return "spend over its history at this time of day", {
            "level_5min_tokens_last_hour": round(cur, 1), "usual_5min_tokens": round(usual, 1),
            "ratio": round(cur / max(usual, 1.0), 2), "history_days": len(refs)}

    def _close_bins(self, k: _Key, first: int, end: int) -> None:
        """Bins [first, end) closed: each adds its evidence to the key's CUSUM (a gap of more than
        an hour starts it again: the key was idle)."""
        th = self.th
        sources, k.bin_sources = k.bin_sources, {}
        if end - first > HISTORY_BINS or (k.history_off_until > -math.inf and k.last_t < k.history_off_until):
            k.cusum, k.cusum_bins, k.cusum_log_ratio = 0.0, 0, 0.0
            self._learn_sources(k, first, sources, None)
            return
        gate = max(th.history_floor_tpm, th.history_peak_share * k.peak, 1e-9) * BIN_S / 60.0
        pseudo = th.history_floor_tpm * BIN_S / 60.0
        bar = math.log(th.history_false_alarm_bins)
        for m in range(first, end):
            day, s = divmod(m, BINS_PER_DAY)
            if k.reference_day != day:
                k.reference_day = day
                k.reference = learn_reference(k.days, day, int(th.history_shift_s // BIN_S), gate, pseudo,
                                              th.history_min_days)
                k.source_known, k.source_known_total = dict(k.source_spend), sum(k.source_spend.values())
            tokens, _ = _bin_of(k.days, m)
            llr = self._learn_sources(k, m, sources if m == first else {}, tokens >= gate)
            ref = k.reference
            if ref is None:
                continue
            ev = bin_evidence(tokens, float(ref.usual[s]), ref, th.history_seq_ratio, pseudo, bar, llr)
            k.cusum = cusum(k.cusum, ev, tokens >= gate)
            if k.cusum == 0.0:
                k.cusum_bins, k.cusum_log_ratio = 0, 0.0
            elif not math.isnan(ref.usual[s]):
                k.cusum_bins += 1
                k.cusum_log_ratio += math.log((tokens + pseudo) / (float(ref.usual[s]) + pseudo))

    def _learn_sources(self, k: _Key, m: int, sources: dict, judged: bool | None) -> float:
        """Closed bin ``m``'s demand per source: the evidence a rare source carrying it gives (0 if none
        did), counted into the key's history of such bins; a clean bin's sources are learned (a bin
        held by a departure never makes its source known)."""
        th = self.th
        share = rare_source_share(sources, k.source_known, k.source_known_total, th.rare_source_share)
        heavy = share >= th.rare_source_bin_share
        llr = rare_source_llr(k.rare_bins, k.judged_bins) if heavy else 0.0
        if _bin_of(k.days, m)[1]:
            return llr
        if judged and k.source_known_total > 0:
            k.judged_bins += 1
            k.rare_bins += heavy
        for src, v in sources.items():
            k.source_spend[src] = k.source_spend.get(src, 0.0) + v
        if len(k.source_spend) > 4 * th.max_sources:  # the smallest forgotten: rare again if they come back
            keep = sorted(k.source_spend.items(), key=lambda kv: kv[1])[-2 * th.max_sources:]
            k.source_spend = dict(keep)
        return llr

    def _sequential(self, k: _Key) -> tuple[str, dict[str, float]] | None:
        """Spend over history bin by bin: the CUSUM over its bar."""
        bar = math.log(self.th.history_false_alarm_bins)
        if k.cusum < bar or k.reference is None:
            return None
        ref = k.reference
        return "spend over its history, bin by bin", {
            "evidence_llr": round(k.cusum, 2), "bar_llr": round(bar, 2), "bins": k.cusum_bins,
            "ratio": round(math.exp(k.cusum_log_ratio / max(k.cusum_bins, 1)), 2),
            "sigma_log": round(ref.sigma, 3), "allowance_log": round(ref.allowance, 3),
            "offset_log": round(float(ref.offset), 3), "history_days": ref.days}

    @staticmethod
    def _drop_new(k: _Key, r: _Req) -> None:
        """A request's demand leaves the 60-s window's new-source sums."""
        if not r.new:
            return
        k.new_sum -= r.tokens
        left = k.new_by_source.get(r.source, 0) - r.tokens
        if left > 0:
            k.new_by_source[r.source] = left
        else:
            k.new_by_source.pop(r.source, None)

    def _taint(self, k: _Key) -> None:
        """The current bin holds a departure: never part of the key's history."""
        if k.bin is not None:
            got = k.days.get(k.bin // BINS_PER_DAY)
            if got is not None:
                got[1][k.bin % BINS_PER_DAY] = 1

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
    def _departure(self, k: _Key, now: float) -> tuple[str, dict[str, float], float | None, bool] | None:
        """(reason, evidence, the bar the last 60 s of demand was over — None for rules whose
        evidence is not that demand — and whether the rule is a fast, strong one that may suspend),
        or None."""
        th = self.th
        demand = k.demand_sum
        if k.fails >= th.error_loop_count and k.fails >= th.error_ratio * len(k.results) and k.last_fail:
            same = k.fails_by_body.get(k.last_fail, 0)
            if same >= th.error_loop_count:
                return "error-retry loop", {"identical_failures_60s": same, "failures_60s": k.fails,
                                            "results_60s": len(k.results)}, None, True
        warm = k.active_minutes >= th.warmup_minutes and k.peak > 0
        if warm and demand > th.volume_floor_tokens:
            ratio = demand / k.peak
            new = k.new_sum
            ev = {"demand_60s_tokens": demand, "peak_minute_tokens": round(k.peak, 1), "ratio": round(ratio, 2),
                  "new_source_share": round(new / demand, 3)}
            if ratio > th.volume_ratio:
                return "volume over its own peak", ev, th.volume_ratio * k.peak, True
            # one new source carrying most of it: clients behind a NAT pool or on mobile networks bring many
            # new addresses, each a small share
            top_new = max(k.new_by_source.values(), default=0) if ratio > th.new_source_ratio else 0
            if top_new >= 0.5 * demand:
                ev["top_new_source_share"] = round(top_new / demand, 3)
                return "volume from a new source", ev, th.new_source_ratio * k.peak, True
        if k.history_departure is not None and now >= k.history_off_until:
            return (*k.history_departure, None, False)
        if len(k.day_history) >= th.rtc_history_days:
            active = sum(1 for h in k.hours if h > math.floor(now / 3600.0) - 24)
            usual = max(k.day_history)
            if active >= th.rtc_active_hours and usual <= th.rtc_history_max_hours:
                return ("round-the-clock traffic", {"active_hours_24h": active, "max_active_hours_per_day": usual},
                        None, False)
        return None

    def _judge(self, key: str, k: _Key, now: float) -> Step | None:
        th = self.th
        if not th.enabled or now < k.override_until:
            return None
        dep = self._departure(k, now)
        if dep is not None:
            k.last_departure = now
            k.minute_departed = True
            k.settling.clear()
            self._taint(k)
        strong = dep is not None and dep[3]
        if strong:
            if k.strong_since is None or now - k.last_strong > th.suspend_after_s:
                k.strong_since = now  # a new run of strong departures
            k.last_strong = now
        if k.state == "ok" and dep is not None:
            tpm = self._throttle_tpm(k, strong, now)
            self._hold_evidence(k, dep[2])
            evidence = dict(dep[1]) if strong else {**dep[1], "throttle_tpm": tpm}
            return self._move(key, k, "throttled", now, dep[0], evidence, tpm)
        if (k.state == "throttled" and strong and k.strong_since is not None
                and now - max(k.since, k.strong_since) >= th.suspend_after_s):
            self._hold_evidence(k, dep[2])  # type: ignore[index]
            return self._move(key, k, "suspended", now, f"{dep[0]}, still {now - k.since:.0f} s after the throttle",  # type: ignore[index]
                              dep[1], None)  # type: ignore[index]
        if k.state == "throttled" and dep is None and now - k.last_departure >= th.release_after_s:
            return self._move(key, k, "ok", now, f"no departure for {now - k.last_departure:.0f} s", {}, None)
        return None

    def _throttle_tpm(self, k: _Key, strong: bool, now: float) -> int:
        """A throttled key's TPM: its peak minute x ``throttle_headroom`` for a strong rule; for a slow one,
        its envelope (its usual 5 minutes over the next hour x ``history_headroom``, per minute) where its
        history knows this time of day, no more than the former; never below ``throttle_floor_tpm``."""
        th = self.th
        peak_cap = th.throttle_headroom * k.peak
        cap = peak_cap
        if not strong and k.reference is not None:
            s = math.floor(now / BIN_S) % BINS_PER_DAY
            env = envelope_tokens(k.reference, s, HISTORY_BINS)
            if env is not None:
                cap = min(peak_cap, th.history_headroom * env / (BIN_S / 60.0))
        return max(th.throttle_floor_tpm, math.ceil(cap))

    @staticmethod
    def _hold_evidence(k: _Key, bar: float | None) -> None:
        """Remember which requests a volume step stood on, to lift it if they turn out to be the
        gateway's own failures (None: a rule whose evidence is not the last 60 s of demand)."""
        if bar is None:
            k.evidence = None
            return
        k.evidence = {id(r): (r, r.tokens) for r in k.demand if r.tokens}  # the objects held: ids stay unique
        k.evidence_sum, k.evidence_bar = sum(n for _, n in k.evidence.values()), bar

    def _move(self, key: str, k: _Key, to: KeyState, now: float, reason: str, evidence: dict[str, float],
              tpm: int | None, actor: str = "zombie-detector") -> Step:
        step = Step(key, k.state, to, reason, evidence, tpm, actor)
        k.state, k.since, k.throttle_tpm = to, now, tpm
        k.throttle_slow = to == "throttled" and "throttle_tpm" in evidence
        if to == "ok" or actor != "zombie-detector":
            k.evidence = None
        return step

    # ---- the gateway's own failures ---------------------------------------------------------
    def _withdraw(self, k: _Key, r: _Req) -> None:
        """Take a request the gateway itself failed out of every window its demand went into."""
        if r.in_window:
            k.demand_sum -= r.tokens
            self._drop_new(k, r)
        got = k.days.get(r.bin // BINS_PER_DAY)
        if got is not None:
            got[0][r.bin % BINS_PER_DAY] = max(0.0, got[0][r.bin % BINS_PER_DAY] - r.tokens)
        if r.bin == k.bin and r.source in k.bin_sources:
            k.bin_sources[r.source] = max(0.0, k.bin_sources[r.source] - r.tokens)
        if r.minute == k.minute:
            k.minute_total -= r.admitted
        else:
            for s in k.settling:
                if s[2] == r.minute:
                    s[1] = max(0.0, s[1] - r.admitted)
        if k.evidence is not None and id(r) in k.evidence:
            k.evidence_sum -= k.evidence.pop(id(r))[1]
        r.tokens, r.admitted, r.new = 0, 0, False

    def _lift_if_unfounded(self, key: str, k: _Key, now: float) -> Step | None:
        if k.state == "ok" or k.evidence is None or k.evidence_sum > k.evidence_bar:
            return None
        step = self._move(key, k, "ok", now, "its evidence was the gateway's own failures",
                          {"demand_60s_tokens_left": k.evidence_sum, "bar_tokens": round(k.evidence_bar, 1)}, None)
        k.last_departure = -math.inf
        return step

    # ---- inputs -------------------------------------------------------------------------------
    def observe_request(self, key: str, now: float, tokens: int, source: str,
                        request: int | None = None) -> Step | None:
        """A request arrived (before admission): ``tokens`` is its reservation estimate; ``request``
        an id the gateway gives its `admitted` and `observe_result` calls (needed to withdraw it)."""
        k = self._k(key)
        now = self._roll(k, now)
        new = self._new_source(k, source, now)
        if k.first_seen is None:
            k.first_seen = now
        r = _Req(now, tokens, new, k.minute, k.bin, source=source)  # type: ignore[arg-type]
        k.bin_sources[source] = k.bin_sources.get(source, 0.0) + tokens
        k.demand.append(r)
        k.demand_sum += tokens
        if new:
            k.new_sum += tokens
            k.new_by_source[source] = k.new_by_source.get(source, 0) + tokens
        k.days[k.bin // BINS_PER_DAY][0][k.bin % BINS_PER_DAY] += tokens  # type: ignore[operator]
        if k.state != "ok":
            self._taint(k)
        if request is not None:
            k.live[request] = r
            if len(k.live) > MAX_LIVE:
                k.live.popitem(last=False)
        return self._judge(key, k, now)

    def admitted(self, key: str, now: float, tokens: int, request: int | None = None) -> None:
        """The request was admitted with ``tokens`` reserved: only admitted work teaches the key's
        peak minute. A refused one still counts as demand (a zombie hammering at its limit is
        seen), but one impossible request (``max_tokens`` of 10 million) must not lift the bar
        that volume is judged by for the week its half-life lasts."""
        k = self._k(key)
        self._roll(k, now)
        k.minute_total += tokens
        r = k.live.get(request) if request is not None else None
        if r is not None:  # a withdrawal takes these tokens back from the minute they went to
            r.minute, r.admitted = k.minute, tokens  # type: ignore[assignment]

    def observe_result(self, key: str, now: float, ok: bool, fingerprint: str, gateway_fault: bool = False,
                       request: int | None = None) -> Step | None:
        """A request ended: ``ok`` False for a backend or client error (not for our own 429);
        ``gateway_fault`` when the failure was the gateway's or its backend's (a 5xx, unreachable,
        timed out): then the request was never the key's activity."""
        k = self._k(key)
        now = self._roll(k, now)
        r = k.live.pop(request, None) if request is not None else None
        if gateway_fault:
            if r is not None:
                self._withdraw(k, r)
            return self._lift_if_unfounded(key, k, now)
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

    def _accept(self, k: _Key, operator_at: float) -> None:
        """An operator said the key is legitimate: what it does next is learned, not judged."""
        k.override_until = operator_at + self.th.override_s
        k.history_off_until = operator_at + self.th.history_override_s
        k.history_departure = None
        k.cusum, k.cusum_bins, k.cusum_log_ratio = 0.0, 0, 0.0
        k.demand.clear()
        k.results.clear()
        k.demand_sum = k.new_sum = k.fails = 0
        k.new_by_source.clear()
        k.fails_by_body.clear()

    def override(self, key: str, now: float, to: KeyState, actor: str, note: str = "") -> Step:
        """An operator's word: unsuspend (``ok``, no automatic step for ``override_s``) or suspend."""
        k = self._k(key)
        if to == "ok":
            self._accept(k, now)
        return self._move(key, k, to, now, note or f"operator override to {to}", {}, None, actor)

    def adopt(self, key: str, state: KeyState, throttle_tpm: int | None, now: float,
              operator_at: float | None = None) -> None:
        """Take a state another replica (or a restart) recorded in the store, without a Step.
        ``operator_at``: an operator set it then; an unsuspend holds automatic steps off here too."""
        k = self._k(key)
        if k.state != state:
            k.state, k.since, k.throttle_tpm = state, now, throttle_tpm
            k.evidence = None
            if state == "ok" and operator_at is not None:
                self._accept(k, operator_at)
