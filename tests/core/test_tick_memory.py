"""The controller's allocator setting (control.retain_freed_memory): a tick's large arrays come
from the process's heap, reused from tick to tick, instead of a fresh mapping each."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import seamguard

_SRC = str(Path(seamguard.__file__).resolve().parents[1])  # the seamguard these tests import, not another install

_PROBE = """
import sys
import numpy as np
from seamguard.control import retain_freed_memory

def in_heap(a):
    p = a.__array_interface__["data"][0]
    for line in open("/proc/self/maps"):
        span, *rest = line.split()
        lo, hi = (int(v, 16) for v in span.split("-"))
        if lo <= p < hi:
            return rest[-1] == "[heap]"
    return False

before = in_heap(np.empty(8 << 20))  # 64 MiB: over glibc's largest mmap threshold
took = retain_freed_memory() if sys.argv[1] == "retain" else False
a = np.ones(8 << 20)
after = in_heap(a)
addr = a.__array_interface__["data"][0]
del a
again = np.ones(8 << 20).__array_interface__["data"][0] == addr
print(before, took, after, again)
"""


def _probe(mode: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_SRC, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120, check=True,
                         env=env)
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/maps")
def test_large_blocks_come_from_the_heap_and_are_reused_once_retained() -> None:
    before, took, after, again = _probe("retain")
    if took != "True":
        pytest.skip("not glibc: the allocator keeps its own policy")
    assert before == "False"  # as glibc starts: a fresh mapping
    assert after == "True" and again == "True"  # freed and taken again: the same pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/maps")
def test_without_it_a_large_block_is_a_fresh_mapping() -> None:
    assert _probe("fresh")[2] == "False"
