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
  receives). Both ports are ``isolated`` and do not learn, so the bridge never forwards
  between slaves: no loop through the fabric's inter-switch link, even in the moment
  after a slave's carrier returns (the kernel re-enables such a port by itself).
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

PORT_DISABLED, PORT_FORWARDING = 0, 3  # bridge port states (include/uapi/linux/if_bridge.h)


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


def _port_state(slave: str) -> int:
    return int(_read(f"/sys/class/net/{slave}/brport/state", "-1") or -1)


def _set_port(slave: str, state: int) -> bool:
    p = subprocess.run(["bridge", "link", "set", "dev", slave, "state", str(state)],
                       check=False, capture_output=True, text=True, timeout=5.0)
    return p.returncode == 0  # forwarding is refused while the slave has no carrier


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
        moved = new != active
        fixed = False
        for s in slaves:  # level-triggered: the kernel re-enables a port whose carrier returns
            want = PORT_FORWARDING if s == new else PORT_DISABLED
            if _port_state(s) != want and (want == PORT_DISABLED or carrier[s]):
                fixed |= _set_port(s, want)
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
