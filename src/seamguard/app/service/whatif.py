"""`GET /api/v1/twin/whatif`: the calibrated twin's answers on this fleet's own window, for the dashboard.

Why this file exists: the dashboard's What-if panel asks what `twin simulate --calibrated FILE
--whatif ...` answers, without a file: the service calibrates the twin on its own ledger over
the window (transitions and actions up to the snapshot's tick, read as `twin calibrate` reads
them; Slurm's accounting stays the CLI's `twin calibrate --slurm`) and the fleet's topology,
then computes the same answers (twin/answer.py): the fleet's ETTR, each job's checkpoint
interval, tier, hot spares and release-slip probability, and what each controller variant
(dry run or enforce, a breaker bound, a drain floor) would have bought over the window.

Bounded: at most `MAX_DRAWS` draws x `MAX_SEEDS` seeds and `MAX_VARIANTS` variants, one
computation at a time (another gets 429 at once, it never queues), and a time budget
(`budget_s`, at most `MAX_BUDGET_S`) after which the samples done are answered and counted.
A read like the other GETs (the `Host` rule applies; it changes nothing). Bad parameters are a
one-line 400.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from seamguard.app.service import timerange
from seamguard.app.service.goodput import _Upto  # the ledger reader bounded to the snapshot's tick
from seamguard.goodput.sources import SourceError, read_ledger
from seamguard.twin.answer import answer, fleet_exposure, fleet_jobs
from seamguard.twin.calibrate import calibrate, published_priors
from seamguard.twin.calibrated import seamguard_params
from seamguard.twin.events.calibration import llama3_failure_model
from seamguard.twin.whatif import base_settings, variants

MAX_DRAWS = MAX_SEEDS = 8
MAX_VARIANTS = 16
MAX_BUDGET_S = 30.0
DEFAULT_SPAN_S = 7 * 86400.0
MAX_SETTING_CHARS = 200


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


Q3 = list[float] | None  # [2.5 %, median, 97.5 %] over draws x seeds


class JobAdviceOut(_M):
    job: str
    gpus: int
    interval_s: Q3 = Field(description="checkpoint interval maximising the job's ETTR")
    ettr: Q3
    tier: str = Field(description="storage or peer_memory, the one chosen most often")
    tier_share: dict[str, float]
    hot_spares: Q3 = Field(description="nodes in repair at once, 99th percentile")
    p_slip: Q3 = Field(description="release-slip probability (null: the job has no deadline)")
    tiers_s: dict[str, dict[str, float]]
    samples: dict[str, int]


class VariantOut(_M):
    variant: str
    settings: dict[str, Any]
    ettr: Q3
    goodput: Q3
    delta_ettr: Q3 = Field(description="this variant's ETTR minus the base's, paired per sample")
    delta_goodput: Q3
    delta_gpu_hours: Q3 = Field(description="productive GPU-hours the variant would have bought over the window")
    better_share: float | None
    drained_nodes: Q3
    held_by_breaker: Q3
    breaker_tripped_share: float | None


class WhatIfBlockOut(_M):
    window: dict[str, float]
    gpus: int
    days: float
    samples: dict[str, Any]
    incidents_in_window: dict[str, int]
    not_replayed: dict[str, int]
    variants: list[VariantOut]


class TwinWhatIfOut(_M):
    since_s: float
    until_s: float
    gpus: int
    days: float
    draws: int
    seeds: int
    fleet_ettr: Q3 = Field(description="the twin's seamguard policy on the calibrated failures")
    detection: Any
    jobs: list[JobAdviceOut]
    whatif: WhatIfBlockOut | None
    priors_used: list[str] = Field(description="domain/class pairs with too few incidents: published priors used")
    measured: list[str] = Field(description="domain/class pairs whose rate was measured in the window")
    wall_s: float


class WhatIfService:
    """One what-if at a time, on the runner's fleet and the service's ledger reader."""

    def __init__(self, runner, reader) -> None:
        self.runner, self.reader = runner, reader
        self._busy = threading.Lock()

    def base(self) -> list[str]:
        """What a what-if is compared with by default: the mode the controller runs now and its breaker."""
        return base_settings(self.runner.snapshot().mode, self.runner.controller.policy.breaker)

    def compute(self, t0: float, t1: float, asked, draws: int, seeds: int, budget_s: float) -> dict:
        s = self.runner.snapshot()
        trs, acts = read_ledger(_Upto(self.reader, s.tick), t0, t1)
        doc = calibrate(trs, acts, [], fleet_exposure(s.fleet), t0, t1, *published_priors(llama3_failure_model()))
        for name, spec in fleet_jobs(s.fleet, t1).items():
            doc["jobs"].setdefault(name, {}).update(spec)
        started = time.monotonic()
        out = answer(doc, draws=draws, seeds=seeds, seed=0, policy=seamguard_params(doc), variants=asked,
                     stop=lambda: time.monotonic() - started > budget_s)
        measured = [f"{h['domain']}/{h['class']}" for h in doc["hazards"] if h["source"] == "measured" and h["count"]]
        return {"since_s": t0, "until_s": t1, **out, "measured": measured, "wall_s": time.monotonic() - started}


def _window(svc: WhatIfService, since: str | None, until: str | None) -> tuple[float, float]:
    try:
        rng = timerange.parse(since, until)
    except ValueError as e:
        raise HTTPException(400, str(e)) from None
    t1 = rng.until_t_s if rng.until_t_s is not None else svc.runner.snapshot().t_s
    t0 = rng.since_t_s if rng.since_t_s is not None else max(t1 - DEFAULT_SPAN_S, 0.0)
    if not t0 < t1:
        raise HTTPException(400, f"since ({t0:g}) must be before until ({t1:g})")
    return t0, t1


def _number(name: str, text: str, lo: float, hi: float, kind: type):
    """A count or a time from the query, or a one-line 400 naming it."""
    try:
        v = kind(text)
    except ValueError:
        raise HTTPException(400, f"{name}: {text!r} is not {'a whole number' if kind is int else 'a number'}") from None
    if not lo <= v <= hi:
        raise HTTPException(400, f"{name}: {text} is outside {lo:g}..{hi:g}")
    return v


def _asked(svc: WhatIfService, whatif: list[str] | None, base: list[str] | None):
    for x in (*(whatif or ()), *(base or ())):
        if len(x) > MAX_SETTING_CHARS:
            raise HTTPException(400, f"a setting of {len(x)} characters; at most {MAX_SETTING_CHARS}")
    if base and not whatif:
        raise HTTPException(400, "base describes what the whatif variants are compared with: give at least one whatif")
    try:
        asked = variants([*svc.base(), *(base or [])], whatif or []) if whatif else None
    except ValueError as e:
        raise HTTPException(400, str(e)) from None
    if asked is not None and len(asked) > MAX_VARIANTS:
        raise HTTPException(400, f"{len(asked)} variants; at most {MAX_VARIANTS} per request")
    return asked


_PARAMS = frozenset({"since", "until", "whatif", "base", "draws", "seeds", "budget_s"})


def router(svc: WhatIfService, prefix: str, auth: Callable[..., str]) -> APIRouter:
    """The endpoint; ``auth`` is the operator-token dependency: a what-if spends up to its budget of
    the controller's CPU, so only an operator may ask for one."""
    r = APIRouter()

    @r.get(f"{prefix}/twin/whatif", response_model=TwinWhatIfOut, tags=["twin"],
           responses={400: {"description": "a window, setting or count that is wrong, in one line"},
                      401: {"description": "no operator token, or one not accepted"},
                      429: {"description": "another what-if is being computed"},
                      502: {"description": "the ledger could not be read"}})
    def twin_whatif(
        request: Request,
        since: Annotated[str | None, Query(description="window start, controller seconds (default: 7 days before "
                                                       "until, not before 0)")] = None,
        until: Annotated[str | None, Query(description="window end (default: the snapshot's time)")] = None,
        whatif: Annotated[list[str] | None, Query(max_length=8, description="KNOB=V[,V...]: mode=enforce|dry_run, "
                                                  "breaker, breaker_in_effect, breaker_window_s, breaker_min_nodes, "
                                                  "drain_min_slowdown; repeat for more")] = None,
        base: Annotated[list[str] | None, Query(max_length=8, description="KNOB=V: changes the base the variants "
                                                "are compared with (default: the mode and breaker bounds this "
                                                "controller runs)")] = None,
        draws: Annotated[str, Query(max_length=8, description=f"parameter draws, 1-{MAX_DRAWS}")] = "4",
        seeds: Annotated[str, Query(max_length=8, description=f"seeds per draw, 1-{MAX_SEEDS}")] = "4",
        budget_s: Annotated[str, Query(max_length=16, description=f"time budget in seconds, at most "
                                       f"{MAX_BUDGET_S:g}; the samples done when it runs out are answered")] = "20",
        _operator: str = Depends(auth),
    ) -> TwinWhatIfOut:
        unknown = sorted(set(request.query_params) - _PARAMS)
        if unknown:  # a misspelt setting silently ignored would answer another question
            raise HTTPException(400, f"unknown query parameter {unknown[0]!r}; known: {', '.join(sorted(_PARAMS))}")
        t0, t1 = _window(svc, since, until)
        n_draws, n_seeds = _number("draws", draws, 1, MAX_DRAWS, int), _number("seeds", seeds, 1, MAX_SEEDS, int)
        budget = _number("budget_s", budget_s, 0.1, MAX_BUDGET_S, float)
        asked = _asked(svc, whatif, base)
        if not svc._busy.acquire(blocking=False):
            raise HTTPException(429, "a what-if is already being computed; ask again when it is done")
        try:
            return TwinWhatIfOut(**svc.compute(t0, t1, asked, n_draws, n_seeds, budget))
        except SourceError as e:
            raise HTTPException(502, str(e)) from None
        except ValueError as e:
            raise HTTPException(400, f"cannot calibrate on {t0:g}..{t1:g}: {e}") from None
        finally:
            svc._busy.release()

    return r
