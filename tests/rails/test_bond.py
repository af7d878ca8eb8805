"""The bonded testbed: active-backup over both rails fails over when its active slave's
carrier goes, keeps established TCP connections, and does not fail back by itself."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time

import pytest

from seamguard.testbed.bond import garp_frame, select_active

pytestmark = pytest.mark.timeout(120)

SLAVES = ["rail0", "rail1"]


@pytest.mark.parametrize("active, carrier, want", [
    (None, {"rail0": True, "rail1": True}, "rail0"),     # first choice: configured order
    ("rail1", {"rail0": True, "rail1": True}, "rail1"),  # no fail-back while the active one is up
    ("rail0", {"rail0": False, "rail1": True}, "rail1"),  # carrier lost: next with carrier
    ("rail1", {"rail0": True, "rail1": False}, "rail0"),
    ("rail0", {"rail0": False, "rail1": False}, "rail0"),  # none up: stay
    (None, {"rail0": False, "rail1": False}, None),
])
def test_select_active(active, carrier, want):
    assert select_active(active, carrier, SLAVES) == want


def test_garp_frame_is_a_broadcast_arp_for_its_own_address():
    mac = bytes.fromhex("020000000001")
    f = garp_frame(mac, "10.213.100.2")
    assert f[:6] == b"\xff" * 6 and f[6:12] == mac and f[12:14] == b"\x08\x06"
    op, sha, spa, tpa = struct.unpack("!6xH6s4s6x4s", f[14:42])
    assert op == 1 and sha == mac and spa == tpa == socket.inet_aton("10.213.100.2")


ECHO = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 7000)); s.listen(); print('ready', flush=True); c, _ = s.accept()\n"
        "while (d := c.recv(65536)):\n    c.sendall(d)\n")
# one line in, one echo back, for as long as stdin has lines; a timeout fails the client
CLIENT = ("import socket, sys\ns = socket.create_connection((sys.argv[1], 7000), timeout=10)\n"
          "for line in sys.stdin:\n    s.sendall(line.encode()); got = b''\n"
          "    while len(got) < len(line): got += s.recv(4096)\n"
          "    print(got.decode().strip(), flush=True)\n")


def _wait(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_bond_fails_over_when_its_active_slave_goes_down(make_testbed):
    tb = make_testbed(hosts=2, rails=2, bond=True)
    assert tb.bond_impl in ("kernel", "emulated")
    assert [tb.bond_active(h) for h in range(2)] == ["rail0", "rail0"]
    procs = []
    try:
        srv = subprocess.Popen([*tb.exec_prefix(1), sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
        procs.append(srv)
        assert srv.stdout.readline().strip() == "ready"
        cli = subprocess.Popen([*tb.exec_prefix(0), sys.executable, "-c", CLIENT, tb.bond_addr(1)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(cli)

        def echo(msg: str) -> str:
            cli.stdin.write(msg + "\n")
            cli.stdin.flush()
            return cli.stdout.readline().strip()

        assert echo("before") == "before"
        to_h1 = tb.fabric_tx_bytes()
        tb.set_link(1, 0, False)  # host 1's active slave loses carrier
        assert _wait(lambda: tb.bond_active(1) == "rail1", 2.0)
        assert tb.bond_active(0) == "rail0"  # only that host moved
        assert echo("during") == "during"  # the same connection, now through the other rail
        after = tb.fabric_tx_bytes()
        assert after[(1, 1)] > to_h1[(1, 1)]  # host 1's inbound traffic arrived on rail 1
        tb.set_link(1, 0, True)
        returned = time.monotonic()
        # by then the (emulated) bond has silenced the port the kernel re-enabled with the carrier
        time.sleep(1.5)
        assert tb.bond_active(1) == "rail1"  # no fail-back (no `primary`)
        sent = tb.fabric_rx_packets()
        before = tb.fabric_tx_bytes()
        for i in range(50):
            assert echo(f"back {i} " + "x" * 1000) == f"back {i} " + "x" * 1000
        after = tb.fabric_tx_bytes()
        # the returned backup slave stays silent, also through the multicast listener reports
        # and router solicitations a returning IPv6 interface sends (within 5 s); one from the
        # bond's MAC would make the switches send the bond's traffic into the backup port
        time.sleep(max(0.0, returned + 5.5 - time.monotonic()))
        assert tb.fabric_rx_packets()[(1, 0)] == sent[(1, 0)]
        # the returned slave stays silent, so the switches keep sending host 1's traffic to rail 1
        assert after[(1, 1)] - before[(1, 1)] > 50_000
        assert after[(1, 0)] - before[(1, 0)] < 5_000
        tb.set_link(1, 1, False)  # now rail 1 goes: back to rail 0
        assert _wait(lambda: tb.bond_active(1) == "rail0", 2.0)
        assert echo("again") == "again"
        tb.set_link(1, 1, True)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
