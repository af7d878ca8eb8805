"""The gateway's Prometheus instruments, in a registry of its own (never the global one).

`GatewayMetrics` is written by the request path and the gatekeeper and rendered by
``GET /metrics``; two gateways in one process (tests, benchmarks) keep separate counts.
Label values are names from the config (tenants, keys, instances), so cardinality is what
the operator configured.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

KEY_STATES = ("ok", "throttled", "suspended")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RouterCollector(Collector):
    """A router's own view (`snapshot()`, when it has one) rendered at scrape time: per path (and
    rail, with KV placement) its transfer latency, samples, pending transfers and admissibility per
    request class; per instance its load and batch cap; decision counts by reason kind."""

    def __init__(self, router: object) -> None:
        self.router = router

    def collect(self) -> Iterator:
        snap = getattr(self.router, "snapshot", None)
        if snap is None:
            return
        s = snap()
        p = "seamguard_gateway_route_"
        who_l = ["prefill", "decode", "rail"]  # rail "": the connector chooses (no KV placement)
        lat = GaugeMetricFamily(p + "path_latency_seconds", "Transfer latency quantile per prefill->decode path",
                                labels=who_l)
        n = GaugeMetricFamily(p + "path_samples", "Transfer samples held per path", labels=who_l)
        pend = GaugeMetricFamily(p + "path_pending", "Transfers in flight per path", labels=who_l)
        adm = GaugeMetricFamily(p + "path_admissible", "1 when the path may take this request class",
                                labels=[*who_l, "request_class"])
        for path in s.get("paths", ()):
            rail = path.get("rail")
            who = [path["prefill"], path["decode"], "" if rail is None else str(rail)]
            if isinstance(path.get("latency_s"), float) and math.isfinite(path["latency_s"]):
                lat.add_metric(who, path["latency_s"])
            n.add_metric(who, float(path.get("samples", 0)))
            pend.add_metric(who, float(path.get("pending", 0)))
            for klass, ok in (path.get("admissible") or {}).items():
                adm.add_metric([*who, klass], 1.0 if ok else 0.0)
        load = GaugeMetricFamily(p + "instance_load", "What the router knows of an instance's load "
                                 "(outstanding, waiting, kv_usage; batch_cap while its batch is shrunk)",
                                 labels=["instance", "kind"])
        for name, d in (s.get("instances") or {}).items():
            for kind, v in d.items():
                if isinstance(v, int | float) and math.isfinite(v):
                    load.add_metric([name, kind], float(v))
        dec = CounterMetricFamily(p + "decisions", "Routing decisions by reason kind", labels=["kind"])
        for kind, c in (s.get("decisions") or {}).items():
            dec.add_metric([kind], float(c))
        yield from (lat, n, pend, adm, load, dec)


class GatewayMetrics:
    def __init__(self, router: object | None = None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "seamguard_gateway_"
        self.requests = Counter(p + "requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.tokens = Counter(p + "tokens", "Tokens served (from usage), by tenant, key and kind",
                              ["tenant", "key", "kind"], registry=r)
        self.refused = Counter(p + "admission_refused", "Requests refused at admission, by reason",
                               ["tenant", "key", "reason"], registry=r)
        self.key_state = Gauge(p + "key_state", "1 for the state each key is in", ["key", "state"], registry=r)
        self.key_steps = Counter(p + "key_state_changes", "Key state changes (detector or operator)",
                                 ["key", "to", "actor"], registry=r)
        self.key_state_downgrades = Counter(
            p + "key_state_downgrades", "A laxer key state in the shared store (Redis) that this replica's durable "
            "record does not explain, overruled (the stricter state kept); alert on any increase",
            ["key", "seen", "kept"], registry=r)
        self.throttle_tpm = Gauge(p + "key_throttle_tpm", "TPM cap of a throttled key (0: not throttled)",
                                  ["key"], registry=r)
        self.ttft = Histogram(p + "ttft_seconds", "Request received -> first token sent (streams)",
                              ["decode"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(p + "tpot_seconds", "Mean time per output token after the first (streams)",
                              ["decode"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
                              registry=r)
        self.decode_first = Histogram(p + "decode_first_token_seconds",
                                      "Decode request sent -> its first token (includes the KV transfer)",
                                      ["prefill", "decode"], buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_errors = Counter(p + "upstream_errors", "Backend failures by instance and kind",
                                       ["instance", "kind"], registry=r)
        self.store_errors = Counter(p + "store_errors", "Budget store failures (admission answers 503)",
                                    ["op"], registry=r)
        self.shed = Counter(p + "router_shed", "Requests the router deferred (503 + Retry-After)",
                            ["request_class"], registry=r)
        self.outstanding = Gauge(p + "outstanding", "Requests in flight per instance", ["instance"], registry=r)
        self.routes = Counter(p + "routes", "Routing decisions; rail: where the KV transfer was placed (\"\": the "
                              "connector's choice); departed=1 when the router left its default",
                              ["prefill", "decode", "rail", "departed"], registry=r)
        if router is not None:
            r.register(RouterCollector(router))

    def set_key_state(self, key: str, state: str, throttle_tpm: int | None) -> None:
        for s in KEY_STATES:
            self.key_state.labels(key, s).set(1.0 if s == state else 0.0)
        self.throttle_tpm.labels(key).set(float(throttle_tpm or 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
