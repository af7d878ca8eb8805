"""How long a fault will last: its expected remaining duration, from a duration distribution. Pure.

Why this file exists: a move, drain or shed pays back only while the fault it dodges lasts. The
planner (decide/planner.py) prices each against ``E[D - a | D > a]``, the time a fault of its
class and domain still has left once it is ``a`` seconds old. The distributions come as data:
the ``durations`` rows of a calibrated twin config (`seamguard twin calibrate`, twin/calibrate.py:
a lognormal fitted to the fleet's own incidents, or the published prior it fell back to), or the
published priors the default policy carries (docs/policy.md), the same rows in the same shape.

- exponential (a prior's mean only): memoryless, ``E[D - a | D > a]`` is the mean at every age;
- lognormal (mu, sigma of ln seconds, a measured fit): with ``z(x) = (mu + x - ln a) / sigma``,
  ``E[D | D > a] = exp(mu + sigma^2 / 2) Phi(z(sigma^2)) / Phi(z(0))``; heavy-tailed, so an old
  fault is expected to last longer than a young one (for sigma above about 1, at every age).

No clock, no I/O: rows and ages in, seconds out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scipy.special import log_ndtr

__all__ = ["EXPONENTIAL", "LOGNORMAL", "Duration", "FaultClock", "Remaining", "duration_from_row", "expected_remaining_s",
           "onsets", "remaining", "table_from_rows"]

EXPONENTIAL, LOGNORMAL = "exponential", "lognormal"
CLASSES = ("hard", "gray")


@dataclass(frozen=True)
class Duration:
    """One (domain, class)'s fault-duration distribution, and what it rests on."""

    domain: str
    """The entity kind the faults struck (cooling_loop, node, gpu, nic, link, ...)."""
    cls: str
    """``hard`` (the entity failed) or ``gray`` (it left healthy without failing)."""
    family: str
    """EXPONENTIAL (``mean_s``) or LOGNORMAL (``mu``, ``sigma``)."""
    mean_s: float = math.nan
    mu: float = math.nan
    sigma: float = math.nan
    source: str = "prior"
    """``measured`` (fitted to the fleet's incidents) or ``prior`` (a published or assumed mean)."""
    n: int = 0
    """Closed incidents the fit rests on (0 for a prior)."""
    origin: str = ""
    """Where the numbers come from (the prior's citation, or the calibrated config)."""

    @property
    def label(self) -> str:
        what = f"{self.family} mean {self.mean_s:.0f} s" if self.family == EXPONENTIAL else \
            f"lognormal median {math.exp(self.mu):.0f} s sigma {self.sigma:.2f}"
        return f"{self.domain}/{self.cls} {what} ({self.source}{f', n={self.n}' if self.n else ''})"


def expected_remaining_s(d: Duration, age_s: float) -> float:
    """``E[D - a | D > a]``: seconds a fault of distribution ``d``, ``age_s`` old, is expected still to last."""
    a = max(float(age_s), 0.0)
    if d.family == EXPONENTIAL:
        return d.mean_s
    if d.sigma <= 0:  # every fault lasts exp(mu); one older than that is ending now
        return max(math.exp(d.mu) - a, 0.0)
    if a <= 0:
        return math.exp(d.mu + d.sigma ** 2 / 2)
    z0 = (d.mu - math.log(a)) / d.sigma
    log_tail_mean = d.mu + d.sigma ** 2 / 2 + float(log_ndtr(z0 + d.sigma)) - float(log_ndtr(z0))
    return max(math.exp(log_tail_mean) - a, 0.0)


def _number(row: Mapping, key: str, where: str) -> float:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{where}: {key} must be a finite number, got {v!r}")
    return float(v)


def duration_from_row(row: object, where: str) -> Duration:
    """A ``durations`` row of a calibrated twin config (or the policy's, the same shape) as a Duration.

    ``source: prior`` rows use their prior's ``mean_s`` (exponential, as the twin draws them);
    measured rows their ``lognormal`` fit (``mu``, ``sigma``), or an explicit
    ``family: exponential`` with ``mean_s``. ValueError naming ``where`` and the field otherwise."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected a mapping with domain, class and a distribution, got {row!r}")
    dom, cls = row.get("domain"), row.get("class")
    if not isinstance(dom, str) or not dom:
        raise ValueError(f"{where}: domain must be a non-empty string, got {dom!r}")
    if cls not in CLASSES:
        raise ValueError(f"{where}: class must be one of {', '.join(CLASSES)}, got {cls!r}")
    where = f"{where} ({dom}/{cls})"
    source = str(row.get("source", "prior"))
    n = row.get("n", 0)
    n = n if isinstance(n, int) and not isinstance(n, bool) else 0
    if source == "prior" and isinstance(row.get("prior"), Mapping):
        prior = row["prior"]
        mean = _number(prior, "mean_s", f"{where} prior")
        return _exponential(dom, cls, mean, where, "prior", 0, str(prior.get("from", "")))
    family = row.get("family", LOGNORMAL if "lognormal" in row else EXPONENTIAL)
    origin = str(row.get("from", "calibrated config" if source == "measured" else ""))
    if family == EXPONENTIAL:
        return _exponential(dom, cls, _number(row, "mean_s", where), where, source, n, origin)
    if family != LOGNORMAL:
        raise ValueError(f"{where}: family must be {EXPONENTIAL} or {LOGNORMAL}, got {family!r}")
    fit = row.get("lognormal", row)
    if not isinstance(fit, Mapping):
        raise ValueError(f"{where}: lognormal must be a mapping with mu and sigma, got {fit!r}")
    mu, sigma = _number(fit, "mu", where), _number(fit, "sigma", where)
    if sigma < 0:
        raise ValueError(f"{where}: sigma must be >= 0, got {sigma}")
    return Duration(dom, cls, LOGNORMAL, math.exp(mu + sigma ** 2 / 2), mu, sigma, source, n, origin)


def _exponential(dom: str, cls: str, mean: float, where: str, source: str, n: int, origin: str) -> Duration:
    if mean <= 0:
        raise ValueError(f"{where}: mean_s must be > 0, got {mean}")
    return Duration(dom, cls, EXPONENTIAL, mean, source=source, n=n, origin=origin)


def table_from_rows(rows: Iterable[object], where: str) -> dict[tuple[str, str], Duration]:
    """(domain, class) -> Duration; a later row for the same pair replaces an earlier one. A calibrated
    config's ``durations`` list is taken as it is (a measured row with no closed incident is skipped)."""
    out: dict[tuple[str, str], Duration] = {}
    for i, row in enumerate(rows):
        if isinstance(row, Mapping) and row.get("source") == "measured" and row.get("n") == 0:
            continue  # a calibrated row of incidents still open, with no prior: nothing to fit yet
        d = duration_from_row(row, f"{where}[{i}]")
        out[(d.domain, d.cls)] = d
    return out


@dataclass(frozen=True)
class Remaining:
    """What the planner priced an action over: the fault's age, its expected remaining time, and from what."""

    age_s: float
    remaining_s: float
    duration: Duration | None
    """None: no history and no prior for the fault's class and domain (the planning horizon is used)."""

    def evidence(self, entity: str) -> tuple[str, float, float, str]:
        """(channel, score, value, unit) for the action's evidence: age and expected remaining seconds."""
        return (f"fault_remaining:{entity}", round(self.age_s, 1), round(self.remaining_s, 1), "s")

    def why(self) -> str:
        src = self.duration.label if self.duration is not None else "no history or prior: the planning horizon"
        return f"fault {self.age_s:.0f} s old, expected to last {self.remaining_s:.0f} s more ({src})"


def remaining(table: Mapping[tuple[str, str], Duration], keys: Iterable[tuple[str, str]], age_s: float,
              horizon_s: float) -> Remaining:
    """The fault's expected remaining time from the first of ``keys`` (domain, class) the table has,
    at most ``horizon_s`` (the planner looks no further); ``horizon_s`` itself if it has none."""
    d = next((table[k] for k in keys if k in table), None)
    rem = horizon_s if d is None else min(expected_remaining_s(d, age_s), horizon_s)
    return Remaining(max(age_s, 0.0), rem, d)


def onsets(previous: Mapping[str, float], unhealthy: Iterable[str], t_s: float) -> dict[str, float]:
    """When each entity now out of healthy left it: its earlier onset, or ``t_s`` if it just did; the
    entities back to healthy are forgotten (an incident runs from leaving healthy to healthy again,
    as twin/calibrate.py measures durations)."""
    return {e: previous.get(e, t_s) for e in unhealthy}


@dataclass(frozen=True)
class FaultClock:
    """What the planner prices over in one tick: the duration table, when each fault began, and now."""

    table: Mapping[tuple[str, str], Duration]
    onsets: Mapping[str, float]
    """``kind:name`` -> when that entity left healthy (:func:`onsets`)."""
    t_s: float
    horizon_s: float

    def remaining(self, entity: str, keys: Iterable[tuple[str, str]]) -> Remaining:
        """The expected remaining time of ``entity``'s fault (``kind:name``), from the first of ``keys``."""
        return remaining(self.table, keys, self.t_s - self.onsets.get(entity, self.t_s), self.horizon_s)
