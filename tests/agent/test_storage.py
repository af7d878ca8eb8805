"""The storage probe on tmp paths: timings, a failing path, and a hung path that never blocks the scrape."""

from __future__ import annotations

import threading
import time

import pytest

from seamguard.agent import storage
from seamguard.agent.storage import StorageProber, probe_path


def test_probe_path_times_write_and_read_and_cleans_up(tmp_path):
    w, r = probe_path(tmp_path, 4096)
    assert 0 < w < 5 and 0 <= r < 5
    assert list(tmp_path.iterdir()) == []  # the temp file is removed


def test_probe_path_times_the_file_create(tmp_path, monkeypatch):
    # a slow metadata server: the create (open O_CREAT) takes 3 s of the probe's clock
    now = [100.0]
    real_mkstemp = storage.tempfile.mkstemp

    def slow_create(*a, **kw):
        now[0] += 3.0
        return real_mkstemp(*a, **kw)

    monkeypatch.setattr(storage.tempfile, "mkstemp", slow_create)
    w, r = probe_path(tmp_path, 4096, clock=lambda: now[0])
    assert w == 3.0 and r == 0.0
    assert list(tmp_path.iterdir()) == []


def test_probe_path_on_a_missing_directory_raises(tmp_path):
    with pytest.raises(OSError):
        probe_path(tmp_path / "absent", 64)


def _prober(paths, **kw):
    observed, failed = [], []
    p = StorageProber(paths, interval_s=kw.get("interval_s", 0.02), timeout_s=kw.get("timeout_s", 5.0), size=512,
                      window=16, observe=lambda n, op, s: observed.append((n, op, s)),
                      fail=lambda n, why: failed.append((n, why)))
    return p, observed, failed


def test_prober_reports_good_and_failing_paths(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    p, observed, failed = _prober([("ok", good), ("bad", not_a_dir)])
    p.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (observed and failed):
            time.sleep(0.02)
    finally:
        p.stop()
    snap = {name: (up, ms) for name, _, up, ms in p.snapshot()}
    assert snap["ok"][0] == 1.0 and snap["ok"][1] > 0
    assert snap["bad"][0] == 0.0 and snap["bad"][1] != snap["bad"][1]  # no latency: NaN
    assert {op for n, op, _ in observed if n == "ok"} == {"write", "read"}
    assert ("bad", "error") in failed and not [f for f in failed if f[0] == "ok"]
    assert list(good.iterdir()) == []


def test_hung_path_is_down_without_blocking_the_scrape(tmp_path, monkeypatch):
    release = threading.Event()

    def hung(path, size, clock=time.perf_counter):
        release.wait(10)  # an fsync on a dead NFS server
        return 0.001, 0.001

    monkeypatch.setattr(storage, "probe_path", hung)
    p, _, failed = _prober([("nfs", tmp_path)], timeout_s=0.1)
    p.start()
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        snap = p.snapshot()
        took = time.monotonic() - t0
        (_, _, up, ms), = snap
        assert took < 0.05  # the scrape reads state, it does not wait for the probe
        assert up == 0.0 and ms >= 100.0  # down, and at least as slow as it has been waiting
        p.snapshot()
        assert failed == [("nfs", "timeout")]  # counted once per stuck probe, not per scrape
    finally:
        release.set()
        p.stop()
