"""`seamguard agent --config agent.yaml`: the per-node exporter, started from its config;
`seamguard agent config --topology T --node N`: that config, written from the topology.

The edge: the file is read here and validated whole, the kernel log opened and NVML
probed before any port is bound; each problem is one ``error: <file>: <field>: ...`` line
(exit 2). The agent itself is seamguard.agent (docs/agent.md).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

import typer

from seamguard.clikit import fail


agent_app = typer.Typer(invoke_without_command=True, no_args_is_help=False)


@agent_app.callback()
def agent(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="Agent config YAML (docs/agent.md)."),
    port: int | None = typer.Option(None, "--port", min=0, max=65535, help="/metrics port (default: the config's)."),
    check: bool = typer.Option(False, "--check", help="Validate the config, open the sources, then exit."),
) -> None:
    """Serve this node's signals on /metrics: kernel-log XIDs, NICs, storage and fabric probes, host pressure."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        fail("--config is required to run the agent (`seamguard agent config --topology T --node N` writes one)")
    try:
        from seamguard.agent.config import AgentConfigError, parse_agent_config
        from seamguard.agent.exporter import Agent
    except ImportError as e:
        fail(f"`seamguard agent` needs prometheus-client ({e.name} is missing): pip install 'seamguard[service]'")
    try:
        text = config.read_bytes()
    except OSError as e:
        fail(f"{config}: cannot read the agent config: {e.strerror or e}")
    try:
        cfg = parse_agent_config(text, str(config))
    except AgentConfigError as e:
        fail(str(e))
    if port is not None:
        cfg = cfg.model_copy(update={"listen": cfg.listen.model_copy(update={"port": port})})
    for s in cfg.storage.paths if cfg.storage.enabled else []:
        if not s.path.is_dir():
            fail(f"{config}: storage.paths: {s.name}: {s.path} is not a directory")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        ag = Agent(cfg)
    except OSError as e:
        src = cfg.kernel_log.path if cfg.kernel_log.source == "kmsg" else cfg.kernel_log.journalctl
        fail(f"{config}: kernel_log: cannot open {src}: {e.strerror or e} (root is needed for /dev/kmsg; "
             "or set kernel_log.enabled: false)")
    for note in ag.notes:
        logging.getLogger("seamguard.agent").info("%s", note)
    if check:
        ag.stop()
        typer.echo(f"{config}: ok")
        return
    try:
        bound = ag.start()
    except OSError as e:
        ag.stop()
        fail(f"{config}: listen: cannot bind {cfg.listen.host}:{cfg.listen.port} or fabric.port {cfg.fabric.port}: "
             f"{e.strerror or e}")
    typer.echo(f"seamguard agent: node {cfg.node}, /metrics on http://{cfg.listen.host}:{bound}/metrics", err=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    ag.stop()


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            fail(f"{flag}: {item!r} is not NAME=VALUE")
        out[key] = value
    return out


@agent_app.command("config")
def agent_config(
    topology: Path = typer.Option(..., "--topology", help="Topology YAML (docs/topology.md)."),
    node: str = typer.Option(..., "--node", help="The node's name in the topology."),
    addresses: Path | None = typer.Option(None, "--addresses", help="YAML mapping NIC name -> address "
                                                                    "('gpu001/mlx5_0': 10.10.0.1) for every node."),
    storage_mount: list[str] = typer.Option([], "--storage-mount", help="STORAGE=/mount/dir (repeatable)."),
    peers_per_rail: int = typer.Option(8, "--peers-per-rail", min=1, max=64, help="Peers probed on each rail."),
    out: Path | None = typer.Option(None, "--out", help="Write here (default: stdout)."),
) -> None:
    """Write this node's agent config from the topology: its rails, symmetric probe peers, storage path."""
    import yaml

    from seamguard.agent.config import AgentConfigError, parse_agent_config
    from seamguard.agent.plan import agent_config_for
    from seamguard.app.config import load_topology, read_yaml
    from seamguard.fleet.topology import TopologyError

    mounts = _pairs(storage_mount, "--storage-mount")
    try:
        fleet = load_topology(topology)
        addr = read_yaml(addresses, "address map", TopologyError) if addresses else {}
    except TopologyError as e:
        fail(str(e))
    if not isinstance(addr, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in addr.items()):
        fail(f"{addresses}: an address map is a mapping of NIC name to address string")
    try:
        cfg, notes = agent_config_for(fleet, node, addr, mounts, peers_per_rail)
    except KeyError as e:
        fail(f"--node: {e.args[0]}")
    text = yaml.safe_dump(cfg, sort_keys=False)
    try:
        parse_agent_config(text, f"agent config for {node}")
    except AgentConfigError as e:
        fail(f"the written config would not validate: {e}")
    for note in notes:
        typer.echo(f"agent config: {note}", err=True)
    if out is None:
        typer.echo(text, nl=False)
        return
    if out.is_dir() or not out.parent.is_dir():
        fail(f"--out: {out} is a directory or its directory does not exist")
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{out}: cannot write: {e.strerror or e}")
