"""The agent: its collectors on one private CollectorRegistry, the probes' threads, one HTTP server.

What is cheap to read is read when Prometheus scrapes (sysfs, /proc, the kernel log's new
lines, NVML); what takes time runs on bounded background threads (storage and fabric
probes) and the scrape reads their last results, so a scrape never waits on a disk or a
peer. ``Agent.start()`` binds the ports; everything before it (config, NVML, opening the
kernel log) fails early with a message naming what is wrong.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server

from seamguard.agent.config import AgentConfig
from seamguard.agent.fabric import EchoServer, FabricProber, Network, Pair
from seamguard.agent.host import read_host
from seamguard.agent.kernel_log import (
    FALLEN,
    SXID,
    XID,
    JournalTail,
    KernelEvent,
    KmsgTail,
    Pending,
    parse_kernel_lines,
    record_text,
)
from seamguard.agent.storage import StorageProber
from seamguard.observe.nvml import close_nvml, open_nvml, pci_bus_id, read_gpu
from seamguard.observe.sysfs import nic_record, read_infiniband, read_netdev

log = logging.getLogger("seamguard.agent")

PROBE_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RTT_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
               500e-3, 1.0, 2.5)
# node_exporter's infiniband names for the sysfs counter files (collector/infiniband_linux.go)
IB_COUNTER_NAMES = {
    "link_downed": "node_infiniband_link_downed_total",
    "link_error_recovery": "node_infiniband_link_error_recovery_total",
    "symbol_error": "node_infiniband_symbol_error_total",
    "port_rcv_errors": "node_infiniband_port_errors_received_total",
    "port_xmit_wait": "node_infiniband_port_transmit_wait_total",
    "local_link_integrity_errors": "node_infiniband_local_link_integrity_errors_total",
    "port_xmit_discards": "node_infiniband_port_discards_transmitted_total",
}


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _family(kind: str, name: str, doc: str, labels: list[str]) -> Metric:
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, doc, labels=labels)


# ---- kernel log ---------------------------------------------------------------------------------
class KernelLogCollector:
    """Drains the kernel log tail on each scrape (bounded) and exports running counts."""

    def __init__(self, node: str, tail, max_series: int, gpus: dict[str, int], dcgm_gauge: bool) -> None:
        self.node, self.tail, self.max_series = node, tail, max_series
        self.gpus, self.dcgm_gauge = dict(gpus), dcgm_gauge
        self.counts: dict[tuple[str, str, int, str], int] = {}
        self.last_xid: dict[str, int] = {}
        self.pending: Pending | None = None
        self.lock = threading.Lock()

    def describe(self) -> list:
        return []  # the registry must not call collect() (it drains the log) at registration

    def add(self, events: list[KernelEvent]) -> None:
        for ev in events:
            key = (ev.kind, ev.pci_bus_id, ev.code, ev.severity)
            if key not in self.counts and len(self.counts) >= self.max_series:
                key = (ev.kind, "other", -1, "")  # the label sets are bounded; the count is kept
            self.counts[key] = self.counts.get(key, 0) + 1
            if ev.kind in (XID, FALLEN):
                self.last_xid[ev.pci_bus_id] = ev.code

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            lines = [t for raw in self.tail.read() for t in record_text(raw)]
            events, self.pending = parse_kernel_lines(lines, self.pending)
            self.add(events)
            counts, last = dict(self.counts), dict(self.last_xid)
        xid = CounterMetricFamily("seamguard_xid_errors", "NVIDIA XID lines in the kernel log, per GPU and code",
                                  labels=["node", "pci_bus_id", "xid"])
        sxid = CounterMetricFamily("seamguard_sxid_errors", "NVSwitch SXID lines in the kernel log",
                                   labels=["node", "pci_bus_id", "sxid", "severity"])
        fallen = CounterMetricFamily("seamguard_gpu_fallen_off_bus",
                                     "'GPU has fallen off the bus' messages (without an XID line)",
                                     labels=["node", "pci_bus_id"])
        for (kind, bdf, code, sev), n in sorted(counts.items()):
            c = "other" if code < 0 else str(code)
            if kind == XID:
                xid.add_metric([self.node, bdf, c], n)
            elif kind == SXID:
                sxid.add_metric([self.node, bdf, c, sev or "unknown"], n)
            else:
                fallen.add_metric([self.node, bdf], n)
        yield from (xid, sxid, fallen)
        if self.dcgm_gauge and self.gpus:
            g = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "value of the last XID error seen (dcgm-exporter's name)",
                                  labels=["Hostname", "gpu", "pci_bus_id"])
            for bdf, idx in sorted(self.gpus.items(), key=lambda kv: kv[1]):
                g.add_metric([self.node, str(idx), bdf], float(last.get(bdf, 0)))
            yield g
        up = GaugeMetricFamily("seamguard_agent_kernel_log_up", "1 while the kernel log source is readable",
                               labels=["node", "source"])
        up.add_metric([self.node, type(self.tail).__name__], 1.0 if self.tail.up else 0.0)
        yield up
        over = CounterMetricFamily("seamguard_agent_kernel_log_overruns",
                                   "kmsg records overwritten before the agent read them", labels=["node"])
        over.add_metric([self.node], self.tail.lines.overrun if self.tail.lines else 0)
        yield over


# ---- NICs -------------------------------------------------------------------------------------
class NicCollector:
    def __init__(self, node: str, cfg) -> None:
        self.node, self.cfg = node, cfg

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        net = read_netdev(self.cfg.net_root)
        ib = read_infiniband(self.cfg.ib_root)
        names = self.cfg.interfaces if self.cfg.interfaces is not None else [n for n in net if n != "lo"]
        lab = ["node", "device"]
        fam = {
            "up": _family("gauge", "node_network_up", "operstate is up", lab),
            "carrier": _family("gauge", "node_network_carrier", "carrier (1 link detected)", lab),
            "carrier_changes": _family("counter", "node_network_carrier_changes", "carrier changes", lab),
            "carrier_up_count": _family("counter", "node_network_carrier_up_changes", "carrier up changes", lab),
            "carrier_down_count": _family("counter", "node_network_carrier_down_changes", "carrier down changes",
                                          lab),
        }
        info = GaugeMetricFamily("node_network_info", "operstate of each interface", labels=lab + ["operstate"])
        for dev in names:
            r = net.get(dev)
            if r is None:
                continue
            fam["up"].add_metric([self.node, dev], 1.0 if r["operstate"] == "up" else 0.0)
            info.add_metric([self.node, dev, str(r["operstate"])], 1.0)
            for key in ("carrier", "carrier_changes", "carrier_up_count", "carrier_down_count"):
                if _finite(r[key]):
                    fam[key].add_metric([self.node, dev], r[key])
        yield from fam.values()
        yield info
        # node_infiniband_* per (device, port): real IB ports, then fleet devices mapped onto netdevs
        ib_lab = ["node", "device", "port"]
        state = GaugeMetricFamily("node_infiniband_state_id", "port state (4 = ACTIVE)", labels=ib_lab)
        phys = GaugeMetricFamily("node_infiniband_physical_state_id", "physical state (5 = LinkUp)", labels=ib_lab)
        counters = {k: CounterMetricFamily(n.removesuffix("_total"), k, labels=ib_lab)
                    for k, n in IB_COUNTER_NAMES.items()}
        rows: dict[tuple[str, str], dict[str, float]] = {}
        for fleet_dev, iface in self.cfg.devices.items():
            rec = nic_record(iface, ib, net)
            if rec is not None:
                rows[(fleet_dev, "1")] = rec
        for (dev, port), rec in ib.items():
            rows.setdefault((dev, port), rec)
        for (dev, port), rec in sorted(rows.items()):
            if _finite(rec.get("state_id")):
                state.add_metric([self.node, dev, port], rec["state_id"])
            if _finite(rec.get("phys_state_id")):
                phys.add_metric([self.node, dev, port], rec["phys_state_id"])
            for k, fam_c in counters.items():
                if _finite(rec.get(k)):
                    fam_c.add_metric([self.node, dev, port], rec[k])
        yield state
        yield phys
        yield from counters.values()


# ---- host pressure ----------------------------------------------------------------------------
class HostCollector:
    _PSI: ClassVar[dict[tuple[str, str], str]] = {
        ("cpu", "some"): "node_pressure_cpu_waiting_seconds",
        ("cpu", "full"): "node_pressure_cpu_stalled_seconds",
        ("memory", "some"): "node_pressure_memory_waiting_seconds",
        ("memory", "full"): "node_pressure_memory_stalled_seconds",
        ("io", "some"): "node_pressure_io_waiting_seconds",
        ("io", "full"): "node_pressure_io_stalled_seconds",
    }

    def __init__(self, node: str, cfg) -> None:
        self.node, self.cfg = node, cfg

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        r = read_host(self.cfg.proc_root, self.cfg.edac_root)
        for (res, kind), name in self._PSI.items():
            v = r.psi.get(res, {}).get(kind)
            if v is None or (res == "cpu" and kind == "full" and v == 0.0):
                continue  # cpu "full" is 0 on kernels that do not track it (node_exporter skips it too)
            f = CounterMetricFamily(name, f"PSI {kind} stall time of {res}", labels=["node"])
            f.add_metric([self.node], v)
            yield f
        if "oom_kill" in r.vmstat:
            f = GaugeMetricFamily("node_vmstat_oom_kill", "/proc/vmstat oom_kill (OOM killer invocations)",
                                  labels=["node"])
            f.add_metric([self.node], r.vmstat["oom_kill"])
            yield f
        if r.edac:
            ce = CounterMetricFamily("node_edac_correctable_errors", "EDAC correctable memory errors",
                                     labels=["node", "controller"])
            ue = CounterMetricFamily("node_edac_uncorrectable_errors", "EDAC uncorrectable memory errors",
                                     labels=["node", "controller"])
            for mc, (c, u) in r.edac.items():
                if _finite(c):
                    ce.add_metric([self.node, mc], c)
                if _finite(u):
                    ue.add_metric([self.node, mc], u)
            yield ce
            yield ue


# ---- GPUs -------------------------------------------------------------------------------------
class GpuCollector:
    def __init__(self, node: str, nvml, handles: list) -> None:
        self.node, self.nvml, self.handles = node, nvml, handles
        self.bus = [pci_bus_id(nvml, h) for h in handles]

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        fams: dict[str, GaugeMetricFamily] = {}
        for i, h in enumerate(self.handles):
            for name, v in read_gpu(self.nvml, h).items():
                if not _finite(v):
                    continue
                f = fams.setdefault(name, GaugeMetricFamily(name, f"{name} (NVML)",
                                                            labels=["Hostname", "gpu", "pci_bus_id"]))
                f.add_metric([self.node, str(i), self.bus[i]], v)
        yield from fams.values()


# ---- storage and fabric: background probes, read on scrape -------------------------------------
class ProbeCollector:
    def __init__(self, node: str, storage: StorageProber | None, fabric: FabricProber | None) -> None:
        self.node, self.storage, self.fabric = node, storage, fabric

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        if self.storage is not None:
            up = GaugeMetricFamily("seamguard_storage_probe_up", "1 when the last probe of the path succeeded "
                                   "within its timeout", labels=["node", "storage", "path"])
            p99 = GaugeMetricFamily("seamguard_storage_write_latency_ms", "p99 write+fsync latency of the recent "
                                    "probes of the path", labels=["node", "storage"])
            for name, path, ok, ms in self.storage.snapshot():
                if _finite(ok):
                    up.add_metric([self.node, name, path], ok)
                if _finite(ms):
                    p99.add_metric([self.node, name], ms)
            yield up
            yield p99
        if self.fabric is not None:
            g = GaugeMetricFamily("seamguard_fabric_link_latency_us", "fastest probe RTT over the peers of the "
                                  "link's rail in the last round (a gray link slows every pair through it)", labels=["node", "link"])
            for link, us in sorted(self.fabric.snapshot().items()):
                g.add_metric([self.node, link], us)
            yield g


class EchoCollector:
    """What the echo responder refused, by reason (not a peer, the source's slots held, all slots held)."""

    def __init__(self, node: str, echo: Callable[[], EchoServer | None]) -> None:
        self.node, self.echo = node, echo

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        server = self.echo()
        if server is None:
            return
        c = CounterMetricFamily("seamguard_fabric_echo_refused", "connections the fabric echo responder closed at "
                                "accept: not from a configured peer, or over the per-source or total slot bound",
                                labels=["node", "reason"])
        for reason, n in sorted(server.refusals().items()):
            c.add_metric([self.node, reason], n)
        yield c


def echo_sources(cfg: AgentConfig) -> tuple[Network, ...]:
    """Who the echo responder answers: every configured peer's address, and ``accept_from``."""
    nets = {ipaddress.ip_network(p.address) for p in cfg.fabric.peers}
    nets.update(ipaddress.ip_network(n) for n in cfg.fabric.accept_from)
    return tuple(sorted(nets, key=lambda n: (n.version, n)))


def _version() -> str:
    try:
        return version("seamguard")
    except PackageNotFoundError:
        return "unknown"


class Agent:
    """Everything `seamguard agent` runs for one node. ``start()`` binds; ``stop()`` releases."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        node = cfg.node
        self.registry = CollectorRegistry()
        self.notes: list[str] = []
        self.nvml = None
        self.server = None
        self.port: int | None = None
        self.echo: EchoServer | None = None
        self.storage: StorageProber | None = None
        self.fabric: FabricProber | None = None
        self.tail = None
        gpu_map: dict[str, int] = dict(cfg.kernel_log.gpus)

        if cfg.gpus.enabled:
            nvml, handles, err = open_nvml()
            if err:
                self.notes.append(f"GPUs: no NVIDIA driver here ({err}); exporting nothing for GPUs")
            else:
                self.nvml = nvml
                gpus = GpuCollector(node, nvml, handles)
                gpu_map.update({b: i for i, b in enumerate(gpus.bus) if b})
                self.registry.register(gpus)
                self.notes.append(f"GPUs: {len(handles)} through NVML")

        if cfg.kernel_log.enabled:
            k = cfg.kernel_log
            # Opening now, before any port is bound: a missing /dev/kmsg or no root is an error at start.
            self.tail = (KmsgTail(k.path, k.max_lines_per_read) if k.source == "kmsg"
                         else JournalTail(k.journalctl, k.max_lines_per_read))
            self.registry.register(KernelLogCollector(node, self.tail, k.max_series, gpu_map, k.dcgm_xid_gauge))
        if cfg.nics.enabled:
            self.registry.register(NicCollector(node, cfg.nics))
        if cfg.host.enabled:
            self.registry.register(HostCollector(node, cfg.host))

        if cfg.storage.enabled and cfg.storage.paths:
            s = cfg.storage
            hist = Histogram("seamguard_storage_probe_seconds", "storage probe latency: write (+fsync) and read",
                             ["node", "storage", "op"], buckets=PROBE_SECONDS_BUCKETS, registry=self.registry)
            fails = Counter("seamguard_storage_probe_failures", "storage probes that failed or timed out",
                            ["node", "storage", "reason"], registry=self.registry)
            self.storage = StorageProber(
                [(p.name, p.path) for p in s.paths], s.interval_s, s.timeout_s, s.size_bytes, s.window,
                observe=lambda name, op, sec: hist.labels(node, name, op).observe(sec),
                fail=lambda name, reason: fails.labels(node, name, reason).inc())
        if cfg.fabric.enabled and cfg.fabric.peers:
            f = cfg.fabric
            pairs = [Pair(r.nic, r.address, p.nic, p.address, p.port or f.port, r.rail, r.link)
                     for r in f.rails for p in f.peers if p.rail == r.rail]
            lab = ["node", "src_nic", "dst_nic", "rail"]
            rtt = Histogram("seamguard_fabric_probe_rtt_seconds", "fabric probe echo round trip",
                            lab, buckets=RTT_BUCKETS, registry=self.registry)
            sent = Counter("seamguard_fabric_probes", "fabric probes sent", lab, registry=self.registry)
            lost = Counter("seamguard_fabric_probe_lost", "fabric probes lost (refused, reset or timed out)",
                           lab, registry=self.registry)

            def record(pair: Pair, seconds: float | None) -> None:
                labels = (node, pair.src_nic, pair.dst_nic, str(pair.rail))
                sent.labels(*labels).inc()
                if seconds is None:
                    lost.labels(*labels).inc()
                else:
                    rtt.labels(*labels).observe(seconds)

            self.fabric = FabricProber(pairs, f.interval_s, f.timeout_s, f.payload_bytes, record)
        if self.storage is not None or self.fabric is not None:
            self.registry.register(ProbeCollector(node, self.storage, self.fabric))
        if cfg.fabric.enabled:
            self.registry.register(EchoCollector(node, lambda: self.echo))
        info = GaugeMetricFamily("seamguard_agent_info", "the agent and what it reads",
                                 labels=["node", "version", "gpus"])
        info.add_metric([node, _version(), "nvml" if self.nvml is not None else "none"], 1.0)
        self.registry.register(_Static([info]))

    def start(self) -> int:
        """Bind the echo responder and /metrics, start the probes; returns the /metrics port."""
        f = self.cfg.fabric
        if f.enabled:
            self.echo = EchoServer(f.listen, f.port, f.timeout_s, echo_sources(self.cfg))
            self.echo.start()
        self.server, _ = start_http_server(self.cfg.listen.port, addr=self.cfg.listen.host, registry=self.registry)
        self.port = int(self.server.server_address[1])
        if self.storage is not None:
            self.storage.start()
        if self.fabric is not None:
            self.fabric.start()
        return self.port

    def stop(self) -> None:
        if self.fabric is not None:
            self.fabric.stop()
        if self.storage is not None:
            self.storage.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.echo is not None:
            self.echo.stop()
        if self.tail is not None:
            self.tail.close()
        close_nvml(self.nvml)


class _Static:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.families
