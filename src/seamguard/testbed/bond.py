"""Active-backup bonding for a testbed host, for kernels built without the bonding driver.

Why this exists: the rail-failover benchmark's `bond_active_backup` baseline is what a
user would try first — Linux bonding, `mode active-backup miimon 100`, over both rails,
the job unchanged. `Testbed(TestbedSpec(bond=True))` uses the kernel's bond when it has
one. A kernel without CONFIG_BONDING (this project's CI VM) gets this stand-in, built
from what every kernel with a bridge has, with the same observable behaviour:

* ``bond0`` is a bridge in the host's namespace with the host's rails as ports and the
  bond's address on it; the job binds to it exactly as to a kernel bond
  (``GLOO_SOCKET_IFNAME=bond0``), one MAC and one address whatever slave is active.
* Exactly one slave carries traffic: the others' bridge ports are ``disabled`` (they
  neither send nor deliver frames, as a kernel bond's backup slave drops what it
  receives), so the fabric's switches learn the bond's MAC on the active slave only.
  The kernel re-enables a disabled port by itself when its carrier returns; until the
  monitor disables it again (one miimon period) it must not make the switches learn
  the bond's MAC there, or they would send the bond's traffic into a port that is about
  to drop it. So the ports do not learn (everything the bond sends is flooded) and only
  the active slave's port floods unicast; what could still leak in that moment is a
  broadcast the bond itself originates (the bridge floods those on every port), and
  the gratuitous ARP sent after each correction puts the switches right. Both ports are
  ``isolated``: the bridge never forwards between slaves, so there is no loop through
  the fabric's inter-switch link. The slaves run no IPv6 (a kernel bond's slaves do
  not either): a returning slave's own neighbour discovery, sent from the bond's MAC
  behind the monitor's back, would make the switches learn the MAC on a backup port.
* A monitor process per host (this module's ``main``, started by the testbed inside the
  host's namespace) reads each slave's carrier every ``miimon`` ms; when the active
  slave's carrier is gone it makes the first slave with carrier active and sends a
  gratuitous ARP from the bond, so the fabric's switches learn where the bond's MAC now
  is. Like the kernel's bond without ``primary``, it does not fail back when the old
  slave returns.

The choice of slave is the pure `select_active`; the rest is the shell around it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

FLOOD = ("unicast_flood", "multicast_flood", "broadcast_flood")  # bridge port flags in sysfs
DISABLED, FORWARDING = 0, 3  # bridge port states (include/uapi/linux/if_bridge.h)


def select_active(active: str | None, carrier: dict[str, bool], slaves: list[str]) -> str | None:
    """The slave that should carry traffic: the current one while its carrier is up, else the
    first slave (in configured order) with carrier; the current one when none has carrier."""
    if active is not None and carrier.get(active, False):
        return active
    return next((s for s in slaves if carrier.get(s, False)), active)


def garp_frame(mac: bytes, ip: str) -> bytes:
    """A gratuitous ARP request (sender = target = ip) broadcast from mac."""
    addr = socket.inet_aton(ip)
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, addr, b"\0" * 6, addr)
    return b"\xff" * 6 + mac + struct.pack("!H", 0x0806) + arp


def _read(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def _carrier(slave: str) -> bool:
    return _read(f"/sys/class/net/{slave}/carrier", "0") == "1"


def _is_active(slave: str) -> bool:
    """Whether the slave's port floods and forwards (disabled and silent otherwise)."""
    return _read(f"/sys/class/net/{slave}/brport/unicast_flood", "0") == "1" and \
        _read(f"/sys/class/net/{slave}/brport/state", "-1") == str(FORWARDING)


def _is_backup(slave: str) -> bool:
    return _read(f"/sys/class/net/{slave}/brport/unicast_flood", "1") == "0" and \
        _read(f"/sys/class/net/{slave}/brport/state", "-1") == str(DISABLED)


def _make(slave: str, active: bool) -> None:
    """Silence before disabling; enable before flooding. Forwarding needs carrier: the
    kernel refuses it otherwise, and sets it itself when the carrier comes."""
    flags = "1" if active else "0"
    if not active:
        for f in FLOOD:
            Path(f"/sys/class/net/{slave}/brport/{f}").write_text(flags)
    st = subprocess.run(["bridge", "link", "set", "dev", slave, "state", str(FORWARDING if active else DISABLED)],
                        check=False, capture_output=True, text=True, timeout=5.0)  # read-only in sysfs
    if st.returncode != 0:
        raise OSError(st.stderr.strip())
    if active:
        for f in FLOOD:
            Path(f"/sys/class/net/{slave}/brport/{f}").write_text(flags)


def _garp(bond: str, ip: str) -> None:
    mac = bytes.fromhex(_read(f"/sys/class/net/{bond}/address").replace(":", ""))
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind((bond, 0))
        s.send(garp_frame(mac, ip))


def run(bond: str, slaves: list[str], ip: str, miimon_s: float, state_file: Path) -> None:
    """Monitor until the parent (the testbed's process) is gone or SIGTERM arrives."""
    parent = os.getppid()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    active: str | None = None
    while not stop and os.getppid() == parent:
        carrier = {s: _carrier(s) for s in slaves}
        new = select_active(active, carrier, slaves)
        moved, fixed = new != active, False
        for s in sorted(slaves, key=lambda s: s == new):  # level-triggered; the old one first
            if not (_is_active(s) if s == new else _is_backup(s)):
                try:
                    _make(s, s == new)
                    fixed = True
                except OSError:
                    pass  # e.g. forwarding refused: the carrier went meanwhile; next period
        if moved or fixed:
            active = new
            try:
                _garp(bond, ip)
            except OSError:
                pass  # bond without carrier: the next change sends one
            tmp = state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"active": active, "t": time.time(), "carrier": carrier}))
            os.replace(tmp, state_file)
        time.sleep(miimon_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bond", default="bond0")
    ap.add_argument("--slaves", required=True, help="comma-separated, in failover order")
    ap.add_argument("--ip", required=True, help="the bond's address (for gratuitous ARP)")
    ap.add_argument("--miimon-ms", type=float, default=100.0)
    ap.add_argument("--state-file", type=Path, required=True)
    a = ap.parse_args(argv)
    run(a.bond, a.slaves.split(","), a.ip, a.miimon_ms / 1000.0, a.state_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
