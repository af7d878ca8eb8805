"""Which inference instances serve a request: the routing seam of the gateway.

The gateway (seamguard.gateway.app) asks a Router for a Route before it proxies a request and
tells it the Outcome afterwards. For disaggregated serving a Route names a prefill instance and
a decode instance, and so the KV-cache transfer path between them; for unified instances
``prefill`` is None. Routers are plain objects with no I/O: the gateway feeds them what it
measured and what the control plane says about links and NICs (seamguard.gateway.routing_feeds
reads both), and time comes from an injected clock.

Three routers, by name in ROUTERS (`make_router` builds one from the gateway config):

- ``round_robin``: each role's instances in turn.
- ``least_outstanding``: fewest requests in flight per instance, ties in turn (what
  LiteLLM's and Envoy's least-request balancers do).
- ``seamguard``: chooses the (prefill, decode) pair per request from the measured transfer
  latency and jitter of each path, the control plane's NIC/link states, and each instance's
  queue and KV-cache pressure; a path is admissible or not per request class; batch work is
  deferred (`Shed`) before interactive work misses its TTFT budget. docs/gateway-routing.md.

Hooks the gateway calls on every router: ``route`` before proxying, ``first_token`` when the
decode instance's first token arrives (optional but it is what lets a stalled transfer be seen
before it ends), ``finished`` after. ``route`` may raise `Shed` (answer 503 + Retry-After).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

Role = Literal["prefill", "decode", "unified"]
RequestClass = Literal["interactive", "batch"]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Instance:
    """One inference server the gateway may send work to."""

    name: str
    url: str  # base URL of its OpenAI-compatible API, e.g. http://10.0.0.2:8000
    role: Role = "unified"
    nic: str | None = None  # the NIC/link id the control plane knows it by (link and NIC states)


@dataclass(frozen=True)
class Route:
    """Where one request goes, and why when that is not the default choice."""

    decode: Instance  # the instance that streams the tokens (the only one for unified serving)
    prefill: Instance | None = None  # disaggregated serving: where the prompt is prefilled
    reason: str = ""  # empty for the default choice; evidence in words otherwise
    evidence: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What the gateway measured for one routed request."""

    ok: bool
    ttft_s: float | None = None  # request received -> first token sent to the client
    tpot_s: float | None = None  # mean time per output token after the first
    decode_first_token_s: float | None = None  # decode request sent -> its first token (includes the KV transfer)
    output_tokens: int = 0


class Shed(Exception):
    """The router declines this request now: answer 503 with Retry-After and an OpenAI error body.

    Raised for batch work only, when no path is admissible for it or when serving it would put
    interactive requests over their TTFT budget ("defer": the client retries after retry_after_s).
    """

    def __init__(self, reason: str, retry_after_s: float, evidence: dict[str, float] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.evidence = evidence or {}


class Router(Protocol):
    def route(self, request_class: RequestClass, prompt_tokens: int) -> Route: ...

    def first_token(self, route: Route, decode_first_token_s: float) -> None: ...

    def finished(self, route: Route, outcome: Outcome) -> None: ...


def _split(instances: list[Instance]) -> tuple[list[Instance], list[Instance]]:
    prefill = [i for i in instances if i.role == "prefill"]
    decode = [i for i in instances if i.role in ("decode", "unified")]
    if not decode:
        raise ValueError("routing: no decode or unified instance configured")
    if prefill and any(i.role == "unified" for i in decode):
        raise ValueError("routing: mix of prefill and unified instances; use prefill+decode or unified only")
    names = [i.name for i in instances]
    if len(set(names)) != len(names):
        raise ValueError("routing: instance names must be unique")
    return prefill, decode


class RoundRobin:
    """Each role's instances in turn; prefill and decode cycle independently."""

    def __init__(self, instances: list[Instance]) -> None:
        prefill, decode = _split(instances)
        self._prefill = itertools.cycle(prefill) if prefill else None
        self._decode = itertools.cycle(decode)

    def route(self, request_class: RequestClass, prompt_tokens: int) -> Route:
        return Route(decode=next(self._decode), prefill=next(self._prefill) if self._prefill else None)

    def first_token(self, route: Route, decode_first_token_s: float) -> None:
        pass

    def finished(self, route: Route, outcome: Outcome) -> None:
        pass


class _InFlight:
    """Requests routed and not finished, per instance name; keyed by the Route object."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self._routes: dict[int, tuple[Route, object]] = {}

    def add(self, route: Route, note: object = None) -> None:
        self._routes[id(route)] = (route, note)
        for inst in (route.prefill, route.decode):
            if inst is not None:
                self.count[inst.name] = self.count.get(inst.name, 0) + 1

    def note(self, route: Route) -> object:
        return self._routes.get(id(route), (None, None))[1]

    def pop(self, route: Route) -> object:
        """The note given at add(); None (and no count change) for a route not in flight."""
        got = self._routes.pop(id(route), None)
        if got is None:
            return None
        for inst in (route.prefill, route.decode):
            if inst is not None:
                self.count[inst.name] -= 1
        return got[1]

    def notes(self) -> list[object]:
        return [n for _, n in self._routes.values()]


def _fewest(candidates: list[Instance], load: Callable[[Instance], float], turn: int) -> Instance:
    """The least loaded candidate; among equals, the one `turn` points at (round robin)."""
    low = min(load(i) for i in candidates)
    tied = [i for i in candidates if load(i) == low]
    return tied[turn % len(tied)]


class LeastOutstanding:
    """Fewest requests in flight per instance, ties in turn; prefill and decode chosen separately.

    In flight = routed and not yet finished, counted by this router (route() adds, finished()
    removes), as LiteLLM's least-busy and Envoy's LEAST_REQUEST do. It knows nothing of paths.
    """

    def __init__(self, instances: list[Instance]) -> None:
        self._prefill, self._decode = _split(instances)
        self._inflight = _InFlight()
        self._turn = 0

    def outstanding(self, name: str) -> int:
        return self._inflight.count.get(name, 0)

    def route(self, request_class: RequestClass, prompt_tokens: int) -> Route:
        self._turn += 1
        load = lambda i: self.outstanding(i.name)  # noqa: E731
        prefill = _fewest(self._prefill, load, self._turn) if self._prefill else None
        r = Route(decode=_fewest(self._decode, load, self._turn), prefill=prefill)
        self._inflight.add(r)
        return r

    def first_token(self, route: Route, decode_first_token_s: float) -> None:
        pass

    def finished(self, route: Route, outcome: Outcome) -> None:
        self._inflight.pop(route)


# ---- the fabric-aware router ------------------------------------------------------------------

# Control-plane states, least to most severe (seamguard.assess.states.State labels).
FABRIC_SEVERITY = {"healthy": 0, "degraded": 1, "checkpoint_unsafe": 2, "quarantine": 3, "harmful": 4,
                   "failed": 5}


@dataclass(frozen=True)
class SeamguardOptions:
    """Settings of the seamguard router; every threshold is relative to a budget or to peers."""

    ttft_budget_s: Mapping[str, float] = field(
        default_factory=lambda: {"interactive": 1.0, "batch": 10.0})
    """TTFT target per request class (the SLO the gateway is held to)."""
    tpot_budget_s: Mapping[str, float] = field(
        default_factory=lambda: {"interactive": 0.1, "batch": 0.25})
    """TPOT target per request class (mean time per output token after the first)."""
    window: int = 8
    """Recent transfer samples kept per path (median and upper quantile are taken over them)."""
    quantile: float = 0.9
    """The path's latency is this quantile of its window: the median plus its jitter."""
    peer_ratio: float = 3.0
    """A path is slow when its latency exceeds peer_ratio x the median of the other paths..."""
    budget_share: float = 0.25
    """...and the excess is more than budget_share of the request class's TTFT budget."""
    stall_ratio: float = 3.0
    """A transfer still waiting for its first token after stall_ratio x the peers' typical
    route->first-token time (and budget_share of the budget beyond it) marks its path stalled now."""
    fabric_block: Mapping[str, int] = field(default_factory=lambda: {"interactive": 1, "batch": 3})
    """Lowest control-plane severity (FABRIC_SEVERITY) that makes a path inadmissible, per class:
    interactive avoids degraded NICs, batch only quarantined, harmful or failed ones."""
    kv_high: float = 0.95
    """KV-cache usage at or above which an instance takes no new work while another can."""
    defer_share: float = 0.6
    """Batch work is deferred while recent interactive TTFTs (their upper quantile) exceed
    defer_share of the interactive budget and some path is out for interactive."""
    defer_max_share: float = 0.5
    """At most this share of the recent batch requests is deferred: batch work slows, it never
    starves (a request deferred k times in a row has probability defer_max_share^k)."""
    probe_after_s: float = 5.0
    """A path out of use for this long gets one batch request to learn whether it recovered; two
    probes in a row in line with the peers drop its older samples (it is back)."""
    forget_after_s: float = 30.0
    """A path's samples older than this are dropped, so interactive work may use it again when no
    batch work has probed it."""
    retry_after_s: float = 1.0
    """Retry-After given with Shed."""
    load_stale_s: float = 10.0
    """Instance load (waiting, KV usage) older than this is ignored."""


@dataclass
class _Path:
    dft: deque = field(default_factory=deque)  # decode_first_token_s samples
    tft: deque = field(default_factory=deque)  # route -> first decode token (seconds, router clock)
    last_sample_t: float = -math.inf
    last_used_t: float = -math.inf
    good_probes: int = 0  # consecutive probes that came back in line with the peers
    lat: float = math.nan  # cached: the window's quantile (the path's latency)
    tft_med: float = math.nan  # cached: median route -> first token
    pending: dict = field(default_factory=dict)  # id(route) -> _Pending, routed and not finished


@dataclass
class _Pending:
    path: tuple[str, str]
    request_class: str
    t0: float
    first_token_t: float | None = None
    probe: bool = False


@dataclass
class _Load:
    waiting: float = 0.0
    kv_usage: float = 0.0
    t: float = -math.inf


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _median(xs: list[float]) -> float:
    return _quantile(xs, 0.5)


def _median_without(sorted_vals: list[float], v: float | None) -> float:
    """Median of sorted_vals with one occurrence of v left out (v None: nothing left out)."""
    if v is None or math.isnan(v):
        return _median(sorted_vals)
    k = bisect.bisect_left(sorted_vals, v)
    m = len(sorted_vals) - 1
    if m <= 0:
        return math.nan
    at = lambda i: sorted_vals[i if i < k else i + 1]  # noqa: E731
    return (at((m - 1) // 2) + at(m // 2)) / 2


class SeamguardRouter:
    """Fabric-aware (prefill, decode) choice per request; see the module docstring and
    docs/gateway-routing.md. Pure: clock injected, inputs fed by the gateway."""

    def __init__(self, instances: list[Instance], options: SeamguardOptions | None = None,
                 clock: Clock = time.monotonic) -> None:
        self._prefill, self._decode = _split(instances)
        self.options = options or SeamguardOptions()
        self._clock = clock
        self._inflight = _InFlight()
        self._paths: dict[tuple[str, str], _Path] = {}
        self._fabric: dict[str, str] = {}
        self._load: dict[str, _Load] = {}
        self._itft: deque = deque(maxlen=max(4, 2 * self.options.window))  # recent interactive TTFTs
        self._batch_deferred: deque = deque(maxlen=20)  # recent batch route() calls: deferred or not
        self._tpot: dict[str, deque] = {}  # decode instance -> recent TPOT samples
        self._tpot_t: dict[str, float] = {}  # ... and when the last one came
        self._turn = 0
        self.decisions: dict[str, int] = {}  # reason kind -> count (for /metrics)
        self._version = 0  # bumped by every new sample; keys the peers cache
        self._cache: tuple[int, dict] | None = None

    # ---- inputs -------------------------------------------------------------------------------
    def update_fabric(self, states: Mapping[str, str]) -> None:
        """The control plane's NIC/link states (name -> state label); replaces the previous map.
        Names not in it count as healthy."""
        self._fabric = {k: v for k, v in states.items() if v != "healthy"}

    def update_load(self, instance: str, waiting: float | None = None, kv_usage: float | None = None) -> None:
        """Queue depth (requests waiting) and KV-cache usage in [0, 1] of one instance, e.g. from
        parse_vllm_metrics over its /metrics."""
        cur = self._load.setdefault(instance, _Load())
        if waiting is not None:
            cur.waiting = float(waiting)
        if kv_usage is not None:
            cur.kv_usage = float(kv_usage)
        cur.t = self._clock()

    def outstanding(self, name: str) -> int:
        return self._inflight.count.get(name, 0)

    def snapshot(self) -> dict:
        """What the router currently believes, for /metrics and the dashboard (plain data):
        per path its latency quantile, median, samples, pending transfers and, per class,
        whether it is admissible and why not; per instance its load; decision counts."""
        now, opts = self._clock(), self.options
        self._forget(now)
        paths = []
        for p in self._prefill:
            for d in self._decode:
                key = (p.name, d.name)
                st = self._paths.get(key, _Path())
                why = {c: self._judge(p, d, c, b, now)[0] for c, b in opts.ttft_budget_s.items()}
                paths.append({"prefill": p.name, "decode": d.name, "latency_s": st.lat,
                              "median_s": _median(list(st.dft)) if st.dft else math.nan, "samples": len(st.dft),
                              "pending": len(st.pending),
                              "admissible": {c: not w for c, w in why.items()}, "why": why})
        loads = {i.name: {"outstanding": self.outstanding(i.name),
                          "waiting": self._load.get(i.name, _Load()).waiting,
                          "kv_usage": self._load.get(i.name, _Load()).kv_usage}
                 for i in self._prefill + self._decode}
        return {"paths": paths, "instances": loads, "fabric": dict(self._fabric), "decisions": dict(self.decisions)}

    # ---- hooks --------------------------------------------------------------------------------
    def route(self, request_class: RequestClass, prompt_tokens: int) -> Route:
        if not self._prefill:  # unified serving: no transfer path, only instance load
            return self._route_unified(request_class)
        now = self._clock()
        self._turn += 1
        opts = self.options
        self._forget(now)
        budget = opts.ttft_budget_s.get(request_class, max(opts.ttft_budget_s.values()))
        judged = {(p.name, d.name): self._judge(p, d, request_class, budget, now)
                  for p in self._prefill for d in self._decode}
        ok = [k for k, (why, _) in judged.items() if not why]
        ibudget = opts.ttft_budget_s.get("interactive", budget)
        fine = set(ok) if request_class == "interactive" else {
            (p.name, d.name) for p in self._prefill for d in self._decode
            if not self._judge(p, d, "interactive", ibudget, now)[0]}
        out_for_interactive = len(fine) < len(judged)
        # a path out for interactive work but within a looser budget takes that work only when no
        # path fine for everyone can: its slow transfers hold KV on both ends (and, with some KV
        # connectors, stall the decode batch), so it is the last resort, not a free lane
        ok = [k for k in ok if k in fine] or ok
        probe = None
        if request_class == "batch":
            probe = self._probe_candidate(judged, now)
            if probe is None and ok and out_for_interactive:
                try:
                    self._defer_if_interactive_at_risk(budget)
                except Shed:
                    self._batch_deferred.append(True)
                    raise
            self._batch_deferred.append(False)
        if probe is not None:
            pair, kind = probe, "probe"
        elif ok:
            pair, kind = self._least_loaded(ok, now), ""
        elif request_class == "batch":
            worst = {k: e for k, (_, e) in judged.items()}
            self._count("shed_no_path")
            raise Shed("no path admissible for batch: " + "; ".join(f"{a}->{b}: {judged[(a, b)][0]}"
                                                                     for a, b in judged),
                       opts.retry_after_s, {f"{a}->{b}.latency_s": e.get("latency_s", math.nan)
                                            for (a, b), e in worst.items()})
        else:  # interactive with nothing admissible: the least bad path, and say so
            pair = min(judged, key=lambda k: (judged[k][1].get("severity", 0), judged[k][1].get("latency_s", 0.0)))
            kind = "least_bad"
        prefill = next(i for i in self._prefill if i.name == pair[0])
        decode = next(i for i in self._decode if i.name == pair[1])
        reason, evidence = self._explain(kind, pair, judged, request_class)
        r = Route(decode=decode, prefill=prefill, reason=reason, evidence=evidence)
        pend = _Pending(pair, request_class, now, probe=kind == "probe")
        self._inflight.add(r, pend)
        path = self._path(pair)
        path.last_used_t = now
        path.pending[id(r)] = pend
        if reason:
            self._count(kind or "avoid")
        return r

    def first_token(self, route: Route, decode_first_token_s: float) -> None:
        pend = self._inflight.note(route)
        if not isinstance(pend, _Pending) or pend.first_token_t is not None:
            return
        now = self._clock()
        pend.first_token_t = now
        self._sample(pend.path, decode_first_token_s, now - pend.t0, now, pend.probe)

    def finished(self, route: Route, outcome: Outcome) -> None:
        pend = self._inflight.pop(route)
        if not isinstance(pend, _Pending):
            return
        self._path(pend.path).pending.pop(id(route), None)
        now = self._clock()
        if pend.first_token_t is None:
            if outcome.decode_first_token_s is not None:
                self._sample(pend.path, outcome.decode_first_token_s, now - pend.t0, now, pend.probe)
            elif not outcome.ok:  # failed before any token: the time it took is the evidence
                self._sample(pend.path, now - pend.t0, now - pend.t0, now, pend.probe)
        if pend.request_class == "interactive" and outcome.ttft_s is not None:
            self._itft.append(outcome.ttft_s)
        if outcome.tpot_s is not None and outcome.output_tokens > 1:
            q = self._tpot.setdefault(route.decode.name, deque(maxlen=self.options.window))
            if pend.probe and not self._slow_decode(route.decode.name, "batch", now, {}, outcome.tpot_s):
                q.clear()  # a probe whose tokens came at the peers' pace: the instance is back
            q.append(outcome.tpot_s)
            self._tpot_t[route.decode.name] = now
            self._version += 1

    # ---- judgement ----------------------------------------------------------------------------
    def _path(self, pair: tuple[str, str]) -> _Path:
        return self._paths.setdefault(pair, _Path())

    def _sample(self, pair: tuple[str, str], dft: float, tft: float, now: float, probe: bool = False) -> None:
        p = self._path(pair)
        if probe:  # two probes in a row in line with the peers: the path recovered, drop its old samples
            peer = self._peers(pair, "lat")
            p.good_probes = p.good_probes + 1 if math.isnan(peer) or dft <= self.options.peer_ratio * peer else 0
        for q, v in ((p.dft, dft), (p.tft, tft)):
            q.append(v)
            keep = p.good_probes if p.good_probes >= 2 else self.options.window
            while len(q) > keep:
                q.popleft()
        if p.good_probes >= 2:
            p.good_probes = 0
        p.last_sample_t = now
        self._refresh(p)

    def _refresh(self, p: _Path) -> None:
        p.lat = _quantile(list(p.dft), self.options.quantile) if p.dft else math.nan
        p.tft_med = _median(list(p.tft)) if p.tft else math.nan
        self._version += 1

    def _sorted(self) -> dict:
        """Every path's latency and route->first-token median, every decode instance's TPOT
        quantile, sorted: the peers of one are these minus itself (cached until a new sample)."""
        if self._cache is None or self._cache[0] != self._version:
            q = self.options.quantile
            tpot = {k: _quantile(list(v), q) for k, v in self._tpot.items() if v}
            have = [p for p in self._paths.values() if p.dft]
            self._cache = (self._version, {"lat": sorted(p.lat for p in have),
                                           "tft_med": sorted(p.tft_med for p in have),
                                           "tpot": tpot, "tpot_sorted": sorted(tpot.values())})
        return self._cache[1]

    def _forget(self, now: float) -> None:
        """Drop evidence older than forget_after_s (paths and decode TPOT windows)."""
        for p in self._paths.values():
            if p.dft and now - p.last_sample_t > self.options.forget_after_s:
                p.dft.clear()
                p.tft.clear()
                self._refresh(p)
        for name in [n for n, t in self._tpot_t.items() if now - t > self.options.forget_after_s]:
            self._tpot.pop(name, None)
            del self._tpot_t[name]
            self._version += 1

    def _latency(self, pair: tuple[str, str]) -> float:
        d = self._paths.get(pair)
        return d.lat if d else math.nan

    def _peers(self, pair: tuple[str, str], attr: str) -> float:
        """Median over the other paths of their `attr` ("lat" or "tft_med"); nan without data."""
        p = self._paths.get(pair)
        return _median_without(self._sorted()[attr], getattr(p, attr) if p and p.dft else None)

    def _severity(self, prefill: Instance, decode: Instance) -> tuple[int, str]:
        worst, name = 0, ""
        for inst in (prefill, decode):
            if inst.nic is None:
                continue
            for nic, state in self._fabric.items():
                # the NIC itself, its link to the leaf ("nic~leaf"), or any NIC of a host ("host/nic")
                if nic == inst.nic or nic.startswith((inst.nic + "~", inst.nic + "/")):
                    sev = FABRIC_SEVERITY.get(state, 0)
                    if sev > worst:
                        worst, name = sev, f"{nic}={state}"
        return worst, name

    def _judge(self, prefill: Instance, decode: Instance, request_class: str, budget: float,
               now: float) -> tuple[str, dict[str, float]]:
        """Why the path is not admissible for this class ("" when it is), and the evidence."""
        opts, pair = self.options, (prefill.name, decode.name)
        ev: dict[str, float] = {}
        sev, nic = self._severity(prefill, decode)
        ev["severity"] = float(sev)
        if sev >= opts.fabric_block.get(request_class, 1):
            return f"control plane: {nic}", ev
        p = self._paths.get(pair)
        why = self._slow_decode(decode.name, request_class, now, ev)
        if why:
            return why, ev
        lat, peer = self._latency(pair), self._peers(pair, "lat")
        ev.update(latency_s=lat, peers_latency_s=peer)
        if p and p.dft:
            ev["jitter_s"] = lat - _median(list(p.dft))
        if not math.isnan(lat) and not math.isnan(peer) and lat > opts.peer_ratio * peer \
                and lat - peer > opts.budget_share * budget:
            return f"transfer p{round(100 * opts.quantile)} {lat:.3f}s vs peers {peer:.3f}s", ev
        # a transfer still waiting for its first token: censored evidence, before it ends
        typical = self._peers(pair, "tft_med")
        ages = [now - n.t0 for n in p.pending.values() if n.first_token_t is None] if p else []
        if ages and not math.isnan(typical):
            oldest = max(ages)
            ev.update(oldest_pending_s=oldest, peers_first_token_s=typical)
            if oldest > opts.stall_ratio * typical and oldest - typical > opts.budget_share * budget:
                return f"transfer pending {oldest:.3f}s vs peers' {typical:.3f}s to first token", ev
        if not math.isnan(lat) and not math.isnan(peer) and lat > opts.peer_ratio * peer:
            # slow, yet within this class's budget (batch): admissible while its queue fits the budget
            queued = len(ages) + 1
            ev["queued"] = float(queued)
            if lat * queued > budget:
                return f"slow path ({lat:.3f}s) x {queued} queued transfers exceeds the {budget:.1f}s budget", ev
        return "", ev

    def _slow_decode(self, name: str, request_class: str, now: float, ev: dict[str, float],
                     sample: float | None = None) -> str:
        """A decode instance whose tokens come slower than its peers' by a share of the TPOT
        budget that matters (same ratio and share as for paths): out for this class. With
        `sample`, judge that one sample instead of the instance's window."""
        opts = self.options
        budget = opts.tpot_budget_s.get(request_class)
        cache = self._sorted()
        q = sample if sample is not None else cache["tpot"].get(name)
        if budget is None or q is None:
            return ""
        peer = _median_without(cache["tpot_sorted"], cache["tpot"].get(name))
        if math.isnan(peer):
            return ""
        ev.update(decode_tpot_s=q, peers_tpot_s=peer)
        if q > opts.peer_ratio * peer and q - peer > opts.budget_share * budget:
            return f"decode {name} TPOT p{round(100 * opts.quantile)} {q:.3f}s vs peers {peer:.3f}s"
        return ""

    def _probe_candidate(self, judged: dict, now: float) -> tuple[str, str] | None:
        """A path out for every class, idle and unsampled for probe_after_s: probe it with batch."""
        for pair, (why, _) in judged.items():
            if not why or why.startswith("control plane"):
                continue
            p = self._path(pair)
            busy = bool(p.pending)
            if not busy and now - max(p.last_sample_t, p.last_used_t) >= self.options.probe_after_s:
                return pair
        return None

    def _defer_if_interactive_at_risk(self, batch_budget: float) -> None:
        opts = self.options
        ibudget = opts.ttft_budget_s.get("interactive")
        if ibudget is None or len(self._itft) < 4:
            return
        recent = _quantile(list(self._itft), opts.quantile)
        deferred = sum(self._batch_deferred) / len(self._batch_deferred) if self._batch_deferred else 0.0
        if recent > opts.defer_share * ibudget and deferred < opts.defer_max_share:
            self._count("defer_batch")
            raise Shed(f"batch deferred: interactive TTFT p{round(100 * opts.quantile)} {recent:.3f}s is over "
                       f"{opts.defer_share:.0%} of its {ibudget:.2f}s budget while a path is out",
                       opts.retry_after_s, {"interactive_ttft_s": recent, "interactive_budget_s": ibudget})

    def _instance_load(self, name: str, now: float) -> float:
        ld = self._load.get(name)
        fresh = ld is not None and now - ld.t <= self.options.load_stale_s
        return self.outstanding(name) + (ld.waiting if fresh else 0.0)  # type: ignore[union-attr]

    def _kv_full(self, name: str, now: float) -> bool:
        ld = self._load.get(name)
        return ld is not None and now - ld.t <= self.options.load_stale_s and ld.kv_usage >= self.options.kv_high

    def _least_loaded(self, pairs: list[tuple[str, str]], now: float) -> tuple[str, str]:
        roomy = [k for k in pairs if not self._kv_full(k[0], now) and not self._kv_full(k[1], now)]
        pairs = roomy or pairs
        score = {k: self._instance_load(k[0], now) + self._instance_load(k[1], now) for k in pairs}
        low = min(score.values())
        tied = [k for k in pairs if score[k] == low]
        return tied[self._turn % len(tied)]

    def _explain(self, kind: str, pair: tuple[str, str], judged: dict, request_class: str
                 ) -> tuple[str, dict[str, float]]:
        """Reason and evidence when the choice departs from the default (all paths admissible)."""
        out = {k: why for k, (why, _) in judged.items() if why}
        if not out and not kind:
            return "", {}
        ev = {k: v for k, v in judged[pair][1].items() if not (isinstance(v, float) and math.isnan(v))}
        for (a, b), why in out.items():
            for key in ("latency_s", "oldest_pending_s", "severity", "decode_tpot_s"):
                v = judged[(a, b)][1].get(key)
                if v is not None and not math.isnan(v):
                    ev[f"{a}->{b}.{key}"] = v
        avoided = "; ".join(f"{a}->{b} ({why})" for (a, b), why in out.items() if (a, b) != pair)
        head = {"probe": f"probe of {pair[0]}->{pair[1]}, out of use ({out.get(pair, '')})",
                "least_bad": f"no admissible path; least bad {pair[0]}->{pair[1]}"}.get(
            kind, f"{request_class}: chose {pair[0]}->{pair[1]}")
        return f"{head}; avoided {avoided}" if avoided else head, ev

    def _route_unified(self, request_class: RequestClass) -> Route:
        now = self._clock()
        self._turn += 1
        roomy = [i for i in self._decode if not self._kv_full(i.name, now)] or self._decode
        r = Route(decode=_fewest(roomy, lambda i: self._instance_load(i.name, now), self._turn))
        self._inflight.add(r, None)
        return r

    def _count(self, kind: str) -> None:
        self.decisions[kind] = self.decisions.get(kind, 0) + 1


# ---- vLLM /metrics ---------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # V1 name, then the V0 one


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """``waiting`` and ``kv_usage`` (0..1) from a vLLM-style Prometheus exposition; a key is
    absent when the server does not export it. Several series (one per model or engine) are
    summed for waiting and maxed for usage."""
    seen: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(v):
            seen.setdefault(m.group(1), []).append(v)
    out: dict[str, float] = {}
    for name in WAITING:
        if name in seen:
            out["waiting"] = sum(seen[name])
            break
    for name in KV_USAGE:
        if name in seen:
            out["kv_usage"] = max(seen[name])
            break
    return out


# ---- registry ---------------------------------------------------------------------------------

ROUTERS: dict[str, Callable[..., Router]] = {
    "round_robin": lambda instances, **_: RoundRobin(instances),
    "least_outstanding": lambda instances, **_: LeastOutstanding(instances),
    "seamguard": lambda instances, clock=time.monotonic, **options: SeamguardRouter(
        instances, SeamguardOptions(**options), clock=clock),
}


def make_router(name: str, instances: list[Instance], clock: Clock = time.monotonic, **options: object) -> Router:
    """The router called `name` (a key of ROUTERS); options are SeamguardOptions fields (ignored
    by the baselines)."""
    try:
        factory = ROUTERS[name]
    except KeyError:
        raise ValueError(f"routing: unknown router {name!r}; one of {', '.join(ROUTERS)}") from None
    return factory(instances, clock=clock, **options)
