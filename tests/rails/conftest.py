"""Fixtures for the rail tests: a testbed that is always torn down, and checked to be gone."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from seamguard.testbed.net import Testbed, TestbedSpec, list_namespaces


def pytest_configure(config):
    if shutil.which("ip") is None:  # CI starts without iproute2
        subprocess.run(["apt-get", "install", "-y", "iproute2"], capture_output=True, timeout=300)


@pytest.fixture
def make_testbed(request):
    """Factory; every testbed it made is deleted and verified gone, also when the test failed."""
    made: list[Testbed] = []

    def make(hosts: int = 3, rails: int = 2, bond: bool = False) -> Testbed:
        tb = Testbed(TestbedSpec(hosts=hosts, rails=rails, bond=bond))
        made.append(tb)  # before up(): a build that fails half-way is still checked
        return tb.up()

    def finish():
        pids = [pid for tb in made for pid in tb.monitor_pids()]
        for tb in made:
            tb.down()
        left = [ns for ns in list_namespaces() for tb in made if ns.startswith(tb.prefix + "-")]
        assert not left, f"testbed left namespaces behind: {left}"
        alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
        assert not alive, f"testbed left bond monitors running: {alive}"

    request.addfinalizer(finish)
    return make
