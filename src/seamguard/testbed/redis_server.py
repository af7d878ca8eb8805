"""A real Debian-packaged redis-server on a free loopback port, in a temporary directory (tests, benchmarks).

No persistence (``--save "" --appendonly no``); started and stopped by the caller, also on
failure. A missing binary raises `MissingBinary` naming the package — never a skip.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from seamguard.ports import free_port
from seamguard.testbed.prom import need


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        exe = need("redis-server", "redis-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer on port {self.port} (see {self.workdir}/redis.log)")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout_s)
        self._proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
