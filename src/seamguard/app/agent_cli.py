"""`seamguard agent --config agent.yaml`: the per-node exporter, started from its config.

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

from seamguard.app.clikit import fail


def agent(
    config: Path = typer.Option(..., "--config", help="Agent config YAML (docs/agent.md)."),
    port: int | None = typer.Option(None, "--port", min=0, max=65535, help="/metrics port (default: the config's)."),
    check: bool = typer.Option(False, "--check", help="Validate the config, open the sources, then exit."),
) -> None:
    """Serve this node's signals on /metrics: kernel-log XIDs, NICs, storage and fabric probes, host pressure."""
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
