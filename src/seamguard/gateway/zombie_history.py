"""Spend over history as a sequential test: the evidence a shape-following leak leaves, bin by bin.

The zombie detector (`zombie.py`) keeps each key's demand per 5-minute bin over its last active
days. A leak that follows the key's daily shape at k x its spend never departs from the key's peak
minute, but every bin it touches holds about (1 + k) x what that bin usually holds. One bin is
weak evidence (a busy key's 5 minutes vary by ~30 %); the bins together are strong. So, per
closed bin, the log ratio of its demand to what the key's previous days held at that time of day
feeds a one-sided CUSUM (Page 1954) of the log-likelihood ratio between "usual" and "``ratio`` x
usual", with the spread learned from the key's own days:

- ``sigma``: how much one bin departs from the usual within a day (upper semi-deviation: a quiet
  bin is no evidence of anything);
- ``allowance``: how far a whole day may sit above the usual (twice the day-to-day spread of its
  days' levels, from the median step between successive days so that a slow trend or one odd
  day does not inflate it, and no less than
  +-10 %: three days cannot show a key's spread): a busy day is subtracted before any bin counts
  as evidence;
- ``offset``: where the key's last three active days sat against the usual, when above it:
  organic growth since the median day is not a leak.

A leak also comes from somewhere: a client the key rarely or never used. So a bin whose volume
already leans towards the leak adds a second, independent term when one source the key's previous
days barely know (under ``rare_share`` of their spend) carries a large share of it: ln(q1 / p0),
where p0 is how often such a bin occurred in the key's own history (Laplace's rule over its judged
bins) and q1 = 1/2 (a leak comes from such a source half the time). A key whose clients rotate
addresses (a NAT pool, mobile clients: many sources, each small) has no single rare source
carrying much of a bin; a key whose one client changes address every day carries such bins in
its history, so p0 is large and the term small.

The statistic crosses ``ln(false_alarm_bins)`` no sooner than once per that many bins on average
when the key is as its history says (Lorden's bound for the CUSUM on a log-likelihood ratio), and
in about ``ln(false_alarm_bins) / (per-bin evidence)`` bins when a leak doubles the key's spend.

Pure: numpy arrays in, numbers out; the caller owns the key's state and the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

BINS_PER_DAY = 288
SMOOTH_BINS = 2  # a day's usual level at a bin: the mean of the 25 minutes around it
MIN_SIGMA = 0.15  # no key's bins are trusted to repeat more exactly than this (log units)
MAX_Z = 4.0  # one bin counts for at most this many sigmas: a single burst is not a leak
MIN_BINS = 4  # ... nor for more than 1/4 of the bar: no burst under 20 minutes crosses it alone
MIN_RESIDUAL_BINS = 24  # judged bins of history needed to learn the spread (two hours)
MIN_DAY_SPREAD = 0.1  # no key's days are trusted to repeat more exactly than +-10 % (a few days cannot show it)
RECENT_DAYS = 3  # the key's current level: the median of its last three active days


@dataclass(frozen=True)
class Reference:
    """What a key's previous active days say about today, learned once a day."""

    usual: np.ndarray  # per bin of the day: the tokens a bin usually holds (NaN: no clean history)
    offset: float  # log units
    sigma: float
    allowance: float
    days: int


def _day_row(days: dict, d: int, pad: int) -> np.ndarray:
    """Day ``d``'s bins with ``pad`` bins of its neighbours either side (an absent day: idle, 0);
    tainted bins NaN."""
    row = np.zeros(BINS_PER_DAY + 2 * pad)
    for j, dd in ((0, d - 1), (1, d), (2, d + 1)):
        got = days.get(dd)
        if got is None:
            continue
        vals = np.frombuffer(got[0], dtype=np.float32).astype(float)
        vals[np.frombuffer(bytes(got[1]), dtype=np.uint8) != 0] = np.nan
        lo = j * BINS_PER_DAY - BINS_PER_DAY + pad
        src_lo, dst_lo = max(0, -lo), max(0, lo)
        n = min(BINS_PER_DAY - src_lo, row.size - dst_lo)
        if n > 0:
            row[dst_lo:dst_lo + n] = vals[src_lo:src_lo + n]
    return row


def day_levels(days: dict, day_ids: list[int]) -> np.ndarray:
    """Per day (rows) and bin: its 25-minute level (the mean of the clean bins around it; NaN where
    none is clean)."""
    pad = SMOOTH_BINS
    out = np.full((len(day_ids), BINS_PER_DAY), np.nan)
    for i, d in enumerate(day_ids):
        win = sliding_window_view(_day_row(days, d, pad), 2 * SMOOTH_BINS + 1)
        clean = (~np.isnan(win)).sum(axis=1)
        out[i] = np.where(clean > 0, np.nansum(win, axis=1) / np.maximum(clean, 1), np.nan)
    return out


def usual_profile(levels: np.ndarray, shift_bins: int) -> np.ndarray:
    """The median day's level at each bin, taken as the most it held within ``shift_bins`` either
    side (a day that starts half an hour early or late is no departure). NaN: no clean history."""
    with np.errstate(all="ignore"):
        med = np.nanmedian(levels, axis=0) if levels.shape[0] else np.full(BINS_PER_DAY, np.nan)
    padded = np.concatenate([np.full(shift_bins, np.nan), med, np.full(shift_bins, np.nan)])
    wide = sliding_window_view(padded, 2 * shift_bins + 1)
    out = np.full(BINS_PER_DAY, np.nan)
    ok = ~np.isnan(wide).all(axis=1)
    out[ok] = np.nanmax(wide[ok], axis=1)
    return out


def _semi(x: np.ndarray) -> float:
    """Upper semi-deviation about 0 (as a standard deviation would be for a symmetric spread)."""
    return float(math.sqrt(2.0 * np.mean(np.maximum(x, 0.0) ** 2))) if x.size else 0.0


def learn_reference(days: dict, today: int, shift_bins: int, gate_tokens: float, pseudo_tokens: float,
                    min_days: int) -> Reference | None:
    """The usual bin today (the median over previous active days) and the spread of those days:
    each day against the median of the others, at the bins that would have been judged."""
    ids = sorted(d for d in days if d < today)
    if len(ids) < min_days:
        return None
    levels = day_levels(days, ids)
    raw = np.stack([np.frombuffer(days[d][0], dtype=np.float32).astype(float) for d in ids])
    taint = np.stack([np.frombuffer(bytes(days[d][1]), dtype=np.uint8) != 0 for d in ids])
    resid, per_day = [], []
    for i in range(len(ids)):
        others = usual_profile(np.delete(levels, i, axis=0), shift_bins)
        judged = (raw[i] >= gate_tokens) & ~taint[i] & ~np.isnan(others)
        if not judged.any():
            continue
        r = np.log((raw[i][judged] + pseudo_tokens) / (others[judged] + pseudo_tokens))
        resid.append(r)
        per_day.append(float(np.median(r)))
    if not resid or sum(r.size for r in resid) < MIN_RESIDUAL_BINS:
        return None
    level = np.array(per_day)
    # where the key's recent days sat (growth since the median day), never below the usual
    offset = max(0.0, float(np.median(level[-RECENT_DAYS:])))
    # day-to-day spread from successive days (a trend and a few odd days do not inflate it)
    steps = np.diff(level)
    spread = max(MIN_DAY_SPREAD, 1.4826 * float(np.median(np.abs(steps))) / math.sqrt(2.0) if steps.size else 0.0)
    within = np.concatenate([r - m for r, m in zip(resid, per_day)])
    usual = usual_profile(levels, shift_bins)
    allowance = 2.0 * spread
    return Reference(usual, offset, max(MIN_SIGMA, _semi(within)), allowance, len(ids))


def bin_evidence(tokens: float, usual: float, ref: Reference, ratio: float, pseudo_tokens: float,
                 bar: float, source_llr: float = 0.0) -> float:
    """The log-likelihood ratio one bin adds for "``ratio`` x usual" against "usual": Gaussian in
    log units with the key's spread, the day's allowance and the key's growth taken off first;
    plus ``source_llr`` (a rare source carried the bin) when the volume already leans towards the
    leak; at most ``bar`` / MIN_BINS."""
    if math.isnan(usual):
        return 0.0
    delta = math.log(ratio)
    r = math.log((tokens + pseudo_tokens) / (usual + pseudo_tokens)) - ref.offset - ref.allowance
    r = min(r, MAX_Z * ref.sigma)
    ev = delta / ref.sigma ** 2 * (r - delta / 2.0)
    return min(bar / MIN_BINS, ev + (source_llr if ev > 0 else 0.0))


def rare_source_share(bin_sources: dict[str, float], known: dict[str, float], known_total: float,
                      rare_share: float) -> float:
    """The largest share of a bin's demand carried by one source that the key's previous days gave
    under ``rare_share`` of their spend (never seen: 0). 0 for an empty bin or a key with no history."""
    total = sum(bin_sources.values())
    if total <= 0 or known_total <= 0:
        return 0.0
    rare = [v for src, v in bin_sources.items() if known.get(src, 0.0) < rare_share * known_total]
    return max(rare, default=0.0) / total


def rare_source_llr(heavy_bins: int, judged_bins: int, q1: float = 0.5) -> float:
    """ln(q1 / p0) for a bin carried by a rare source, p0 = how often the key's own judged bins were
    (Laplace's rule: (heavy + 1) / (judged + 2)); never negative."""
    p0 = (heavy_bins + 1.0) / (judged_bins + 2.0)
    return max(0.0, math.log(q1 / p0))


def envelope_tokens(ref: Reference, s: int, bins: int) -> float | None:
    """What the key usually spends in one 5-minute bin over bins [s, s + bins) of the day (their most,
    so a rising morning is not cut), with its recent growth and a day's allowance (a busy day of a
    healthy key sits inside it); None where its history says nothing."""
    ahead = ref.usual[s:min(BINS_PER_DAY, s + bins)]
    if ahead.size == 0 or np.isnan(ahead).all():
        return None
    return float(np.nanmax(ahead)) * math.exp(ref.offset + ref.allowance)


def cusum(score: float, evidence: float, judged: bool) -> float:
    """Page's CUSUM: evidence accumulates, never below 0; a bin too small to judge only lowers it."""
    return max(0.0, score + (evidence if judged else min(evidence, 0.0)))
