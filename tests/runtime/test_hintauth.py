"""Signed hints (seamguard/hintauth.py) and the path and name checks of runtime/settings.py:
decision tables, no launch."""

from __future__ import annotations

import os
import stat

import pytest

from seamguard import hintauth
from seamguard.hintauth import HintGate, HintRefused, sign
from seamguard.runtime.metrics import JobView, render
from seamguard.runtime.settings import LaunchSettings, RuntimeSettings, run_id_error, under_roots

KEY, OTHER = b"k" * 32, b"o" * 32
NOW_S = 1_800_000_000.0
NOW_NS = int(NOW_S * 1e9)


def _gate() -> HintGate:
    return HintGate(KEY, wall_s=lambda: NOW_S)


def test_a_genuine_hint_is_taken_once():
    gate = _gate()
    env = sign(KEY, "sg/hint/target", "/ckpt/b", NOW_NS)
    assert gate.admit("sg/hint/target", env) == "/ckpt/b"
    with pytest.raises(HintRefused) as again:
        gate.admit("sg/hint/target", env)
    assert again.value.reason == "replayed"
    assert gate.admit("sg/hint/target", sign(KEY, "sg/hint/target", "/ckpt/c", NOW_NS + 1)) == "/ckpt/c"
    assert gate.refusals() == {"unsigned": 0, "forged": 0, "replayed": 1, "stale": 0}


@pytest.mark.parametrize("name, text, reason", [
    ("sg/hint/target", "/tmp/evil", "unsigned"),
    ("sg/hint/target", "", "unsigned"),
    ("sg/hint/target", f"sg-hint-v1 x {'0' * 64}\n/tmp/evil", "unsigned"),
    ("sg/hint/target", f"sg-hint-v1 {NOW_NS} {'0' * 64}\n/tmp/evil", "forged"),
    ("sg/hint/target", sign(OTHER, "sg/hint/target", "/tmp/evil", NOW_NS), "forged"),          # another key
    ("sg/hint/target", sign(KEY, "sg/hint/rollback_to", "/tmp/evil", NOW_NS), "forged"),      # another hint's
    ("sg/hint/target", sign(KEY, "sg/hint/target", "/ckpt", NOW_NS) + "/../tmp", "forged"),  # value altered
    ("rollback", sign(KEY, "rollback", "", NOW_NS - int(601e9)), "stale"),                  # before a restart
    ("rollback", sign(KEY, "rollback", "", NOW_NS + int(601e9)), "stale"),                  # from the future
])
def test_what_is_refused_and_why(name, text, reason):
    gate = _gate()
    with pytest.raises(HintRefused) as refused:
        gate.admit(name, text)
    assert refused.value.reason == reason and gate.refusals()[reason] == 1


def test_replay_is_judged_per_hint_name():
    gate = _gate()
    assert gate.admit("evacuate_rank_2", sign(KEY, "evacuate_rank_2", "", NOW_NS + 5)) == ""
    # signed earlier, read later (sorted file names): another name, not a replay
    assert gate.admit("evacuate_rank_10", sign(KEY, "evacuate_rank_10", "", NOW_NS)) == ""


def test_key_files_are_private_and_fresh(tmp_path):
    a, b = hintauth.create_key(tmp_path / "k1"), hintauth.create_key(tmp_path / "k2")
    assert a != b and len(a) == hintauth.KEY_BYTES
    assert stat.S_IMODE(os.stat(tmp_path / "k1").st_mode) == 0o600
    assert hintauth.read_key(tmp_path / "k1", private=True) == a
    (tmp_path / "k1").chmod(0o640)
    with pytest.raises(ValueError, match="mode 640"):
        hintauth.read_key(tmp_path / "k1", private=True)
    (tmp_path / "short").write_text("abcd\n")
    with pytest.raises(ValueError, match="32 hex digits"):
        hintauth.read_key(tmp_path / "short")


def test_a_hint_file_round_trips(tmp_path):
    path = hintauth.write_hint_file(tmp_path, "avoid_rails", "rail0 3\nrail1 2\n", KEY)
    assert hintauth.hint_file_value(path) == "rail0 3\nrail1 2\n"
    assert HintGate(KEY).admit("avoid_rails", path.read_text()) == "rail0 3\nrail1 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["avoid_rails"]   # no temp file left


@pytest.mark.parametrize("run_id, ok", [
    ("seamguard", True), ("job-42.retry_1", True), ("1234", True),
    ("../../x", False), ("a/b", False), ("a..b", False), (".hidden", False), ("", False),
    ("x" * 129, False), ("tab\tname", False), ("nul\0", False),
])
def test_run_ids_name_files_safely(run_id, ok):
    assert (run_id_error(run_id) is None) == ok


def test_roots_hold_after_dotdot_and_symlinks(tmp_path):
    roots = (tmp_path / "storage",)
    (tmp_path / "storage" / "b").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "storage" / "link").symlink_to(tmp_path / "outside")
    assert under_roots(tmp_path / "storage" / "b", roots)
    assert under_roots(tmp_path / "storage" / "not-yet", roots)
    assert not under_roots(f"{tmp_path}/storage/../outside", roots)
    assert not under_roots(tmp_path / "storage" / "link" / "x", roots)
    assert not under_roots(tmp_path / "storage-evil", roots)     # a prefix is not a parent
    assert not under_roots("storage/b", roots)                    # relative: refused


def test_launch_settings_refuse_bad_ports_names_and_roots(tmp_path):
    for kwargs, option in (({"master_port": 99999}, "--master-port"), ({"master_port": -1}, "--master-port"),
                           ({"run_id": "../../x"}, "--run-id"), ({"metrics_port": 0}, "--metrics-port"),
                           ({"hint_dir": tmp_path / "a\nb"}, "--hint-dir")):
        with pytest.raises(ValueError, match=option):
            LaunchSettings(script=["x.py"], preload=(), **kwargs)
    with pytest.raises(ValueError, match="--checkpoint-roots"):
        RuntimeSettings(checkpoint_dir=tmp_path / "ckpt", checkpoint_roots=(str(tmp_path / "elsewhere"),))
    with pytest.raises(ValueError, match="absolute"):
        RuntimeSettings(checkpoint_roots=("relative/dir",))
    assert RuntimeSettings(checkpoint_dir=tmp_path / "ckpt").roots == (tmp_path,)


def test_store_binds_loopback_for_one_node_and_the_master_address_otherwise():
    one = LaunchSettings(script=["x.py"], preload=(), master_addr="10.0.0.5")
    many = LaunchSettings(script=["x.py"], preload=(), nnodes=2, master_addr="10.0.0.5", master_port=29500)
    chosen = LaunchSettings(script=["x.py"], preload=(), nnodes=2, master_addr="node0", master_port=29500,
                            store_bind="10.1.0.5")
    assert (one.store_host, many.store_host, chosen.store_host) == ("127.0.0.1", "10.0.0.5", "10.1.0.5")


def test_refused_hints_are_counted_in_the_metrics():
    text = render(JobView("train", (), 0, 5, None, 0, 0, (("forged", 2), ("unsigned", 0))))
    assert 'seamguard_job_hints_refused_total{job_name="train",reason="forged"} 2' in text
    assert 'seamguard_job_hints_refused_total{job_name="train",reason="unsigned"} 0' in text
