"""docs/production.md, run: the operator's walk from a running Slurm to an HA controller that
drains a failing node, with the commands and files read out of the document itself.

Real servers throughout: slurmctld and one slurmd per node, each node in its own network
namespace (testbed/slurm.py); Prometheus; etcd; PostgreSQL. The telemetry is the twin's,
served for the imported topology with one GPU fault (testbed/fault_exporter.py) where a
fleet has dcgm-exporter and agents. The walk: import the topology from Slurm, write and
check every node's agent config, validate the tuned policy, dry run (replay + eval) on the
history Prometheus holds, then two `seamguard run` replicas with ``ha:``, first in dry run
(the drain ledgered as ``dry_run``, Slurm untouched), then restarted in enforce -> the
leader drains the faulty node in Slurm (ledgered with its token); ``kill -9`` the leader
-> the other replica leads and repeats nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import yaml

from conftest import subprocess_env
from seamguard.agent.config import parse_agent_config
from seamguard.app.config import load_topology
from seamguard.ports import free_port
from seamguard.testbed.ha_pair import LEADER_KEY, KeyWatch, audit, takeovers, world_records
from seamguard.testbed.multinode import EtcdServer
from seamguard.testbed.postgres_server import PostgresServer
from seamguard.testbed.prom import PrometheusServer
from seamguard.testbed.slurm import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "production.md"
NODES = ["gpu000", "gpu001", "gpu002", "gpu003"]
FAULTY_GPU = "gpu002/gpu2"
FAULTY_NODE = "gpu002"
TOPOLOGY_CONF = ("SwitchName=leaf0 Nodes=gpu[000-001]\nSwitchName=leaf1 Nodes=gpu[002-003]\n"
                 "SwitchName=spine0 Switches=leaf[0-1]\n")
TICK_S = 1.0

RULES = ROOT / "deploy" / "prometheus" / "seamguard-rules.yml"


# ---- the document -------------------------------------------------------------------------------
def doc_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def doc_commands(text: str) -> list[str]:
    """Every ``seamguard ...`` line of the ``sh`` blocks, in the document's order."""
    return [line.strip() for info, body in doc_blocks(text) if info == "sh"
            for line in body.splitlines() if line.strip().startswith("seamguard ")]


def doc_files(text: str) -> dict[str, str]:
    """The ``yaml`` blocks whose first line is ``# file: NAME``."""
    out = {}
    for info, body in doc_blocks(text):
        first, _, rest = body.partition("\n")
        if info == "yaml" and first.startswith("# file: "):
            out[first.removeprefix("# file: ").strip()] = rest
    return out


def command(commands: list[str], prefix: str) -> str:
    found = [c for c in commands if c.startswith(prefix)]
    assert len(found) == 1, f"docs/production.md: expected one `{prefix}` command, found {found}"
    return found[0]


def argv(cmd: str, values: dict[str, str]) -> list[str]:
    """The doc's command with its $VARIABLES filled, as ``python -m seamguard ...``."""
    words = shlex.split(cmd)
    assert words[0] == "seamguard"
    filled = [re.sub(r"\$([A-Z_]+)", lambda m: values[m.group(1)], w) for w in words[1:]]
    return [sys.executable, "-m", "seamguard", *filled]


def test_the_document_lists_the_walk_in_order() -> None:
    cmds = doc_commands(DOC.read_text())
    order = ["seamguard fleet import", "seamguard agent config", "seamguard agent --config", "seamguard replay",
             "seamguard eval", "seamguard policy validate", "seamguard run"]
    firsts = [next(i for i, c in enumerate(cmds) if c.startswith(p)) for p in order]
    assert firsts == sorted(firsts), cmds
    assert set(doc_files(DOC.read_text())) == {"facility.yaml", "policy.yaml", "controller-a.yaml"}


def test_what_the_document_points_to_exists() -> None:
    """Alerts, files under deploy/ and docs/ that the walk names are there."""
    text = DOC.read_text()
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    named = set(re.findall(r"`(Seamguard\w+)`", text))
    assert named and named <= alerts, named - alerts
    paths = set(re.findall(r"\b((?:deploy|docs)/[\w./-]*\w)", text))
    assert paths and not [p for p in paths if not (ROOT / p).exists()], paths
    assert "docs/production.md" in (ROOT / "README.md").read_text()


# ---- the walk --------------------------------------------------------------------------------------
def _run(args: list[str], cwd: Path, env: dict[str, str], timeout_s: float = 180) -> subprocess.CompletedProcess:
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    assert r.returncode == 0, f"{shlex.join(args[2:])}: exit {r.returncode}\n{r.stderr[-2000:]}"
    return r


def _wait(what: str, cond, timeout_s: float, why=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what} within {timeout_s:.0f} s; {why()}")


def _node_state(sc: SlurmCluster, node: str) -> str:
    out = sc.scontrol("show", "node", node, "-o").stdout
    m = re.search(r"\bState=(\S+)", out)
    return m.group(1) if m else ""


def _drains(ledger_url: str, dry_run: bool = True) -> list[tuple]:
    """(actuator, key, op, status, fence) of every drain in the ledger (one row per actuator), the
    dry run's rows (status dry_run) only with ``dry_run``."""
    with psycopg.connect(ledger_url, connect_timeout=10) as conn:
        rows = conn.execute("SELECT actuator, key, op, status, fence FROM actions WHERE verb = 'drain' "
                            "ORDER BY actuator, id").fetchall()
    return [r for r in rows if dry_run or r[3] != "dry_run"]


ONE_DRAIN = [(a, f"drain:{FAULTY_NODE}", "apply", "done") for a in ("log", "slurm")]


def _decided(ledger_url: str, key: str) -> bool:
    with psycopg.connect(ledger_url, connect_timeout=10) as conn:
        return conn.execute("SELECT 1 FROM decisions WHERE key = %s AND event = 'decided' LIMIT 1",
                            (key,)).fetchone() is not None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Walk:
    """Where the walk runs: its directory, the doc's commands and files, the Slurm cluster, and the
    environment its commands get (the Slurm clients' wrappers first on PATH)."""

    work: Path
    cmds: list[str]
    files: dict[str, str]
    sc: SlurmCluster
    env: dict[str, str]

    def argv(self, prefix: str, **values: str) -> list[str]:
        return argv(command(self.cmds, prefix), values)

    def run(self, args: list[str]) -> subprocess.CompletedProcess:
        return _run(args, self.work, self.env)

    def node_state(self, node: str) -> str:
        return _node_state(self.sc, node)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ip netns)")
def test_the_walk_from_slurm_to_an_ha_controller_draining_a_failing_node(tmp_path: Path) -> None:
    text = DOC.read_text()
    work = tmp_path / "walk"
    work.mkdir()
    with ExitStack() as stack:
        sc = stack.enter_context(SlurmCluster(tmp_path / "slurm", NODES, slurmd=True, topology_conf=TOPOLOGY_CONF))
        env = {**subprocess_env(), "SLURM_CONF": str(sc.conf),
               "PATH": f"{sc.workdir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        w = Walk(work, doc_commands(text), doc_files(text), sc, env)
        import_topology_and_write_agent_configs(w)
        prom, start = serve_telemetry(w, stack, tmp_path)
        dry_run_on_history(w, prom.url, start)
        pg = stack.enter_context(PostgresServer())
        etcd = stack.enter_context(EtcdServer.loopback(tmp_path / "etcd"))
        watch = KeyWatch(etcd.address).start()
        stack.callback(watch.stop)
        pair = ControllerPair(w, pg.create_database("walk_ledger"), etcd.address, prom.url, watch)
        stack.callback(pair.stop)
        pair.dry_run_then_enforce()
        pair.kill_the_leader()


def import_topology_and_write_agent_configs(w: Walk) -> None:
    """Steps 2 and 3: the topology from the running Slurm and the facility's base; every node's agent config."""
    (w.work / "facility.yaml").write_text(w.files["facility.yaml"])
    w.run(w.argv("seamguard fleet import"))
    fleet = load_topology(w.work / "topology.yaml")
    assert fleet.node_names == NODES and len(fleet.gpu_names) == 32
    topo = yaml.safe_load((w.work / "topology.yaml").read_text())
    assert {s["name"] for s in topo["switches"]} == {"leaf0", "leaf1", "spine0"}  # from topology.conf
    for node in NODES:
        w.run(w.argv("seamguard agent config", NODE=node))
        agent = parse_agent_config((w.work / f"agent-{node}.yaml").read_text(), f"agent-{node}.yaml")
        assert agent.node == node, agent
        w.run(w.argv("seamguard agent --config", NODE=node))


def serve_telemetry(w: Walk, stack: ExitStack, tmp_path: Path) -> tuple[PrometheusServer, float]:
    """The twin for the imported topology, one GPU escalating to a fatal XID, scraped by Prometheus.
    Prometheus first, so its history holds the exporter's whole life; (server, wall time it began)."""
    port = free_port()
    prom = stack.enter_context(PrometheusServer(tmp_path / "prom", targets=[f"127.0.0.1:{port}"],
                                                scrape_interval="1s"))
    start = time.time()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "seamguard.app.fault_twin", "fault", "--topology", str(w.work / "topology.yaml"),
         "--fault", f"gpu_ecc_escalation:{FAULTY_GPU}", "--start-s", "5", "--magnitude", "2",
         "--tick-s", str(TICK_S), "--port", str(port), "--truth-out", str(w.work / "truth.json")],
        env=w.env, stdout=subprocess.DEVNULL, stderr=open(w.work / "exporter.log", "wb"))
    stack.callback(_stop, exporter)
    prom.wait_targets_up(90)
    return prom, start


def dry_run_on_history(w: Walk, prom_url: str, start: float) -> None:
    """Steps 4 and 5: the tuned policy validated; replay over the history, eval against the fault."""
    (w.work / "policy.yaml").write_text(w.files["policy.yaml"])
    w.run(w.argv("seamguard policy validate"))
    _wait("the fault in the truth file", lambda: _fault_start_wall(w.work) is not None, 60)
    fault_wall = _fault_start_wall(w.work)
    _wait("history past the fatal XID", lambda: time.time() > fault_wall + 8, 60)
    replay = w.argv("seamguard replay", PROMETHEUS=prom_url, START=f"{start:.0f}", END=f"{time.time():.0f}")
    replay[replay.index("--step") + 1] = str(TICK_S)  # the test's scrape interval (docs/production.md §9)
    w.run(replay)
    timeline = (w.work / "timeline.jsonl").read_text().splitlines()
    assert any(f"drain:{FAULTY_NODE}" in line for line in timeline), "the replay would not drain the faulty node"
    (w.work / "incidents.yaml").write_text(yaml.safe_dump({"version": 1, "incidents": [
        {"id": "ECC-1", "kind": "gpu", "entity": FAULTY_GPU, "fault": "ecc_escalation", "start": fault_wall}]}))
    score = json.loads(w.run([*w.argv("seamguard eval"), "--json"]).stdout)
    overall, (incident,) = score["overall"], score["incidents"]
    assert (overall["detected"], overall["healthy_drains"], overall["false_actions"]) == (1, 0, 0), overall
    assert incident["actions"] >= 1 and incident["delay_s"] is not None, incident
    assert "DRAIN" not in w.node_state(FAULTY_NODE)  # the dry run touched nothing


@dataclass
class ControllerPair:
    """Steps 6 and 7: two `seamguard run` replicas from the doc's config, one PostgreSQL ledger, an etcd lease."""

    w: Walk
    ledger_url: str
    etcd: str
    prom_url: str
    watch: KeyWatch
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def launch(self, name: str, mode: str) -> None:
        doc_cfg = yaml.safe_load(self.w.files["controller-a.yaml"])
        cfg = _test_config(doc_cfg, name, mode, self.ledger_url, self.etcd, self.prom_url)
        (self.w.work / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        run = self.w.argv("seamguard run")
        run[run.index("--config") + 1] = f"{name}.yaml"
        self.procs[name] = subprocess.Popen(run, cwd=self.w.work, env=self.w.env, stdout=subprocess.DEVNULL,
                                            stderr=open(self.w.work / f"{name}.log", "ab"))

    def logs(self) -> str:
        return "".join(f"\n--- {n}\n" + (self.w.work / f"{n}.log").read_text()[-1500:] for n in self.procs)

    def stop(self) -> None:
        for proc in self.procs.values():
            _stop(proc)

    def dry_run_then_enforce(self) -> None:
        doc_cfg = yaml.safe_load(self.w.files["controller-a.yaml"])
        assert doc_cfg["ha"]["name"] == "ctl-a" and doc_cfg["mode"] == "dry_run"
        for name in ("ctl-a", "ctl-b"):
            self.launch(name, doc_cfg["mode"])
        _wait("a leader", lambda: self.watch.holder() is not None, 90, self.logs)
        _wait(f"the dry run deciding to drain {FAULTY_NODE}",
              lambda: _decided(self.ledger_url, f"drain:{FAULTY_NODE}"), 120, self.logs)
        time.sleep(3 * TICK_S)
        assert "DRAIN" not in self.w.node_state(FAULTY_NODE)
        assert {r[3] for r in _drains(self.ledger_url)} == {"dry_run"}  # what it would do, not done

        # step 7: both configs say enforce, restarted one at a time, the follower first
        dry_leader = self.watch.holder()
        assert dry_leader is not None
        for name in sorted(self.procs, key=lambda n: n == dry_leader.holder):
            _stop(self.procs[name])
            self.launch(name, "enforce")
        _wait(f"{FAULTY_NODE} drained in Slurm", lambda: "DRAIN" in self.w.node_state(FAULTY_NODE), 120, self.logs)
        rows = _drains(self.ledger_url, dry_run=False)
        assert [r[:4] for r in rows] == ONE_DRAIN, rows
        (fence,) = {r[4] for r in rows}
        assert fence in {e.revision for e in self.watch.snapshot() if e.kind == "put"}  # a leader's token
        reason = self.w.sc.scontrol("show", "node", FAULTY_NODE, "-o").stdout.split("Reason=", 1)[1]
        assert reason.startswith("seamguard"), reason
        assert all("DRAIN" not in self.w.node_state(n) for n in NODES if n != FAULTY_NODE)

    def kill_the_leader(self) -> None:
        """``kill -9`` the leader: the other replica takes the lease and the ledger, and repeats nothing."""
        leader = self.watch.holder()
        assert leader is not None
        self.procs[leader.holder].send_signal(signal.SIGKILL)
        self.procs[leader.holder].wait(10)
        gone = self.watch.wait_for(lambda e: e.kind == "delete" and e.revision == leader.revision, 60)
        assert gone is not None, "the killed leader's lease never ended"
        _wait("the other replica leading",
              lambda: (h := self.watch.holder()) is not None and h.revision > leader.revision, 60, self.logs)
        new = self.watch.holder()
        assert new is not None and new.holder != leader.holder
        _wait("the new leader's first tick", lambda: any(t["token"] == new.revision and t["first_tick_wall_s"]
                                                           for t in takeovers(self.ledger_url)), 60, self.logs)
        time.sleep(5 * TICK_S)
        assert "DRAIN" in self.w.node_state(FAULTY_NODE)
        assert [r[:4] for r in _drains(self.ledger_url, dry_run=False)] == ONE_DRAIN
        # the log actuator's record is the world's: one drain, ever; every ledger row inside its term's lease
        world = [(r["op"], r["key"]) for r in world_records(self.w.work / "actions.jsonl")]
        assert world == [("apply", f"drain:{FAULTY_NODE}")], world
        a = audit(self.ledger_url, self.w.work / "actions.jsonl", self.watch.snapshot())
        assert (a["duplicated"], a["double_led"]) == (0, 0), a  # its "lost" counts one actuator: not read here


def _fault_start_wall(work: Path) -> float | None:
    """Wall time the injected fault began (the truth file maps simulated time to wall time)."""
    try:
        truth = json.loads((work / "truth.json").read_text())
    except (OSError, ValueError):
        return None
    if not truth["faults"]:
        return None
    return truth["wall_start"] + truth["faults"][0]["start_s"] / truth["speed"]


def _test_config(doc_cfg: dict, name: str, mode: str, ledger_url: str, etcd: str, prom_url: str) -> dict:
    """The doc's controller config with this test's addresses and timings (docs/production.md §9)."""
    cfg = json.loads(json.dumps(doc_cfg))
    cfg.update(mode=mode, tick_s=TICK_S, ledger=ledger_url)
    cfg["ha"].update(etcd=[etcd], lease_s=2, name=name, key=LEADER_KEY)
    cfg["prometheus"]["url"] = prom_url
    cfg["prometheus"]["timeout_s"] = 1.0
    return cfg
