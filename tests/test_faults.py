"""Issue 14: hostile input at every edge never kills the loop and never hangs a tick.

Each test drives the product's fault injection (seamguard.testbed.faults) against the
real source / actuator / file readers: no real Prometheus or Slurm is needed, so the
whole file runs in well under a minute.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from seamguard.act.log import LogActuator
from seamguard.act.slurm import SlurmActuator, SlurmConfig, SlurmError
from seamguard.app.config import ConfigError, load_policy, load_run_config, load_topology
from seamguard.app.runner import Runner
from seamguard.control import Controller
from seamguard.decide.actions import Action, Verb
from seamguard.decide.policy import default_policy
from seamguard.fleet.generate import FleetShape, generate_fleet
from seamguard.ledger.sqlite import Ledger
from seamguard.observe.prometheus import PromConfig, PrometheusSource
from seamguard.testbed.faults import (
    MALFORMED,
    PromFaultProxy,
    SlurmCommandFaults,
    matrix_answer,
    sinfo_rows,
    vector_answer,
)
from seamguard.twin.telemetry import Twin, TwinConfig

FLEET = generate_fleet(FleetShape(gpus=16), seed=0)  # gpu000, gpu001
T0 = 1_700_000_000.0


def answer(path: str, form: dict[str, str]) -> tuple[int, bytes]:
    """A healthy Prometheus: every GPU reports 50 for every GPU signal."""
    gpus = [({"Hostname": n.split("/")[0], "gpu": n.split("gpu")[-1]}) for n in FLEET.gpu_names]
    if path.endswith("query_range"):
        t0 = float(form["start"])
        return 200, matrix_answer([(m, [(t0, "50"), (t0 + 5, "51")]) for m in gpus])
    return 200, vector_answer([(m, "50") for m in gpus], float(form.get("time", T0)))


@pytest.fixture
def proxy():
    with PromFaultProxy(answer=answer) as p:
        yield p


def source(proxy, **kw) -> PrometheusSource:
    kw = {"retries": 0, "deadline_s": 2.0, "timeout_s": 1.0, **kw}
    return PrometheusSource(FLEET, PromConfig(url=proxy.url, **kw))


# ---- Prometheus: malformed answers are dropped and flagged, never raised -------------------------
@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_answer_is_flagged_and_the_rest_of_the_tick_is_kept(proxy, kind) -> None:
    proxy.set("malformed", kind=kind, only="DCGM_FI_DEV_GPU_TEMP")
    with source(proxy) as src:
        f = src.frame_at(T0)  # before issue 14: metric_not_object raised AttributeError out of here
    assert np.isnan(f.get("DCGM_FI_DEV_GPU_TEMP")).all()
    assert any(x.startswith("prometheus:DCGM_FI_DEV_GPU_TEMP:") for x in f.flags), f.flags
    assert (f.values["DCGM_FI_DEV_SM_CLOCK"] == 50).all()  # other signals untouched


@pytest.mark.parametrize("kind", ["metric_not_object", "short_pair", "wrong_types"])
def test_malformed_range_answer_never_escapes_replay(proxy, kind) -> None:
    proxy.set("malformed", kind=kind, only="DCGM_FI_DEV_GPU_TEMP")
    with source(proxy) as src:
        frames = list(src.frames(T0, T0 + 5, 5.0))  # before: short_pair raised IndexError
    assert len(frames) == 2
    assert any("malformed" in x for x in frames[0].flags if x.startswith("prometheus:DCGM_FI_DEV_GPU_TEMP:"))
    assert (frames[0].values["DCGM_FI_DEV_SM_CLOCK"] == 50).all()


def test_one_bad_series_is_dropped_and_its_neighbours_kept(proxy) -> None:
    good = [({"Hostname": "gpu000", "gpu": str(i)}, "60") for i in range(8)]
    body = json.loads(vector_answer(good))
    body["data"]["result"][3]["metric"] = "Hostname=gpu000"  # one series breaks the schema
    body["data"]["result"][5]["value"] = [T0]  # a short pair
    proxy.answer = lambda path, form: (200, json.dumps(body).encode())
    with source(proxy) as src:
        f = src.frame_at(T0)
    temp = f.values["DCGM_FI_DEV_GPU_TEMP"]
    assert np.isfinite(temp).sum() == 6 and np.isnan(temp[[3, 5]]).all()
    assert any("2 malformed series dropped" in x for x in f.flags if "GPU_TEMP" in x), f.flags


class _Live:
    """The shape of app.sources.PrometheusLiveSource, over a fault proxy."""

    name = "prometheus"
    tick_s = 5.0

    def __init__(self, src: PrometheusSource, actuators: list) -> None:
        self.src, self._acts = src, actuators

    def next_frame(self, wall_s: float):
        return self.src.frame_at(wall_s)

    def placement(self):
        return FLEET

    def actuators(self):
        return self._acts

    def progress(self):
        return None

    def close(self) -> None:
        self.src.close()


def test_runner_survives_every_fault_mode(proxy, tmp_path) -> None:
    """The issue's first defect: the loop died after 0 ticks on a malformed answer."""
    modes = [("pass", {}), ("refuse", {}), ("status", {}), ("drip", {"interval_s": 0.05}),
             ("huge", {"size_bytes": 4 << 20}), ("partial", {"keep": 0.3}), ("truncate", {"keep": 0.5})]
    modes += [("malformed", {"kind": k}) for k in sorted(MALFORMED)]
    src = source(proxy, deadline_s=1.0, max_response_bytes=1 << 20)
    runner = Runner(_Live(src, [LogActuator(tmp_path / "a.jsonl")]), mode="enforce", speed=0,
                    ledger_path=tmp_path / "l.db")
    try:
        for mode, kw in modes:
            proxy.set(mode, **kw)
            runner.advance(1)
        proxy.clear()
        runner.advance(1)
        assert runner.ticks == len(modes) + 1 and not runner.fatal
        assert runner.snapshot().counters.tick_errors == 0
    finally:
        runner.stop()


# ---- Prometheus: reads are bounded in time and size ----------------------------------------------
def test_drip_feed_is_bounded_by_the_frame_deadline(proxy) -> None:
    # 16 bytes every 0.2 s: each read is far under the 5 s read timeout, the answer takes minutes.
    proxy.set("drip", chunk=16, interval_s=0.2)
    with source(proxy, timeout_s=5.0, deadline_s=1.5, max_concurrency=4) as src:
        t = time.monotonic()
        f = src.frame_at(T0)
        took = time.monotonic() - t
    assert took < 3.0, took
    assert any("retryable: tick deadline exceeded" in x for x in f.flags), f.flags


def test_slow_server_and_retries_stay_inside_the_deadline(proxy) -> None:
    proxy.set("slow", delay_s=3.0)
    with source(proxy, timeout_s=0.5, retries=5, deadline_s=1.2) as src:
        t = time.monotonic()
        f = src.frame_at(T0)
        assert time.monotonic() - t < 2.5
    assert all(":retryable:" in x for x in f.flags if "GPU_TEMP" in x)


@pytest.mark.parametrize("declared", [True, False])
def test_huge_answer_is_cut_off_not_buffered(proxy, declared) -> None:
    # declared: refused from Content-Length; not declared: stopped while streaming.
    proxy.set("huge", size_bytes=64 << 20, only="DCGM_FI_DEV_GPU_TEMP", declare_length=declared)
    with source(proxy, max_response_bytes=1 << 20, deadline_s=10.0) as src:
        t = time.monotonic()
        f = src.frame_at(T0)
        assert time.monotonic() - t < 5.0
        assert src.timing.bytes < 2 << 20
    flag = [x for x in f.flags if x.startswith("prometheus:DCGM_FI_DEV_GPU_TEMP:")]
    assert flag and "permanent" in flag[0] and "max_response_bytes" in flag[0]
    assert ("not read" in flag[0]) is declared
    assert (f.values["DCGM_FI_DEV_SM_CLOCK"] == 50).all()


def test_outage_is_retryable_and_recovery_is_immediate(proxy) -> None:
    with source(proxy) as src:
        proxy.set("refuse")
        down = src.frame_at(T0)
        proxy.clear()
        up = src.frame_at(T0 + 5)
    assert down.values == {} and all(":retryable:" in x for x in down.flags)
    assert (up.values["DCGM_FI_DEV_GPU_TEMP"] == 50).all()


# ---- Slurm: hostile command output --------------------------------------------------------------
@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    f = SlurmCommandFaults(tmp_path / "bin", huge_bytes=8 << 20)
    monkeypatch.setenv("PATH", f.env()["PATH"])
    return f


def test_separator_in_another_owners_reason_does_not_break_the_tick(fake_slurm) -> None:
    nodes = FLEET.node_names
    fake_slurm.set("sinfo", "canned", sinfo_rows(nodes, drained={
        nodes[0]: "admin: PSU swap | ticket 123 | see https://x/y?a=1|b=2",
        nodes[1]: "seamguard: quarantine xid=79"}))
    fake_slurm.set("scontrol", "canned")
    act = SlurmActuator(SlurmConfig(timeout_s=5))
    assert act.nodes()[nodes[0]].reason == "admin: PSU swap | ticket 123 | see https://x/y?a=1|b=2"
    assert act.observe() == {f"drain:{nodes[1]}"}  # before: SlurmError "cannot parse line"
    res = act.apply(Action(key=f"drain:{nodes[0]}", verb=Verb.DRAIN, target=nodes[0], target_kind="node",
                           reason="seamguard: failed xid=79"))
    # left as is: nothing but reads ("show ...") reached scontrol
    assert res.ok and "another owner" in res.detail
    assert not [c for c in fake_slurm.calls("scontrol") if not c.startswith("show ")]
    # And through the controller: every tick observes Slurm; none fails.
    ctl = Controller(FLEET, default_policy(mode="enforce"), [act], None, tick_s=5.0, mode="enforce")
    tw = Twin(FLEET, [], TwinConfig(tick_s=5.0), 0)
    for _ in range(3):
        assert not ctl.tick(tw.step()).error


def test_garbage_rows_are_dropped_and_the_rest_used(fake_slurm) -> None:
    rows = sinfo_rows(FLEET.node_names)
    fake_slurm.set("sinfo", "canned", ["<html>502</html>", rows[0], "|||||", "tail of a reason with a newline",
                                       rows[1]])
    act = SlurmActuator(SlurmConfig(timeout_s=5))
    assert set(act.nodes()) == set(FLEET.node_names)
    assert len(act.problems) == 3


@pytest.mark.parametrize("mode,retryable", [("garbage", True), ("fail", True), ("huge", False)])
def test_unusable_sinfo_is_an_error_not_an_empty_cluster(fake_slurm, mode, retryable) -> None:
    fake_slurm.set("sinfo", mode)
    act = SlurmActuator(SlurmConfig(timeout_s=10, max_output_bytes=1 << 20))
    with pytest.raises(SlurmError) as e:
        act.observe()
    assert e.value.retryable is retryable


def test_hung_sinfo_is_killed_at_the_timeout(fake_slurm) -> None:
    fake_slurm.set("sinfo", "hang")
    act = SlurmActuator(SlurmConfig(timeout_s=1.0))
    t = time.monotonic()
    with pytest.raises(SlurmError, match="no answer within 1s") as e:
        act.observe()
    assert time.monotonic() - t < 3.0 and e.value.retryable
    # A drain through a hung Slurm is a retryable failure, not an exception.
    res = act.apply(Action(key="drain:gpu000", verb=Verb.DRAIN, target="gpu000", target_kind="node", reason="x"))
    assert not res.ok and res.retryable


def test_non_utf8_sinfo_output_is_read(fake_slurm) -> None:
    fake_slurm.set("sinfo", "non_utf8")
    act = SlurmActuator(SlurmConfig(timeout_s=5))
    n = act.nodes()["gpu000"]  # before: UnicodeDecodeError out of subprocess.run(text=True)
    assert n.draining and "\ufffd" in n.reason


# ---- the log actuator's file ------------------------------------------------------------------------
def test_log_actuator_skips_foreign_and_torn_lines(tmp_path) -> None:
    p = tmp_path / "actions.jsonl"
    p.write_bytes(b'{"op": "apply", "key": "drain:gpu000"}\n12\n{"op": 1}\n\xff\xfe\n[]\n{"op": "apply", "key": "dr')
    act = LogActuator(p)
    assert act.observe() == {"drain:gpu000"}
    act.apply(Action(key="drain:gpu001", verb=Verb.DRAIN, target="gpu001", target_kind="node", reason="r"))
    assert act.observe() == {"drain:gpu000", "drain:gpu001"}  # not glued onto the torn tail


# ---- files: bounded YAML, encodings, paths, ledgers ---------------------------------------------------
def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("loader,error", [(load_run_config, ConfigError), (load_policy, Exception),
                                          (load_topology, Exception)])
def test_alias_bomb_is_refused_fast_naming_the_file(tmp_path, loader, error) -> None:
    p = tmp_path / "bomb.yaml"
    text = alias_bomb()
    while len(text) < 27_000:  # the 27 KB bomb: more of the same top level
        text += alias_bomb().replace("a", f"b{len(text)}_")
    p.write_text(text)
    t = time.monotonic()
    with pytest.raises(error) as e:
        loader(p)
    assert time.monotonic() - t < 5.0
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg and "aliases" in msg


def test_non_utf8_and_bad_paths_are_one_line_errors(tmp_path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("version: 1\ntopology: caf\xe9.yaml\n".encode("latin-1"))
    cases = [(bad, "not UTF-8"), (tmp_path / "missing.yaml", "cannot read"), (tmp_path, "cannot read")]
    for path, expect in cases:
        with pytest.raises(ConfigError) as e:
            load_run_config(path)
        assert str(path) in str(e.value) and expect in str(e.value) and "\n" not in str(e.value)


def test_corrupt_ledger_is_a_ledger_error_naming_the_file(tmp_path) -> None:
    from seamguard.ledger.sqlite import LedgerError

    p = tmp_path / "ledger.db"
    p.write_bytes(b"\x00garbage, not SQLite\xff" * 300)
    with pytest.raises(LedgerError, match=str(p)):
        Ledger(p)
    with pytest.raises(LedgerError):
        Ledger(tmp_path)  # a directory


def test_cli_bad_inputs_give_one_error_line(tmp_path) -> None:
    from seamguard.app.cli import app

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"mode: caf\xe9\n")
    cli = CliRunner()
    for args in (["policy", "validate", str(bomb)], ["policy", "validate", str(latin)],
                 ["fleet", "validate", str(tmp_path / "nope.yaml")], ["fleet", "validate", str(tmp_path)],
                 ["run", "--config", str(bomb)], ["run", "--config", str(latin)]):
        r = cli.invoke(app, args)
        assert r.exit_code == 2, (args, r.output, r.exception)
        assert "Traceback" not in r.output and r.output.startswith("error: "), (args, r.output)
