"""The Prometheus source: PromQL over the HTTP API in, fleet-aligned Frames out.

The only place that does HTTP for telemetry. One adapter covers Prometheus, Thanos,
Mimir and VictoriaMetrics (same API under a base URL and path prefix, tenant header,
bearer token; REFERENCE.md section 1). Series are mapped to entities with dict lookups
cached across ticks and written into numpy arrays, so a 10k-GPU tick costs little more
than the HTTP transfer. Counters stay raw (assess computes rates with resets).

Failures never take a tick down: a query that times out, answers 5xx/4xx, returns
non-JSON or ``status: error``, or carries NaN/Inf samples is logged, the signal is left
missing (NaN), and the Frame's ``flags`` says what failed. Entities that stop reporting
read as NaN: absence is a signal for assess, not a crash here.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seamguard.fleet.model import Fleet, Kind
from seamguard.observe.frame import Frame, make_frame
from seamguard.observe.prommap import EntityKey, Mapping
from seamguard.observe.signals import REGISTRY

log = logging.getLogger("seamguard.observe.prometheus")

# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS_PER_SERIES = 11_000


class PromConfig(BaseModel):
    """Where and how to query (the `prometheus:` section of a run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="base URL, e.g. http://prometheus:9090")
    path_prefix: str = Field("", description="'/prometheus' for Mimir, '/select/<tenant>/prometheus' for "
                                             "VictoriaMetrics cluster")
    tenant: str | None = Field(None, description="X-Scope-OrgID header (Mimir, Cortex, Thanos receive)")
    bearer_token: str | None = Field(None, description="Authorization: Bearer <token>")
    bearer_token_file: Path | None = Field(None, description="read the token from this file at start")
    timeout_s: float = Field(10.0, gt=0, description="read timeout of one query")
    connect_timeout_s: float = Field(3.0, gt=0)
    retries: int = Field(1, ge=0, le=5, description="retries of a retryable failure within one tick")
    max_concurrency: int = Field(2, ge=1, le=64, description="queries in flight at once")
    verify_tls: bool = True
    compression: bool = Field(False, description="ask for gzip: worth it only over slow links; on a LAN or loopback "
                                                 "compressing ~20 MB of JSON per tick costs seconds of CPU on both sides")
    range_chunk_steps: int = Field(360, ge=1, le=MAX_POINTS_PER_SERIES,
                                   description="steps per query_range request (batched history fetch)")
    mapping: Mapping = Field(default_factory=Mapping)

    @model_validator(mode="after")
    def _check(self) -> PromConfig:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.path_prefix and not self.path_prefix.startswith("/"):
            raise ValueError(f"path_prefix must start with '/', got {self.path_prefix!r}")
        return self

    def api(self, endpoint: str) -> str:
        return self.url.rstrip("/") + self.path_prefix.rstrip("/") + "/api/v1/" + endpoint

    def headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if not self.compression:
            h["Accept-Encoding"] = "identity"
        if self.tenant:
            h["X-Scope-OrgID"] = self.tenant
        token = self.bearer_token
        if token is None and self.bearer_token_file is not None:
            token = self.bearer_token_file.read_text().strip()
        if token:
            h["Authorization"] = f"Bearer {token}"
        return h


class PromError(Exception):
    """A query that failed; ``retryable`` says whether asking again may help."""

    def __init__(self, msg: str, retryable: bool) -> None:
        super().__init__(msg)
        self.retryable = retryable


@dataclass
class IngestTiming:
    """Seconds spent per step of the last fetch, summed over queries (threads overlap)."""

    query_s: float = 0.0  # HTTP round trip and body transfer
    parse_s: float = 0.0  # JSON decode
    build_s: float = 0.0  # series -> entity index -> arrays
    wall_s: float = 0.0
    series: int = 0
    bytes: int = 0


@dataclass
class _Resolver:
    """Series labels -> entity index, cached by the raw label values (bounded by series)."""

    key: EntityKey
    index: dict[str, int]
    cache: dict[tuple[str | None, str | None], int] = field(default_factory=dict)

    def __call__(self, metric: dict[str, str]) -> int:
        name = None
        for lab in self.key.labels:
            name = metric.get(lab)
            if name is not None:
                break
        sub = metric.get(self.key.sub_label) if self.key.sub_label else None
        k = (name, sub)
        i = self.cache.get(k)
        if i is None:
            if name is None or (self.key.sub_label and sub is None):
                i = -1
            else:
                i = self.index.get(self.key.entity_name(name, sub), -1)
            self.cache[k] = i
        return i


class PrometheusSource:
    """Frames from a Prometheus-compatible HTTP API, aligned to ``fleet``."""

    def __init__(self, fleet: Fleet, cfg: PromConfig, client: httpx.Client | None = None) -> None:
        self.fleet = fleet
        self.cfg = cfg
        self.queries = cfg.mapping.queries()
        self._client = client or httpx.Client(
            headers=cfg.headers(), verify=cfg.verify_tls,
            timeout=httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s))
        self._owns_client = client is None
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_concurrency, thread_name_prefix="promq")
        self._resolvers: dict[Kind, _Resolver] = {}
        for kind in {REGISTRY[s].kind for s in self.queries}:
            idx = {n: i for i, n in enumerate(fleet.names(kind))}
            self._resolvers[kind] = _Resolver(cfg.mapping.key_for(kind), idx)
        self.timing = IngestTiming()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- HTTP ----------------------------------------------------------------------------
    def _request(self, endpoint: str, params: dict[str, str], timing: IngestTiming) -> list[dict]:
        """One API call -> the ``data.result`` list; raises PromError."""
        attempt = 0
        while True:
            try:
                return self._request_once(endpoint, params, timing)
            except PromError as e:
                if not e.retryable or attempt >= self.cfg.retries:
                    raise
                attempt += 1
                time.sleep(min(0.2 * 2 ** attempt, 1.0))

    def _request_once(self, endpoint: str, params: dict[str, str], timing: IngestTiming) -> list[dict]:
        t0 = time.perf_counter()
        try:
            resp = self._client.post(self.cfg.api(endpoint), data=params)
            body = resp.content
        except httpx.TimeoutException as e:
            raise PromError(f"timeout after {self.cfg.timeout_s:g}s ({type(e).__name__})", True) from None
        except httpx.TransportError as e:
            raise PromError(f"transport error: {type(e).__name__}: {e}", True) from None
        t1 = time.perf_counter()
        timing.query_s += t1 - t0
        timing.bytes += len(body)
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            snippet = body[:120].decode("utf-8", "replace").replace("\n", " ")
            # A proxy's HTML error page on 5xx is worth retrying; garbage on 200 is not.
            raise PromError(f"HTTP {resp.status_code}, body is not JSON: {snippet!r}",
                            resp.status_code >= 500) from None
        finally:
            timing.parse_s += time.perf_counter() - t1
        if not isinstance(doc, dict):
            raise PromError(f"HTTP {resp.status_code}, unexpected JSON {type(doc).__name__}", False)
        if resp.status_code >= 400 or doc.get("status") != "success":
            err = f"{doc.get('errorType', 'error')}: {doc.get('error', '')}".strip()
            retry = resp.status_code >= 500 or resp.status_code == 429 or doc.get("errorType") in ("timeout",
                                                                                                  "unavailable")
            raise PromError(f"HTTP {resp.status_code}, {err}", retry)
        for w in doc.get("warnings") or []:
            log.warning("prometheus warning for %s: %s", params.get("query"), w)
        data = doc.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise PromError(f"HTTP {resp.status_code}, response has no data.result list", False)
        return data["result"]

    # ---- instant: one Frame ------------------------------------------------------------------
    def frame_at(self, t_query: float | None = None, t_frame: float | None = None) -> Frame:
        """Evaluate every signal at ``t_query`` (Unix seconds; None = server now).

        ``t_frame`` stamps the Frame (defaults to ``t_query`` or the wall clock).
        """
        t_wall = time.time()
        t_q = t_query if t_query is not None else t_wall
        timing = IngestTiming()
        params_t = {"time": f"{t_q:.3f}"}

        def one(sig: str) -> tuple[str, np.ndarray | None, list[str], IngestTiming]:
            local = IngestTiming()
            try:
                result = self._request("query", {"query": self.queries[sig], **params_t}, local)
            except PromError as e:
                log.error("prometheus query for %s failed (%s): %s",
                          sig, "retryable" if e.retryable else "permanent", e)
                return sig, None, [f"prometheus:{sig}:{'retryable' if e.retryable else 'permanent'}: {e}"], local
            t0 = time.perf_counter()
            arr, flags = self._vector(sig, result)
            local.build_s += time.perf_counter() - t0
            local.series += len(result)
            return sig, arr, flags, local

        values: dict[str, np.ndarray] = {}
        flags: list[str] = []
        w0 = time.perf_counter()
        for sig, arr, fl, local in self._pool.map(one, list(self.queries)):
            if arr is not None:
                values[sig] = arr
            flags.extend(fl)
            timing.query_s += local.query_s
            timing.parse_s += local.parse_s
            timing.build_s += local.build_s
            timing.series += local.series
            timing.bytes += local.bytes
        timing.wall_s = time.perf_counter() - w0
        self.timing = timing
        return make_frame(self.fleet, t_frame if t_frame is not None else t_q, values, tuple(flags))

    def _vector(self, sig: str, result: list[dict]) -> tuple[np.ndarray, list[str]]:
        kind = REGISTRY[sig].kind
        n = self.fleet.count(kind)
        resolve = self._resolvers[kind]
        idx = np.empty(len(result), dtype=np.int64)
        raw: list[str] = []
        flags: list[str] = []
        try:
            for j, s in enumerate(result):
                idx[j] = resolve(s["metric"])
                raw.append(s["value"][1])
        except (KeyError, IndexError, TypeError) as e:
            log.error("prometheus result for %s is malformed: %s", sig, e)
            return np.full(n, np.nan), [f"prometheus:{sig}:permanent: malformed vector sample ({e})"]
        vals = _floats(raw)
        return self._place(sig, n, idx, vals, flags), flags

    @staticmethod
    def _place(sig: str, n: int, idx: np.ndarray, vals: np.ndarray, flags: list[str]) -> np.ndarray:
        out = np.full(n, np.nan)
        known = idx >= 0
        unknown = int((~known).sum())
        if unknown:
            flags.append(f"prometheus:{sig}:partial: {unknown} series for entities not in the fleet")
        bad = ~np.isfinite(vals) & known
        if bad.any():
            flags.append(f"prometheus:{sig}:partial: {int(bad.sum())} NaN/Inf/unparsable samples dropped")
            log.error("prometheus %s: %d NaN/Inf/unparsable samples treated as missing", sig, int(bad.sum()))
        ok = known & ~bad
        sel = idx[ok]
        if sel.size and np.unique(sel).size != sel.size:
            flags.append(f"prometheus:{sig}:partial: {sel.size - np.unique(sel).size} duplicate series "
                         "(last wins); check the mapping labels")
        out[sel] = vals[ok]
        return out

    # ---- range: many Frames -----------------------------------------------------------------
    def frames(self, start: float, end: float, step: float) -> Iterator[Frame]:
        """Frames at start, start+step, ... <= end, from batched query_range calls."""
        if step <= 0 or end < start:
            raise ValueError(f"need step > 0 and end >= start, got start={start} end={end} step={step}")
        n_steps = int(math.floor((end - start) / step + 1e-9)) + 1
        chunk = self.cfg.range_chunk_steps
        for c0 in range(0, n_steps, chunk):
            k = min(chunk, n_steps - c0)
            t0 = start + c0 * step
            t1 = t0 + (k - 1) * step
            block, flags = self._range_block(t0, t1, step, k)
            for i in range(k):
                vals = {sig: arr[i] for sig, arr in block.items()}
                yield make_frame(self.fleet, t0 + i * step, vals, tuple(flags))

    def _range_block(self, t0: float, t1: float, step: float, k: int) -> tuple[dict[str, np.ndarray], list[str]]:
        params = {"start": f"{t0:.3f}", "end": f"{t1:.3f}", "step": f"{step:g}"}

        def one(sig: str):
            local = IngestTiming()
            try:
                result = self._request("query_range", {"query": self.queries[sig], **params}, local)
            except PromError as e:
                log.error("prometheus range query for %s failed (%s): %s",
                          sig, "retryable" if e.retryable else "permanent", e)
                return sig, None, [f"prometheus:{sig}:{'retryable' if e.retryable else 'permanent'}: {e}"]
            return sig, self._matrix(sig, result, t0, step, k), []

        block: dict[str, np.ndarray] = {}
        flags: list[str] = []
        for sig, arr, fl in self._pool.map(one, list(self.queries)):
            if arr is not None:
                block[sig], more = arr
                flags.extend(more)
            flags.extend(fl)
        return block, flags

    def _matrix(self, sig: str, result: list[dict], t0: float, step: float,
                k: int) -> tuple[np.ndarray, list[str]]:
        kind = REGISTRY[sig].kind
        n = self.fleet.count(kind)
        resolve = self._resolvers[kind]
        out = np.full((k, n), np.nan)
        flags: list[str] = []
        unknown = bad = 0
        for s in result:
            try:
                i = resolve(s["metric"])
                pts = s["values"]
            except (KeyError, TypeError):
                bad += 1
                continue
            if i < 0:
                unknown += 1
                continue
            try:
                a = np.array(pts, dtype=float).reshape(-1, 2)
            except ValueError:
                a = np.array([(float(p[0]), _float(p[1])) for p in pts], dtype=float).reshape(-1, 2)
            rows = np.rint((a[:, 0] - t0) / step).astype(np.int64)
            v = a[:, 1]
            fin = np.isfinite(v) & (rows >= 0) & (rows < k)
            bad += int((~np.isfinite(v)).sum())
            out[rows[fin], i] = v[fin]
        if unknown:
            flags.append(f"prometheus:{sig}:partial: {unknown} series for entities not in the fleet")
        if bad:
            flags.append(f"prometheus:{sig}:partial: {bad} NaN/Inf/malformed samples dropped")
            log.error("prometheus %s: %d NaN/Inf/malformed range samples treated as missing", sig, bad)
        return out, flags


def _float(s: object) -> float:
    try:
        return float(s)  # Prometheus writes "NaN", "+Inf", "-Inf" as strings; float() reads them
    except (TypeError, ValueError):
        return math.nan


def _floats(raw: list[str]) -> np.ndarray:
    try:
        return np.array(raw, dtype=float)
    except (TypeError, ValueError):
        return np.array([_float(x) for x in raw], dtype=float)
