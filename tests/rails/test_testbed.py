"""The testbed itself: topology, faults are reversible, nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from seamguard.testbed.net import Testbed, TestbedSpec, clean, list_namespaces, ours, wait_carrier

SRC = str(Path(__file__).resolve().parents[2] / "src")
pytestmark = pytest.mark.timeout(120)


def test_faults_change_what_hosts_see_and_revert(make_testbed):
    tb = make_testbed(hosts=2, rails=2)
    assert set(tb.leftovers()["namespaces"]) == set(tb.namespaces())
    before = tb.host_link_stats(1)["rail0"]
    assert before["carrier"] == 1.0
    tb.set_link(1, 0, False)
    assert wait_carrier(tb, 1, 0, up=False)
    assert tb.host_link_stats(0)["rail0"]["carrier"] == 1.0  # only that host's link
    tb.set_link(1, 0, True)
    assert wait_carrier(tb, 1, 0, up=True)
    after = tb.host_link_stats(1)["rail0"]
    assert after["carrier_down_changes"] == before["carrier_down_changes"] + 1
    tb.set_gray(0, 1, 20)
    out = subprocess.run(["tc", "-n", tb.host_ns(0), "qdisc", "show", "dev", "rail1"],
                         capture_output=True, text=True).stdout
    assert "tbf" in out
    tb.set_gray(0, 1, None)
    out = subprocess.run(["tc", "-n", tb.host_ns(0), "qdisc", "show", "dev", "rail1"],
                         capture_output=True, text=True).stdout
    assert "tbf" not in out


def test_switch_down_is_silent_on_carrier_but_stops_traffic(make_testbed):
    tb = make_testbed(hosts=2, rails=2)
    probe = [*tb.exec_prefix(0), sys.executable, "-c",
             "import socket,sys; s=socket.create_connection((sys.argv[1], 9), timeout=1.0)", tb.addr(1, 1)]
    # nothing listens on port 9: a reachable peer refuses at once, an unreachable one times out
    p = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    assert "ConnectionRefusedError" in p.stderr
    tb.set_switch(1, False)
    p = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    assert "timed out" in p.stderr or "TimeoutError" in p.stderr
    assert tb.host_link_stats(0)["rail1"]["carrier"] == 1.0
    tb.set_switch(1, True)


def test_error_inside_the_context_still_removes_everything():
    tb = Testbed(TestbedSpec(hosts=2, rails=1))
    with pytest.raises(RuntimeError, match="boom"):
        with tb:
            tb.set_gray(0, 0, 10)
            raise RuntimeError("boom")
    assert tb.leftovers() == {"namespaces": []}


def test_clean_removes_testbeds_of_a_killed_process():
    code = ("import sys, time; from seamguard.testbed.net import Testbed, TestbedSpec; "
            "tb = Testbed(TestbedSpec(hosts=1, rails=1)).up(); print(tb.prefix, flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": SRC})
    try:
        prefix = p.stdout.readline().strip()
        assert prefix and any(ns.startswith(prefix + "-") for ns in list_namespaces())
    finally:
        p.send_signal(signal.SIGKILL)  # no atexit, no finally: the worst case
        p.wait(10)
    removed = clean()
    assert any(ns.startswith(prefix + "-") for ns in removed)
    assert not [ns for ns in ours() if ns.startswith(prefix + "-")]
