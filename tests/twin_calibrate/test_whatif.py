"""Policy what-ifs on a calibrated window (twin/whatif.py, `twin simulate --calibrated --whatif`).

A constructed window: ten GPUs of a 1,024-node fleet go slow together for twelve hours (gray
incidents in the ledger, nothing hard). The controller drains a slowed GPU's node when the
economics say so (the slowed GPUs land on twin nodes drawn at random, some under a job where a
drain pays); a dry run drains nothing, a breaker of two nodes holds every drain past the second,
a drain floor above every slowdown drains none. Each must show in the replay as the sign of the
change against the base, and the base itself must drain.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from seamguard.app.cli import app
from seamguard.twin.calibrate import calibrate, published_priors
from seamguard.twin.calibrated import seamguard_params
from seamguard.twin.events.calibration import llama3_failure_model
from seamguard.twin.events.config import ClusterConfig, ControllerSettings
from seamguard.twin.history import exposure
from seamguard.twin.whatif import replay_streams, variants, whatif

CFG = ClusterConfig(gpus=8192, days=2.0, workload="mix")
ONSET_S, LASTS_S = 6 * 3600.0, 12 * 3600.0


def _slow_window(n: int = 10) -> dict:
    rows = []
    for k in range(n):
        ent = f"gpu{k:03d}/gpu0"
        rows += [{"id": 2 * k + 1, "tick": 1, "t_s": ONSET_S, "kind": "gpu", "entity": ent,
                  "from_state": "healthy", "to_state": "degraded", "reasons": []},
                 {"id": 2 * k + 2, "tick": 2, "t_s": ONSET_S + LASTS_S, "kind": "gpu", "entity": ent,
                  "from_state": "degraded", "to_state": "healthy", "reasons": []}]
    return calibrate(rows, [], [], exposure(CFG), 0.0, CFG.horizon_s, *published_priors(llama3_failure_model()))


@pytest.fixture(scope="module")
def answer() -> dict:
    doc = _slow_window()
    asked = variants([], ["mode=dry_run", "breaker=0.001", "breaker=off", "drain_min_slowdown=0.9"])
    return {v["variant"]: v for v in whatif(doc, CFG, asked, seamguard_params(doc), 2, 3, 0)["variants"]}


def test_the_windows_incidents_are_replayed_as_they_happened():
    doc = _slow_window()
    s, skipped = replay_streams(doc, CFG, np.random.default_rng(0))
    assert skipped == {}
    assert s.slow_t.tolist() == [ONSET_S] * 10 and s.slow_dur_s.tolist() == [LASTS_S] * 10
    assert not s.slow_comm.any()  # a GPU's slowdown is compute
    assert s.fail_t.size == 0 and s.cool_t.size == 0  # nothing hard, no cooling in the window


def test_each_policy_variant_changes_the_outcome_the_way_it_must(answer):
    base = answer["base"]
    assert base["drained_nodes"][0] > 2 and base["held_by_breaker"][2] == 0
    dry = answer["mode=dry_run"]
    assert dry["drained_nodes"][2] == 0 and dry["delta_ettr"][2] < 0  # worse in every sample
    held = answer["breaker=0.001"]  # max(0.001 x 1,024, 2 nodes) = 2 per window
    assert held["drained_nodes"] == [2, 2, 2] and held["held_by_breaker"][0] > 0
    assert held["breaker_tripped_share"] == 1.0
    assert held["delta_ettr"][2] < 0 and held["delta_gpu_hours"][2] < 0
    floor = answer["drain_min_slowdown=0.9"]  # the twin's slowdowns are 10-50 %: none is drained
    assert floor["drained_nodes"][2] == 0 and floor["delta_ettr"][2] < 0
    off = answer["breaker=off"]  # the default bound never held ten nodes on a 1,024-node fleet
    assert off["delta_ettr"] == [0.0, 0.0, 0.0] and off["held_by_breaker"][2] == 0
    assert 0 < dry["ettr"][1] < base["ettr"][1] <= 1


@pytest.mark.parametrize("base,whatifs,msg", [
    ([], ["mode=maybe"], "mode must be one of enforce, dry_run"),
    ([], ["breaker=2"], "breaker_max_fleet_fraction must be in (0, 1]"),
    ([], ["speed=3"], "KNOB one of mode, breaker"),
    ([], ["breaker="], "give 1 to 12 values"),
    (["breaker=0.1,0.2"], ["mode=dry_run"], "one value per knob"),
    ([], ["breaker_min_nodes=1.5"], "whole number of nodes"),
])
def test_bad_settings_are_one_line_errors(base, whatifs, msg):
    with pytest.raises(ValueError) as e:
        variants(base, whatifs)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_controller_settings_validate():
    with pytest.raises(ValueError, match="breaker_window_s"):
        ControllerSettings(breaker_window_s=1.0)


def test_cli_whatif_answers_and_refuses_bad_input(tmp_path):
    path = tmp_path / "cal.yaml"
    doc = _slow_window()
    doc["jobs"] = {"train": {"gpus_in_topology": 4096}}
    path.write_text(yaml.safe_dump(json.loads(json.dumps(doc, default=str))))
    r = CliRunner().invoke(app, ["twin", "simulate", "--calibrated", str(path), "--runs", "2", "--draws", "1",
                                 "--whatif", "mode=dry_run", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])["whatif"]
    assert [v["variant"] for v in out["variants"]] == ["base", "mode=dry_run"]
    assert out["incidents_in_window"] == {"hard": 0, "gray": 10} and out["samples"]["done"] == 2
    assert out["variants"][1]["delta_ettr"][2] < 0
    r = CliRunner().invoke(app, ["twin", "simulate", "--calibrated", str(path), "--runs", "2", "--draws", "1",
                                 "--whatif", "mode=dry_run"])
    assert r.exit_code == 0 and "mode=dry_run: ETTR -" in r.output, r.output
    for argv, msg in ((["--calibrated", str(path), "--whatif", "breaker=7"], "--whatif/--base: "),
                      (["--whatif", "mode=dry_run"], "--whatif, --base and --controller-policy need --calibrated FILE"),
                      (["--calibrated", str(path), "--whatif", "mode=enforce", "--controller-policy", str(tmp_path / "no.yaml")],
                       "--controller-policy: "),
                      (["--calibrated", str(path), "--base", "mode=dry_run"], "give at least one --whatif")):
        r = CliRunner().invoke(app, ["twin", "simulate", *argv])
        assert r.exit_code == 2 and msg in r.output and r.output.count("error:") == 1, r.output


def test_cli_base_is_the_policy_files_mode_and_breaker(tmp_path):
    path, pol = tmp_path / "cal.yaml", tmp_path / "policy.yaml"
    doc = _slow_window()
    doc["jobs"] = {"train": {"gpus_in_topology": 4096}}
    path.write_text(yaml.safe_dump(json.loads(json.dumps(doc, default=str))))
    pol.write_text(yaml.safe_dump({"version": 1, "mode": "dry_run", "breaker": {"max_fleet_fraction": 0.3,
                                                                                "window_s": 1800.0}}))
    r = CliRunner().invoke(app, ["twin", "simulate", "--calibrated", str(path), "--runs", "1", "--draws", "1",
                                 "--controller-policy", str(pol), "--whatif", "mode=enforce", "--json"])
    assert r.exit_code == 0, r.output
    base, enforce = json.loads(r.output.strip().splitlines()[-1])["whatif"]["variants"]
    assert base["settings"]["mode"] == "dry_run" and enforce["settings"]["mode"] == "enforce"
    for v in (base, enforce):
        assert (v["settings"]["breaker_max_fleet_fraction"], v["settings"]["breaker_window_s"]) == (0.3, 1800.0)
    assert enforce["delta_ettr"][0] > 0  # enforcing drains the slowed GPUs the dry run leaves running


def test_a_measured_detector_is_run_at_its_recall_bound_too(tmp_path):
    from seamguard.twin.events.detection import parse_detection_results
    from tests.twin_events.test_baselines_tuned import _detection_doc

    doc = _slow_window()
    blind = parse_detection_results(_detection_doc(0.0, 30.0, 60.0, precision=1.0), "blind.json")
    out = whatif(doc, CFG, variants([], ["mode=dry_run"]), seamguard_params(doc, blind), 2, 2, 0)
    assert out["samples"]["detection"] == ["blind.json", "blind.json (recall at its 95% lower bound)"]
    base, dry = out["variants"]
    assert base["drained_nodes"] == [0, 0, 0]  # a detector that finds nothing leaves nothing to drain
    assert abs(dry["delta_ettr"][1]) < 0.01  # and enforcing it buys nothing a dry run lacks
