"""The election on a real etcd: one leader at a time, its token growing with each term,
a hand-over on resignation, and a leader cut off from etcd that stops acting before its
lease can end (its own deadline, no message needed)."""

from __future__ import annotations

import time

import pytest

from seamguard.app.config import ConfigError, load_run_config
from seamguard.app.leader import ACT_SHARE, Elector, LeaseSettings, Term
from seamguard.testbed.tcp_proxy import TcpProxy


def _wait(pred, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def _settings(endpoint: str, name: str, key: str) -> LeaseSettings:
    return LeaseSettings((endpoint,), name, lease_s=2, key=key)


def test_a_term_allows_acting_only_before_its_deadline():
    t = Term(token=7, act_until_s=100.0)
    assert t.may_act(99.9) and not t.may_act(100.0)
    assert not Term().may_act(0.0)  # following: token 0


def test_settings_refuse_what_etcd_would():
    with pytest.raises(ValueError, match="minimum lease of 2 s"):
        LeaseSettings(("h:2379",), "a", lease_s=1)
    with pytest.raises(ValueError, match="at least one endpoint"):
        LeaseSettings((), "a")
    with pytest.raises(ValueError, match="not host:port"):
        LeaseSettings(("etcd-without-port",), "a").host_ports()
    assert LeaseSettings(("http://10.0.0.1:2379",), "a").host_ports() == [("10.0.0.1", 2379)]
    s = LeaseSettings(("h:1",), "a", lease_s=3)
    assert s.act_window_s == pytest.approx(3 * ACT_SHARE) and s.act_window_s < s.lease_s


def test_one_leader_and_a_larger_token_after_it_resigns(etcd):
    a = Elector(_settings(etcd.address, "a", "/t/resign")).start()
    assert _wait(lambda: a.term().token > 0)
    b = Elector(_settings(etcd.address, "b", "/t/resign")).start()
    try:
        time.sleep(1.0)
        assert b.term().token == 0, "two leaders"
        first = a.term().token
        a.stop()  # revokes the lease: b does not wait for it to expire
        t0 = time.monotonic()
        assert _wait(lambda: b.term().token > 0)
        assert time.monotonic() - t0 < 2.0  # well inside a 2 s lease: the hand-over did not wait for expiry
        assert b.term().token > first
        assert b.may_act(b.term().token) and not b.may_act(first)
    finally:
        a.stop()
        b.stop()


def test_a_leader_cut_off_from_etcd_stops_acting_before_its_lease_ends(etcd):
    host, port = etcd.address.rsplit(":", 1)
    with TcpProxy((host, int(port))) as proxy:
        a = Elector(_settings(proxy.address, "a", "/t/cut")).start()
        b = Elector(_settings(etcd.address, "b", "/t/cut"))
        try:
            assert _wait(lambda: a.term().token > 0)
            b.start()  # after a leads: b follows
            time.sleep(1.0)
            token = a.term().token
            assert b.term().token == 0
            proxy.block()
            assert _wait(lambda: not a.may_act(token), 5.0)
            stopped = time.monotonic()
            assert b.term().token == 0, "b led while a could still act"
            assert _wait(lambda: b.term().token > token, 10.0)
            took = time.monotonic()
            assert took > stopped  # a stopped first; b only after etcd ended a's lease
            assert not a.may_act(token)
            proxy.unblock()
            time.sleep(2.0)
            assert a.term().token == 0  # healed, it finds its lease gone and follows
        finally:
            a.stop()
            b.stop()


def test_the_run_config_takes_ha_and_a_postgresql_ledger(tmp_path):
    base = "version: 1\ntopology: t.yaml\nprometheus: {url: 'http://p:9090'}\n"
    p = tmp_path / "run.yaml"
    p.write_text(base + "ledger: postgresql://u@db/sg\nha: {etcd: ['e:2379'], lease_s: 3, name: ctl-a}\n")
    cfg = load_run_config(p)
    assert cfg.ledger == "postgresql://u@db/sg" and cfg.ha is not None and cfg.ha.name == "ctl-a"
    p.write_text(base + "ledger: l.db\n")
    assert load_run_config(p).ledger == tmp_path / "l.db" and load_run_config(p).ha is None
    for bad, field in (("ha: {etcd: [], name: a}", "ha.etcd"), ("ha: {etcd: ['e:1'], name: a, lease_s: 1}", "ha.lease_s"),
                       ("ha: {etcd: ['e:1']}", "ha.name"), ("ha: {etcd: ['e:1'], name: 'a b'}", "ha.name")):
        p.write_text(base + bad + "\n")
        with pytest.raises(ConfigError) as e:
            load_run_config(p)
        assert field in str(e.value), str(e.value)
