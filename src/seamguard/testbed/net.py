"""A small multi-rail cluster on one machine: hosts as network namespaces, rails as bridges.

Why this exists: rail failover must be shown on real sockets over real interfaces whose
carrier really drops, not on mocks. Tests, the rail-failover benchmark and
`seamguard testbed demo` all build their cluster here and inject faults through it.

Layout (everything lives in namespaces this module creates; the host's own network
namespace is never touched):

    <prefix>-fab      the "fabric" namespace: one bridge per rail (``br<r>``, the leaf
                      switch of rail r) and one management bridge (``brm``)
    <prefix>-h<i>     host i: interfaces ``rail<r>`` (10.213.<r>.<i+1>/24) and ``mgmt``
                      (10.213.200.<i+1>/24), plus ``lo``

Each host interface is one end of a veth pair; the other end (``h<i>r<r>`` / ``h<i>m``)
is a port of the bridge in the fabric namespace.

A bonded testbed (``TestbedSpec(bond=True)``) is what a user without seamguard would build
over the same rails: every host's rails are slaves of ``bond0`` in active-backup mode
(miimon), which holds the host's only data address 10.213.100.<i+1>/24, and an
inter-switch link (``isl0``-``isl1``) joins the rail switches into one L2 domain, as
active-backup across two switches needs (a host that failed over to rail 1 must still
reach hosts on rail 0). The kernel's bonding driver is used when the kernel has one,
else `seamguard.testbed.bond`'s stand-in (same behaviour, see there); `bond_impl` says
which. Faults are applied on the fabric side
(a switch port going down is what a host sees as a carrier loss) or on the bridge itself
(a whole rail's switch). Deleting the namespaces deletes every link, bridge and qdisc
with them, so cleanup is one operation per namespace and cannot leave a veth behind.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213"  # private test subnet, only ever configured inside our namespaces
MGMT_OCTET = 200
BOND_OCTET = 100
BOND_IF = "bond0"
SRC = str(Path(__file__).resolve().parents[2])  # .../src, for PYTHONPATH inside namespaces
NAME_RE = re.compile(r"^sg(\d+)t(\d+)-(fab|h\d+)$")


class TestbedError(RuntimeError):
    __test__ = False
    """A namespace/link operation failed; the message carries the command and its stderr."""


def _ip(*args: str, timeout_s: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise TestbedError(f"{' '.join(cmd)}: timed out after {timeout_s}s") from e
    if check and p.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p


def _tc(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["tc", "-n", ns, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=10.0)
    if check and p.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p


def list_namespaces() -> list[str]:
    p = _ip("netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def ours(names: list[str] | None = None) -> list[str]:
    """Namespaces that a seamguard testbed created (by name pattern)."""
    return [n for n in (list_namespaces() if names is None else names) if NAME_RE.match(n)]


def clean(all_testbeds: bool = False) -> list[str]:
    """Delete leftover testbed namespaces whose creating process is gone (or all of them)."""
    removed = []
    for ns in ours():
        pid = int(NAME_RE.match(ns).group(1))  # type: ignore[union-attr]
        alive = pid != os.getpid() and os.path.exists(f"/proc/{pid}")
        if all_testbeds or not alive:
            _ip("netns", "delete", ns, check=False)
            removed.append(ns)
    return removed


@dataclass(frozen=True)
class TestbedSpec:
    __test__ = False  # not a pytest class
    hosts: int = 4
    rails: int = 2
    mtu_bytes: int = 9000  # jumbo frames like a real RoCE fabric; also cheaper per byte on veth
    bond: bool = False  # rails as slaves of an active-backup bond0 per host (see module doc)
    miimon_ms: int = 100  # the bond's carrier poll period (the kernel bond's miimon)

    def __post_init__(self) -> None:
        if not 1 <= self.hosts <= 60:
            raise ValueError(f"hosts must be in 1..60, got {self.hosts}")
        if not 1 <= self.rails <= 8:
            raise ValueError(f"rails must be in 1..8, got {self.rails}")


_COUNTER = [0]
_LIVE: set["Testbed"] = set()


def _atexit_cleanup() -> None:
    for tb in list(_LIVE):
        tb.down()


atexit.register(_atexit_cleanup)


@dataclass(eq=False)
class Testbed:
    """The namespaces and links of one testbed; a context manager that always tears down."""

    __test__ = False  # not a pytest class

    spec: TestbedSpec = field(default_factory=TestbedSpec)
    prefix: str = ""
    _timers: list[threading.Timer] = field(default_factory=list, repr=False)
    _gray: set[tuple[int, int]] = field(default_factory=set, repr=False)
    _up: bool = False
    bond_impl: str = ""  # "kernel" or "emulated" once a bonded testbed is up
    _monitors: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _state_dir: str = ""

    def __post_init__(self) -> None:
        if not self.prefix:
            _COUNTER[0] += 1
            self.prefix = f"sg{os.getpid()}t{_COUNTER[0]}"

    # ---- names and addresses ---------------------------------------------------------
    @property
    def fabric_ns(self) -> str:
        return f"{self.prefix}-fab"

    def host_ns(self, host: int) -> str:
        return f"{self.prefix}-h{host}"

    @staticmethod
    def rail_if(rail: int) -> str:
        return f"rail{rail}"

    @staticmethod
    def port(host: int, rail: int | None) -> str:
        """The switch-side end of a host's link (rail None = management)."""
        return f"h{host}m" if rail is None else f"h{host}r{rail}"

    @staticmethod
    def addr(host: int, rail: int | None) -> str:
        return f"{SUBNET}.{MGMT_OCTET if rail is None else rail}.{host + 1}"

    @staticmethod
    def bond_addr(host: int) -> str:
        """A bonded host's data address (on ``bond0``)."""
        return f"{SUBNET}.{BOND_OCTET}.{host + 1}"

    def namespaces(self) -> list[str]:
        return [self.fabric_ns] + [self.host_ns(h) for h in range(self.spec.hosts)]

    # ---- lifecycle -----------------------------------------------------------------------
    def up(self) -> "Testbed":
        if self._up:
            return self
        _LIVE.add(self)
        self._up = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        s, fab = self.spec, self.fabric_ns
        for ns in self.namespaces():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        bridges = [(f"br{r}", r) for r in range(s.rails)] + [("brm", None)]
        for br, _ in bridges:
            _ip("-n", fab, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0")
            _ip("-n", fab, "link", "set", br, "up")
        for h in range(s.hosts):
            hns = self.host_ns(h)
            for br, rail in bridges:
                inner = "mgmt" if rail is None else self.rail_if(rail)
                outer = self.port(h, rail)
                _ip("-n", fab, "link", "add", outer, "mtu", str(s.mtu_bytes), "type", "veth",
                    "peer", "name", inner, "netns", hns, "mtu", str(s.mtu_bytes))
                _ip("-n", fab, "link", "set", outer, "master", br)
                _ip("-n", fab, "link", "set", outer, "up")
                if s.bond and rail is not None:
                    continue  # a slave: no address of its own, enslaved below
                _ip("-n", hns, "addr", "add", f"{self.addr(h, rail)}/24", "dev", inner)
                _ip("-n", hns, "link", "set", inner, "up")
        if s.bond:
            self._build_bonds()

    def _build_bonds(self) -> None:
        s, fab = self.spec, self.fabric_ns
        # the inter-switch link: rail switches in one L2 domain, a chain (no loop)
        for r in range(1, s.rails):
            a, b = f"isl{r - 1}r{r}a", f"isl{r - 1}r{r}b"
            _ip("-n", fab, "link", "add", a, "mtu", str(s.mtu_bytes), "type", "veth", "peer", "name", b,
                "mtu", str(s.mtu_bytes))
            for end, br in ((a, f"br{r - 1}"), (b, f"br{r}")):
                _ip("-n", fab, "link", "set", end, "master", br)
                _ip("-n", fab, "link", "set", end, "up")
        slaves = [self.rail_if(r) for r in range(s.rails)]
        kernel_bond = ["link", "add", BOND_IF, "mtu", str(s.mtu_bytes), "type", "bond", "mode", "active-backup",
                       "miimon", str(s.miimon_ms)]
        probe = _ip("-n", self.host_ns(0), *kernel_bond, check=False)  # "Unknown device type" without the driver
        self.bond_impl = "kernel" if probe.returncode == 0 else "emulated"
        if self.bond_impl == "emulated":
            self._state_dir = tempfile.mkdtemp(prefix=f"{self.prefix}-bond")
        for h in range(s.hosts):
            hns = self.host_ns(h)
            if self.bond_impl == "kernel":
                if h:  # host 0's is the probe
                    _ip("-n", hns, *kernel_bond)
            else:
                _ip("-n", hns, "link", "add", BOND_IF, "mtu", str(s.mtu_bytes), "type", "bridge",
                    "stp_state", "0", "forward_delay", "0")
            for sl in slaves:  # a kernel bond only takes slaves that are down
                _ip("-n", hns, "link", "set", sl, "master", BOND_IF)
                if self.bond_impl == "emulated":  # silent until the monitor picks the active slave
                    _ip("-n", hns, "link", "set", "dev", sl, "type", "bridge_slave", "isolated", "on",
                        "learning", "off", "flood", "off", "mcast_flood", "off", "bcast_flood", "off")
                    # a kernel bond's slaves run no IPv6 of their own; a bridge port does, and its
                    # neighbour discovery, sent from the bond's MAC, would move the MAC in the fabric
                    _ip("netns", "exec", hns, "sysctl", "-qw", f"net.ipv6.conf.{sl}.disable_ipv6=1", check=False)
            if self.bond_impl == "emulated":  # a bridge's MAC follows its ports' unless set; a bond's is fixed
                mac = _ip("-n", hns, "-j", "link", "show", slaves[0]).stdout
                _ip("-n", hns, "link", "set", BOND_IF, "address", json.loads(mac)[0]["address"])
            _ip("-n", hns, "addr", "add", f"{self.bond_addr(h)}/24", "dev", BOND_IF)
            _ip("-n", hns, "link", "set", BOND_IF, "up")
            for sl in slaves:
                _ip("-n", hns, "link", "set", sl, "up")
            if self.bond_impl == "emulated":
                cmd = [*self.exec_prefix(h), sys.executable, "-m", "seamguard.testbed.bond", "--bond", BOND_IF,
                       "--slaves", ",".join(slaves), "--ip", self.bond_addr(h), "--miimon-ms", str(s.miimon_ms),
                       "--state-file", str(self._bond_state_file(h))]
                pp = os.environ.get("PYTHONPATH", "")
                env = {**os.environ, "PYTHONPATH": SRC + (os.pathsep + pp if pp else "")}
                self._monitors.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 15.0
        while any(self.bond_active(h) is None for h in range(s.hosts)):
            if time.monotonic() > deadline or any(m.poll() is not None for m in self._monitors):
                raise TestbedError("bond monitors did not select an active slave within 15 s")
            time.sleep(0.05)

    def _bond_state_file(self, host: int) -> Path:
        return Path(self._state_dir) / f"h{host}.json"

    def monitor_pids(self) -> list[int]:
        """Processes this testbed runs (the emulated bonds' monitors); none after down()."""
        return [m.pid for m in self._monitors if m.poll() is None]

    def bond_active(self, host: int) -> str | None:
        """The slave that carries a bonded host's traffic now (None before one is chosen)."""
        if self.bond_impl == "kernel":
            p = subprocess.run([*self.exec_prefix(host), "cat", f"/sys/class/net/{BOND_IF}/bonding/active_slave"],
                               check=False, capture_output=True, text=True, timeout=10.0)
            return p.stdout.strip() or None
        try:
            return json.loads(self._bond_state_file(host).read_text())["active"]
        except (OSError, ValueError, KeyError):
            return None

    def down(self) -> None:
        """Delete everything this testbed created. Idempotent; never raises."""
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        for m in self._monitors:  # they live in our namespaces: stop them first
            if m.poll() is None:
                m.terminate()
        for m in self._monitors:
            try:
                m.wait(5.0)
            except subprocess.TimeoutExpired:
                m.kill()
                m.wait(5.0)
        self._monitors.clear()
        if self._state_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)
            self._state_dir = ""
        for ns in self.namespaces():
            _ip("netns", "delete", ns, check=False)
        self._gray.clear()
        self._up = False
        _LIVE.discard(self)

    def __enter__(self) -> "Testbed":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ---- running things inside a host --------------------------------------------------
    def exec_prefix(self, host: int) -> list[str]:
        """Command prefix that runs a process inside host's namespace (own /sys view)."""
        return ["ip", "netns", "exec", self.host_ns(host)]

    # ---- faults (each reversible) ------------------------------------------------------
    def set_link(self, host: int, rail: int, up: bool) -> None:
        """The switch port of (host, rail) up or down: the host sees carrier change."""
        _ip("-n", self.fabric_ns, "link", "set", self.port(host, rail), "up" if up else "down")

    def flap(self, host: int, rail: int, down_s: float) -> threading.Timer:
        """Take a host's rail link down now and bring it back after down_s (non-blocking)."""
        self.set_link(host, rail, False)
        t = threading.Timer(down_s, self._restore_link, args=(host, rail))
        t.daemon = True
        self._timers.append(t)
        t.start()
        return t

    def _restore_link(self, host: int, rail: int) -> None:
        if self._up:
            try:
                self.set_link(host, rail, True)
            except TestbedError:
                pass  # torn down meanwhile

    def set_switch(self, rail: int, up: bool) -> None:
        """A whole rail's leaf switch stops (or resumes) forwarding. Host carriers stay up:
        this is the silent failure that only a bounded collective timeout can catch."""
        _ip("-n", self.fabric_ns, "link", "set", f"br{rail}", "up" if up else "down")

    def set_gray(self, host: int, rail: int, rate_mbit: float | None) -> None:
        """Bandwidth collapse on both directions of (host, rail) via tbf; None restores."""
        for ns, dev in ((self.host_ns(host), self.rail_if(rail)), (self.fabric_ns, self.port(host, rail))):
            _tc(ns, "qdisc", "del", "dev", dev, "root", check=False)
            if rate_mbit is not None:
                _tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                    "burst", "32kbit", "latency", "400ms")
        if rate_mbit is None:
            self._gray.discard((host, rail))
        else:
            self._gray.add((host, rail))

    # ---- observation ---------------------------------------------------------------------
    def host_link_stats(self, host: int) -> dict[str, dict[str, float]]:
        """sysfs counters of a host's rail interfaces, read inside its namespace."""
        ifs = " ".join(self.rail_if(r) for r in range(self.spec.rails))
        script = (f"for i in {ifs}; do d=/sys/class/net/$i; "
                  "echo $i $(cat $d/operstate) $(cat $d/carrier 2>/dev/null || echo 0) "
                  "$(cat $d/carrier_changes) $(cat $d/carrier_down_count) "
                  "$(cat $d/statistics/rx_bytes) $(cat $d/statistics/tx_bytes); done")
        p = subprocess.run([*self.exec_prefix(host), "sh", "-c", script], capture_output=True,
                           text=True, timeout=10.0)
        if p.returncode != 0:
            raise TestbedError(f"reading link stats of host {host}: {p.stderr.strip()}")
        out = {}
        for line in p.stdout.splitlines():
            name, oper, carrier, changes, downs, rx, tx = line.split()
            out[name] = {"up": float(oper == "up"), "carrier": float(carrier), "carrier_changes": float(changes),
                         "carrier_down_changes": float(downs), "rx_bytes": float(rx), "tx_bytes": float(tx)}
        return out

    def fabric_tx_bytes(self) -> dict[tuple[int, int], float]:
        """Bytes each switch port sent towards its host = the host's inbound bytes per rail."""
        return self._port_stats("tx", "bytes")

    def fabric_rx_packets(self) -> dict[tuple[int, int], float]:
        """Frames each switch port received from its host = what the host sent per rail."""
        return self._port_stats("rx", "packets")

    def _port_stats(self, way: str, unit: str) -> dict[tuple[int, int], float]:
        p = _ip("-n", self.fabric_ns, "-j", "-s", "link", "show")
        out = {}
        for link in json.loads(p.stdout):
            m = re.match(r"^h(\d+)r(\d+)$", link.get("ifname", ""))
            if m:
                out[(int(m.group(1)), int(m.group(2)))] = float(link["stats64"][way][unit])
        return out

    def leftovers(self) -> dict[str, list[str]]:
        """What of this testbed still exists (namespaces); empty after down()."""
        present = set(list_namespaces())
        return {"namespaces": [ns for ns in self.namespaces() if ns in present]}


def wait_carrier(tb: Testbed, host: int, rail: int, up: bool, timeout_s: float = 5.0) -> bool:
    """Bounded wait until a host interface's carrier reaches the given state."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (tb.host_link_stats(host)[tb.rail_if(rail)]["carrier"] == 1.0) == up:
            return True
        time.sleep(0.05)
    return False
