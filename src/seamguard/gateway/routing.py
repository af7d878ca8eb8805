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
  deferred (`Shed`) before interactive work misses its TTFT budget; work of a looser TPOT budget
  (batch) is packed onto decode "lanes" that interactive work keeps off, so a lane may run the
  bigger batches its budget allows. docs/gateway-routing.md.

Hooks the gateway calls on every router: ``route`` before proxying, ``prefilled`` when the
prefill instance has answered (optional), ``first_token`` when the decode instance's first token
arrives (optional but it is what lets a stalled transfer be seen before it ends), ``finished``
after. ``route`` may raise `Shed` (answer 503 + Retry-After).
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
    rails: tuple[str, ...] = ()
    """The NICs it moves KV over, one per rail, by their control-plane names, in rail order (a
    prefill instance's ``kv_transfer_params.remote_hosts`` order). Given on the prefill and the
    decode instances, the router chooses the rail of each transfer (KV placement); empty: the
    backend's connector chooses."""
    home_rail: int = 0  # a decode instance: the rail it pulls KV over unless the router moves it

    def __post_init__(self) -> None:
        object.__setattr__(self, "rails", tuple(self.rails))  # from JSON/YAML lists


@dataclass(frozen=True)
class Route:
    """Where one request goes, and why when that is not the default choice."""

    decode: Instance  # the instance that streams the tokens (the only one for unified serving)
    prefill: Instance | None = None  # disaggregated serving: where the prompt is prefilled
    reason: str = ""  # empty for the default choice; evidence in words otherwise
    evidence: dict[str, float] = field(default_factory=dict)
    kv_rail: int | None = None  # the rail the decode instance pulls the KV over (None: its connector's choice)


def route_label(route: Route) -> str:
    """``p0->d1``, ``p0->d1/r0`` with the KV placed on rail 0, or ``d1`` for unified serving: what
    the gateway sends back in ``x-seamguard-route`` so a caller can tell which path served it."""
    head = f"{route.prefill.name}->{route.decode.name}" if route.prefill else route.decode.name
    return head + ("" if route.kv_rail is None else f"/r{route.kv_rail}")


def place_kv(kv_transfer_params: dict, rail: int | None) -> dict:
    """The prefill's ``kv_transfer_params`` narrowed to one rail: ``remote_hosts`` (one address per
    rail) becomes that rail's address alone, also as ``remote_host``, so the decode instance pulls
    over it. Unchanged when rail is None or the prefill advertised no such rail."""
    hosts = kv_transfer_params.get("remote_hosts")
    if rail is None or not isinstance(hosts, list) or not 0 <= rail < len(hosts):
        return kv_transfer_params
    return {**kv_transfer_params, "remote_host": hosts[rail], "remote_hosts": [hosts[rail]]}


@dataclass(frozen=True)
class Outcome:
    """What the gateway measured for one routed request."""

    ok: bool
    ttft_s: float | None = None  # request received -> first token sent to the client
    tpot_s: float | None = None  # mean time per output token after the first
    decode_first_token_s: float | None = None  # decode request sent -> its first token (includes the KV transfer)
    output_tokens: int = 0
    cancelled: bool = False  # the gateway dropped it for a faster copy (a hedge): no evidence either way


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
    """The path's latency is this quantile of its window (the median plus its jitter), or its
    newest sample when that is higher: a path that just turned slow is judged on that sample at
    once instead of after a tenth of the window (as peak-EWMA balancers take a new high at once),
    and a sample back in line (the next use, or a batch probe) ends it."""
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
    batch_tpot_share: float = 0.8
    """A decode instance's batch is shrunk while its TPOT (the window's upper quantile) exceeds
    this share of the tightest TPOT budget: the gateway caps the requests it has in flight there
    (vLLM's max_num_seqs, applied from outside), lowering the cap by batch_cap_decrease once per
    window of samples and raising it by one per sample back under the target."""
    batch_cap_decrease: float = 0.75
    """Multiplicative decrease of a decode instance's cap (AIMD, as TCP and Envoy's adaptive
    concurrency do); the cap is lifted once it grows past the in-flight count it started from."""
    batch_cap_min: int = 2
    """The cap never goes below this many requests in flight per decode instance."""
    class_lanes: bool = True
    """Decode lanes per TPOT budget. A decode step is shared by every sequence in it, so a batch
    request next to interactive ones is held to the interactive TPOT. With this on, work of a class
    whose TPOT budget is looser than the tightest is packed onto the decode instances already
    holding the most of it (its lanes), work of the tightest class avoids the lanes while another
    decode instance can take it, and a lane's batch cap aims at the looser budget while it holds
    no tighter work. Off: every class is placed by load alone."""


@dataclass
class _Path:
    dft: deque = field(default_factory=deque)  # decode_first_token_s samples
    tft: deque = field(default_factory=deque)  # route -> first decode token (seconds, router clock)
    last_sample_t: float = -math.inf
    last_used_t: float = -math.inf
    good_probes: int = 0  # consecutive probes that came back in line with the peers
    lat: float = math.nan  # cached: the window's quantile (the path's latency)
    tft_med: float = math.nan  # cached: median route -> first token
    dft_med: float = math.nan  # cached: median decode request sent -> first token
    pending: dict = field(default_factory=dict)  # id(route) -> _Pending, routed and not finished


PathKey = tuple[str, str, "int | None"]  # (prefill, decode, rail); rail None: the connector's choice


@dataclass
class _Cap:
    """A decode instance's shrunk batch: at most `cap` requests in flight from this gateway."""

    cap: int
    origin: int  # in-flight count when it was first capped; the cap is lifted above it
    since: int = 0  # TPOT samples since the last decrease


@dataclass
class _Pending:
    path: PathKey
    request_class: str
    t0: float
    first_token_t: float | None = None
    probe: bool = False
    prefilled: bool = False  # the prefill instance answered: its GPU is done with this request
    prefilled_t: float | None = None  # ... when (router clock): the KV transfer starts then


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
    """Fabric-aware (prefill, decode, rail) choice per request; see the module docstring and
    docs/gateway-routing.md. Pure: clock injected, inputs fed by the gateway."""

    def __init__(self, instances: list[Instance], options: SeamguardOptions | None = None,
                 clock: Clock = time.monotonic) -> None:
        self._prefill, self._decode = _split(instances)
        self.options = options or SeamguardOptions()
        self._clock = clock
        self._inflight = _InFlight()
        self._paths: dict[PathKey, _Path] = {}
        self._fabric: dict[str, str] = {}
        self._load: dict[str, _Load] = {}
        self._itft: deque = deque(maxlen=max(4, 2 * self.options.window))  # recent interactive TTFTs
        self._batch_deferred: deque = deque(maxlen=20)  # recent batch route() calls: deferred or not
        self._tpot: dict[str, deque] = {}  # decode instance -> recent TPOT samples
        self._tpot_t: dict[str, float] = {}  # ... and when the last one came
        self._caps: dict[str, _Cap] = {}  # decode instance -> its shrunk batch
        self._in_prefill: dict[str, int] = {}  # prefill instance -> requests routed and not yet prefilled
        self._classes: dict[str, dict[str, int]] = {}  # decode instance -> request class -> routed, not finished
        self._sees_prefill = False  # the caller reports prefilled(): stalls are timed from the transfer's start
        self._turn = 0
        self.decisions: dict[str, int] = {}  # reason kind -> count (for /metrics)
        self.recent: deque = deque(maxlen=50)  # the latest departures from the default, newest last
        self._version = 0  # bumped by every new sample; keys the peers cache
        self._cache: tuple[int, dict] | None = None
        for p in self._prefill:
            for d in self._decode:
                if p.rails and d.rails and len(p.rails) != len(d.rails):
                    raise ValueError(f"routing: {p.name} has {len(p.rails)} rails and {d.name} {len(d.rails)}; "
                                     "give every instance the same rails or none")
        for d in self._decode:
            if d.rails and not 0 <= d.home_rail < len(d.rails):
                raise ValueError(f"routing: {d.name}.home_rail {d.home_rail} is not one of its {len(d.rails)} rails")

    # ---- paths --------------------------------------------------------------------------------
    @staticmethod
    def _rails(prefill: Instance, decode: Instance) -> list[int | None]:
        """The rails a transfer between the two can take; [None] when the router does not place KV."""
        n = len(prefill.rails) if prefill.rails and len(prefill.rails) == len(decode.rails) else 0
        return list(range(n)) if n >= 2 else [None]

    @staticmethod
    def _home(decode: Instance, rails: list[int | None]) -> int | None:
        return decode.home_rail if rails != [None] else None

    def _keys(self) -> list[tuple[Instance, Instance, int | None]]:
        return [(p, d, r) for p in self._prefill for d in self._decode for r in self._rails(p, d)]

    @staticmethod
    def label(key: PathKey) -> str:
        """``p0->d1`` or, with KV placement, ``p0->d1/r1`` (rail 1)."""
        return f"{key[0]}->{key[1]}" + ("" if key[2] is None else f"/r{key[2]}")

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

    def batch_cap(self, name: str) -> int | None:
        """The cap on requests in flight to decode instance `name` while its batch is shrunk."""
        c = self._caps.get(name)
        return c.cap if c else None

    def snapshot(self) -> dict:
        """What the router currently believes, for /metrics and the dashboard (plain data):
        per path (and rail) its latency quantile, median, samples, pending transfers and, per
        class, whether it is admissible and why not; per instance its load and batch cap;
        decision counts; the latest departures from the default with their evidence."""
        now, opts = self._clock(), self.options
        self._forget(now)
        paths = []
        for p, d, r in self._keys():
            key = (p.name, d.name, r)
            st = self._paths.get(key, _Path())
            why = {c: self._judge(p, d, r, c, b, now)[0] for c, b in opts.ttft_budget_s.items()}
            paths.append({"prefill": p.name, "decode": d.name, "rail": r, "home": r == self._home(d, [r]),
                          "latency_s": st.lat, "median_s": _median(list(st.dft)) if st.dft else math.nan,
                          "samples": len(st.dft), "pending": len(st.pending),
                          "admissible": {c: not w for c, w in why.items()}, "why": why})
        loads = {i.name: {"outstanding": self.outstanding(i.name),
                          "waiting": self._load.get(i.name, _Load()).waiting,
                          "kv_usage": self._load.get(i.name, _Load()).kv_usage,
                          "batch_cap": self.batch_cap(i.name),
                          **({"lane": int(self._is_lane(i.name))} if i in self._decode and self._prefill else {}),
                          **{f"{c}_in_flight": n for c, n in self._classes.get(i.name, {}).items()}}
                 for i in self._prefill + self._decode}
        return {"now": now, "paths": paths, "instances": loads, "fabric": dict(self._fabric),
                "decisions": dict(self.decisions), "recent": list(self.recent)}

    # ---- hooks --------------------------------------------------------------------------------
    def route(self, request_class: RequestClass, prompt_tokens: int) -> Route:
        if not self._prefill:  # unified serving: no transfer path, only instance load
            return self._route_unified(request_class)
        now = self._clock()
        self._turn += 1
        opts = self.options
        self._forget(now)
        budget = opts.ttft_budget_s.get(request_class, max(opts.ttft_budget_s.values()))
        keys = self._keys()
        judged = {(p.name, d.name, r): self._judge(p, d, r, request_class, budget, now) for p, d, r in keys}
        ok = [k for k, (why, _) in judged.items() if not why]
        ibudget = opts.ttft_budget_s.get("interactive", budget)
        ijudged = judged if request_class == "interactive" else {
            (p.name, d.name, r): self._judge(p, d, r, "interactive", ibudget, now) for p, d, r in keys}
        fine = {k for k, (why, _) in ijudged.items() if not why}
        out_for_interactive = len(fine) < len(judged)
        # a path out for interactive work but within a looser budget takes that work only when no
        # path fine for everyone can: its slow transfers hold KV on both ends (and, with some KV
        # connectors, stall the decode batch), so it is the last resort, not a free lane
        ok = [k for k in ok if k in fine] or ok
        placed = self._placed(ok)
        cands = self._lane_filter(placed, request_class, now) if opts.class_lanes else placed
        cands, capped = self._under_cap(cands, request_class)
        probe, lane = None, {}
        if request_class == "batch":
            probe = self._probe_candidate(judged, ijudged, now)
            if probe is None and cands and out_for_interactive:
                try:
                    self._defer_if_interactive_at_risk(budget)
                except Shed as e:
                    self._batch_deferred.append(True)
                    self._remember(request_class, None, "defer_batch", e.reason, e.evidence)
                    raise
            self._batch_deferred.append(False)
        if probe is not None:
            key, kind = probe, "probe"
        elif cands:
            key = self._least_loaded(cands, now, pack=opts.class_lanes and self._loose(request_class),
                                     request_class=request_class)
            kind = "kv_rail" if key[2] != self._home(self._inst(key[1]), [key[2]]) else ""
            lane = self._lane_note(key, placed, request_class, now) if opts.class_lanes else {}
            kind = kind or ("lane" if lane else "")
        elif request_class == "batch":
            self._shed_batch(judged, capped)
        else:  # interactive with nothing admissible: the least bad path, and say so
            key = min(judged, key=lambda k: (judged[k][1].get("severity", 0), judged[k][1].get("latency_s", 0.0),
                                             self.outstanding(k[1])))
            kind = "least_bad"
        prefill, decode = self._inst(key[0]), self._inst(key[1])
        reason, evidence = self._explain(kind, key, judged, request_class, capped, lane)
        r = Route(decode=decode, prefill=prefill, reason=reason, evidence=evidence, kv_rail=key[2])
        pend = _Pending(key, request_class, now, probe=kind == "probe")
        self._inflight.add(r, pend)
        self._in_prefill[key[0]] = self._in_prefill.get(key[0], 0) + 1
        on = self._classes.setdefault(key[1], {})
        on[request_class] = on.get(request_class, 0) + 1
        path = self._path(key)
        path.last_used_t = now
        path.pending[id(r)] = pend
        if reason:
            self._count(kind or ("batch_cap" if capped else "avoid"))
            self._remember(request_class, key, kind or ("batch_cap" if capped else "avoid"), reason, evidence)
        return r

    def prefilled(self, route: Route) -> None:
        """The prefill instance answered (its KV is held for the pull): from now on the request
        loads the KV path and the decode instance, not the prefill GPU. Optional for callers; a
        request never reported here counts on its prefill instance until it finishes."""
        pend = self._inflight.note(route)
        if isinstance(pend, _Pending) and not pend.prefilled:
            pend.prefilled, pend.prefilled_t = True, self._clock()
            self._in_prefill[pend.path[0]] -= 1
            self._sees_prefill = True

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
        if not pend.prefilled:
            self._in_prefill[pend.path[0]] -= 1
        self._classes[pend.path[1]][pend.request_class] -= 1
        self._path(pend.path).pending.pop(id(route), None)
        if outcome.cancelled:
            return
        now = self._clock()
        if pend.first_token_t is None:
            if outcome.decode_first_token_s is not None:
                self._sample(pend.path, outcome.decode_first_token_s, now - pend.t0, now, pend.probe)
            elif not outcome.ok:  # failed before any token: the time it took is the evidence
                self._sample(pend.path, now - pend.t0, now - pend.t0, now, pend.probe)
        if pend.request_class == "interactive" and outcome.ttft_s is not None:
            self._itft.append(outcome.ttft_s)
        if outcome.tpot_s is not None and outcome.output_tokens > 1:
            name = route.decode.name
            q = self._tpot.setdefault(name, deque(maxlen=self.options.window))
            if pend.probe and not self._slow_decode(name, "batch", now, {}, outcome.tpot_s):
                q.clear()  # a probe whose tokens came at the peers' pace: the instance is back
            q.append(outcome.tpot_s)
            self._tpot_t[name] = now
            self._version += 1
            self._adapt_cap(name, outcome.tpot_s, pend.request_class)

    # ---- hedging a stalled transfer ----------------------------------------------------------
    def stall_after_s(self, route: Route) -> float | None:
        """Seconds after its decode request was sent at which this request's own transfer counts
        as stalled (the rule `_judge` applies to pending transfers: stall_ratio x the peers'
        typical decode-first-token time, and budget_share of its class's TTFT budget beyond
        it), or None: not a disaggregated route, no budget for its class, no peers' history."""
        pend = self._inflight.note(route)
        budget = self.options.ttft_budget_s.get(pend.request_class) if isinstance(pend, _Pending) else None
        if budget is None or route.prefill is None:
            return None
        typical = self._peers(pend.path, "dft_med")
        if math.isnan(typical):
            return None
        return max(self.options.stall_ratio * typical, typical + self.options.budget_share * budget)

    def hedged(self, stalled: Route, hedge: Route, waited_s: float) -> None:
        """The gateway re-sent a stalled request along `hedge`: counted and explained."""
        pend = self._inflight.note(hedge)
        if not isinstance(pend, _Pending):
            return
        old = route_label(stalled)
        self._count("hedge")
        self._remember(pend.request_class, pend.path, "hedge", f"no first token over {old} after {waited_s:.3f}s: "
                       f"re-sent over {route_label(hedge)}, the first to answer is kept", {f"{old}.waited_s": waited_s})

    # ---- shrinking a decode instance's batch ------------------------------------------------
    def _adapt_cap(self, name: str, tpot_s: float, request_class: str) -> None:
        """AIMD on the requests in flight to one decode instance, from its TPOT: while the
        window's upper quantile and the latest sample are over the target, cut the cap (at most
        once per window of samples); each sample under the target raises it by one; past the
        in-flight count it started from, it is lifted. The target is batch_tpot_share of the
        tightest TPOT budget among the classes on the instance (`_tpot_target`)."""
        opts = self.options
        if not opts.tpot_budget_s:
            return
        target = opts.batch_tpot_share * self._tpot_target(name, request_class)
        q = _quantile(list(self._tpot[name]), opts.quantile)
        cur = self._caps.get(name)
        load = self.outstanding(name) + 1  # the request that just finished was in the batch
        if q > target and tpot_s > target:  # the window and the latest sample: slow now, not an old outlier
            if cur is None:
                cur = self._caps[name] = _Cap(cap=max(opts.batch_cap_min, math.floor(opts.batch_cap_decrease * load)),
                                              origin=max(load, opts.batch_cap_min))
            elif cur.since >= opts.window:
                cur.cap = max(opts.batch_cap_min, math.floor(opts.batch_cap_decrease * min(cur.cap, load)))
                cur.since = 0
            cur.since += 1
        elif cur is not None and tpot_s <= target:
            cur.cap += 1
            cur.since += 1
            if cur.cap > cur.origin:
                del self._caps[name]

    # ---- decode lanes per TPOT budget --------------------------------------------------------
    def _loose(self, request_class: str) -> bool:
        """The class's TPOT budget is looser than the tightest one (batch next to interactive)."""
        b = self.options.tpot_budget_s
        return request_class in b and b[request_class] > min(b.values())

    def _tpot_target(self, name: str, request_class: str) -> float:
        """The tightest TPOT budget among the classes in flight on decode instance `name` and
        `request_class` (a lane holding only batch work aims at batch's budget); without
        class_lanes, the tightest budget of all."""
        b = self.options.tpot_budget_s
        if not self.options.class_lanes:
            return min(b.values())
        on = {c for c, n in self._classes.get(name, {}).items() if n > 0} | {request_class}
        return min((b[c] for c in on if c in b), default=min(b.values()))

    def _is_lane(self, name: str) -> bool:
        """A decode instance whose work in flight is mostly of looser-TPOT classes."""
        on = self._classes.get(name, {})
        loose = sum(n for c, n in on.items() if self._loose(c))
        return loose > 0 and loose >= sum(n for c, n in on.items() if not self._loose(c))

    def _lane_filter(self, cands: list[PathKey], request_class: str, now: float) -> list[PathKey]:
        """Work of the tightest TPOT class keeps off lanes and off decode instances whose recent
        TPOT is over its budget, while another candidate is neither and has KV-cache room."""
        if self._loose(request_class) or request_class not in self.options.tpot_budget_s:
            return cands
        budget = self.options.tpot_budget_s[request_class]
        tpot = self._sorted()["tpot"]
        roomy = {k for k in cands if not self._kv_full(k[0], now) and not self._kv_full(k[1], now)}
        fit = [k for k in cands if tpot.get(k[1], 0.0) <= budget and k in roomy] or cands
        return [k for k in fit if not self._is_lane(k[1]) and k in roomy] or fit

    def _lane_note(self, key: PathKey, placed: list[PathKey], request_class: str, now: float) -> dict:
        """When the lanes sent the request to another decode instance than load alone would
        have: {"text": why, evidence...}; {} otherwise."""
        plain, _ = self._under_cap(placed, request_class)
        if not plain:
            return {}
        default = self._least_loaded(plain, now)[1]
        if default == key[1]:
            return {}
        on = self._classes.get(key[1] if self._loose(request_class) else default, {})
        mine = on.get(request_class, 0)
        loose = sum(n for c, n in on.items() if self._loose(c))
        if self._loose(request_class):
            return {"text": f"packed onto {key[1]}, the lane holding {mine} {request_class} requests "
                            f"(least loaded: {default})", f"{key[1]}.{request_class}_in_flight": float(mine)}
        tp = self._sorted()["tpot"].get(default)
        if tp is not None and tp > self.options.tpot_budget_s[request_class]:
            return {"text": f"kept off {default}: its TPOT p{round(100 * self.options.quantile)} {tp:.3f}s is over "
                            f"the {request_class} budget", f"{default}.decode_tpot_s": tp}
        return {"text": f"kept off lane {default} ({loose} looser-TPOT requests in flight)",
                f"{default}.lane_in_flight": float(loose)}

    def _under_cap(self, cands: list[PathKey], request_class: str) -> tuple[list[PathKey], dict[str, int]]:
        """Candidates whose decode instance is below its batch cap, and the caps that took some
        out. Interactive work that finds every candidate at its cap goes over it (least loaded)."""
        capped = {k[1]: c.cap for k in cands if (c := self._caps.get(k[1])) and self.outstanding(k[1]) >= c.cap}
        if not capped:
            return cands, {}
        room = [k for k in cands if k[1] not in capped]
        if room:
            return room, capped
        return ([] if request_class == "batch" else cands), capped

    # ---- KV placement -------------------------------------------------------------------------
    def _placed(self, ok: list[PathKey]) -> list[PathKey]:
        """One candidate per (prefill, decode) pair: its home rail when admissible, else the
        admissible rail with the fewest transfers pending, then the lowest latency."""
        by_pair: dict[tuple[str, str], list[PathKey]] = {}
        for k in ok:
            by_pair.setdefault((k[0], k[1]), []).append(k)
        out = []
        for (_, d), ks in by_pair.items():
            home = self._home(self._inst(d), [ks[0][2]])
            at_home = [k for k in ks if k[2] == home]
            out.append(at_home[0] if at_home else min(ks, key=lambda k: (
                len(self._path(k).pending), 0.0 if math.isnan(self._latency(k)) else self._latency(k))))
        return out

    def _inst(self, name: str) -> Instance:
        return next(i for i in self._prefill + self._decode if i.name == name)

    # ---- judgement ----------------------------------------------------------------------------
    def _path(self, key: PathKey) -> _Path:
        return self._paths.setdefault(key, _Path())

    def _sample(self, key: PathKey, dft: float, tft: float, now: float, probe: bool = False) -> None:
        p = self._path(key)
        if probe:  # two probes in a row in line with the peers: the path recovered, drop its old samples
            peer = self._peers(key, "lat")
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
        p.lat = max(_quantile(list(p.dft), self.options.quantile), p.dft[-1]) if p.dft else math.nan
        p.tft_med = _median(list(p.tft)) if p.tft else math.nan
        p.dft_med = _median(list(p.dft)) if p.dft else math.nan
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
                                           "dft_med": sorted(p.dft_med for p in have),
                                           "tpot": tpot, "tpot_sorted": sorted(tpot.values())})
        return self._cache[1]

    def _forget(self, now: float) -> None:
        """Drop evidence older than forget_after_s (paths, decode TPOT windows and batch caps)."""
        for p in self._paths.values():
            if p.dft and now - p.last_sample_t > self.options.forget_after_s:
                p.dft.clear()
                p.tft.clear()
                self._refresh(p)
        for name in [n for n, t in self._tpot_t.items() if now - t > self.options.forget_after_s]:
            self._tpot.pop(name, None)
            self._caps.pop(name, None)
            del self._tpot_t[name]
            self._version += 1

    def _latency(self, key: PathKey) -> float:
        d = self._paths.get(key)
        return d.lat if d else math.nan

    def _peers(self, key: PathKey, attr: str) -> float:
        """Median over the other paths of their `attr` ("lat", "tft_med" or "dft_med"); nan without data."""
        p = self._paths.get(key)
        return _median_without(self._sorted()[attr], getattr(p, attr) if p and p.dft else None)

    def _severity(self, prefill: Instance, decode: Instance, rail: int | None) -> tuple[int, str]:
        """The worst control-plane state on the NICs the transfer crosses: with KV placement the
        two ends of its rail, else each instance's `nic`."""
        worst, name = 0, ""
        for inst in (prefill, decode):
            mine = inst.rails[rail] if rail is not None else inst.nic
            if mine is None:
                continue
            for nic, state in self._fabric.items():
                # the NIC itself, its link to the leaf ("nic~leaf"), any NIC of a host named by
                # `mine` ("host/nic"), or the host `mine` is on ("host" for "host/nic")
                if nic == mine or nic.startswith((mine + "~", mine + "/")) or mine.startswith(nic + "/"):
                    sev = FABRIC_SEVERITY.get(state, 0)
                    if sev > worst:
                        worst, name = sev, f"{nic}={state}"
        return worst, name

    def _judge(self, prefill: Instance, decode: Instance, rail: int | None, request_class: str, budget: float,
               now: float) -> tuple[str, dict[str, float]]:
        """Why the path is not admissible for this class ("" when it is), and the evidence."""
        opts, key = self.options, (prefill.name, decode.name, rail)
        ev: dict[str, float] = {}
        sev, nic = self._severity(prefill, decode, rail)
        ev["severity"] = float(sev)
        if sev >= opts.fabric_block.get(request_class, 1):
            return f"control plane: {nic}", ev
        p = self._paths.get(key)
        why = self._slow_decode(decode.name, request_class, now, ev)
        if why:
            return why, ev
        lat, peer = self._latency(key), self._peers(key, "lat")
        ev.update(latency_s=lat, peers_latency_s=peer)
        if p and p.dft:
            ev["jitter_s"] = lat - _median(list(p.dft))
        if not math.isnan(lat) and not math.isnan(peer) and lat > opts.peer_ratio * peer \
                and lat - peer > opts.budget_share * budget:
            newest = p is not None and lat == p.dft[-1] > _quantile(list(p.dft), opts.quantile)
            which = "latest transfer" if newest else f"transfer p{round(100 * opts.quantile)}"
            return f"{which} {lat:.3f}s vs peers {peer:.3f}s", ev
        # a transfer still waiting for its first token: censored evidence, before it ends
        typical, ages = self._pending_ages(key, p, now)
        if ages and not math.isnan(typical):
            oldest = max(ages)
            ev.update(oldest_pending_s=oldest, peers_first_token_s=typical)
            if oldest > opts.stall_ratio * typical and oldest - typical > opts.budget_share * budget:
                return f"transfer pending {oldest:.3f}s vs peers' {typical:.3f}s to first token", ev
        if not math.isnan(lat) and not math.isnan(peer) and lat > opts.peer_ratio * peer:
            # slow, yet within this class's budget (batch): admissible while its queue fits the budget
            queued = (sum(1 for n in p.pending.values() if n.first_token_t is None) if p else 0) + 1
            ev["queued"] = float(queued)
            if lat * queued > budget:
                return f"slow path ({lat:.3f}s) x {queued} queued transfers exceeds the {budget:.1f}s budget", ev
        return "", ev

    def _pending_ages(self, key: PathKey, p: _Path | None, now: float) -> tuple[float, list[float]]:
        """The path's transfers still waiting for their first token, and the peers' typical time
        for that wait. When the caller reports prefilled(), from the transfer's start against the
        peers' decode_first_token_s (prefill queueing, which a burst or a busy host puts on every
        path, is left out); otherwise from routing against the peers' route->first-token time."""
        waiting = [n for n in p.pending.values() if n.first_token_t is None] if p else []
        if self._sees_prefill:
            return (self._peers(key, "dft_med"),
                    [now - n.prefilled_t for n in waiting if n.prefilled_t is not None])
        return self._peers(key, "tft_med"), [now - n.t0 for n in waiting]

    def _slow_decode(self, name: str, request_class: str, now: float, ev: dict[str, float],
                     sample: float | None = None) -> str:
        """A decode instance whose tokens come slower than its peers' by a share of the TPOT
        budget that matters (same ratio and share as for paths) and over this class's TPOT
        budget: out for this class. Within the budget it serves the class's SLO, whatever its
        peers do (a batch lane runs bigger, slower steps than its interactive peers by design).
        With `sample`, judge that one sample instead of the instance's window."""
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
        if q > opts.peer_ratio * peer and q - peer > opts.budget_share * budget and q > budget:
            return f"decode {name} TPOT p{round(100 * opts.quantile)} {q:.3f}s vs peers {peer:.3f}s"
        return ""

    def _probe_candidate(self, judged: dict, ijudged: dict, now: float) -> PathKey | None:
        """A path out by its own measurements (for batch, or for interactive work only: batch keeps
        off those while it can), idle and unsampled for probe_after_s: probe it with batch."""
        for key, (why, _) in judged.items():
            why = why or ijudged[key][0]
            if not why or why.startswith("control plane"):
                continue
            p = self._path(key)
            busy = bool(p.pending)
            if not busy and now - max(p.last_sample_t, p.last_used_t) >= self.options.probe_after_s:
                return key
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

    def _shed_batch(self, judged: dict, capped: dict[str, int]) -> None:
        opts = self.options
        if capped and any(not why for why, _ in judged.values()):
            self._count("defer_batch_cap")
            ev = {f"{d}.batch_cap": float(c) for d, c in capped.items()}
            reason = "batch deferred: every decode instance is at its shrunk batch cap (" + ", ".join(
                f"{d} {self.outstanding(d)}/{c}" for d, c in capped.items()) + ")"
            self._remember("batch", None, "defer_batch_cap", reason, ev)
            raise Shed(reason, opts.retry_after_s, ev)
        self._count("shed_no_path")
        reason = "no path admissible for batch: " + "; ".join(f"{self.label(k)}: {judged[k][0]}" for k in judged)
        ev = {f"{self.label(k)}.latency_s": e.get("latency_s", math.nan) for k, (_, e) in judged.items()}
        self._remember("batch", None, "shed_no_path", reason, ev)
        raise Shed(reason, opts.retry_after_s, ev)

    def _instance_load(self, name: str, now: float) -> float:
        """Requests on the instance's GPU or queued for it: a prefill instance's are those not yet
        prefilled (a request whose KV waits for its pull holds KV, counted in kv_usage, not the
        GPU); a decode instance's are all routed to it; plus the waiting it reports."""
        ld = self._load.get(name)
        fresh = ld is not None and now - ld.t <= self.options.load_stale_s
        busy = self._in_prefill[name] if name in self._in_prefill else self.outstanding(name)
        return busy + (ld.waiting if fresh else 0.0)  # type: ignore[union-attr]

    def _kv_full(self, name: str, now: float) -> bool:
        ld = self._load.get(name)
        return ld is not None and now - ld.t <= self.options.load_stale_s and ld.kv_usage >= self.options.kv_high

    def _least_loaded(self, keys: list[PathKey], now: float, pack: bool = False,
                      request_class: str = "") -> PathKey:
        """The least loaded pair (ties in turn); with `pack`, first the pair whose decode
        instance holds the most work of `request_class` (a looser-TPOT class fills its lanes)."""
        roomy = [k for k in keys if not self._kv_full(k[0], now) and not self._kv_full(k[1], now)]
        keys = roomy or keys
        score = {k: (-self._classes.get(k[1], {}).get(request_class, 0) if pack else 0,
                     self._instance_load(k[0], now) + self._instance_load(k[1], now)) for k in keys}
        low = min(score.values())
        tied = [k for k in keys if score[k] == low]
        return tied[self._turn % len(tied)]

    def _explain(self, kind: str, key: PathKey, judged: dict, request_class: str, capped: dict[str, int],
                 lane: dict | None = None) -> tuple[str, dict[str, float]]:
        """Reason and evidence when the choice departs from the default (every path admissible
        on its home rail, no decode instance at its batch cap, the least loaded pair)."""
        out = {k: why for k, (why, _) in judged.items() if why}
        if not out and not kind and not capped:
            return "", {}
        ev = {k: v for k, v in judged[key][1].items() if not (isinstance(v, float) and math.isnan(v))}
        ev.update({k: v for k, v in (lane or {}).items() if k != "text"})
        for k, why in out.items():
            for field_ in ("latency_s", "oldest_pending_s", "severity", "decode_tpot_s"):
                v = judged[k][1].get(field_)
                if v is not None and not math.isnan(v):
                    ev[f"{self.label(k)}.{field_}"] = v
        for d, c in capped.items():
            ev[f"{d}.batch_cap"] = float(c)
            ev[f"{d}.outstanding"] = float(self.outstanding(d))
            tp = self._sorted()["tpot"].get(d)
            if tp is not None:
                ev[f"{d}.decode_tpot_s"] = tp
        avoided = "; ".join(f"{self.label(k)} ({why})" for k, why in out.items() if k != key)
        head = {"probe": f"probe of {self.label(key)}, out of use ({out.get(key, '')})",
                "least_bad": f"no admissible path; least bad {self.label(key)}"}.get(
            kind, f"{request_class}: chose {self.label(key)}")
        if kind == "kv_rail":
            home = self._inst(key[1]).home_rail
            head += f", KV moved from rail {home} to rail {key[2]}"
            ev["kv_rail"], ev["home_rail"] = float(key[2]), float(home)  # type: ignore[arg-type]
        if lane:
            head += "; " + lane["text"]
        if capped:
            head += "; batch shrunk on " + ", ".join(f"{d} (cap {c})" for d, c in capped.items())
        return f"{head}; avoided {avoided}" if avoided else head, ev

    def _remember(self, request_class: str, key: PathKey | None, kind: str, reason: str,
                  evidence: dict[str, float]) -> None:
        self.recent.append({"t": self._clock(), "request_class": request_class, "kind": kind,
                            "path": self.label(key) if key else None, "reason": reason,
                            "evidence": {k: v for k, v in evidence.items() if not math.isnan(v)}})

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
# The first name an instance exports wins: vLLM (V1, then V0), SGLang, TGI (docs/gateway.md).
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """``waiting`` and ``kv_usage`` (0..1) from a vLLM-, SGLang- or TGI-style Prometheus
    exposition; a key is absent when the server does not export it (TGI has no KV-usage gauge).
    Several series (one per model, engine or rank) are summed for waiting and maxed for usage."""
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
