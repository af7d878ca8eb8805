"""A disaggregated inference pool on the namespaced testbed: one shapable link per KV path.

Why this exists: the routing benchmark and the routing integration test need prefill->decode
paths that each cross their own real link, so that degrading one path with ``tc tbf`` slows
exactly that path's KV transfers (real traffic, not a sleep). Built on seamguard.testbed.net
(hosts = namespaces, rails = bridges) and seamguard.testbed.inference_pool.

Layout, for P prefill and D decode instances (``Testbed`` with P + D + 1 hosts and D rails):

    host i < P          prefill i: OpenAI API on its mgmt address, KV served on every rail
    host P + j          decode j: OpenAI API on mgmt, pulls KV from its rail j address (its
                        home rail) unless the gateway places the transfer on another rail
    host P + D          the client (load generator / gateway), on mgmt only

Decode j pulls over rail j, and rail j of prefill i carries only decode j's pulls, so the
interface ``rail<j>`` of prefill host i is the path (prefill i -> decode j) alone.
`shape_argv` gives the ``tc`` commands that degrade it (both directions, like
Testbed.set_gray, with an explicit rate and burst); `degrade` applies them now.
`start_gateway` runs `seamguard gateway` on the client host in front of the pool.
The MTU is 1500 so that a tbf burst smaller than a jumbo frame cannot black-hole the link.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from seamguard.gateway.routing import Instance
from seamguard.testbed.inference_pool import PoolProcess, launch
from seamguard.testbed.net import Testbed, TestbedSpec, _tc

API_PORT = 8100
KV_PORT = 8200
GATEWAY_PORT = 8080
BENCH_KEYS = {"interactive": "sk-bench-interactive-0001", "batch": "sk-bench-batch-0001"}
BENCH_ADMIN_TOKEN = "bench-admin-token-0001"  # reads the gateway's /metrics (the router's decisions)


@dataclass
class PoolBed:
    """P prefill + D decode instances and one client host; a context manager that always
    stops the instances and deletes the namespaces."""

    prefill: int = 2
    decode: int = 2
    instance_args: list[str] = field(default_factory=list)  # extra inference_pool flags (timing, shape)
    tb: Testbed | None = None
    procs: list[PoolProcess] = field(default_factory=list)

    @property
    def client_host(self) -> int:
        return self.prefill + self.decode

    def up(self) -> "PoolBed":
        if not 1 <= self.decode <= 8:
            raise ValueError("decode instances: 1..8 (one rail each)")
        self.tb = Testbed(TestbedSpec(hosts=self.prefill + self.decode + 1, rails=self.decode, mtu_bytes=1500)).up()
        try:
            tb = self.tb
            for i in range(self.prefill):
                addrs = ",".join(tb.addr(i, r) for r in range(self.decode))
                self.procs.append(launch(tb.exec_prefix(i), [
                    "--role", "prefill", "--name", f"p{i}", "--host", tb.addr(i, None), "--port", str(API_PORT),
                    "--kv-port", str(KV_PORT), "--kv-addrs", addrs, *self.instance_args]))
            for j in range(self.decode):
                h = self.prefill + j
                binds = [tb.addr(h, j)] + [tb.addr(h, r) for r in range(self.decode) if r != j]  # home rail first
                self.procs.append(launch(tb.exec_prefix(h), [
                    "--role", "decode", "--name", f"d{j}", "--host", tb.addr(h, None), "--port", str(API_PORT),
                    "--kv-bind", ",".join(binds), *self.instance_args]))
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every instance and delete the testbed. Idempotent; never raises."""
        for p in self.procs:
            try:
                p.stop()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        self.procs.clear()
        if self.tb is not None:
            self.tb.down()

    def __enter__(self) -> "PoolBed":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def instances(self) -> list[Instance]:
        """The instances as the router sees them. nic: a decode instance's home rail interface
        (``<host ns>/rail<j>``), a prefill instance's host (``<host ns>``: it serves KV on every
        rail). rails: every host's rail interfaces in rail order, so the seamguard router can
        place a transfer on another rail than the decode instance's home rail (KV placement)."""
        tb = self.tb
        assert tb is not None
        rails = lambda h: tuple(f"{tb.host_ns(h)}/{tb.rail_if(r)}" for r in range(self.decode))  # noqa: E731
        out = [Instance(f"p{i}", f"http://{tb.addr(i, None)}:{API_PORT}", "prefill", tb.host_ns(i), rails(i))
               for i in range(self.prefill)]
        out += [Instance(f"d{j}", f"http://{tb.addr(self.prefill + j, None)}:{API_PORT}", "decode",
                         f"{tb.host_ns(self.prefill + j)}/rail{j}", rails(self.prefill + j), home_rail=j)
                for j in range(self.decode)]
        return out

    def shape_argv(self, prefill: int, decode: int, rate_mbit: float | None, burst_bytes: int = 16384,
                   latency_ms: int = 400) -> list[list[str]]:
        """tc commands that shape (or, rate None, restore) the path prefill -> decode."""
        tb = self.tb
        assert tb is not None
        ends = [(tb.host_ns(prefill), tb.rail_if(decode)), (tb.fabric_ns, tb.port(prefill, decode))]
        if rate_mbit is None:
            return [["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"] for ns, dev in ends]
        return [["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                 "burst", str(burst_bytes), "latency", f"{latency_ms}ms"] for ns, dev in ends]

    def degrade(self, prefill: int, decode: int, rate_mbit: float | None, burst_bytes: int = 16384) -> None:
        for argv in self.shape_argv(prefill, decode, rate_mbit, burst_bytes):
            _tc(argv[2], *argv[3:], check=rate_mbit is not None)

    def start_gateway(self, router: str, router_options: dict, workdir: Path, port: int = GATEWAY_PORT,
                      feed_every_s: float = 0.5, timeout_s: float = 30.0) -> subprocess.Popen:
        """`seamguard gateway` in the client host, in front of the pool, with `router`; one key per
        request class (BENCH_KEYS), no token budgets and no zombie detection (the routing is what
        is measured). Stop it with stop_gateway. Readiness: the load generator waits for /healthz."""
        tb = self.tb
        assert tb is not None
        cfg = {"version": 1, "host": "127.0.0.1", "port": port,
               "instances": [asdict(i) for i in self.instances()], "router": router,
               "router_options": router_options, "feed_every_s": feed_every_s,
               "timeouts": {"connect_s": 2.0, "read_s": timeout_s, "total_s": 4 * timeout_s},
               "store": {"type": "sqlite", "path": str(workdir / "gateway.db")},
               "zombie": {"enabled": False},
               "tenants": [{"name": cls, "keys": [{"name": f"{cls}-key", "key": key,
                                                   "priority": "low" if cls == "batch" else "normal"}]}
                           for cls, key in BENCH_KEYS.items()]}
        path = workdir / "gateway.json"  # JSON is YAML
        path.write_text(json.dumps(cfg))
        log = (workdir / "gateway.log").open("w")
        return subprocess.Popen([*tb.exec_prefix(self.client_host), sys.executable, "-m", "seamguard", "gateway",
                                 "--config", str(path), "-o", "json"], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "SEAMGUARD_GATEWAY_TOKEN": BENCH_ADMIN_TOKEN})

    @staticmethod
    def stop_gateway(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)

    def run_load(self, spec: dict, timeout_s: float) -> dict:
        """Run seamguard.testbed.inference_load with `spec` inside the client host; its result."""
        tb = self.tb
        assert tb is not None
        with tempfile.TemporaryDirectory(prefix="sg-load-") as d:
            sp, out = Path(d) / "spec.json", Path(d) / "out.json"
            sp.write_text(json.dumps(spec))
            p = subprocess.run([*tb.exec_prefix(self.client_host), sys.executable, "-m",
                                "seamguard.testbed.inference_load", "--spec", str(sp), "--out", str(out)],
                               capture_output=True, text=True, timeout=timeout_s)
            if p.returncode != 0:
                raise RuntimeError(f"load generator failed ({p.returncode}): {p.stderr[-2000:]}")
            return json.loads(out.read_text())
