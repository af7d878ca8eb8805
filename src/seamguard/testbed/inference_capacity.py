"""The nominal capacity of an emulated inference pool under a request mix: requests/s it sustains
within the mix's SLO with nothing degraded.

Why this exists: a routing comparison at one arbitrary offered rate says little; at a rate far
below capacity every balancer looks fine, far above it none does. benchmarks/inference_routing.py
offers load as stated fractions of this capacity. Pure functions of the emulator's model
(seamguard.testbed.inference_pool.PoolTiming) and the mix (seamguard.testbed.inference_load's
ClassMix); no clock, no I/O. docs/gateway-routing.md gives the formula.

Per stage, with E[p] and E[o] the mix's mean prompt and output tokens:

- prefill instance: one prompt on the emulated GPU at a time (FIFO), so
  ``1 / (prefill_base_s + prefill_per_token_s x E[p])`` requests/s;
- decode instance: a continuous batch of B sequences steps in ``decode_base_s +
  decode_per_seq_s x (B - 1)`` and gives each one token, so ``B / (step(B) x E[o])`` requests/s,
  with B the largest batch that (a) fits ``max_batch``, (b) steps within the mix's tightest TPOT
  target (a larger batch would put every sequence on the instance over it) and (c) fits the KV
  cache at E[p] + E[o] tokens per sequence;
- the pool: the smaller of P x prefill and D x decode (the stage that saturates first).

Utilization = offered mean rate (Poisson rate plus bursts) / pool capacity. Queueing makes TTFT
grow without bound as utilization nears 1, so the capacity is the asymptote, not a rate that
meets every TTFT target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the load generator and the emulator import a server stack
    from seamguard.testbed.inference_load import ClassMix
    from seamguard.testbed.inference_pool import PoolTiming


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def clipped_lognormal_mean(median: float, sigma: float, upper: float) -> float:
    """E[min(upper, median x exp(sigma Z))], Z standard normal: the mean token count of one of
    the load generator's log-normal draws (its rounding and its lower clip at 1 token are left
    out; they move the mean by well under 1 % for the mixes used here)."""
    if median <= 0 or sigma < 0 or upper <= 0:
        raise ValueError(f"clipped_lognormal_mean: median {median}, sigma {sigma}, upper {upper}: need median > 0, "
                         "sigma >= 0, upper > 0")
    if sigma == 0:
        return min(median, upper)
    z = math.log(upper / median) / sigma
    return median * math.exp(sigma * sigma / 2) * _phi(z - sigma) + upper * (1.0 - _phi(z))


def mix_means(classes: Sequence[ClassMix]) -> tuple[float, float]:
    """(mean prompt tokens, mean output tokens) of one request of the mix, classes weighted by share."""
    total = sum(c.share for c in classes)
    if not classes or total <= 0:
        raise ValueError("mix_means: the mix has no class with a positive share")
    prompt = sum(c.share * clipped_lognormal_mean(c.prompt_median, c.prompt_sigma, c.prompt_max) for c in classes)
    output = sum(c.share * clipped_lognormal_mean(c.output_median, c.output_sigma, c.output_max) for c in classes)
    return prompt / total, output / total


@dataclass(frozen=True)
class PoolCapacity:
    """What the pool sustains and why; every rate in requests/s."""

    prefill_rps: float  # all prefill instances together
    decode_rps: float  # all decode instances together
    pool_rps: float  # min of the two
    bottleneck: str  # "prefill" or "decode"
    decode_batch: int  # B: sequences per decode step at capacity
    decode_batch_limit: str  # what set B: "max_batch", "tpot" or "kv_cache"
    decode_step_s: float  # step(B)
    mean_prompt_tokens: float
    mean_output_tokens: float


def pool_capacity(timing: PoolTiming, prefill: int, decode: int, classes: Sequence[ClassMix]) -> PoolCapacity:
    """The nominal capacity of `prefill` prefill and `decode` decode instances, each with `timing`,
    under the mix `classes` (module docstring)."""
    if prefill < 1 or decode < 1:
        raise ValueError(f"pool_capacity: {prefill} prefill and {decode} decode instances; need at least one of each")
    p_mean, o_mean = mix_means(classes)
    tpot = min(c.tpot_slo_s for c in classes)
    if timing.decode_base_s > tpot:
        raise ValueError(f"pool_capacity: decode_base_s {timing.decode_base_s} s is over the mix's tightest TPOT "
                         f"target {tpot} s: no batch meets it")
    step = lambda b: timing.decode_base_s + timing.decode_per_seq_s * (b - 1)  # noqa: E731
    limits = {"max_batch": timing.max_batch,
              "tpot": (1 + math.floor((tpot - timing.decode_base_s) / timing.decode_per_seq_s + 1e-9)
                       if timing.decode_per_seq_s > 0 else timing.max_batch),
              "kv_cache": max(1, math.floor(timing.kv_capacity_tokens / (p_mean + o_mean)))}
    why = min(limits, key=lambda k: limits[k])
    batch = limits[why]
    prefill_rps = prefill / (timing.prefill_base_s + timing.prefill_per_token_s * p_mean)
    decode_rps = decode * batch / (step(batch) * o_mean)
    return PoolCapacity(prefill_rps=prefill_rps, decode_rps=decode_rps, pool_rps=min(prefill_rps, decode_rps),
                        bottleneck="prefill" if prefill_rps < decode_rps else "decode", decode_batch=batch,
                        decode_batch_limit=why, decode_step_s=step(batch), mean_prompt_tokens=p_mean,
                        mean_output_tokens=o_mean)


def poisson_rate_for(utilization: float, capacity_rps: float, burst_size: int, burst_every_s: float) -> float:
    """The Poisson arrival rate that, with a burst of burst_size every burst_every_s (0: none),
    offers utilization x capacity_rps on average."""
    if not 0 < utilization:
        raise ValueError(f"utilization {utilization}: must be > 0")
    bursts = burst_size / burst_every_s if burst_every_s > 0 else 0.0
    rate = utilization * capacity_rps - bursts
    if rate <= 0:
        raise ValueError(f"utilization {utilization}: {utilization * capacity_rps:.2f} req/s of {capacity_rps:.2f} is "
                         f"not more than the bursts alone ({bursts:.2f} req/s)")
    return rate
