"""Faults nobody named are still seen (issue 37, point 5): decision tables.

A twin fleet's frames carry two series no channel names (an HBM temperature gauge that
follows load, an NVLink traffic counter that grows with it), each GPU with its own offset
and noise. Through the controller (assess, then decide with the default policy):
- one GPU's gauge drifting away from its own past and its peers -> that GPU degraded, the
  evidence names the series, never quarantined or failed, no drain;
- the same drift on every GPU (a driver update) -> nothing;
- a counter that stops while its peers move -> a telemetry fault of that GPU;
- a series that vanishes while its host still reports -> a telemetry fault of that GPU;
- a spike of two scrapes -> nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from seamguard.assess import State
from seamguard.assess.unnamed import UnnamedJudgeConfig
from seamguard.control import Controller
from seamguard.decide import default_policy
from seamguard.decide.actions import ActionKey, Verb
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.observe.unnamed import SeriesBlock, UnnamedConfig, block_from_columns
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=64, nodes_per_storage_path=4), seed=3)
TICK = 30.0
POL = default_policy()
WARM = POL.assess.unnamed.warm_samples + 5
GAUGE, COUNTER = "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
DRAINS = (State.QUARANTINE, State.HARMFUL, State.FAILED)


class World:
    """The twin plus the two unnamed series, with hooks to bend them per tick."""

    def __init__(self, seed: int = 4) -> None:
        self.twin = Twin(FLEET, [], TwinConfig(tick_s=TICK, warm_gpu_share=0.0), seed=seed)
        self.rng = np.random.default_rng(seed)
        n = FLEET.count(Kind.GPU)
        self.offset_c = self.rng.normal(0.0, 2.0, n)  # each board its own normal
        self.bytes = np.zeros(n)
        self.ctl = Controller(FLEET, POL, tick_s=TICK)

    def tick(self, bend=None):
        frame = self.twin.step()
        util = frame.values["DCGM_FI_DEV_GPU_UTIL"] / 100.0
        n = util.size
        gauge = 45.0 + 25.0 * util + self.offset_c + self.rng.normal(0.0, 0.3, n)
        self.bytes += util * 2e9 * TICK * (1.0 + 0.05 * self.rng.standard_normal(n))
        cols = {GAUGE: gauge, COUNTER: self.bytes.copy()}
        if bend is not None:
            bend(cols)
        block = block_from_columns(Kind.GPU, n, cols, UnnamedConfig())
        rep = self.ctl.tick(replace(frame, series=(block,)))
        assert not rep.error, rep.error
        return rep

    def warm(self) -> None:
        for _ in range(WARM):
            self.tick()


def busy_gpu(i: int = 5) -> int:
    return int(np.flatnonzero(FLEET.gpu_job == 0)[i])


def unnamed_channels(rep, g: int) -> dict[str, float]:
    e = rep.assessment.kinds[Kind.GPU].evidence
    return {c: float(e.score[g, j]) for j, c in enumerate(e.channels) if ":" in c and e.score[g, j] > 0}


def drains(rep) -> list[str]:
    return [k for k in rep.decisions.desired if ActionKey.parse(k).verb == Verb.DRAIN]


def run(world: World, ticks: int, bend=None):
    reps = [world.tick(bend) for _ in range(ticks)]
    return reps


def test_a_drifting_gauge_on_one_gpu_degrades_it_naming_the_series_and_never_drains():
    w, g = World(), busy_gpu()
    w.warm()

    def hot(cols):
        cols[GAUGE][g] += 10.0
    reps = run(w, 40, hot)
    states = [int(r.assessment.kinds[Kind.GPU].states.state[g]) for r in reps]
    assert State.DEGRADED in states
    assert not any(s in DRAINS for s in states)
    assert all(not drains(r) for r in reps)
    assert max(int(r.assessment.node_state.max()) for r in reps) <= State.DEGRADED
    named = unnamed_channels(reps[-1], g)
    assert list(named) == [f"series:{GAUGE}"]
    # only that GPU: its peers are untouched
    others = [i for i in range(FLEET.count(Kind.GPU)) if i != g]
    assert all(not unnamed_channels(r, i) for r in reps for i in others)


def test_the_same_drift_on_every_gpu_is_nobodys_fault():
    w = World()
    w.warm()

    def driver_update(cols):
        cols[GAUGE] += 8.0
    reps = run(w, 20, driver_update)
    assert all(not unnamed_channels(r, i) for r in reps for i in range(FLEET.count(Kind.GPU)))
    assert all(int(r.assessment.kinds[Kind.GPU].states.state.max()) == State.HEALTHY for r in reps)


def test_a_counter_stuck_while_its_peers_move_is_a_telemetry_fault_of_that_gpu():
    w, g = World(), busy_gpu(2)
    w.warm()
    frozen = float(w.bytes[g])

    def stuck(cols):
        cols[COUNTER][g] = frozen
    reps = run(w, POL.assess.unnamed.stuck_ticks + 2, stuck)
    assert f"telemetry:{COUNTER}" in unnamed_channels(reps[-1], g)
    assert not unnamed_channels(reps[0], g)  # still for one tick is not stuck
    assert all(not unnamed_channels(reps[-1], i) for i in range(FLEET.count(Kind.GPU)) if i != g)


def test_a_series_that_vanishes_while_its_host_reports_is_a_telemetry_fault():
    w, g = World(), busy_gpu(3)
    w.warm()

    def gone(cols):
        cols[GAUGE][g] = np.nan
    reps = run(w, POL.assess.unnamed.vanish_ticks + 1, gone)
    assert f"telemetry:{GAUGE}" in unnamed_channels(reps[-1], g)
    assert all(not unnamed_channels(reps[-1], i) for i in range(FLEET.count(Kind.GPU)) if i != g)


def test_a_series_gone_everywhere_is_no_ones_telemetry_fault():
    w = World()
    w.warm()

    def dropped(cols):  # a new exporter version stopped exporting it
        cols[GAUGE][:] = np.nan
    reps = run(w, POL.assess.unnamed.vanish_ticks + 2, dropped)
    assert all(not unnamed_channels(r, i) for r in reps for i in range(FLEET.count(Kind.GPU)))


def test_a_two_scrape_spike_is_nothing():
    w, g = World(), busy_gpu(4)
    w.warm()
    k = [0]

    def spike(cols):
        k[0] += 1
        if k[0] in (2, 3):
            cols[GAUGE][g] += 20.0
    reps = run(w, 10, spike)
    assert all(not unnamed_channels(r, g) for r in reps)
    assert all(int(r.assessment.kinds[Kind.GPU].states.state[g]) == State.HEALTHY for r in reps)


# (weight, telemetry score, explain GFS): whether unnamed evidence alone could reach quarantine (0.8)
BOUND_CASES = [((0.6, 0.55, 0.2), False), ((0.8, 0.55, 0.0), True), ((0.6, 0.6, 0.5), True)]


@pytest.mark.parametrize("knobs,refused", BOUND_CASES)
def test_the_config_refuses_weights_that_could_drain_on_their_own(knobs, refused):
    w, t, e = knobs
    if refused:
        with pytest.raises(ValueError, match="on its own"):
            UnnamedJudgeConfig(weight=w, telemetry_score=t, explain_gfs=e)
    else:
        UnnamedJudgeConfig(weight=w, telemetry_score=t, explain_gfs=e)


def test_a_block_that_does_not_fit_is_refused_in_one_line():
    with pytest.raises(ValueError, match="do not fit"):
        SeriesBlock(Kind.GPU, ("a", "b"), np.zeros(2, bool), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="bad series pattern"):
        UnnamedConfig(deny=("(",))


# ---- end to end: backfilled history -> real Prometheus -> the source's one query per exporter ----
def test_a_drifting_unnamed_series_is_seen_through_a_real_prometheus(tmp_path):
    """The twin's named series and an HBM temperature gauge no signal names, written as
    OpenMetrics and backfilled; the Prometheus source's range frames carry the gauge (and
    not the exporter's version gauge, denied), and the controller degrades the one GPU
    whose gauge drifts, naming it."""
    from seamguard.observe.exposition import label_strings, render_openmetrics
    from seamguard.observe.prometheus import PromConfig, PrometheusSource
    from seamguard.testbed.prom import PrometheusServer, backfill

    twin = Twin(FLEET, [], TwinConfig(tick_s=TICK, warm_gpu_share=0.0), seed=6)
    rng = np.random.default_rng(6)
    g, n, ticks, onset = busy_gpu(1), FLEET.count(Kind.GPU), WARM + 14, WARM
    offset = rng.normal(0.0, 2.0, n)
    base = float(int(__import__("time").time() // 60 * 60) - 2 * 3600)
    frames, extra = [], []
    labels = label_strings(FLEET)
    for k in range(ticks):
        f = twin.step()
        frames.append((base + f.t_s, f))
        hbm = 45.0 + 0.25 * f.values["DCGM_FI_DEV_GPU_UTIL"] + offset + rng.normal(0.0, 0.3, n)
        hbm[g] += 10.0 if k >= onset else 0.0
        extra.append((base + f.t_s, hbm))
    om = [c for c in render_openmetrics(frames, labels) if c != "# EOF\n"]
    om.append(f"# TYPE {GAUGE} gauge\n")
    om += [f"{GAUGE}{labels[Kind.GPU][i]} {v[i]:.3f} {t:.3f}\n" for t, v in extra for i in range(n)]
    om += ["# TYPE DCGM_FI_DRIVER_VERSION gauge\n"]
    om += [f"DCGM_FI_DRIVER_VERSION{labels[Kind.GPU][i]} 1 {t:.3f}\n" for t, _ in extra for i in range(n)]
    backfill(om + ["# EOF\n"], tmp_path / "tsdb")
    ctl = Controller(FLEET, POL, tick_s=TICK)
    with PrometheusServer(tmp_path / "prom", tsdb_dir=tmp_path / "tsdb", lookback_delta="45s") as prom, \
            PrometheusSource(FLEET, PromConfig(url=prom.url)) as src:
        reps = [ctl.tick(f) for f in src.frames(frames[0][0], frames[-1][0], TICK)]
    assert all(not r.error for r in reps)
    assert [r for r in reps[:onset] if unnamed_channels(r, g)] == []
    assert any(f"series:{GAUGE}" in unnamed_channels(r, g) for r in reps[onset:])
    assert any(int(r.assessment.kinds[Kind.GPU].states.state[g]) == State.DEGRADED for r in reps)
    others = [i for i in range(n) if i != g]
    assert all(not unnamed_channels(r, i) for r in reps for i in others)
    assert GAUGE in ctl.unnamed[Kind.GPU].names and "DCGM_FI_DRIVER_VERSION" not in ctl.unnamed[Kind.GPU].names


# ---- the judge alone: a deviation the named channels already explain adds nothing --------------
@pytest.mark.parametrize("named_gfs,flagged", [(0.0, True), (0.19, True), (0.2, False), (0.9, False)])
def test_a_deviation_on_an_entity_the_named_channels_explain_adds_nothing(named_gfs, flagged):
    from seamguard.assess.unnamed import judge
    cfg = POL.assess.unnamed
    rng = np.random.default_rng(1)
    n = 12
    level = rng.normal(50.0, 2.0, n)
    st, group, learn = None, np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    named = np.zeros(n)
    for k in range(cfg.warm_samples + cfg.sustain_n + 2):
        x = level + rng.normal(0.0, 0.2, n)
        if k > cfg.warm_samples:
            x[0] += 15.0
            named[0] = named_gfs
        block = SeriesBlock(Kind.GPU, ("x",), np.zeros(1, bool), x[:, None])
        score, _, _, st = judge(block, st, 30.0 * k, group, named, learn, None, cfg)
    assert (score[0, 0] > 0) == flagged
    assert (score[1:] == 0).all()


def test_the_hinted_peer_median_is_the_leave_one_out_median():
    """The judge's sort starts from last tick's order; the result is stats.loo_median's, exactly."""
    from seamguard.assess.stats import loo_median
    from seamguard.assess.unnamed import _peer_median
    rng = np.random.default_rng(3)
    g = rng.integers(0, 40, 2000)
    order = None
    for _ in range(3):
        x = rng.normal(10.0, 3.0, 2000)
        x[rng.random(2000) < 0.1] = np.nan
        med, n, order = _peer_median(x, g, 40, order)
        ref_med, ref_n = loo_median(x, g, 40)
        np.testing.assert_array_equal(n, ref_n)
        np.testing.assert_allclose(med, ref_med, rtol=0, atol=1e-9)


# ---- the Prometheus source: one query per exporter, its answer mapped, its failure only flagged ----
def _source(handler):
    import httpx

    from seamguard.observe.prometheus import PromConfig, PrometheusSource
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return PrometheusSource(FLEET, PromConfig(url="http://prom.invalid", retries=0), client=client)


def test_the_source_maps_an_exporters_other_series_onto_its_gpus_in_one_query():
    from urllib.parse import parse_qs

    import httpx

    from seamguard.observe.prommap import entity_labels
    labels = entity_labels(FLEET, Kind.GPU)
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        q = parse_qs(request.content.decode())["query"][0]
        asked.append(q)
        result = []
        if q.startswith('{__name__=~"DCGM_.+"'):
            result = [{"metric": {"__name__": GAUGE, **labels[i]}, "value": [1.0, str(40.0 + i)]} for i in range(3)]
            result += [{"metric": {"__name__": "DCGM_FI_DRIVER_VERSION", **labels[0]}, "value": [1.0, "1"]},
                       {"metric": {"__name__": GAUGE, "Hostname": "elsewhere", "gpu": "0"}, "value": [1.0, "9"]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    with _source(handler) as src:
        frame = src.frame_at(1000.0)
    unnamed = [q for q in asked if q.startswith("{__name__")]
    assert len(unnamed) == 2  # one per exporter: dcgm-exporter and node_exporter's infiniband collector
    assert 'gpu!=""' in unnamed[0] and "DCGM_FI_DEV_GPU_TEMP" in unnamed[0]  # named series left out
    gpu = {b.kind: b for b in frame.series}[Kind.GPU]
    assert GAUGE in gpu.names and "DCGM_FI_DRIVER_VERSION" not in gpu.names
    col = gpu.values[:, gpu.names.index(GAUGE)]
    np.testing.assert_array_equal(col[:3], [40.0, 41.0, 42.0])
    assert np.isnan(col[3:]).all()


def test_a_failed_exporter_query_is_flagged_and_freezes_nothing():
    import httpx

    from seamguard.assess.quality import FailsafeConfig, bad_scopes

    def handler(request: httpx.Request) -> httpx.Response:
        if request.content.decode().startswith("query=%7B__name__"):
            return httpx.Response(503, text="overloaded")
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    with _source(handler) as src:
        frame = src.frame_at(1000.0)
    assert any(f.startswith("prometheus:unnamed:gpu:retryable") for f in frame.flags)
    assert frame.series == ()
    bad, _ = bad_scopes(FLEET, frame, FailsafeConfig(), ())
    assert not any("unnamed" in k for k in bad)
