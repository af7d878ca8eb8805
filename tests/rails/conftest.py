"""Fixtures for the rail tests: a testbed that is always torn down, and checked to be gone."""

from __future__ import annotations

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

    def make(hosts: int = 3, rails: int = 2) -> Testbed:
        tb = Testbed(TestbedSpec(hosts=hosts, rails=rails)).up()
        made.append(tb)
        return tb

    def finish():
        for tb in made:
            tb.down()
        left = [ns for ns in list_namespaces() for tb in made if ns.startswith(tb.prefix + "-")]
        assert not left, f"testbed left namespaces behind: {left}"

    request.addfinalizer(finish)
    return make
