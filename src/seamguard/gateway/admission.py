"""Token-level admission: what a request reserves, which caps apply, and whether it fits.

Pure functions over numbers (no clock, no I/O); the stores (seamguard.gateway.store) call
`fits` inside one transaction (SQLite) or mirror it in one Lua script (Redis), so the check
and the reservation are atomic. Windows:

- per minute: a sliding window approximated from two fixed one-minute buckets (the
  current one counts fully, the previous one by the share of it still inside the last 60 s),
  as Cloudflare's and Envoy's rate limiters do; no 2x burst across a minute boundary.
- per day: a fixed UTC day.
- concurrency: requests in flight.

A request reserves its estimate at admission and the store reconciles it with the real
``usage`` at the end (the difference is released or charged to the bucket it was reserved
in), so budgets are never over-spent by more than one request's under-estimate per key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Priority = Literal["high", "normal", "low"]
MINUTE_S = 60.0
DAY_S = 86400.0
PER_MESSAGE_TOKENS = 4  # role and separators of a chat message (OpenAI's cookbook counts 3-4)


@dataclass(frozen=True)
class Limits:
    """Caps of one scope (a key or a tenant); None is unlimited."""

    tpm: int | None = None
    tpd: int | None = None
    concurrency: int | None = None


def never_fits(amount: int, scopes: list[tuple[str, Limits]]) -> str | None:
    """Why a request of ``amount`` tokens can never be admitted (it asks for more than a scope's
    whole per-minute or per-day budget), or None. Waiting would not help: the caller must ask for
    fewer tokens, so this is an invalid request, not a rate limit with a Retry-After."""
    for name, lim in scopes:
        for cap, per in ((lim.tpm, "minute"), (lim.tpd, "day")):
            if cap is not None and amount > cap:
                return f"{amount} tokens (prompt + max_tokens) exceed {name}'s whole budget of {cap} per {per}"
    return None


@dataclass(frozen=True)
class Counters:
    """What a scope has used, as the store read it at ``now``."""

    minute_cur: int = 0  # tokens charged to the current one-minute bucket
    minute_prev: int = 0  # ... and to the one before it
    day: int = 0  # tokens charged to the current UTC day
    inflight: int = 0


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""  # "" | "tpm" | "tpd" | "concurrency" | "shed" (with the scope, e.g. "tenant tpm")
    retry_after_s: int = 0


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # content parts: text parts count, images a fixed 85 tokens' worth
        return sum(len(p.get("text", "")) if isinstance(p, dict) and p.get("type") == "text" else 340
                   for p in content)
    return 0


def estimate_prompt_tokens(body: dict[str, Any], chars_per_token: float = 4.0) -> int:
    """Prompt tokens from text length: characters / chars_per_token (about 4 for English with
    BPE tokenizers), plus PER_MESSAGE_TOKENS per chat message; rounded up (a completions prompt
    given as token ids counts exactly). Reconciled with the
    backend's real ``usage`` when the request ends, so a wrong guess costs one request's
    difference, never a drift."""
    if isinstance(body.get("messages"), list):
        chars = sum(_text_chars(m.get("content")) if isinstance(m, dict) else 0 for m in body["messages"])
        extra = PER_MESSAGE_TOKENS * len(body["messages"])
    else:
        p = body.get("prompt")
        if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
            return len(p)  # already token ids
        if isinstance(p, list) and p and all(isinstance(x, list) for x in p):
            return sum(len(x) for x in p)  # a batch of token-id prompts
        chars = sum(len(x) for x in p if isinstance(x, str)) if isinstance(p, list) else _text_chars(p)
        extra = 0
    return math.ceil(chars / chars_per_token) + extra


def requested_output_tokens(body: dict[str, Any], default: int) -> int:
    """``max_completion_tokens``, else ``max_tokens``, else the configured default."""
    for f in ("max_completion_tokens", "max_tokens"):
        v = body.get(f)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def shed_share(priority: Priority, shed_low_at: float, shed_normal_at: float) -> float:
    """The share of its tenant's TPM a request of this priority may bring the tenant to: low
    priority is refused first as the tenant nears its budget, high may use all of it."""
    return {"low": shed_low_at, "normal": shed_normal_at, "high": 1.0}[priority]


def minute_used(c: Counters, elapsed_in_minute_s: float) -> float:
    """Tokens in the sliding last minute: current bucket plus the still-covered part of the previous."""
    return c.minute_cur + c.minute_prev * max(0.0, 1.0 - elapsed_in_minute_s / MINUTE_S)


def _minute_retry(c: Counters, cap: float, amount: int, elapsed: float) -> int:
    """Seconds until the sliding minute has room for ``amount`` if nothing else is charged."""
    room = cap - amount
    if c.minute_cur <= room:  # the previous bucket's share decays within this minute
        t = MINUTE_S * (1.0 - (room - c.minute_cur) / c.minute_prev) if c.minute_prev > 0 else elapsed
        return max(1, math.ceil(t - elapsed))
    # the current bucket alone is too full: at the boundary it becomes the previous one, then decays
    return max(1, math.ceil(MINUTE_S - elapsed + MINUTE_S * (1.0 - room / c.minute_cur)))


def fits(c: Counters, lim: Limits, amount: int, elapsed_in_minute_s: float, elapsed_in_day_s: float,
         tpm_share: float = 1.0, scope: str = "key") -> Verdict:
    """Whether reserving ``amount`` tokens (and one in-flight slot) keeps this scope within its caps.

    ``tpm_share`` scales the TPM cap: below 1 for a lower priority near a tenant's budget (shed)
    or for a throttled key. A reservation larger than the whole cap never fits.
    """
    if lim.concurrency is not None and c.inflight + 1 > lim.concurrency:
        return Verdict(False, f"{scope} concurrency", 1)
    if lim.tpd is not None and c.day + amount > lim.tpd:
        return Verdict(False, f"{scope} tpd", max(1, math.ceil(DAY_S - elapsed_in_day_s)))
    if lim.tpm is not None:
        cap = lim.tpm * tpm_share
        if minute_used(c, elapsed_in_minute_s) + amount > cap:
            why = "shed" if tpm_share < 1.0 and minute_used(c, elapsed_in_minute_s) + amount <= lim.tpm else "tpm"
            if amount > cap:
                return Verdict(False, f"{scope} {why}", int(MINUTE_S))
            return Verdict(False, f"{scope} {why}", min(int(2 * MINUTE_S),
                                                        _minute_retry(c, cap, amount, elapsed_in_minute_s)))
    return Verdict(True)


def windows(now: float) -> tuple[int, float, int, float]:
    """(minute index, seconds into it, UTC day index, seconds into it) of a wall-clock time."""
    m = math.floor(now / MINUTE_S)
    d = math.floor(now / DAY_S)
    return m, now - m * MINUTE_S, d, now - d * DAY_S
