"""The controller shell: breaker, ledger, dry-run, bad ticks, restart without duplicate actions."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from seamguard.act import LogActuator
from seamguard.control import Controller
from seamguard.decide import PolicyError, default_policy, parse_policy
from seamguard.fleet import FleetShape, Kind, generate_fleet
from seamguard.ledger import Ledger
from seamguard.observe import make_frame
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=512), seed=2)


def _frames_with_dead_gpus(fleet, n_ticks, sick_nodes, start=3):
    """Twin frames where the given nodes' GPUs climb in correctable errors (quarantine-level)."""
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    gpus = np.flatnonzero(np.isin(fleet.gpu_node, sick_nodes))
    for i in range(n_ticks):
        f = twin.step()
        if i >= start:
            twin.gpu_sbe[gpus] += 20  # 20 errors / 5 s = 14,400 per hour
        yield f


def test_breaker_trips_stays_tripped_and_persists(tmp_path):
    sick = list(range(0, 40, 2))  # 20 of 64 nodes: far past a 5 % fleet budget
    pol = default_policy(mode="enforce")
    log = LogActuator(tmp_path / "actions.jsonl")
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ctl = Controller(FLEET, pol, [log], ledger, tick_s=5.0)
    for f in _frames_with_dead_gpus(FLEET, 12, sick):
        ctl.tick(f)
    drained = {k for k in log.observe() if k.startswith("drain:")}
    budget = int(pol.breaker.max_fleet_fraction * FLEET.count(Kind.NODE))
    assert ctl.breaker.tripped and "of the fleet" in ctl.breaker.reason
    assert 0 < len(drained) <= budget
    held = [d for d in ledger.decisions() if d["event"] == "held_by_breaker"]
    assert held
    # stays tripped on later, healthy ticks, and across a restart from the ledger
    for f in _frames_with_dead_gpus(FLEET, 3, []):
        ctl.tick(f)
    assert ctl.breaker.tripped
    ledger.close()
    ctl2 = Controller(FLEET, pol, [log], Ledger(tmp_path / "ledger.sqlite"), tick_s=5.0)
    assert ctl2.breaker.tripped
    ctl2.reset_breaker()
    assert not ctl2.breaker.tripped


def test_dry_run_changes_nothing_and_records_each_decision_once(tmp_path):
    log = LogActuator(tmp_path / "actions.jsonl")
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(FLEET, default_policy(), [log], ledger, tick_s=5.0)
    assert ctl.mode == "dry_run"
    for f in _frames_with_dead_gpus(FLEET, 10, [5]):
        ctl.tick(f)
    assert log.observe() == set()
    rows = ledger.actions()
    assert rows and all(r["status"] == "dry_run" for r in rows)
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys))


def test_a_bad_frame_fails_the_tick_not_the_controller(tmp_path):
    ledger = Ledger(tmp_path / "l.sqlite")
    ctl = Controller(FLEET, default_policy(), [], ledger, tick_s=5.0)
    frames = list(_frames_with_dead_gpus(FLEET, 3, []))
    bad = frames[1]
    bad.values["DCGM_FI_DEV_GPU_TEMP"] = bad.values["DCGM_FI_DEV_GPU_TEMP"][:10]  # wrong shape
    reports = [ctl.tick(f) for f in frames]
    assert not reports[0].error and reports[1].error and not reports[2].error
    assert ledger.get_meta("tick_error.1")


def test_frame_shape_errors_name_the_signal():
    from seamguard.observe import FrameError
    with pytest.raises(FrameError, match="DCGM_FI_DEV_GPU_TEMP.*expected shape"):
        make_frame(FLEET, 0.0, {"DCGM_FI_DEV_GPU_TEMP": np.zeros(3)})
    with pytest.raises(FrameError, match="unknown signal 'nope'"):
        make_frame(FLEET, 0.0, {"nope": np.zeros(3)})


def test_policy_errors_name_the_field(tmp_path):
    with pytest.raises(PolicyError, match=r"breaker\.max_fleet_fraction: Input should be less than or equal to 1"):
        parse_policy({"breaker": {"max_fleet_fraction": 3}}, "p.yaml")
    with pytest.raises(PolicyError, match=r"actions\.drain_states: .*unknown state 'broken'"):
        parse_policy({"actions": {"drain_states": ["broken"]}}, "p.yaml")
    with pytest.raises(PolicyError, match=r"assess\.hysteresis\.gpu"):
        parse_policy({"assess": {"hysteresis": {"gpu": {"degrade_enter": 0.2, "degrade_exit": 0.4}}}}, "p.yaml")


CRASHING_CONTROLLER = textwrap.dedent('''
    import os, sys
    import numpy as np
    from seamguard.act import LogActuator
    from seamguard.control import Controller
    from seamguard.decide import default_policy
    from seamguard.fleet import FleetShape, generate_fleet
    from seamguard.ledger import Ledger
    from seamguard.twin.telemetry import Twin, TwinConfig

    class CrashingLog(LogActuator):
        """Dies (no cleanup, like kill -9) right after its N-th apply reaches the world."""
        def __init__(self, path, crash_after):
            super().__init__(path)
            self.crash_after, self.applied = crash_after, 0
        def apply(self, action):
            res = super().apply(action)
            self.applied += 1
            if self.applied == self.crash_after:
                os._exit(17)
            return res

    out, crash_after, n_ticks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fleet = generate_fleet(FleetShape(gpus=512), seed=2)
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    sick = np.flatnonzero(np.isin(fleet.gpu_node, [3, 9]))
    ctl = Controller(fleet, default_policy(mode="enforce"), [CrashingLog(out + "/world.jsonl", crash_after)],
                     Ledger(out + "/ledger.sqlite"), tick_s=5.0)
    # Replay the same deterministic world up to where the controller resumes.
    for i in range(n_ticks):
        f = twin.step()
        if i >= 3:
            twin.gpu_sbe[sick] += 20
        if i >= ctl.tick_no:
            ctl.tick(f)
''')


def test_killed_mid_tick_resumes_without_repeating_or_losing_actions(tmp_path):
    script = tmp_path / "ctl.py"
    script.write_text(CRASHING_CONTROLLER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    # First run dies right after the first action of the first acting tick reached the world.
    r1 = subprocess.run([sys.executable, str(script), str(tmp_path), "1", "20"], env=env, timeout=120)
    assert r1.returncode == 17
    ledger = Ledger(tmp_path / "ledger.sqlite")
    pending = [a for a in ledger.actions() if a["status"] == "pending"]
    assert len(pending) == 1  # the action the crash interrupted was recorded as intent
    ledger.close()
    # Second run: no crash; it resumes from the ledger's last tick.
    r2 = subprocess.run([sys.executable, str(script), str(tmp_path), "0", "20"], env=env, timeout=120)
    assert r2.returncode == 0
    records = [json.loads(x) for x in (tmp_path / "world.jsonl").read_text().splitlines()]
    applies = [r["key"] for r in records if r["op"] == "apply"]
    assert len(applies) == len(set(applies)), "an action was applied twice"
    assert {"drain:" + FLEET.node_names[3], "drain:" + FLEET.node_names[9]} <= set(applies), "an action was lost"
    ledger = Ledger(tmp_path / "ledger.sqlite")
    statuses = {a["key"]: a["status"] for a in reversed(ledger.actions())}  # the latest row per key wins
    assert "pending" not in statuses.values()
    assert statuses[pending[0]["key"]] == "done"  # settled from the world's actual state
