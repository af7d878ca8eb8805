"""docs/production.md, run: the operator's walk from a running Slurm to an HA controller that
drains a failing node, with the commands and files read out of the document itself.

Real servers throughout: slurmctld and one slurmd per node, each node in its own network
namespace (testbed/slurm.py); Prometheus; etcd; PostgreSQL. The telemetry is the twin's,
served for the imported topology with one GPU fault (testbed/fault_exporter.py) where a
fleet has dcgm-exporter and agents. The walk: import the topology from Slurm, write every
node's agent config, dry run (replay + eval) on the history Prometheus holds, validate the
tuned policy, then two `seamguard run` replicas in enforce with ``ha:`` -> the leader drains
the faulty node in Slurm (ledgered with its token); ``kill -9`` the leader -> the other
replica leads and repeats nothing.
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
TOPOLOGY_CONF = "SwitchName=leaf0 Nodes=gpu[000-001]\nSwitchName=leaf1 Nodes=gpu[002-003]\nSwitchName=spine0 Switches=leaf[0-1]\n"
TICK_S = 1.0

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ip netns)")]


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
    order = ["seamguard fleet import", "seamguard agent config", "seamguard agent --config", "seamguard replay", "seamguard eval",
             "seamguard policy validate", "seamguard run"]
    firsts = [next(i for i, c in enumerate(cmds) if c.startswith(p)) for p in order]
    assert firsts == sorted(firsts), cmds
    assert set(doc_files(DOC.read_text())) == {"facility.yaml", "policy.yaml", "controller-a.yaml"}


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


def test_the_walk_from_slurm_to_an_ha_controller_draining_a_failing_node(tmp_path: Path) -> None:
    text = DOC.read_text()
    cmds, files = doc_commands(text), doc_files(text)
    work = tmp_path / "walk"
    work.mkdir()
    with ExitStack() as stack:
        sc = stack.enter_context(SlurmCluster(tmp_path / "slurm", NODES, slurmd=True, topology_conf=TOPOLOGY_CONF))
        env = {**subprocess_env(), "SLURM_CONF": str(sc.conf),
               "PATH": f"{sc.workdir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}

        # 2. import the topology from the running Slurm, with the facility's base
        (work / "facility.yaml").write_text(files["facility.yaml"])
        _run(argv(command(cmds, "seamguard fleet import"), {}), work, env)
        fleet = load_topology(work / "topology.yaml")
        assert fleet.node_names == NODES and len(fleet.gpu_names) == 32
        topo = yaml.safe_load((work / "topology.yaml").read_text())
        assert {s["name"] for s in topo["switches"]} == {"leaf0", "leaf1", "spine0"}  # from topology.conf

        # 3. every node's agent config
        for node in NODES:
            _run(argv(command(cmds, "seamguard agent config"), {"NODE": node}), work, env)
            agent = parse_agent_config((work / f"agent-{node}.yaml").read_text(), f"agent-{node}.yaml")
            assert agent.node == node, agent
            _run(argv(command(cmds, "seamguard agent --config"), {"NODE": node}), work, env)

        # telemetry: the twin for the imported topology, one GPU escalating to a fatal XID. Prometheus
        # first, so the history holds the exporter's whole life (replay's window starts with it).
        port = free_port()
        prom = stack.enter_context(PrometheusServer(tmp_path / "prom", targets=[f"127.0.0.1:{port}"],
                                                    scrape_interval="1s"))
        start = time.time()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "seamguard.testbed.fault_exporter", "--topology", str(work / "topology.yaml"),
             "--fault", f"gpu_ecc_escalation:{FAULTY_GPU}", "--start-s", "5", "--magnitude", "2",
             "--tick-s", str(TICK_S), "--port", str(port), "--truth-out", str(work / "truth.json")],
            env=env, stdout=subprocess.DEVNULL, stderr=open(work / "exporter.log", "wb"))
        stack.callback(_stop, exporter)
        prom.wait_targets_up(90)

        # 4.-5. dry run on the history Prometheus holds, with the tuned policy
        (work / "policy.yaml").write_text(files["policy.yaml"])
        _run(argv(command(cmds, "seamguard policy validate"), {}), work, env)
        _wait("the fault in the truth file", lambda: _fault_start_wall(work) is not None, 60)
        fault_wall = _fault_start_wall(work)
        _wait("history past the fatal XID", lambda: time.time() > fault_wall + 8, 60)
        replay = argv(command(cmds, "seamguard replay"), {"PROMETHEUS": prom.url, "START": f"{start:.0f}",
                                                           "END": f"{time.time():.0f}"})
        replay[replay.index("--step") + 1] = str(TICK_S)  # the test's scrape interval (docs/production.md §9)
        _run(replay, work, env)
        timeline = [json.loads(line) for line in (work / "timeline.jsonl").read_text().splitlines() if line.strip()]
        assert any("drain:gpu002" in json.dumps(rec) for rec in timeline), "the replay would not drain gpu002"
        (work / "incidents.yaml").write_text(yaml.safe_dump({"version": 1, "incidents": [
            {"id": "ECC-1", "kind": "gpu", "entity": FAULTY_GPU, "fault": "ecc_escalation", "start": fault_wall}]}))
        ev = _run([*argv(command(cmds, "seamguard eval"), {}), "--json"], work, env)
        score = json.loads(ev.stdout)
        overall, (incident,) = score["overall"], score["incidents"]
        assert (overall["detected"], overall["healthy_drains"], overall["false_actions"]) == (1, 0, 0), overall
        assert incident["actions"] >= 1 and incident["delay_s"] is not None, incident
        assert "DRAIN" not in _node_state(sc, FAULTY_NODE)  # the dry run touched nothing

        # 6. two replicas, dry run, sharing a PostgreSQL ledger, leading by an etcd lease
        pg = stack.enter_context(PostgresServer())
        ledger_url = pg.create_database("walk_ledger")
        etcd = stack.enter_context(EtcdServer.loopback(tmp_path / "etcd"))
        watch = KeyWatch(etcd.address).start()
        stack.callback(watch.stop)
        doc_cfg = yaml.safe_load(files["controller-a.yaml"])
        assert doc_cfg["ha"]["name"] == "ctl-a" and doc_cfg["mode"] == "dry_run"
        replicas: dict[str, subprocess.Popen] = {}
        stack.callback(lambda: [_stop(p) for p in replicas.values()])

        def launch(name: str, mode: str) -> None:
            cfg = _test_config(doc_cfg, name, mode, ledger_url, etcd.address, prom.url)
            (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
            run = argv(command(cmds, "seamguard run"), {})
            run[run.index("--config") + 1] = f"{name}.yaml"
            replicas[name] = subprocess.Popen(run, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                              stderr=open(work / f"{name}.log", "ab"))

        def logs() -> str:
            return "".join(f"\n--- {n}\n" + (work / f"{n}.log").read_text()[-1500:] for n in replicas)

        for name in ("ctl-a", "ctl-b"):
            launch(name, doc_cfg["mode"])
        _wait("a leader", lambda: watch.holder() is not None, 90, logs)
        _wait(f"the dry run deciding to drain {FAULTY_NODE}", lambda: _decided(ledger_url, f"drain:{FAULTY_NODE}"),
              120, logs)
        time.sleep(3 * TICK_S)
        assert "DRAIN" not in _node_state(sc, FAULTY_NODE)
        assert {r[3] for r in _drains(ledger_url)} == {"dry_run"}  # recorded as what it would do, not done

        # 7. enforce: both configs say so, restarted one at a time, the follower first
        dry_leader = watch.holder()
        assert dry_leader is not None
        for name in sorted(replicas, key=lambda n: n == dry_leader.holder):
            _stop(replicas[name])
            launch(name, "enforce")
        _wait(f"{FAULTY_NODE} drained in Slurm", lambda: "DRAIN" in _node_state(sc, FAULTY_NODE), 120, logs)
        rows = _drains(ledger_url, dry_run=False)
        assert [r[:4] for r in rows] == ONE_DRAIN, rows
        (fence,) = {r[4] for r in rows}
        assert fence in {e.revision for e in watch.snapshot() if e.kind == "put"}  # a leader's fencing token
        leader = watch.holder()
        assert leader is not None
        assert "seamguard" in sc.scontrol("show", "node", FAULTY_NODE, "-o").stdout.split("Reason=", 1)[1]
        assert all("DRAIN" not in _node_state(sc, n) for n in NODES if n != FAULTY_NODE)

        # kill -9 the leader: the other replica takes the lease and the ledger, repeats nothing
        replicas[leader.holder].send_signal(signal.SIGKILL)
        replicas[leader.holder].wait(10)
        gone = watch.wait_for(lambda e: e.kind == "delete" and e.revision == leader.revision, 60)
        assert gone is not None, "the killed leader's lease never ended"
        _wait("the other replica leading", lambda: (h := watch.holder()) is not None and h.revision > leader.revision,
              60, logs)
        new = watch.holder()
        assert new is not None and new.holder != leader.holder
        _wait("the new leader's first tick", lambda: any(t["token"] == new.revision and t["first_tick_wall_s"]
                                                           for t in takeovers(ledger_url)), 60, logs)
        time.sleep(5 * TICK_S)
        assert "DRAIN" in _node_state(sc, FAULTY_NODE)
        assert [r[:4] for r in _drains(ledger_url, dry_run=False)] == ONE_DRAIN
        # the log actuator's record is the world's: one drain, ever; every ledger row inside its term's lease
        assert [(r["op"], r["key"]) for r in world_records(work / "actions.jsonl")] == [("apply", f"drain:{FAULTY_NODE}")]
        a = audit(ledger_url, work / "actions.jsonl", watch.snapshot())  # counts one actuator: "lost" is the slurm row
        assert (a["duplicated"], a["double_led"]) == (0, 0), a


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
