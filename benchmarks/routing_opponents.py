"""The routers a competent operator would put against seamguard's in benchmarks/inference_routing.py.

Why this exists: round robin and least-outstanding are blind to faults; an operator running a
disaggregated pool today would run a balancer with outlier ejection, or a load- and
cache-aware scheduler. Both are implemented here as the opponent (not product code), behind
the same Router hooks the gateway calls (seamguard.gateway.routing: route, first_token,
finished, update_load), and registered into that module's router table by `register()` so the
load generator can build them by name (run this file as the load generator: it registers, then
hands its arguments to seamguard.testbed.inference_load).

Both choose a *path*: (prefill, decode, rail) when the instances list their rails (the same rail
access seamguard's router has), else (prefill, decode) with the connector's rail (the home rail).

- ``p2c_eject``: power of two choices over paths, the one with fewer requests in flight (on its
  prefill and decode instances) wins; Envoy-style outlier ejection per path. Settings are
  Envoy's OutlierDetection defaults (envoyproxy.io/docs/envoy/v1.30.4/api-v3/config/cluster/v3/
  outlier_detection.proto): 5 consecutive failures, 10 s analysis interval, 30 s base ejection
  time multiplied by the times ejected, at most 10 % of the paths ejected but always at least
  one. A failure is an error or a first token later than the class's TTFT budget (the operator's
  per-request timeout). Envoy has no latency-outlier rule by default; the one added here, as an
  operator would for LLM serving, ejects at a sweep a path whose mean first-token latency over
  the interval is more than LATENCY_FACTOR x the median of the paths' means (at least
  MIN_REQUESTS requests in the interval; Envoy's success-rate volume of 100 never triggers at
  these rates).
- ``prefix_kv``: llm-d's filter -> score -> pick (llm-d.ai/docs/0.8/architecture/core/router/epp/
  scheduling), each scorer normalised to [0, 1] and weighted: prefix-cache hit estimate (weight
  3) and queue depth (weight 2), the default profile Red Hat documents for llm-d
  (docs.redhat.com, OpenShift AI 3.4, "Configuring scheduler settings"), plus KV-cache
  utilisation (weight 1, our choice). The prefix estimate is the share of the prompt's leading
  blocks the router last sent to that decode instance (an approximate prefix index, as llm-d's
  approximate prefix scorer keeps); queue depth and KV use come from each instance's /metrics
  (update_load) plus this router's own in-flight count.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from seamguard.gateway.routing import ROUTERS, Instance, Outcome, Route, _split

PathKey = tuple[str, str, int | None]  # prefill name ("" for unified), decode name, rail (None: connector's)


def _paths(instances: list[Instance]) -> list[tuple[Instance | None, Instance, int | None]]:
    """Every (prefill, decode, rail) a request may take; rails only when both ends list the same
    number (two or more) of rails, as seamguard's router does."""
    prefill, decode = _split(instances)
    out = []
    for d in decode:
        for p in prefill or [None]:
            n = len(d.rails) if p is not None and len(p.rails) == len(d.rails) >= 2 else 0
            out += [(p, d, r) for r in (range(n) if n else [None])]
    return out


def _key(route: Route) -> PathKey:
    return (route.prefill.name if route.prefill else "", route.decode.name, route.kv_rail)


@dataclass(frozen=True)
class EjectionSettings:
    """Envoy OutlierDetection defaults (see the module docstring), plus the latency rule."""

    consecutive_failures: int = 5
    interval_s: float = 10.0
    base_ejection_s: float = 30.0
    max_ejection_share: float = 0.10  # but at least one path
    latency_factor: float = 2.0
    min_requests: int = 5
    ttft_timeout_s: dict = field(default_factory=lambda: {"interactive": 1.0, "batch": 10.0})


class P2CEjection:
    """Power of two choices, least outstanding, with outlier ejection per path."""

    def __init__(self, instances: list[Instance], settings: EjectionSettings | None = None,
                 clock=time.monotonic, seed: int = 0) -> None:
        self._paths = _paths(instances)
        self.s = settings or EjectionSettings()
        self._clock, self._rng = clock, random.Random(seed)
        self._inflight: dict[str, int] = {}
        self._cls: dict[int, str] = {}  # in-flight route -> its request class (for its timeout)
        self._streak: dict[PathKey, int] = {}
        self._lat: dict[PathKey, list[float]] = {}  # first-token latencies since the last sweep
        self._ejected_until: dict[PathKey, float] = {}
        self._times_ejected: dict[PathKey, int] = {}
        self._next_sweep = clock() + self.s.interval_s
        self.decisions: dict[str, int] = {}

    def _load(self, path) -> int:
        return sum(self._inflight.get(i.name, 0) for i in path[:2] if i is not None)

    def ejected(self, now: float | None = None) -> set[PathKey]:
        now = self._clock() if now is None else now
        return {k for k, t in self._ejected_until.items() if t > now}

    def _eject(self, key: PathKey, now: float, why: str) -> None:
        cap = max(1, int(self.s.max_ejection_share * len(self._paths)))
        if key in self.ejected(now) or len(self.ejected(now)) >= cap:
            return
        n = self._times_ejected[key] = self._times_ejected.get(key, 0) + 1
        self._ejected_until[key] = now + self.s.base_ejection_s * n
        self.decisions[f"ejected ({why})"] = self.decisions.get(f"ejected ({why})", 0) + 1

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.s.interval_s
        means = {k: statistics.fmean(v) for k, v in self._lat.items() if len(v) >= self.s.min_requests}
        if len(means) >= 2:
            med = statistics.median(means.values())
            for k, m in sorted(means.items(), key=lambda kv: -kv[1]):
                if m > self.s.latency_factor * med:
                    self._eject(k, now, "latency outlier")
        self._lat.clear()

    def route(self, request_class: str, prompt_tokens: int) -> Route:
        now = self._clock()
        self._sweep(now)
        out = self.ejected(now)
        cands = [p for p in self._paths if (p[0].name if p[0] else "", p[1].name, p[2]) not in out] or self._paths
        a, b = self._rng.sample(cands, 2) if len(cands) >= 2 else (cands[0], cands[0])
        p, d, r = a if self._load(a) <= self._load(b) else b
        for i in (p, d):
            if i is not None:
                self._inflight[i.name] = self._inflight.get(i.name, 0) + 1
        route = Route(decode=d, prefill=p, kv_rail=r)
        self._cls[id(route)] = request_class
        return route

    def first_token(self, route: Route, decode_first_token_s: float) -> None:
        pass

    def finished(self, route: Route, outcome: Outcome) -> None:
        request_class = self._cls.pop(id(route), "interactive")
        for i in (route.prefill, route.decode):
            if i is not None:
                self._inflight[i.name] = max(0, self._inflight.get(i.name, 0) - 1)
        if outcome.cancelled:
            return
        k, now = _key(route), self._clock()
        late = outcome.ttft_s is not None and outcome.ttft_s > self.s.ttft_timeout_s.get(request_class, 10.0)
        if outcome.decode_first_token_s is not None:
            self._lat.setdefault(k, []).append(outcome.decode_first_token_s)
        self._streak[k] = self._streak.get(k, 0) + 1 if (not outcome.ok or late) else 0
        if self._streak[k] >= self.s.consecutive_failures:
            self._streak[k] = 0
            self._eject(k, now, "consecutive failures")


@dataclass(frozen=True)
class ScorerWeights:
    prefix: float = 3.0
    queue: float = 2.0
    kv: float = 1.0
    block_tokens: int = 16  # tokens per prefix block (vLLM's default block size)
    index_blocks: int = 4096  # blocks remembered per decode instance (LRU)


class PrefixKVScorer:
    """llm-d-style weighted scorers over paths: prefix-cache hit, queue depth, KV utilisation."""

    def __init__(self, instances: list[Instance], weights: ScorerWeights | None = None, clock=time.monotonic) -> None:
        self._paths = _paths(instances)
        self.w = weights or ScorerWeights()
        self._inflight: dict[str, int] = {}
        self._waiting: dict[str, float] = {}
        self._kv: dict[str, float] = {}
        self._index: dict[str, OrderedDict] = {}
        self._turn = 0
        self.decisions: dict[str, int] = {}

    def update_load(self, instance: str, waiting: float | None = None, kv_usage: float | None = None) -> None:
        if waiting is not None:
            self._waiting[instance] = waiting
        if kv_usage is not None:
            self._kv[instance] = kv_usage

    def _blocks(self, prefix: tuple | None, prompt_tokens: int) -> list[int]:
        """Chained block hashes of the prompt's full blocks (what a prefix index keys on)."""
        toks = tuple(prefix) if prefix is not None else ()
        out, h = [], 0
        for i in range(len(toks) // self.w.block_tokens):
            h = hash((h, toks[i * self.w.block_tokens:(i + 1) * self.w.block_tokens]))
            out.append(h)
        return out

    def _queue(self, name: str) -> float:
        return self._waiting.get(name, 0.0) + self._inflight.get(name, 0)

    def scores(self, prompt_tokens: int, prefix: tuple | None = None) -> list[tuple[float, tuple]]:
        blocks = self._blocks(prefix, prompt_tokens)
        loads = {p[1].name: self._queue(p[1].name) + (self._queue(p[0].name) if p[0] else 0) for p in self._paths}
        lo, hi = min(loads.values()), max(loads.values())
        out = []
        for path in self._paths:
            d = path[1].name
            idx = self._index.get(d, OrderedDict())
            hit = next((i for i, b in enumerate(blocks) if b not in idx), len(blocks))
            prefix_s = hit / len(blocks) if blocks else 0.0
            queue_s = 1.0 if hi == lo else 1.0 - (loads[d] - lo) / (hi - lo)
            kv_s = 1.0 - min(1.0, max(0.0, self._kv.get(d, 0.0)))
            out.append((self.w.prefix * prefix_s + self.w.queue * queue_s + self.w.kv * kv_s, path))
        return out

    def route(self, request_class: str, prompt_tokens: int, prefix: tuple | None = None) -> Route:
        scored = self.scores(prompt_tokens, prefix)
        best = max(s for s, _ in scored)
        tied = [p for s, p in scored if s == best]
        self._turn += 1
        p, d, r = tied[self._turn % len(tied)]
        idx = self._index.setdefault(d.name, OrderedDict())
        for b in self._blocks(prefix, prompt_tokens):
            idx[b] = True
            idx.move_to_end(b)
        while len(idx) > self.w.index_blocks:
            idx.popitem(last=False)
        for i in (p, d):
            if i is not None:
                self._inflight[i.name] = self._inflight.get(i.name, 0) + 1
        return Route(decode=d, prefill=p, kv_rail=r)

    def first_token(self, route: Route, decode_first_token_s: float) -> None:
        pass

    def finished(self, route: Route, outcome: Outcome) -> None:
        for i in (route.prefill, route.decode):
            if i is not None:
                self._inflight[i.name] = max(0, self._inflight.get(i.name, 0) - 1)


OPPONENTS = ("p2c_eject", "prefix_kv")


def register() -> None:
    """Add the opponents to seamguard.gateway.routing.ROUTERS (idempotent)."""
    ROUTERS.setdefault("p2c_eject", lambda instances, clock=time.monotonic, ttft_budget_s=None, **_: P2CEjection(
        instances, EjectionSettings(ttft_timeout_s=dict(ttft_budget_s or EjectionSettings().ttft_timeout_s)),
        clock=clock))
    ROUTERS.setdefault("prefix_kv", lambda instances, clock=time.monotonic, **_: PrefixKVScorer(instances,
                                                                                                 clock=clock))


if __name__ == "__main__":  # the load generator, with the opponents known by name
    register()
    from seamguard.testbed.inference_load import main

    main(sys.argv[1:])
