"""The held-out physics: gradual and intermittent onsets, healthy backgrounds, classes with no
channel, and a version that pins the histories it makes."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from seamguard.scenarios import Scenario, ScenarioSpec
from seamguard.scenarios.faults import FAULT_CLASS_NAMES, HELDOUT_CLASS_NAMES
from seamguard.scenarios.shifted import BACKGROUND, GENERATOR_VERSION, Onset

# sha256 of a small held-out history (values rounded to 0.1) per generator version: a change to
# the physics that does not bump GENERATOR_VERSION fails here.
DIGESTS = {"2026.12-1": "3732bfcd96af28e0da3926de1df9314740d0a18d88f85525fc14d20b0b24530c",
           "2026.12-2": "4a568f836085b0bd4971a6c1b2b59d36bd9635578308b22f1911acd0fc3e496b"}


def _run(spec: ScenarioSpec, onset: Onset | None = None):
    sc = Scenario(spec)
    if onset is not None:
        for f in sc.faults:
            f.state["onset"] = onset
    rows: list[tuple[float, dict]] = []
    sc.run(lambda t, v, d: rows.append((t - spec.start_unix, {k: a.copy() for k, a in v.items()})))
    return sc, rows


def _clock_deficit(sc, rows):
    """Per scrape after the fault's start: 1 - the faulty GPU's clock / its node peers' median, at load."""
    f = sc.faults[0]
    peers = np.flatnonzero((sc.fleet.gpu_node == sc.fleet.gpu_node[f.index]) & (np.arange(len(sc.fleet.gpu_names))
                                                                                 != f.index))
    out = []
    for t, v in rows:
        clk, util = v["DCGM_FI_DEV_SM_CLOCK"], v["DCGM_FI_DEV_GPU_UTIL"]
        if t < f.start_s or not np.isfinite(clk[f.index]) or util[f.index] < 50:
            continue
        out.append((t - f.start_s, 1 - clk[f.index] / np.nanmedian(clk[peers])))
    return np.array(out)


def test_ramp_onset_grows_gradually_to_full_strength():
    spec = ScenarioSpec(gpus=64, minutes=60, seed=1001, physics="shifted", faults=("fail_slow_gpu",))
    sc, rows = _run(spec, Onset("ramp", ramp_s=900.0))
    d = _clock_deficit(sc, rows)
    full = sc.faults[0].params["clock"]
    early = d[d[:, 0] <= 120, 1]
    mid = d[(d[:, 0] >= 400) & (d[:, 0] <= 500), 1]
    late = d[d[:, 0] >= 960, 1]
    assert len(early) and len(mid) and len(late)
    assert early.max() < 0.35 * (1 - full)  # a step would show the whole deficit at once
    assert 0.3 * (1 - full) < np.median(mid) < 0.75 * (1 - full)
    assert np.median(late) > 0.85 * (1 - full)


def test_intermittent_fault_toggles_on_and_off():
    spec = ScenarioSpec(gpus=64, minutes=60, seed=1002, physics="shifted", faults=("fail_slow_gpu",))
    sc, rows = _run(spec, Onset("intermittent", on_s=120.0, off_s=240.0))
    d = _clock_deficit(sc, rows)
    on = d[:, 1] > 0.5 * (1 - sc.faults[0].params["clock"])
    toggles = int(np.count_nonzero(on[1:] != on[:-1]))
    assert on.any() and (~on).any()
    assert toggles >= 3
    phase_on = (d[:, 0] % 360.0) < 120.0
    assert np.mean(on == phase_on) > 0.85  # on exactly when its schedule says


def _increases(rows, name):
    a = np.array([v[name] for _, v in rows], dtype=float)
    with np.errstate(invalid="ignore"):
        d = np.diff(a, axis=0)
    return np.where(np.isfinite(d) & (d > 0), d, 0.0).sum(axis=0)


@pytest.mark.parametrize("kind", ["gpu", "nic", "node"])
def test_healthy_fleet_has_background_errors_on_every_counter_at_documented_shares(kind):
    rows = _run(ScenarioSpec(gpus=512, minutes=60, seed=1003, physics="shifted"))[1]
    dev_rows = _run(ScenarioSpec(gpus=512, minutes=60, seed=1003))[1]
    n = {"gpu": 512, "nic": len(rows[0][1]["node_infiniband_state_id"]), "node": 64}[kind]
    for name, share, per_h, burst in BACKGROUND[kind]:
        inc = _increases(rows, name)
        dev = _increases(dev_rows, name) if name in dev_rows[0][1] else np.zeros(1)
        if dev.sum() > 0:  # the development physics' own noise is there too: only more of it
            assert inc.sum() > 0, name
            continue
        # The documented rate: events per hour = entities x prone share x rate (lognormal spread,
        # mean exp(0.7^2 / 2)), each a burst. Rare counters may show nothing in an hour.
        events = n * share * per_h * np.exp(0.245)
        if events >= 5:
            assert inc.sum() > 0, name
        assert inc.sum() <= 3 * events * burst[1] + 10, (name, inc.sum(), events)
        if events >= 5:
            assert inc.sum() >= 0.25 * events * burst[0], (name, inc.sum(), events)
        assert float(np.mean(inc > 0)) <= min(1.0, 2.5 * share), (name, float(np.mean(inc > 0)), share)
    assert "node_edac_correctable_errors_total" not in dev_rows[0][1]  # development physics unchanged


def test_flow_noise_and_checkpoints_are_wider_when_shifted():
    spec = dict(gpus=512, minutes=60, seed=1004)
    dev, dev_rows = _run(ScenarioSpec(**spec))
    sh, sh_rows = _run(ScenarioSpec(**spec, physics="shifted"))

    def noise(rows):
        f = np.array([v["seamguard_coolant_flow_lpm"] for _, v in rows])
        return float(np.nanmedian(np.nanstd(f / np.nanmedian(f, axis=0), axis=0)))

    assert noise(dev_rows) < 0.006 < 0.008 < noise(sh_rows) < 0.013
    lengths = [e.end_s - e.t_s for e in sh.events if e.what == "checkpoint"]
    assert max(lengths) > 150 and max(lengths) <= 300
    assert any(e.what == "exporter_stale" for e in sh.events)


def test_stale_exporter_repeats_its_last_values():
    sc, rows = _run(ScenarioSpec(gpus=512, minutes=60, seed=1005, physics="shifted"))
    e = next(e for e in sc.events if e.what == "exporter_stale")
    gs = np.flatnonzero(sc.fleet.gpu_node == e.index)
    inside = [v["DCGM_FI_DEV_POWER_USAGE"][gs] for t, v in rows if e.t_s + 30 <= t < e.end_s]
    assert len(inside) >= 4
    finite = [x for x in inside if np.isfinite(x).all()]
    assert all(np.array_equal(finite[0], x) for x in finite)  # power never repeats to the milliwatt by itself
    after = [v["DCGM_FI_DEV_POWER_USAGE"][gs] for t, v in rows if t >= e.end_s + 30]
    assert after and not all(np.array_equal(after[0], x) for x in after)


def test_classes_without_a_channel_change_only_what_their_physics_says():
    assert set(FAULT_CLASS_NAMES) < set(HELDOUT_CLASS_NAMES)
    spec = ScenarioSpec(gpus=256, minutes=60, seed=1006, physics="shifted",
                        faults=("pcie_downtrain", "host_memory_ue", "hbm_heat"))
    sc, rows = _run(spec, Onset())
    by = {f.cls: f for f in sc.faults}
    pd, hm, hb = by["pcie_downtrain"], by["host_memory_ue"], by["hbm_heat"]
    last = rows[-1][1]
    assert last["DCGM_FI_DEV_PCIE_LINK_WIDTH"][pd.index] in (4.0, 8.0)
    assert np.nanmin(rows[0][1]["DCGM_FI_DEV_PCIE_LINK_WIDTH"]) == 16.0
    ce = _increases([r for r in rows if r[0] >= hm.start_s], "node_edac_correctable_errors_total")
    assert ce[hm.index] > 0
    if hm.hard_failure_s is not None:
        ue = _increases(rows, "node_edac_uncorrectable_errors_total")
        assert ue[hm.index] == 1
        gone = [v["DCGM_FI_DEV_GPU_TEMP"][sc.fleet.gpu_node == hm.index] for t, v in rows if t > hm.hard_failure_s + 60]
        assert gone and all(np.isnan(x).all() for x in gone)  # the host crashed: its series vanished
    before = [v for t, v in rows if t < hb.start_s]
    after = [v for t, v in rows if t > hb.start_s + hb.params["ramp_s"]]
    gap = lambda vs, n: np.nanmedian([v["DCGM_FI_DEV_MEMORY_TEMP"][hb.index] - v["DCGM_FI_DEV_GPU_TEMP"][hb.index]
                                      for v in vs])  # noqa: E731
    assert gap(after, 0) - gap(before, 0) > 0.8 * hb.params["rise_c"]


def test_generator_version_pins_the_history_and_is_recorded():
    sc, rows = _run(ScenarioSpec(gpus=64, minutes=20, seed=1000, physics="shifted",
                                 faults=("ecc_sbe", "pcie_downtrain", "nic_link_flap")))
    assert sc.truth()["spec"]["generator_version"] == GENERATOR_VERSION
    assert sc.truth()["spec"]["physics"] == "shifted"
    h = hashlib.sha256()
    for t, v in rows:
        for k in sorted(v):
            h.update(k.encode())
            h.update(np.nan_to_num(np.round(v[k].astype(float), 1), nan=-1.0).tobytes())
    assert GENERATOR_VERSION in DIGESTS, "new generator version: record its digest"
    assert h.hexdigest() == DIGESTS[GENERATOR_VERSION], (
        f"the held-out history changed ({h.hexdigest()}) without a new GENERATOR_VERSION: bump it, "
        "and evaluate again on held-out seeds")


def test_unknown_physics_is_refused_in_one_line():
    with pytest.raises(ValueError, match="physics must be one of dev, shifted"):
        ScenarioSpec(physics="wild")


def _sxid_scenario(seed: int, gpus: int = 256, minutes: float = 60.0) -> Scenario:
    """A held-out scenario with one NVSwitch fault that reaches its fatal SXid (a step onset)."""
    sc = Scenario(ScenarioSpec(gpus=gpus, minutes=minutes, seed=seed, physics="shifted", faults=("nvswitch_sxid",)))
    f = sc.faults[0]
    f.state["onset"] = Onset()
    if f.hard_failure_s is None:
        f.hard_failure_s = f.start_s + min(900.0, sc.window_s - f.start_s - 120.0)
    return sc


def _sxid_run(seed: int, domain_of=None):
    sc = _sxid_scenario(seed)
    spec = sc.spec
    if domain_of is not None:  # the topology names NVLink domains wider than a node (NVL racks)
        sc.fleet = sc.sim.fleet = replace(sc.fleet, node_nvlink_domain=domain_of(sc.fleet))
    f = sc.faults[0]
    rows: list[tuple[float, dict]] = []
    sc.run(lambda t, v, d: rows.append((t - spec.start_unix, {k: a.copy() for k, a in v.items()})))
    return sc, f, rows


def test_nvswitch_sxid_non_fatal_climb_then_fatal_stops_the_nvlink_domain():
    sc, f, rows = _sxid_run(1007)
    fl, node = sc.fleet, f.index
    gs = np.flatnonzero(fl.gpu_node == node)
    nf = np.array([v["seamguard_sxid_nonfatal_link"][node] for _, v in rows])
    fatal = np.array([v["seamguard_sxid_fatal_link"][node] for _, v in rows])
    t = np.array([t for t, _ in rows])
    # The agent exports a series from the node's first SXid on; nothing before the fault starts.
    assert np.isnan(nf[t < f.start_s]).all() and np.isnan(fatal[t < f.hard_failure_s]).all()
    counts = nf[np.isfinite(nf)]
    assert len(counts) and (np.diff(counts) >= 0).all()
    assert 1 <= np.nanmax(fatal) <= f.params["links_max"]
    # Only its own node logged the port's SXids.
    others = np.array([np.delete(v["seamguard_sxid_nonfatal_link"], node) for _, v in rows])
    assert np.isnan(others).all()
    # After the fatal one: XID 74 on every GPU of the node, their work stops, the GPUs still report.
    after = [v for tt, v in rows if tt >= f.hard_failure_s + 60]
    assert after and all((v["DCGM_FI_DEV_XID_ERRORS"][gs] == 74).all() for v in after)
    assert all((v["DCGM_FI_DEV_GPU_UTIL"][gs] == 0).all() and np.isfinite(v["DCGM_FI_DEV_GPU_TEMP"][gs]).all()
               for v in after)
    before = [v for tt, v in rows if f.start_s <= tt < f.hard_failure_s]
    assert np.median([np.nanmean(v["DCGM_FI_DEV_GPU_UTIL"][gs]) for v in before]) > 50  # non-fatal: work goes on
    # After a link is down nothing more crosses it: the non-fatal count stops.
    assert len({float(v["seamguard_sxid_nonfatal_link"][node]) for v in after}) == 1
    assert (np.array([v["seamguard_agent_info"] for _, v in rows]) == 1).any(axis=0).all()


def test_fatal_sxid_takes_down_every_node_of_a_shared_nvlink_domain():
    pairs = lambda fl: np.arange(len(fl.node_names)) // 2  # noqa: E731 (two nodes per NVLink domain)
    sc, f, rows = _sxid_run(1008, pairs)
    fl = sc.fleet
    dom = np.flatnonzero(pairs(fl) == pairs(fl)[f.index])
    assert len(dom) == 2
    last = rows[-1][1]
    in_dom = np.isin(fl.gpu_node, dom)
    assert (last["DCGM_FI_DEV_XID_ERRORS"][in_dom] == 74).all()
    assert not (last["DCGM_FI_DEV_XID_ERRORS"][~in_dom] == 74).any()
    # The kernel log that shows the switch's SXids is the node's whose driver saw them (the labelled one).
    assert np.isfinite(last["seamguard_sxid_fatal_link"][f.index])
    assert np.isnan(np.delete(last["seamguard_sxid_fatal_link"], f.index)).all()


def test_sxid_series_are_written_as_the_agent_labels_them(tmp_path):
    from seamguard.scenarios import OpenMetricsWriter

    sc = _sxid_scenario(1009, gpus=128, minutes=20)
    writer = OpenMetricsWriter(tmp_path / "h.om", sc.fleet)
    sc.run(writer)
    text = writer.close().read_text()
    node = sc.fleet.node_names[sc.faults[0].index]
    assert text.count("# TYPE seamguard_sxid_errors_total ") == 1  # one family, every code and severity in it
    line = next(ln for ln in text.splitlines() if ln.startswith("seamguard_sxid_errors_total{"))
    for lab in ('job="seamguard-agent"', f'node="{node}"', 'pci_bus_id="', 'severity="'):
        assert lab in line, line
    assert f'severity="fatal",sxid="20034"}}' in text
    assert f'node="{node}"' in text
    assert f'seamguard_agent_info{{instance="{node}:9475",job="seamguard-agent",node="{node}"}} 1' in text


def test_held_out_classes_need_the_held_out_physics():
    with pytest.raises(ValueError, match="nvswitch_sxid exist only in the held-out physics"):
        ScenarioSpec(faults=("nvswitch_sxid",))
    assert "nvswitch_sxid" in HELDOUT_CLASS_NAMES and "nvswitch_sxid" not in FAULT_CLASS_NAMES


def test_scenarios_cli_chooses_the_physics(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "seamguard", "scenarios", "generate", *args], env=env,
                              capture_output=True, text=True, timeout=300)

    r = cli("--out-dir", str(tmp_path / "s"), "--gpus", "128", "--minutes", "20", "--physics", "shifted",
            "--faults", "nvswitch_sxid", "-o", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["physics"] == "shifted" and d["generator_version"] == GENERATOR_VERSION
    assert json.loads(Path(d["truth"]).read_text())["spec"]["physics"] == "shifted"
    assert "# TYPE seamguard_agent_info " in Path(d["openmetrics"]).read_text()  # the held-out physics' agent
    for args, msg in ((["--physics", "wild"], "--physics: expected one of dev, shifted"),
                      (["--faults", "nvswitch_sxid"], "unknown fault class(es) for --physics dev: nvswitch_sxid")):
        r = cli("--out-dir", str(tmp_path / "x"), *args)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and msg in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
