"""decide/durations.py: a fault's expected remaining duration, against closed forms and numerical integrals.

The distributions are the two a calibrated twin config carries (twin/calibrate.py): the published
priors' exponential means and the lognormal fits to a fleet's own incidents; the rows are read as
`seamguard twin calibrate` writes them, and the default policy's priors are the twin's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from seamguard.decide import default_policy
from seamguard.decide.durations import (
    EXPONENTIAL,
    LOGNORMAL,
    Duration,
    FaultClock,
    duration_from_row,
    expected_remaining_s,
    onsets,
    table_from_rows,
)
from seamguard.decide.policy import PolicyError, parse_policy
from seamguard.twin.calibrate import HARD, GRAY, calibrate, published_priors
from seamguard.twin.events.calibration import llama3_failure_model


def _lognormal(mu: float, sigma: float) -> Duration:
    return Duration("cooling_loop", GRAY, LOGNORMAL, math.exp(mu + sigma ** 2 / 2), mu, sigma, "measured", 10)


def _numeric_remaining(mu: float, sigma: float, age_s: float) -> float:
    """E[D - a | D > a] = integral of the survival function from a, over S(a), by quadrature (in ln x, up
    to where S is 1e-15: the rest of the integral is below the tolerance)."""
    dist = stats.lognorm(s=sigma, scale=math.exp(mu))
    tail, _ = integrate.quad(lambda u: dist.sf(math.exp(u)) * math.exp(u), math.log(age_s),
                             math.log(dist.isf(1e-15)), limit=500, epsrel=1e-9)
    return tail / dist.sf(age_s)


@pytest.mark.parametrize("mean_s", [15.0, 1020.0, 86400.0])
@pytest.mark.parametrize("age_s", [0.0, 5.0, 600.0, 1e5])
def test_an_exponential_fault_is_memoryless(mean_s, age_s):
    d = Duration("node", GRAY, EXPONENTIAL, mean_s)
    assert expected_remaining_s(d, age_s) == pytest.approx(mean_s)
    if age_s < 30 * mean_s:  # further out the survival function underflows: the closed form is all there is
        x = stats.expon(scale=mean_s)  # the exponential's own mean residual life, by quadrature
        tail = integrate.quad(x.sf, age_s, age_s + 60 * mean_s)[0]
        assert expected_remaining_s(d, age_s) == pytest.approx(tail / x.sf(age_s), rel=1e-6)


@pytest.mark.parametrize("mu, sigma", [(math.log(60), 0.3), (math.log(60), 1.0), (math.log(120), 1.8),
                                       (math.log(3600), 2.5)])
@pytest.mark.parametrize("age_q", [0.01, 0.3, 0.5, 0.9, 0.99])
def test_a_lognormal_fault_matches_the_integral_of_its_survival(mu, sigma, age_q):
    age = float(stats.lognorm(s=sigma, scale=math.exp(mu)).ppf(age_q))
    assert expected_remaining_s(_lognormal(mu, sigma), age) == pytest.approx(_numeric_remaining(mu, sigma, age),
                                                                            rel=1e-5)


def test_a_new_lognormal_fault_is_expected_to_last_its_mean():
    d = _lognormal(math.log(100), 1.2)
    assert expected_remaining_s(d, 0.0) == pytest.approx(100 * math.exp(1.2 ** 2 / 2))
    assert expected_remaining_s(d, -3.0) == expected_remaining_s(d, 0.0)  # an age below 0 is a new fault


def test_heavy_tailed_faults_are_expected_to_last_longer_the_older_they_are_light_tailed_shorter():
    ages = np.geomspace(1.0, 1e5, 40)
    heavy = [expected_remaining_s(_lognormal(math.log(60), 2.0), a) for a in ages]
    assert all(b > a for a, b in zip(heavy, heavy[1:])), heavy
    light = [expected_remaining_s(_lognormal(math.log(600), 0.2), a) for a in (300.0, 600.0, 900.0, 1200.0)]
    assert all(b < a for a, b in zip(light, light[1:])), light


def test_every_fault_the_same_length_ends_on_time():
    d = _lognormal(math.log(240), 0.0)  # one incident: the fit has no spread
    assert expected_remaining_s(d, 40.0) == pytest.approx(200.0)
    assert expected_remaining_s(d, 500.0) == 0.0


def test_the_rows_of_a_calibrated_config_are_read_as_twin_calibrate_writes_them():
    # a week of a loop's flow losses and one node's fail-slow: lognormal where there are enough, the prior else
    rng = np.random.default_rng(3)
    dur = rng.lognormal(math.log(300), 1.5, 12)
    starts = np.cumsum(rng.uniform(2e5, 4e5, 12))  # apart: one incident ends before the next
    rows = []
    for k, (t, d) in enumerate(zip(starts, dur)):
        rows += [{"entity": "cdu-a", "kind": "cooling_loop", "t_s": t, "to_state": "degraded", "tick": 2 * k},
                 {"entity": "cdu-a", "kind": "cooling_loop", "t_s": t + d, "to_state": "healthy", "tick": 2 * k + 1}]
    rows += [{"entity": "h0", "kind": "node", "t_s": 10.0, "to_state": "degraded", "tick": 99},
             {"entity": "h0", "kind": "node", "t_s": 70.0, "to_state": "healthy", "tick": 100}]
    rates, durs = published_priors(llama3_failure_model())
    doc = calibrate(rows, [], [], {"cooling_loop": 2, "node": 4}, 0.0, float(starts[-1] + 1e5), rates, durs)
    table = table_from_rows(doc["durations"], "durations")
    loop, node = table[("cooling_loop", GRAY)], table[("node", GRAY)]
    logs = np.log(dur)
    assert (loop.family, loop.source, loop.n) == (LOGNORMAL, "measured", 12)
    assert loop.mu == pytest.approx(logs.mean()) and loop.sigma == pytest.approx(logs.std(ddof=1))
    assert (node.family, node.source) == (EXPONENTIAL, "prior")  # one incident (< 3): the prior
    assert node.mean_s == durs[("node", GRAY)]["mean_s"]


def test_the_default_policys_priors_are_the_twins_published_ones():
    """All but node/gray (a fail-slow spell's 17 min is not how long a quarantined node stays bad)."""
    _, durs = published_priors(llama3_failure_model())
    table = default_policy().objective.duration_table()
    assert {k: (d.family, d.mean_s, d.source) for k, d in table.items()} == \
        {k: (EXPONENTIAL, v["mean_s"], "prior") for k, v in durs.items() if k != ("node", GRAY)}


def test_calibrated_rows_override_the_priors_pair_by_pair():
    row = {"domain": "cooling_loop", "class": "gray", "n": 8, "source": "measured",
           "lognormal": {"mu": math.log(40), "sigma": 0.5}, "p50_s": 40.0, "records": {}}
    table = parse_policy({"objective": {"fault_durations": [row]}}).objective.duration_table()
    assert table[("cooling_loop", GRAY)].family == LOGNORMAL and table[("cooling_loop", GRAY)].n == 8
    assert table[("node", HARD)].mean_s == 86400.0  # the prior still


@pytest.mark.parametrize("row, words", [
    ({"domain": "node", "class": "grey", "mean_s": 10}, "class must be one of hard, gray"),
    ({"domain": "node", "class": "gray", "mean_s": -1}, "mean_s must be > 0"),
    ({"domain": "node", "class": "gray"}, "mean_s must be a finite number"),
    ({"domain": "node", "class": "gray", "lognormal": {"mu": 3.0}}, "sigma must be a finite number"),
    ({"domain": "node", "class": "gray", "family": "weibull", "mean_s": 3}, "family must be"),
    ({"class": "gray", "mean_s": 3}, "domain must be a non-empty string"),
    ("node gray 10", "expected a mapping"),
])
def test_a_bad_row_is_one_line_naming_where_and_what(row, words):
    with pytest.raises(ValueError) as e:
        duration_from_row(row, "durations[2]")
    assert words in str(e.value) and str(e.value).startswith("durations[2]") and "\n" not in str(e.value)
    with pytest.raises(PolicyError) as p:
        parse_policy({"objective": {"fault_durations": [row]}}, "my-policy.yaml")
    assert "my-policy.yaml" in str(p.value) and words in str(p.value)


def test_a_fault_is_as_old_as_its_entity_has_been_out_of_healthy():
    first = onsets({}, ["cooling_loop:a", "node:h0"], 100.0)
    later = onsets(first, ["cooling_loop:a", "node:h1"], 130.0)
    assert later == {"cooling_loop:a": 100.0, "node:h1": 130.0}  # h0 recovered: forgotten
    clock = FaultClock({("cooling_loop", GRAY): Duration("cooling_loop", GRAY, EXPONENTIAL, 500.0)}, later, 160.0,
                       3600.0)
    r = clock.remaining("cooling_loop:a", [("cooling_loop", GRAY)])
    assert (r.age_s, r.remaining_s) == (60.0, 500.0)
    assert clock.remaining("cooling_loop:a", [("cooling_loop", HARD)]).remaining_s == 3600.0  # none: the horizon
    long = FaultClock({("node", GRAY): Duration("node", GRAY, EXPONENTIAL, 86400.0)}, later, 160.0, 3600.0)
    assert long.remaining("node:h1", [("node", GRAY)]).remaining_s == 3600.0  # no further than the horizon
