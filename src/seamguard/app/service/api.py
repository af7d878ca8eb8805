"""The HTTP API, `/metrics`, `/healthz` and the dashboard's static files (FastAPI).

Handlers are thin: take the current Snapshot from the runner, hand it to a renderer in
`render.py`, return a typed model. Mutating calls (mode, breaker reset, pins) need a
bearer token and run on the controller thread through `Runner.submit`, recorded under the
token's name. Every request must name this service in `Host` (``access.py``: DNS
rebinding). Every error is a 4xx/503 with a `detail` that says what was wrong.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from importlib import resources
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from seamguard.assess.states import STATE_BY_LABEL
from seamguard.fleet.model import KIND_BY_LABEL, Kind
from seamguard.ledger import open_reader
from seamguard.app.service import models as m
from seamguard.app.service import render, timerange
from seamguard.app.service.goodput import GoodputCollector, GoodputService
from seamguard.app.service.goodput import router as goodput_router
from seamguard.app.service.whatif import WhatIfService
from seamguard.app.service.whatif import router as whatif_router
from seamguard.app.service.access import UNNAMED, HostRule, allowed_hosts, host_allowed, token_owner
from seamguard.app.service.metrics import make_registry
from seamguard.app.service.metrics import render as render_metrics
from seamguard.app.runner import Runner, ServiceUnavailable

API = "/api/v1"
_bearer = HTTPBearer(auto_error=False, description="the token printed by `seamguard serve` (or --token)")
_E404 = {404: {"model": m.Problem, "description": "no such entity, loop or rack"}}
_E400 = {400: {"model": m.Problem, "description": "parameters that contradict each other"}}
_EBODY = {400: {"model": m.Problem, "description": "the body is not valid JSON"}}
_E401 = {401: {"model": m.Problem, "description": "missing or wrong bearer token"}}
_E503 = {503: {"model": m.Problem, "description": "the controller thread did not answer in time"}}
_ERANGE = {400: {"model": m.Problem, "description": "since/until not a time in seconds, or not in order"}}

Limit = Annotated[int, Query(ge=1, le=1000, description="page size")]
Offset = Annotated[int, Query(ge=0, le=10_000_000, description="rows to skip")]
EntityName = Annotated[str, Path(min_length=1, max_length=256, description="entity name, e.g. gpu000/gpu3")]
LoopName = Annotated[str | None, Query(max_length=256, description="only entities on this cooling loop")]
Since = Annotated[str | None, Query(description="range start in controller seconds (the summary's t_s clock: "
                                                "simulated for the twin, Unix for a live source)")]
Until = Annotated[str | None, Query(description="range end in controller seconds; at most 31 days after since")]


def time_range(since: Since = None, until: Until = None) -> timerange.TimeRange:
    """The checked ``since``/``until`` of a history read; a one-line 400 when they are wrong."""
    try:
        return timerange.parse(since, until)
    except ValueError as e:
        raise HTTPException(400, str(e)) from None


Range = Annotated[timerange.TimeRange, Depends(time_range)]


# The API docs pages may load only what this service serves: ReDoc's bundle fetches a logo
# from its vendor's CDN, and nothing should leave an air-gapped (or any) operator's browser.
DOCS_PATHS = frozenset({"/docs", "/redoc"})
DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'")

_NO_TOKEN = "this call changes the controller: send 'Authorization: Bearer <token>'"


def create_app(runner: Runner, token: str | Mapping[str, str], hosts: HostRule | None = None) -> FastAPI:
    """The app. ``token``: one unnamed token (acting as "operator") or {operator name: token};
    ``hosts``: the `Host` names answered (default: loopback's, ``access.allowed_hosts``)."""
    tokens = {UNNAMED: token} if isinstance(token, str) else dict(token)
    if not tokens or not all(tokens.values()):
        raise ValueError("the service needs a non-empty bearer token for mutating calls")
    hosts = allowed_hosts("127.0.0.1") if hosts is None else hosts
    # Swagger UI and ReDoc served from the package's own copies: /docs works air-gapped.
    app = FastAPIOffline(title="seamguard", version="1",
                  description="Gray-failure control plane: fleet state, evidence, decisions and operator controls. "
                              "Every read renders one immutable snapshot published after a controller tick.")
    reader = open_reader(runner.ledger_path)
    registry = make_registry(runner.snapshot, lambda: runner.leading, runner.series)
    goodput = GoodputService(runner, reader)  # /api/v1/goodput and its /metrics gauges (goodput.py)
    registry.register(GoodputCollector(goodput))
    app.include_router(goodput_router(goodput, API))
    breaker_cfg = runner.controller.policy.breaker
    assess_cfg = runner.controller.policy.assess

    def require_token(cred: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> str:
        """The name of the operator whose token came with the call (what the audit trail records)."""
        if cred is None or cred.scheme.lower() != "bearer":
            raise HTTPException(401, _NO_TOKEN, headers={"WWW-Authenticate": "Bearer"})
        who = token_owner(cred.credentials, tokens)
        if who is None:
            raise HTTPException(401, "bearer token not accepted", headers={"WWW-Authenticate": "Bearer"})
        return who

    # the twin's what-ifs (whatif.py): seconds of CPU each, so behind the operator token
    app.include_router(whatif_router(WhatIfService(runner, reader), API, require_token))

    @app.middleware("http")
    async def _host_and_auth_first(request: Request, call_next):
        # Host first, for every path: a page on a rebinding domain reads nothing, not even /healthz.
        if not host_allowed(request.headers.get("host"), hosts):
            return JSONResponse({"detail": "the Host header does not name this service (seamguard serve "
                                           "--allowed-host adds a name)"}, status_code=400)
        # Mutating calls are refused before their body or parameters are even parsed, so
        # a caller without the token learns nothing but "401".
        if request.method in ("PUT", "POST", "DELETE", "PATCH") and request.url.path.startswith(API):
            scheme, _, cred = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not cred:
                return JSONResponse({"detail": _NO_TOKEN}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            if token_owner(cred.strip(), tokens) is None:
                return JSONResponse({"detail": "bearer token not accepted"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.middleware("http")
    async def _docs_stay_local(request: Request, call_next):
        response = await call_next(request)
        if request.url.path in DOCS_PATHS:
            response.headers["Content-Security-Policy"] = DOCS_CSP
        return response

    @app.exception_handler(ServiceUnavailable)
    def _unavailable(_req: Request, e: ServiceUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=503)

    def _kind(k: m.KindName) -> Kind:  # type: ignore[valid-type]
        return KIND_BY_LABEL[k.value]

    def _not_found(e: KeyError) -> HTTPException:
        return HTTPException(404, str(e.args[0]) if e.args else "not found")

    # ---- health and metrics -----------------------------------------------------------
    @app.get("/healthz", response_model=m.Health, tags=["ops"])
    def healthz(response: Response) -> m.Health:
        s = runner.snapshot()
        if not runner.healthy:
            response.status_code = 503
        return m.Health(status="ok" if runner.healthy else ("failed" if runner.fatal else "stopped"),
                        tick=s.tick, controller_running=runner.running,
                        snapshot_age_s=round(time.time() - s.wall_s, 3), error=runner.fatal)

    @app.get("/metrics", tags=["ops"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition"}})
    def metrics() -> Response:
        return Response(render_metrics(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- reads ------------------------------------------------------------------------------
    @app.get(f"{API}/summary", response_model=m.Summary, tags=["fleet"])
    def summary() -> m.Summary:
        return render.summary(runner.snapshot(), breaker_cfg)

    @app.get(f"{API}/history/fleet", response_model=m.FleetHistory, tags=["fleet"], responses={**_E404, **_ERANGE})
    def fleet_history(rng: Range, points: Annotated[int, Query(ge=1, le=2000, description="points to return, "
                                                                                          "newest last")] = 360,
                      loop: LoopName = None) -> m.FleetHistory:
        """Fleet figures per tick (state counts, coolant per loop, useful throughput). With
        ``since``, the part older than the ticks in memory comes from the ledger's persisted
        rows (`persisted`), so a restart or a week still charts; a range holding more than
        ``points`` ticks is rolled up to ``points`` equal spans of time."""
        try:
            return render.fleet_history(runner.snapshot(), points, loop, assess_cfg.evidence, rng, reader)
        except KeyError as e:
            raise _not_found(e) from None

    @app.get(f"{API}/history/states", response_model=m.StateHistory, tags=["fleet"], responses=_ERANGE)
    def state_history(rng: Range, kind: m.KindName = m.KindName("gpu"),  # type: ignore[valid-type]
                      points: Annotated[int, Query(ge=2, le=2000, description="sample times")] = 360,
                      ) -> m.StateHistory:
        return render.state_history(runner.snapshot(), reader, _kind(kind), rng, points)

    @app.get(f"{API}/entities", response_model=m.EntityPage, tags=["fleet"], responses={**_E400, **_E404})
    def entities(kind: m.KindName = m.KindName("gpu"),  # type: ignore[valid-type]
                 state: Annotated[list[m.StateName] | None, Query(description="repeat to match several")] = None,  # type: ignore[valid-type]
                 domain: m.DomainName | None = None, loop: LoopName = None,
                 rack: Annotated[str | None, Query(max_length=256)] = None,
                 min_gfs: Annotated[float | None, Query(ge=0.0, le=1.0)] = None,
                 sort: m.SortKey = m.SortKey.name, limit: Limit = 100, offset: Offset = 0) -> m.EntityPage:
        s = runner.snapshot()
        k = _kind(kind)
        if domain is not None and render.KIND_DOMAIN[k] != domain.value:
            raise HTTPException(400, f"kind {k.label!r} belongs to domain {render.KIND_DOMAIN[k]!r}, "
                                     f"not {domain.value!r}")
        try:
            return render.entities(s, k, limit, offset, states=[x.value for x in state] if state else None,
                                   loop=loop, rack=rack, min_gfs=min_gfs, sort=sort.value)
        except KeyError as e:
            raise _not_found(e) from None

    @app.get(API + "/entities/{kind}/{name:path}", response_model=m.EntityDetail, tags=["fleet"],
             responses={**_E404, **_ERANGE})
    def entity(kind: m.KindName, name: EntityName, rng: Range,  # type: ignore[valid-type]
               history: Annotated[int, Query(ge=1, le=500, description="transitions to return")] = 50,
               points: Annotated[int | None, Query(ge=1, le=10_000, description="signal points per series")] = None,
               ) -> m.EntityDetail:
        s = runner.snapshot()
        try:
            return render.entity_detail(s, runner.ring, reader, _kind(kind), name, history, points, assess_cfg, rng)
        except KeyError as e:
            raise _not_found(e) from None

    @app.get(f"{API}/admissibility", response_model=m.AdmissibleNodes, tags=["scheduling"], responses=_E404)
    def admissibility(job_class: m.JobClassName, loop: LoopName = None,  # type: ignore[valid-type]
                      limit: Limit = 1000, offset: Offset = 0) -> m.AdmissibleNodes:
        try:
            return render.admissible(runner.snapshot(), job_class.value, limit, offset, loop)
        except KeyError as e:
            raise _not_found(e) from None

    @app.get(f"{API}/admissibility/summary", response_model=m.AdmissibilitySummary, tags=["scheduling"])
    def admissibility_summary() -> m.AdmissibilitySummary:
        return render.admissibility_summary(runner.snapshot())

    @app.get(f"{API}/jobs", response_model=list[m.JobOut], tags=["jobs"])
    def jobs() -> list[m.JobOut]:
        return render.jobs(runner.snapshot())

    @app.get(f"{API}/throughput", response_model=m.Throughput, tags=["jobs"])
    def throughput() -> m.Throughput:
        return render.throughput(runner.snapshot())

    @app.get(f"{API}/transitions", response_model=list[m.TransitionOut], tags=["record"], responses=_ERANGE)
    def transitions(rng: Range, entity: Annotated[str | None, Query(max_length=256)] = None,
                    kind: m.KindName | None = None,  # type: ignore[valid-type]
                    limit: Limit = 100, offset: Offset = 0) -> list[m.TransitionOut]:
        rows = reader.transitions(upto_tick=runner.snapshot().tick, entity=entity, kind=kind.value if kind else None,
                                  limit=limit, offset=offset, since_t_s=rng.since_t_s, until_t_s=rng.until_t_s)
        return [m.TransitionOut(**r) for r in rows]

    @app.get(f"{API}/decisions", response_model=list[m.DecisionOut], tags=["record"], responses=_ERANGE)
    def decisions(rng: Range,
                  entity: Annotated[str | None, Query(max_length=256, description="target or cause")] = None,
                  event: Annotated[str | None, Query(pattern="^(decided|withdrawn|held_by_breaker)$")] = None,
                  limit: Limit = 100, offset: Offset = 0) -> list[m.DecisionOut]:
        rows = reader.decisions(upto_tick=runner.snapshot().tick, entity=entity, event=event, limit=limit,
                                offset=offset, since_t_s=rng.since_t_s, until_t_s=rng.until_t_s)
        return [m.DecisionOut(**r) for r in rows]

    @app.get(f"{API}/actions", response_model=list[m.ActionOut], tags=["record"], responses=_ERANGE)
    def actions(rng: Range, entity: Annotated[str | None, Query(max_length=256, description="target or cause")] = None,
                status: Annotated[str | None, Query(pattern="^(pending|done|failed|refused|dry_run|interrupted)$")] = None,
                limit: Limit = 100, offset: Offset = 0) -> list[m.ActionOut]:
        rows = reader.actions(upto_tick=runner.snapshot().tick, entity=entity, status=status, limit=limit,
                              offset=offset, since_t_s=rng.since_t_s, until_t_s=rng.until_t_s)
        return [m.ActionOut(**r) for r in rows]

    @app.get(f"{API}/timeline", response_model=list[m.TimelineEvent], tags=["record"], responses=_ERANGE)
    def timeline(rng: Range, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> list[m.TimelineEvent]:
        return render.timeline(runner.snapshot(), reader, limit, rng)

    @app.get(f"{API}/map", response_model=m.FleetMap, tags=["fleet"], responses=_E404)
    def fleet_map(loop: LoopName = None) -> m.FleetMap:
        try:
            return render.fleet_map(runner.snapshot(), loop)
        except KeyError as e:
            raise _not_found(e) from None

    @app.get(f"{API}/breaker", response_model=m.Breaker, tags=["controls"])
    def breaker() -> m.Breaker:
        return render.breaker(runner.snapshot(), breaker_cfg)

    @app.get(f"{API}/pins", response_model=list[m.PinOut], tags=["controls"])
    def pins() -> list[m.PinOut]:
        return [render.pin_out(p) for p in runner.snapshot().pins]

    # ---- mutations (bearer token) -----------------------------------------------------------------
    @app.put(f"{API}/mode", response_model=m.Summary, tags=["controls"], responses={**_EBODY, **_E401, **_E503})
    def set_mode(body: m.ModeIn, who: str = Depends(require_token)) -> m.Summary:
        return render.summary(runner.set_mode(body.mode.value, by=who), breaker_cfg)

    @app.post(f"{API}/breaker/reset", response_model=m.Breaker, tags=["controls"],
              responses={**_EBODY, **_E401, **_E503})
    def reset_breaker(body: m.BreakerResetIn, who: str = Depends(require_token)) -> m.Breaker:
        return render.breaker(runner.reset_breaker(by=who, why=body.why), breaker_cfg)

    @app.get(f"{API}/failsafe", response_model=m.Failsafe, tags=["controls"])
    def failsafe(limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> m.Failsafe:
        return render.failsafe(runner.snapshot(), reader, limit)

    @app.put(API + "/pins/{kind}/{name:path}", response_model=m.PinOut, tags=["controls"],
             responses={**_EBODY, **_E401, **_E404, **_E503})
    def pin(kind: m.PinnableKind, name: EntityName, body: m.PinIn,  # type: ignore[valid-type]
            who: str = Depends(require_token)) -> m.PinOut:
        try:
            p = runner.pin(KIND_BY_LABEL[kind.value], name, STATE_BY_LABEL[body.state.value], body.note, by=who)
        except KeyError as e:
            raise _not_found(e) from None
        return render.pin_out(p)

    @app.delete(API + "/pins/{kind}/{name:path}", response_model=m.PinOut, tags=["controls"],
                responses={**_E401, **_E404, **_E503})
    def unpin(kind: m.PinnableKind, name: EntityName,  # type: ignore[valid-type]
              who: str = Depends(require_token)) -> m.PinOut:
        try:
            p = runner.unpin(KIND_BY_LABEL[kind.value], name, by=who)
        except KeyError as e:
            raise _not_found(e) from None
        if p is None:
            raise HTTPException(404, f"{kind.value} {name!r} is not pinned")
        return render.pin_out(p)

    # ---- the dashboard --------------------------------------------------------------------------------
    static = resources.files("seamguard.app.service") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(str(static / "index.html"), media_type="text/html")

    return app
