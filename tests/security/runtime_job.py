"""A real `seamguard launch` of the tiny CPU example job, run in the background so an
attack can reach it while it trains (tests/security/test_runtime_*.py).

Uses only what any version of the runtime offers (the CLI, torch's TCPStore client, the
events file), so each attack can be run against an older tree too.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from seamguard.ports import free_port

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


@dataclass
class Job:
    proc: subprocess.Popen
    root: Path
    port: int
    out: Path = field(init=False)
    ckpt: Path = field(init=False)
    hints: Path = field(init=False)

    def __post_init__(self) -> None:
        self.out, self.ckpt, self.hints = self.root / "run", self.root / "ckpt", self.root / "hints"

    def events(self) -> list[dict]:
        f = self.out / "events.jsonl"
        if not f.exists():
            return []
        out = []
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass   # a line being written
        return out

    def kinds(self, name: str) -> list[dict]:
        return [e for e in self.events() if e.get("event") == name]

    def stderr(self) -> str:
        f = self.root / "stderr.txt"
        return f.read_text(errors="replace") if f.exists() else ""

    def wait_step(self, step: int, timeout_s: float = 120.0) -> None:
        log, deadline = self.out / "worker_0.log", time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if log.exists() and any(int(x.split()[0]) >= step for x in log.read_text().splitlines() if x.strip()):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended (code {self.proc.returncode}) before step {step}: "
                                     f"{self.stderr()[-2000:]}")
            time.sleep(0.05)
        raise AssertionError(f"step {step} not reached in {timeout_s}s")

    def wait_for(self, what, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not what() and time.monotonic() < deadline:
            time.sleep(0.05)

    def finish(self, timeout_s: float = 180.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self.proc.kill()
            self.proc.wait(timeout=30)


def start(root: Path, *, steps: int = 40, nproc: int = 2, spares: int = 0, extra: tuple = ()) -> Job:
    """A one-node job on a port chosen here (so the attacker knows it), persisting every
    10 steps to ``root/ckpt``, hint directory ``root/hints``."""
    out, ckpt, hints = root / "run", root / "ckpt", root / "hints"
    hints.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, "-m", "seamguard", "launch", "--nproc", str(nproc), "--spares", str(spares),
           "--master-port", str(port), "--checkpoint-dir", str(ckpt), "--hint-dir", str(hints),
           "--snapshot-every", "5", "--persist-every", "10", "--keep-checkpoints", "100",
           "--events-file", str(out / "events.jsonl"), *extra, "--",
           str(REPO / "examples" / "train_ddp.py"), "--steps", str(steps), "--out", str(out),
           "--step-sleep-s", "0.1"]
    with open(root / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
    return Job(proc, root, port)


def attacker(port: int):
    """What any local process can do: connect to the job's store as a TCPStore client."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=10))


def signed_hint(hints: Path, name: str, value: str = "", key_file: Path | None = None) -> None:
    """An operator's (or the controller's) legitimate hint file: signed with the job's key
    where this tree signs hints, a plain file where it does not."""
    try:
        from seamguard import hintauth
    except ImportError:
        (hints / name).write_text(value)
        return
    key_file = key_file or hints / hintauth.KEY_FILE_NAME
    deadline = time.monotonic() + 60
    while not key_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    hintauth.write_hint_file(hints, name, value, hintauth.read_key(key_file))


def files_under(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def listening_addresses(port: int) -> list[str]:
    """The local addresses of the sockets listening on ``port`` (/proc/net/tcp, tcp6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, state = parts[1], parts[3]
            addr, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:   # 0A: LISTEN
                found.append(_addr(addr, width))
    return found


def _addr(hexaddr: str, width: int) -> str:
    import ipaddress

    raw = bytes.fromhex(hexaddr)
    if width == 8:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))
