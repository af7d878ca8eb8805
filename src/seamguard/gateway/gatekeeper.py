"""Who may send a request now: keys, budgets, zombie steps — the gateway's admission shell.

The HTTP layer (seamguard.gateway.app) calls `Gatekeeper.admit` before it proxies a
request and `finish` when it ends (once, on every path). Between them sit the pure parts
(admission arithmetic, the zombie detector) and the store; the gatekeeper applies each
detector `Step` to the shared key state (store), the ledger and /metrics. Time comes from
the injected ``clock`` (wall seconds), so a benchmark may run it in simulated time.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from seamguard.gateway.admission import (
    Charge,
    Counters,
    Limits,
    Priority,
    Reserved,
    charge,
    minute_used,
    never_fits,
    request_problem,
    reserve_for,
    shed_share,
    windows,
)
from seamguard.gateway.config import GatewayConfig
from seamguard.gateway.ledger import GatewayLedger
from seamguard.gateway.metrics import GatewayMetrics
from seamguard.gateway.store import KeyRecord, Reservation, Scope, Store, StoreError
from seamguard.gateway.zombie import KeyState, Step, ZombieDetector

TICK_EVERY_S = 10.0  # how often throttles of keys gone quiet are lifted
# who sets a key's state on its own; any other actor is a person (an admin token's name), whose
# unsuspend holds the detector off for override_s on every replica
AUTOMATIC_ACTORS = frozenset({"", "zombie-detector"})


@dataclass(frozen=True)
class KeyInfo:
    name: str
    tenant: str
    priority: Priority
    limits: Limits


class Refusal(Exception):
    """A request not admitted: the HTTP status and an OpenAI-style error."""

    def __init__(self, status: int, message: str, type_: str, code: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.retry_after_s = (status, message, type_, code,
                                                                               retry_after_s)


@dataclass
class Ticket:
    key: KeyInfo
    reservation: Reservation
    reserved: Reserved  # what the reservation is made of, and the caps the forwarded body carries
    fingerprint: str
    finished: bool = field(default=False)
    request: int = 0  # the detector's id for it (to withdraw it if the gateway fails it)

    @property
    def prompt_estimate(self) -> int:
        return self.reserved.prompt_estimate


class Gatekeeper:
    def __init__(self, cfg: GatewayConfig, store: Store, ledger: GatewayLedger, metrics: GatewayMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg, self.store, self.ledger, self.metrics, self.clock = cfg, store, ledger, metrics, clock
        self.detector = ZombieDetector(cfg.zombie)
        self.keys: dict[str, KeyInfo] = {}
        self.by_digest: dict[str, KeyInfo] = {}
        self.tenants = {t.name: t.limits() for t in cfg.tenants}
        for t in cfg.tenants:
            for k in t.keys:
                info = KeyInfo(k.name, t.name, k.priority, k.limits())
                self.keys[k.name] = info
                self.by_digest[k.digest()] = info
                metrics.set_key_state(k.name, "ok", None)
        self._last_tick = -1e18
        self._requests = itertools.count(1)
        # per key: steps this replica has begun writing (a read of the store that began before one
        # ended may be older than the detector's own state, and must not be adopted)
        self._steps_begun: dict[str, int] = {}
        self._steps_writing: dict[str, int] = {}

    def authenticate(self, secret: str | None) -> KeyInfo | None:
        if not secret:
            return None
        return self.by_digest.get(hashlib.sha256(secret.encode()).hexdigest())

    async def _apply(self, step: Step | None, now: float) -> None:
        if step is None:
            return
        k = self.keys[step.key]
        self._steps_begun[step.key] = self._steps_begun.get(step.key, 0) + 1
        self._steps_writing[step.key] = self._steps_writing.get(step.key, 0) + 1
        try:
            await self.store.set_key_record(step.key, KeyRecord(step.to_state, step.throttle_tpm, step.reason, now,
                                                                step.actor))
        finally:
            self._steps_writing[step.key] -= 1
        self.ledger.record(now, step.key, k.tenant, step.from_state, step.to_state, step.reason, step.evidence,
                           step.actor)
        self.metrics.set_key_state(step.key, step.to_state, step.throttle_tpm)
        self.metrics.key_steps.labels(step.key, step.to_state, step.actor).inc()

    async def _key_record(self, key: str) -> KeyRecord:
        """The key's state from the store; a downgrade the store overruled (Redis lost or rewrote a
        stricter state this replica recorded) is counted, and alerts (docs/gateway.md)."""
        rec = await self.store.key_record(key)
        if rec.overruled:
            self.metrics.key_state_downgrades.labels(key, rec.overruled, rec.state).inc()
            self.metrics.set_key_state(key, rec.state, rec.throttle_tpm)
        return rec

    async def admit(self, key: KeyInfo, body: dict, raw: bytes, source: str) -> Ticket:
        """Reserve the request's estimate against its key and tenant, or raise `Refusal`."""
        adm = self.cfg.admission
        now = self.clock()
        if now - self._last_tick >= TICK_EVERY_S:
            self._last_tick = now
            for st in self.detector.tick(now):
                await self._apply(st, now)
        begun = self._steps_begun.get(key.name, 0)
        rec = await self._key_record(key.name)  # another replica or an operator may have changed it
        if begun == self._steps_begun.get(key.name, 0) and not self._steps_writing.get(key.name):
            # adopted only if no step of ours was written meanwhile: else the read may predate it
            # (concurrent admissions read "ok" while a throttle's write was in flight, and stepped again)
            self.detector.adopt(key.name, rec.state, rec.throttle_tpm, now,  # type: ignore[arg-type]
                                rec.since if rec.actor not in AUTOMATIC_ACTORS else None)
        problem = request_problem(body)
        if problem is not None:
            self.metrics.refused.labels(key.tenant, key.name, "invalid").inc()
            raise Refusal(400, problem, "invalid_request_error", "invalid_value")
        reserved = reserve_for(body, adm.default_max_tokens, adm.chars_per_token, adm.prompt_template_tokens)
        amount = reserved.amount
        why = never_fits(amount, [(f"key {key.name!r}", key.limits), (f"tenant {key.tenant!r}", self.tenants[key.tenant])])
        if why is not None:
            self.metrics.refused.labels(key.tenant, key.name, "never_fits").inc()
            raise Refusal(400, f"{why}; lower max_tokens or the prompt", "invalid_request_error", "request_too_large")
        rid = next(self._requests)
        if rec.state != "suspended":
            await self._apply(self.detector.observe_request(key.name, now, amount, source, request=rid), now)
        state, throttle_tpm = self.detector.state(key.name)
        if state == "suspended":
            self.metrics.refused.labels(key.tenant, key.name, "suspended").inc()
            raise Refusal(403, f"API key {key.name!r} is suspended; an operator can lift it (/admin)",
                          "permission_error", "key_suspended")
        lim = key.limits
        if state == "throttled" and throttle_tpm is not None:
            lim = Limits(min(lim.tpm or throttle_tpm, throttle_tpm), lim.tpd, lim.concurrency)
        scopes = [Scope(f"key:{key.name}", lim),
                  Scope(f"tenant:{key.tenant}", self.tenants[key.tenant],
                        shed_share(key.priority, adm.shed_low_at, adm.shed_normal_at))]
        verdict, res = await self.store.reserve(scopes, amount, now, adm.inflight_ttl_s)
        if res is None:
            reason = verdict.reason + (" (key throttled)" if state == "throttled" and verdict.reason.startswith("key")
                                       else "")
            self.metrics.refused.labels(key.tenant, key.name, verdict.reason).inc()
            raise Refusal(429, f"rate limit: {reason} for key {key.name!r} ({amount} tokens reserved); "
                               f"retry after {verdict.retry_after_s} s", "rate_limit_exceeded",
                          verdict.reason.replace(" ", "_"), verdict.retry_after_s)
        self.detector.admitted(key.name, now, amount, request=rid)
        return Ticket(key, res, reserved, hashlib.blake2b(raw, digest_size=8).hexdigest(), request=rid)

    async def finish(self, t: Ticket, ok: bool, prompt_tokens: object, completion_tokens: object,
                     gateway_fault: bool = False) -> Charge:
        """`settle` with the counts as the backend reported them (``prompt_tokens`` None: it sent no
        usage, and ``completion_tokens`` is what was relayed); they are validated (admission.charge)."""
        if prompt_tokens is None:
            relayed = completion_tokens if isinstance(completion_tokens, int) else 0
            return await self.settle(t, ok, charge(t.reserved, None, relayed), gateway_fault)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        return await self.settle(t, ok, charge(t.reserved, usage, 0), gateway_fault)

    async def settle(self, t: Ticket, ok: bool, c: Charge, gateway_fault: bool = False) -> Charge:
        """Reconcile the reservation with the request's charge (a failed request that generated
        nothing is charged nothing); feed the result to the detector. Idempotent. A charge is never
        negative, so the reconcile never gives back more than was reserved. ``gateway_fault``: the
        gateway or its backend failed it (502, 504, a timeout): nothing counts against the key (no
        tokens unless some were relayed, no failure, no demand for the detector)."""
        if t.finished:
            return c
        t.finished = True
        now = self.clock()
        used = c.total if (ok or c.completion) else 0
        try:
            await self.store.reconcile(t.reservation, used, now)
        except StoreError:  # the reservation stays charged, its slot expires: never under-counts
            self.metrics.store_errors.labels("reconcile").inc()
        if used:
            self.metrics.tokens.labels(t.key.tenant, t.key.name, "prompt").inc(c.prompt)
            self.metrics.tokens.labels(t.key.tenant, t.key.name, "completion").inc(c.completion)
        await self._apply(self.detector.observe_result(t.key.name, now, ok, t.fingerprint, gateway_fault=gateway_fault,
                                                       request=t.request), now)
        return c

    async def release(self, t: Ticket) -> None:
        """Give the whole reservation back for a request that was never sent (the router shed it):
        no tokens, and no result for the detector (a deferred request is not a failure)."""
        if t.finished:
            return
        t.finished = True
        now = self.clock()
        try:
            await self.store.reconcile(t.reservation, 0, now)
        except StoreError:
            self.metrics.store_errors.labels("reconcile").inc()
        # the gateway's own refusal: its demand withdrawn, like a 502's
        await self._apply(self.detector.observe_result(t.key.name, now, False, t.fingerprint, gateway_fault=True,
                                                       request=t.request), now)

    async def override(self, key: str, to: KeyState, actor: str, note: str) -> KeyRecord:
        now = self.clock()
        await self._apply(self.detector.override(key, now, to, actor, note), now)
        return await self.store.key_record(key)

    async def reset(self, key: str, actor: str, note: str = "") -> KeyRecord:
        """Clear the key's counters and any throttle or suspension (the ledger records who and why)."""
        now = self.clock()
        await self.store.reset(f"key:{key}", now)
        why = "operator reset: counters cleared" + (f": {note}" if note else "")
        return await self.override(key, "ok", actor, why)

    async def keys_view(self) -> list[dict]:
        now = self.clock()
        out = []
        for k in self.keys.values():
            c = await self.store.counters(f"key:{k.name}", now)
            rec = await self._key_record(k.name)
            out.append({"name": k.name, "tenant": k.tenant, "priority": k.priority, "state": rec.state,
                        "throttle_tpm": rec.throttle_tpm, "reason": rec.reason, "since_s": rec.since,
                        "by": rec.actor, "limits": vars(k.limits), "used": _used(c, now),
                        "baseline": self.detector.baseline(k.name)})
        return out

    async def tenants_view(self) -> list[dict]:
        now = self.clock()
        out = []
        for name, lim in self.tenants.items():
            c = await self.store.counters(f"tenant:{name}", now)
            out.append({"name": name, "limits": vars(lim), "used": _used(c, now),
                        "keys": [k.name for k in self.keys.values() if k.tenant == name]})
        return out


def _used(c: Counters, now: float) -> dict:
    _, em, _, _ = windows(now)
    return {"tokens_last_minute": round(minute_used(c, em)), "tokens_today": c.day, "inflight": c.inflight}
