"""The one runner: `run --config` and `serve --config` read a config the same way; state survives."""

import textwrap

import numpy as np
import pytest

from seamguard.act.base import ActionResult
from seamguard.app.config import load_run_config
from seamguard.app.runner import Runner
from seamguard.app.sources import TwinSource
from seamguard.control import Controller
from seamguard.decide import Verb, default_policy
from seamguard.fleet import FleetShape, generate_fleet, fleet_to_topology
from seamguard.ledger import Ledger
from seamguard.twin.telemetry import Twin, TwinConfig


def _config(tmp_path, **extra):
    import yaml

    fleet = generate_fleet(FleetShape(gpus=64), seed=1)
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(fleet_to_topology(fleet)))
    (tmp_path / "policy.yaml").write_text("breaker:\n  max_fleet_fraction: 0.02\n  max_loop_fraction: 0.1\n")
    body = textwrap.dedent("""\
        version: 1
        topology: topo.yaml
        policy: policy.yaml
        mode: enforce
        tick_s: 5
        ledger: state/ledger.sqlite
        prometheus: {url: "http://127.0.0.1:9"}
        actuators: [{type: log, path: actions.jsonl}]
        """)
    (tmp_path / "state").mkdir()
    (tmp_path / "run.yaml").write_text(body)
    return load_run_config(tmp_path / "run.yaml")


def test_from_config_uses_the_configs_policy_mode_and_ledger(tmp_path):
    cfg = _config(tmp_path)
    r = Runner.from_config(cfg)
    try:
        assert r.controller.policy.breaker.max_fleet_fraction == 0.02
        assert r.controller.mode == "enforce"
        assert r.ledger_path == str(tmp_path / "state" / "ledger.sqlite")
        assert [a.name for a in r.controller.actuators] == ["log"]
    finally:
        r.close()
    assert (tmp_path / "state" / "ledger.sqlite").exists()


def test_an_operators_dry_run_survives_a_restart_but_never_upgrades_to_enforce(tmp_path):
    fleet = generate_fleet(FleetShape(gpus=64), seed=1)
    path = tmp_path / "ledger.sqlite"
    ctl = Controller(fleet, default_policy(), [], Ledger(path), tick_s=5.0, mode="enforce")
    ctl.set_mode("dry_run", by="alice")
    ctl.ledger.close()
    again = Controller(fleet, default_policy(), [], Ledger(path), tick_s=5.0, mode="enforce")
    assert again.mode == "dry_run"
    again.set_mode("enforce", by="alice")
    again.ledger.close()
    # A config that says dry_run stays dry_run whatever the ledger remembers.
    assert Controller(fleet, default_policy(), [], Ledger(path), tick_s=5.0, mode="dry_run").mode == "dry_run"


class Refuses:
    """An actuator that refuses every drain permanently (e.g. the scheduler has no such node)."""

    name = "refuses"
    verbs = frozenset({Verb.DRAIN})

    def __init__(self) -> None:
        self.calls = 0

    def observe(self) -> set[str]:
        return set()

    def apply(self, action) -> ActionResult:
        self.calls += 1
        return ActionResult(False, "no such node", retryable=False)

    def revert(self, key) -> ActionResult:
        return ActionResult(True)


def test_a_permanent_failure_is_recorded_once_not_retried_every_tick(tmp_path):
    fleet = generate_fleet(FleetShape(gpus=512), seed=2)
    act = Refuses()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ctl = Controller(fleet, default_policy(mode="enforce"), [act], ledger, tick_s=5.0)
    twin = Twin(fleet, [], TwinConfig(tick_s=5.0), seed=4)
    gpus = np.flatnonzero(fleet.gpu_node == 3)
    statuses = []
    for i in range(14):
        f = twin.step()
        if i >= 3:
            twin.gpu_sbe[gpus] += 20
        statuses += [c.status for c in ctl.tick(f).changes if c.verb == "drain"]
    assert statuses == ["refused"], statuses
    assert act.calls == 1


def test_a_dead_loop_is_reported_and_run_raises(tmp_path):
    src = TwinSource(gpus=64, minutes=2.0, seed=0, counterfactual=False)
    r = Runner(src, speed=1000.0, ledger_path=tmp_path / "l.sqlite")

    def boom(snap):
        raise MemoryError("simulated")

    r._publish = boom  # a failure outside the controller's per-tick guard
    with pytest.raises(RuntimeError, match="MemoryError"):
        r.run()
    assert r.fatal.startswith("MemoryError") and not r.healthy


class Flaky:
    """An actuator whose state cannot be read every other call (a hung or failing sinfo)."""

    name = "flaky"
    verbs = frozenset({Verb.DRAIN})

    def __init__(self) -> None:
        self.calls = 0

    def observe(self) -> set[str]:
        self.calls += 1
        if self.calls % 2 == 0:
            raise RuntimeError("sinfo: timed out")
        return set()

    def apply(self, action) -> ActionResult:
        return ActionResult(True)

    def revert(self, key) -> ActionResult:
        return ActionResult(True)


def test_a_failing_source_or_actuator_never_kills_the_loop(tmp_path):
    src = TwinSource(gpus=64, minutes=2.0, seed=0, counterfactual=False)
    flaky = Flaky()
    src.actuators = lambda: [flaky]
    real = src.next_frame
    calls = {"n": 0}

    def sometimes(wall_s):
        calls["n"] += 1
        if calls["n"] in (3, 4):
            raise ConnectionError("prometheus: connection refused")
        return real(wall_s)

    src.next_frame = sometimes
    r = Runner(src, speed=1000.0, ledger_path=tmp_path / "l.sqlite", max_ticks=8)
    assert r.run() == 8 and not r.fatal
    assert flaky.calls >= 8


def test_run_stops_after_max_ticks_and_writes_events(tmp_path):
    src = TwinSource(gpus=64, minutes=2.0, seed=0, counterfactual=False)
    out = tmp_path / "events.jsonl"
    r = Runner(src, speed=1000.0, ledger_path=tmp_path / "l.sqlite", events_out=out, max_ticks=4)
    assert r.run() == 4
    assert out.exists()


def test_tick_line_names_what_changed_and_counts_the_rest():
    from types import SimpleNamespace as NS

    from seamguard.act.reconcile import Change
    from seamguard.app.runner import tick_line
    from seamguard.assess.states import State
    from seamguard.control import TickReport
    from seamguard.fleet.model import Kind

    def tr(e):
        return NS(kind=Kind.GPU, entity=e, from_state=State.HEALTHY, to_state=State.DEGRADED)

    quiet = TickReport(tick=3, t_s=0.0, assessment=NS(transitions=[]), decisions=None)
    assert tick_line(quiet) == ""
    busy = TickReport(tick=4, t_s=0.0, assessment=NS(transitions=[tr(f"n{i}/gpu0") for i in range(5)]),
                      decisions=None,
                      changes=[Change("apply", "drain:n1", None, "slurm", "dry_run", "")])
    line = tick_line(busy)
    assert line.startswith("tick 4: gpu n0/gpu0 healthy->degraded, gpu n1/gpu0 healthy->degraded, ")
    assert "(+2 more)" in line and "n3/gpu0" not in line and line.endswith("apply drain:n1 (dry_run)")
    failed = TickReport(tick=5, t_s=0.0, assessment=None, decisions=None, error="boom")
    assert tick_line(failed) == ""
