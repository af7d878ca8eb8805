"""The Prometheus source: PromQL over the HTTP API in, fleet-aligned Frames out.

The only place that does HTTP for telemetry. One adapter covers Prometheus, Thanos,
Mimir and VictoriaMetrics (same API under a base URL and path prefix, tenant header,
bearer token; sources in docs/sources.md §1). Series are mapped to entities with dict lookups
cached across ticks and written into numpy arrays, so a 10k-GPU tick costs little more
than the HTTP transfer. Counters stay raw (assess computes rates with resets).

Failures never take a tick down: a query that times out, answers 5xx/4xx, returns
non-JSON or ``status: error``, or carries NaN/Inf samples is logged, the signal is left
missing (NaN), and the Frame's ``flags`` says what failed. Entities that stop reporting
read as NaN: absence is a signal for assess, not a crash here.

Every answer is validated at the edge before anything is built from it (the schema
below: ``status``, ``data.resultType``, ``result[].metric`` an object whose mapped
labels are strings, ``value`` / ``values`` ``[timestamp, "value"]`` pairs). One bad
series or point is dropped and counted in ``flags``; the rest of the signal is kept.
Reading is bounded twice: an answer larger than ``max_response_bytes`` is cut off
while streaming (never buffered whole), and every query of one frame shares one
deadline (``deadline_s``), so a server that drip-feeds bytes under the per-read
timeout still cannot hold a tick past it. Flags say ``retryable`` (timeouts, 5xx,
429, the deadline) or ``permanent`` (4xx, garbage on 200, schema violations, too big).
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
from typing import Any, Literal

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seamguard.fleet.model import KIND_BY_LABEL, Fleet, Kind
from seamguard.observe.frame import Frame, make_frame
from seamguard.observe.prommap import EntityKey, Mapping
from seamguard.observe.signals import REGISTRY, signals_for
from seamguard.observe.unnamed import SeriesBlock, UnnamedConfig, block_from_columns, selector, unjudged

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
    deadline_s: float = Field(10.0, gt=0, description="overall bound on one frame's queries, retries and "
                                                      "body transfer included; keep it below tick_s")
    range_deadline_s: float = Field(300.0, gt=0, description="the same bound for one query_range block (replay)")
    max_response_bytes: int = Field(256 * 1024 * 1024, ge=1024,
                                    description="an answer larger than this is cut off while streaming and "
                                                "the signal flagged (lower range_chunk_steps for huge fleets)")
    mapping: Mapping = Field(default_factory=Mapping)
    unnamed: UnnamedConfig = Field(default_factory=UnnamedConfig,
                                   description="the series nobody named: one query per exporter (observe/unnamed.py)")

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


# ---- the edge schema: what a Prometheus API answer must look like ------------------------------
class _Data(BaseModel):
    model_config = ConfigDict(extra="ignore")

    resultType: Literal["vector", "matrix", "scalar", "string"]
    result: list[Any]  # each element checked by _vector / _matrix (a bad one is dropped, not fatal)


class PromAnswer(BaseModel):
    """The envelope of every /api/v1 answer (https://prometheus.io/docs/prometheus/latest/querying/api/).

    Series inside ``data.result`` are checked one by one while they are mapped: a
    vector sample is ``{"metric": {label: str}, "value": [ts, "v"]}``, a matrix series
    ``{"metric": {...}, "values": [[ts, "v"], ...]}``; ``ts`` is a number, ``v`` a
    string (or number) that parses as a float ("NaN", "+Inf" parse and are dropped).
    """

    model_config = ConfigDict(extra="ignore")

    status: Literal["success", "error"]
    data: _Data | None = None
    errorType: str | None = None
    error: str | None = None
    warnings: list[Any] = Field(default_factory=list)


class _Malformed(Exception):
    """One series that does not fit the schema: dropped and counted, never raised out."""


_NUM = (int, float)
_VAL = (str, int, float)


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
        """Entity index, -1 for a series of no entity in the fleet; raises _Malformed."""
        if type(metric) is not dict:
            raise _Malformed(f"metric is {type(metric).__name__}, not an object")
        name = None
        for lab in self.key.labels:
            name = metric.get(lab)
            if name is not None:
                break
        sub = metric.get(self.key.sub_label) if self.key.sub_label else None
        if (name is not None and type(name) is not str) or (sub is not None and type(sub) is not str):
            raise _Malformed("a mapped label is not a string")
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
        self.unnamed_queries = _unnamed_queries(cfg)
        for kind in {REGISTRY[s].kind for s in self.queries} | set(self.unnamed_queries):
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
    def _request(self, endpoint: str, params: dict[str, str], timing: IngestTiming, deadline: float,
                 expect: str) -> list:
        """One API call -> the ``data.result`` list; raises PromError.

        ``deadline`` (time.monotonic()) bounds the call, its retries and its backoff."""
        attempt = 0
        while True:
            try:
                return self._request_once(endpoint, params, timing, deadline, expect)
            except PromError as e:
                if not e.retryable or attempt >= self.cfg.retries:
                    raise
                attempt += 1
                pause = min(0.2 * 2 ** attempt, 1.0)
                if time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)

    def _read_body(self, endpoint: str, params: dict[str, str], deadline: float) -> tuple[int, bytes]:
        """POST and stream the answer, stopping at the deadline or past ``max_response_bytes``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PromError("tick deadline exceeded before the query was sent", True)
        limit = self.cfg.max_response_bytes
        timeout = httpx.Timeout(min(self.cfg.timeout_s, remaining),
                                connect=min(self.cfg.connect_timeout_s, remaining))
        try:
            with self._client.stream("POST", self.cfg.api(endpoint), data=params, timeout=timeout) as resp:
                declared = resp.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise PromError(f"HTTP {resp.status_code}, answer of {int(declared)} bytes is larger than "
                                    f"max_response_bytes ({limit}); not read", False)
                chunks: list[bytes] = []
                got = 0
                for chunk in resp.iter_bytes():
                    got += len(chunk)
                    if got > limit:
                        raise PromError(f"HTTP {resp.status_code}, answer larger than max_response_bytes "
                                        f"({limit}); stopped reading", False)
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise PromError(f"tick deadline exceeded while reading the answer ({got} bytes so far)",
                                        True)
                return resp.status_code, b"".join(chunks)
        except httpx.TimeoutException as e:
            raise PromError(f"timeout after {min(self.cfg.timeout_s, remaining):g}s ({type(e).__name__})",
                            True) from None
        except httpx.TransportError as e:
            raise PromError(f"transport error: {type(e).__name__}: {e}", True) from None

    def _request_once(self, endpoint: str, params: dict[str, str], timing: IngestTiming, deadline: float,
                      expect: str) -> list:
        t0 = time.perf_counter()
        try:
            status, body = self._read_body(endpoint, params, deadline)
        finally:
            timing.query_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        timing.bytes += len(body)
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            snippet = body[:120].decode("utf-8", "replace").replace("\n", " ")
            # A proxy's HTML error page on 5xx is worth retrying; garbage on 200 is not.
            raise PromError(f"HTTP {status}, body is not JSON: {snippet!r}", status >= 500) from None
        finally:
            timing.parse_s += time.perf_counter() - t1
        if not isinstance(doc, dict):
            raise PromError(f"HTTP {status}, unexpected JSON {type(doc).__name__}", status >= 500)
        retry_status = status >= 500 or status == 429
        try:
            ans = PromAnswer.model_validate(doc)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(top level)"
            raise PromError(f"HTTP {status}, answer does not fit the API schema: {where}: {first['msg']}",
                            retry_status) from None
        if status >= 400 or ans.status != "success":
            err = f"{ans.errorType or 'error'}: {ans.error or ''}".strip()
            retry = retry_status or ans.errorType in ("timeout", "unavailable")
            raise PromError(f"HTTP {status}, {err}", retry)
        for w in ans.warnings[:5]:
            log.warning("prometheus warning for %s: %.300s", params.get("query"), w)
        if ans.data is None:
            raise PromError(f"HTTP {status}, response has no data.result list", False)
        if ans.data.resultType != expect:
            raise PromError(f"HTTP {status}, resultType {ans.data.resultType!r}, expected {expect!r}", False)
        return ans.data.result

    @staticmethod
    def _failed(sig: str, e: PromError, what: str = "query") -> list[str]:
        kind = "retryable" if e.retryable else "permanent"
        log.error("prometheus %s for %s failed (%s): %s", what, sig, kind, e)
        return [f"prometheus:{sig}:{kind}: {e}"]

    @staticmethod
    def _internal(sig: str, e: Exception) -> list[str]:
        # A bug of ours on odd input: the signal is lost for this tick, never the loop.
        log.exception("prometheus %s: could not build the signal", sig)
        return [f"prometheus:{sig}:permanent: internal error on this answer ({type(e).__name__}: {e})"]

    # ---- instant: one Frame ------------------------------------------------------------------
    def frame_at(self, t_query: float | None = None, t_frame: float | None = None) -> Frame:
        """Evaluate every signal at ``t_query`` (Unix seconds; None = server now).

        ``t_frame`` stamps the Frame (defaults to ``t_query`` or the wall clock). Never
        raises on what the server answers, and returns within about ``deadline_s``.
        """
        t_wall = time.time()
        t_q = t_query if t_query is not None else t_wall
        timing = IngestTiming()
        params_t = {"time": f"{t_q:.3f}"}
        deadline = time.monotonic() + self.cfg.deadline_s

        def one(sig: str) -> tuple[str, np.ndarray | None, list[str], IngestTiming]:
            local = IngestTiming()
            try:
                result = self._request("query", {"query": self.queries[sig], **params_t}, local, deadline,
                                       "vector")
                t0 = time.perf_counter()
                arr, flags = self._vector(sig, result)
                local.build_s += time.perf_counter() - t0
                local.series += len(result)
                return sig, arr, flags, local
            except PromError as e:
                return sig, None, self._failed(sig, e), local
            except Exception as e:
                return sig, None, self._internal(sig, e), local

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
        series = self._unnamed_at(params_t, deadline, values, flags)
        timing.wall_s = time.perf_counter() - w0
        self.timing = timing
        return make_frame(self.fleet, t_frame if t_frame is not None else t_q, values, tuple(flags), series)

    def _vector(self, sig: str, result: list) -> tuple[np.ndarray, list[str]]:
        kind = REGISTRY[sig].kind
        n = self.fleet.count(kind)
        resolve = self._resolvers[kind]
        idx = np.empty(len(result), dtype=np.int64)
        raw: list[Any] = []
        flags: list[str] = []
        malformed = 0
        why = ""
        for j, s in enumerate(result):
            try:
                if type(s) is not dict:
                    raise _Malformed(f"sample is {type(s).__name__}, not an object")
                v = s.get("value")
                if type(v) is not list or len(v) != 2 or type(v[0]) not in _NUM or type(v[1]) not in _VAL:
                    raise _Malformed("value is not a [timestamp, \"value\"] pair")
                idx[j] = resolve(s.get("metric"))
                raw.append(v[1])
            except _Malformed as e:
                malformed += 1
                why = why or str(e)
                idx[j] = -2
                raw.append("nan")
        if malformed:
            flags.append(f"prometheus:{sig}:partial: {malformed} malformed series dropped ({why})")
            log.error("prometheus %s: %d malformed series dropped (%s)", sig, malformed, why)
        vals = _floats(raw)
        return self._place(sig, n, idx, vals, flags), flags

    @staticmethod
    def _place(sig: str, n: int, idx: np.ndarray, vals: np.ndarray, flags: list[str]) -> np.ndarray:
        out = np.full(n, np.nan)
        known = idx >= 0
        unknown = int((idx == -1).sum())
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
            extra = self._unnamed_range(t0, t1, step, k, flags)
            for i in range(k):
                vals = {sig: arr[i] for sig, arr in block.items()}
                series = tuple(self._block(kind, {nm: a[i] for nm, a in cols.items()}, vals)
                               for kind, cols in extra.items())
                yield make_frame(self.fleet, t0 + i * step, vals, tuple(flags), series)

    def range_series(self, query: str, start: float, end: float, step: float) -> list[tuple[dict, np.ndarray]]:
        """One PromQL range query as it is, not aligned to the fleet: (labels, (m, 2) array of
        [t, value]) per series; malformed series dropped. Bounded by ``range_deadline_s``;
        raises PromError. For readers of series no signal maps (live goodput)."""
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        result = self._request("query_range", params, IngestTiming(), time.monotonic() + self.cfg.range_deadline_s,
                               "matrix")
        return [(s["metric"], _points(s["values"])[0]) for s in result
                if type(s) is dict and type(s.get("metric")) is dict and type(s.get("values")) is list]

    def _range_block(self, t0: float, t1: float, step: float, k: int) -> tuple[dict[str, np.ndarray], list[str]]:
        params = {"start": f"{t0:.3f}", "end": f"{t1:.3f}", "step": f"{step:g}"}
        deadline = time.monotonic() + self.cfg.range_deadline_s

        def one(sig: str):
            local = IngestTiming()
            try:
                result = self._request("query_range", {"query": self.queries[sig], **params}, local, deadline,
                                       "matrix")
                return sig, self._matrix(sig, result, t0, step, k), []
            except PromError as e:
                return sig, None, self._failed(sig, e, "range query")
            except Exception as e:
                return sig, None, self._internal(sig, e)

        block: dict[str, np.ndarray] = {}
        flags: list[str] = []
        for sig, arr, fl in self._pool.map(one, list(self.queries)):
            if arr is not None:
                block[sig], more = arr
                flags.extend(more)
            flags.extend(fl)
        return block, flags

    def _matrix(self, sig: str, result: list, t0: float, step: float,
                k: int) -> tuple[np.ndarray, list[str]]:
        kind = REGISTRY[sig].kind
        n = self.fleet.count(kind)
        resolve = self._resolvers[kind]
        out = np.full((k, n), np.nan)
        flags: list[str] = []
        unknown = bad = malformed = 0
        why = ""
        for s in result:
            try:
                if type(s) is not dict:
                    raise _Malformed(f"series is {type(s).__name__}, not an object")
                pts = s.get("values")
                if type(pts) is not list:
                    raise _Malformed("values is not a list")
                i = resolve(s.get("metric"))
            except _Malformed as e:
                malformed += 1
                why = why or str(e)
                continue
            if i < 0:
                unknown += 1
                continue
            a, dropped = _points(pts)
            if dropped:
                malformed += dropped
                why = why or "a point is not a [timestamp, \"value\"] pair"
            if not a.shape[0]:
                continue
            ts = a[:, 0]
            v = a[:, 1]
            okt = np.isfinite(ts)
            rows = np.full(ts.shape, -1, dtype=np.int64)
            rows[okt] = np.rint((ts[okt] - t0) / step).astype(np.int64)
            fin = np.isfinite(v) & (rows >= 0) & (rows < k)
            bad += int((~np.isfinite(v)).sum())
            out[rows[fin], i] = v[fin]
        if unknown:
            flags.append(f"prometheus:{sig}:partial: {unknown} series for entities not in the fleet")
        if malformed:
            flags.append(f"prometheus:{sig}:partial: {malformed} malformed series/points dropped ({why})")
            log.error("prometheus %s: %d malformed range series/points dropped (%s)", sig, malformed, why)
        if bad:
            flags.append(f"prometheus:{sig}:partial: {bad} NaN/Inf/malformed samples dropped")
            log.error("prometheus %s: %d NaN/Inf/malformed range samples treated as missing", sig, bad)
        return out, flags


    # ---- series nobody named (observe/unnamed.py) ----------------------------------------------
    def _block(self, kind: Kind, cols: dict[str, np.ndarray], values: dict[str, np.ndarray]) -> SeriesBlock:
        """A kind's block: the exporter's other series plus the named measurements of that kind that
        no channel judges (observe/unnamed.py :func:`unjudged`) this frame has."""
        named = {s.name: values[s.name] for s in unjudged(kind) if s.name in values}
        counters = frozenset(s.name for s in unjudged(kind) if s.counter)
        return block_from_columns(kind, self.fleet.count(kind), {**cols, **named}, self.cfg.unnamed, counters)

    def _unnamed_at(self, params_t: dict[str, str], deadline: float, values: dict[str, np.ndarray],
                    flags: list[str]) -> tuple[SeriesBlock, ...]:
        def one(kind: Kind):
            try:
                result = self._request("query", {"query": self.unnamed_queries[kind], **params_t}, IngestTiming(),
                                       deadline, "vector")
                rows = [(s.get("metric"), [s.get("value")]) for s in result if type(s) is dict]
                return kind, self._columns(kind, rows, None, 0.0, 1), []
            except PromError as e:
                return kind, None, self._failed(f"unnamed:{kind.label}", e)
            except Exception as e:
                return kind, None, self._internal(f"unnamed:{kind.label}", e)
        out = []
        for kind, cols, fl in self._pool.map(one, list(self.unnamed_queries)):
            flags.extend(fl)
            if cols is not None:
                out.append(self._block(kind, {nm: a[0] for nm, a in cols.items()}, values))
        return tuple(out)

    def _unnamed_range(self, t0: float, t1: float, step: float, k: int, flags: list[str]):
        params = {"start": f"{t0:.3f}", "end": f"{t1:.3f}", "step": f"{step:g}"}
        deadline = time.monotonic() + self.cfg.range_deadline_s

        def one(kind: Kind):
            try:
                result = self._request("query_range", {"query": self.unnamed_queries[kind], **params},
                                       IngestTiming(), deadline, "matrix")
                rows = [(s.get("metric"), s.get("values")) for s in result if type(s) is dict]
                return kind, self._columns(kind, rows, t0, step, k), []
            except PromError as e:
                return kind, None, self._failed(f"unnamed:{kind.label}", e, "range query")
            except Exception as e:
                return kind, None, self._internal(f"unnamed:{kind.label}", e)
        out: dict[Kind, dict[str, np.ndarray]] = {}
        for kind, cols, fl in self._pool.map(one, list(self.unnamed_queries)):
            flags.extend(fl)
            if cols is not None:
                out[kind] = cols
        return out

    def _columns(self, kind: Kind, rows: list, t0: float | None, step: float, k: int) -> dict[str, np.ndarray]:
        """``(labels, points)`` of one exporter's series -> {name: [k, entities]}; series of no entity,
        malformed ones and names the config drops are skipped. ``t0`` None: one instant sample."""
        resolve, n, keep = self._resolvers[kind], self.fleet.count(kind), self.cfg.unnamed.keeps
        out: dict[str, np.ndarray] = {}
        for metric, pts in rows:
            try:
                i = resolve(metric)
            except _Malformed:
                continue
            name = metric.get("__name__")
            if i < 0 or type(name) is not str or type(pts) is not list or not keep(name):
                continue
            col = out.get(name)
            if col is None:
                if len(out) >= 4 * self.cfg.unnamed.max_series:
                    continue  # an exporter far past the cap: the rest is not parsed
                col = out[name] = np.full((k, n), np.nan)
            a, _ = _points(pts)
            if not a.shape[0]:
                continue
            r = np.zeros(a.shape[0], dtype=np.int64) if t0 is None else np.rint((a[:, 0] - t0) / step).astype(np.int64)
            ok = np.isfinite(a[:, 1]) & (r >= 0) & (r < k)
            col[r[ok], i] = a[ok, 1]
        return out


def _unnamed_queries(cfg: PromConfig) -> dict[Kind, str]:
    """One selector per exporter whose series nobody named are judged (none when disabled)."""
    if not cfg.unnamed.enabled:
        return {}
    out = {}
    for label, name_re in sorted(cfg.unnamed.exporters.items()):
        kind = KIND_BY_LABEL[label]
        out[kind] = selector(name_re, cfg.mapping.key_for(kind).sub_label, [s.name for s in signals_for(kind)],
                             cfg.mapping.selector)
    return out


def _points(pts: list) -> tuple[np.ndarray, int]:
    """``[[ts, "v"], ...]`` -> (m, 2) float array and how many points were not pairs (dropped)."""
    try:
        a = np.array(pts, dtype=float)
        if a.ndim == 2 and a.shape[1] == 2:
            return a, 0
        if a.size == 0:
            return np.empty((0, 2)), 0
    except (TypeError, ValueError):
        pass
    good: list[tuple[float, float]] = []
    dropped = 0
    for p in pts:
        if type(p) is list and len(p) == 2 and type(p[0]) in _NUM and type(p[1]) in _VAL:
            good.append((float(p[0]), _float(p[1])))
        else:
            dropped += 1
    return (np.array(good, dtype=float).reshape(-1, 2), dropped)


def _float(s: object) -> float:
    if type(s) not in _VAL:
        return math.nan
    try:
        return float(s)  # type: ignore[arg-type]  # Prometheus writes "NaN", "+Inf", "-Inf"; float() reads them
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _floats(raw: list) -> np.ndarray:
    try:
        return np.array(raw, dtype=float)
    except (TypeError, ValueError, OverflowError):
        return np.array([_float(x) for x in raw], dtype=float)
